// Command tetra is the fifth post's tetration app on Go's net/http (see ../README.md).
//
//	GET /          "OK, no problema!"
//	GET /tetra/x   x**x computed in 64-bit floats, as the post does, and printed as
//	               Go prints a float64 (fmt.Fprint): /tetra/3 is "27", /tetra/8
//	               "1.6777216e+07", /tetra/20 "1.048576e+26", from /tetra/144 on
//	               "+Inf". x: 1 to 4 ASCII digits, at most 1000, else
//	               400 "x must be an integer in 0..1000", as in the other four apps
//	GET /health    200 "ok"
//
// Reads PORT (default 3000) and binds 127.0.0.1:PORT, or serves the socket drover's
// shared mode passes as fd 3 (LISTEN_FDS; LISTEN_PID, when set, must be this pid).
// Every response carries `x-worker`: DROVER_WORKER_ID, or the pid without it.
// On SIGTERM or SIGINT it stops accepting, finishes requests in flight and exits 0.
package main

import (
	"context"
	"fmt"
	"log"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// The same bound and grammar in all five apps (ParseFloat alone would take "inf",
// "0x10" or "1_0").
const maxX = 1000

var xDigits = regexp.MustCompile(`^[0-9]{1,4}$`)

func text(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprint(w, body)
}

func routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		text(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("/tetra/", func(w http.ResponseWriter, r *http.Request) {
		// One path segment, as /tetra/:x is in the other frameworks.
		raw := strings.TrimPrefix(r.URL.Path, "/tetra/")
		if raw == "" || strings.Contains(raw, "/") {
			http.NotFound(w, r)
			return
		}
		n, err := strconv.Atoi(raw)
		if !xDigits.MatchString(raw) || err != nil || n > maxX {
			text(w, http.StatusBadRequest, fmt.Sprintf("x must be an integer in 0..%d", maxX))
			return
		}
		x := float64(n)
		text(w, http.StatusOK, fmt.Sprint(math.Pow(x, x)))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// "/" is the mux's catch-all.
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		text(w, http.StatusOK, "OK, no problema!")
	})
	return mux
}

// listener serves the socket drover passed as fd 3 when it was meant for this process,
// else binds PORT. A LISTEN_PID of another process means the variables leaked through
// a wrapper (`go run`, a shell script), and that process owns the socket.
func listener() (net.Listener, string, error) {
	fds, err := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	pid, pidSet := os.LookupEnv("LISTEN_PID")
	if err == nil && fds >= 1 && (!pidSet || pid == strconv.Itoa(os.Getpid())) {
		f := os.NewFile(3, "LISTEN_FDS")
		defer f.Close() // FileListener works on a duplicate
		ln, err := net.FileListener(f)
		return ln, " (fd 3 from LISTEN_FDS)", err
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "3000"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", port))
	return ln, "", err
}

func main() {
	log.SetFlags(0)
	worker, ok := os.LookupEnv("DROVER_WORKER_ID")
	if !ok {
		worker = strconv.Itoa(os.Getpid())
	}
	ln, how, err := listener()
	if err != nil {
		log.Fatalf("tetra (go): %v", err)
	}
	mux := routes()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Set before the mux runs, so 404s carry it too.
		w.Header().Set("X-Worker", worker)
		mux.ServeHTTP(w, r)
	})}

	drained := make(chan struct{})
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		// Stops accepting, closes idle keep-alive connections and returns when the busy
		// ones are done; drover's SIGKILL deadline bounds the wait.
		_ = srv.Shutdown(context.Background())
		close(drained)
	}()

	fmt.Printf("tetra (go) worker %s (pid %d) listening on %s%s\n", worker, os.Getpid(), ln.Addr(), how)
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		log.Fatalf("tetra (go): %v", err)
	}
	<-drained
}

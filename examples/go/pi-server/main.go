// Command pi-server is a demo backend for drover, standard library only: the same
// routes and answers as ../../pi-server.js. It estimates pi by Monte-Carlo sampling,
// so each request costs CPU in proportion to `iterations`.
//
//	GET /                      same as /pi
//	GET /pi?iterations=N       estimate pi from N random points (default 100000)
//	GET /mixed[?n=K]           90% cheap (1e4 points), 10% expensive (5e5 points);
//	                           with n, request K is expensive when K % 10 == 0
//	GET /health                200 "ok"
//
// Reads PORT (default 3000), or serves the listening socket drover passes as fd 3 when
// LISTEN_FDS is set (systemd's convention; LISTEN_PID, when set, must be this pid).
// Every response carries an `x-worker` header: DROVER_WORKER_ID, or the pid without it.
// On SIGTERM or SIGINT it stops accepting, finishes requests in flight and exits 0.
//
// Unlike one Node or Python process, one Go process serves requests in parallel on
// every core; set GOMAXPROCS=1 to compare like with like under `drover run -w auto`.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"math/rand"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	defaultIterations = 100000
	cheap             = 10000
	expensive         = 500000
	// Bounds the CPU one request may ask for, so a typo cannot wedge a worker for minutes.
	maxIterations = 100000000
)

var (
	worker       *string // DROVER_WORKER_ID; null in answers when unset
	workerHeader string
	// ASCII digits only, as in the Node and Python servers.
	digits  = regexp.MustCompile(`^[0-9]+$`)
	integer = regexp.MustCompile(`^-?[0-9]+$`)
)

type answer struct {
	Pi         float64 `json:"pi"`
	Iterations int     `json:"iterations"`
	Worker     *string `json:"worker"`
	Pid        int     `json:"pid"`
	Ms         float64 `json:"ms"`
	Kind       string  `json:"kind,omitempty"`
}

// newRand is a generator for one request: the global one takes a lock (this server
// runs requests in parallel), and before Go 1.20 it starts from the same seed in every
// worker.
func newRand() *rand.Rand {
	return rand.New(rand.NewSource(time.Now().UnixNano()))
}

func estimatePi(iterations int) float64 {
	rng := newRand()
	inside := 0
	for i := 0; i < iterations; i++ {
		x, y := rng.Float64(), rng.Float64()
		if x*x+y*y <= 1 {
			inside++
		}
	}
	return 4 * float64(inside) / float64(iterations)
}

func send(w http.ResponseWriter, status int, body []byte, contentType string) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Worker", workerHeader)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func text(w http.ResponseWriter, status int, msg string) {
	send(w, status, []byte(msg), "text/plain")
}

func piAnswer(w http.ResponseWriter, iterations int, kind string) {
	started := time.Now()
	pi := estimatePi(iterations)
	ms := float64(time.Since(started).Nanoseconds()) / 1e6
	body, _ := json.Marshal(answer{pi, iterations, worker, os.Getpid(), ms, kind})
	send(w, http.StatusOK, append(body, '\n'), "application/json")
}

func handle(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		text(w, http.StatusMethodNotAllowed, "method not allowed\n")
		return
	}
	// The request target as sent, split by hand as the Node and Python servers do.
	path, rawQuery, _ := strings.Cut(r.RequestURI, "?")
	query, _ := url.ParseQuery(rawQuery)
	switch path {
	case "/health":
		text(w, http.StatusOK, "ok")
	case "/", "/pi":
		iterations := defaultIterations
		if raw, ok := first(query, "iterations"); ok {
			iterations = -1
			if digits.MatchString(raw) {
				if v, err := strconv.Atoi(raw); err == nil {
					iterations = v
				}
			}
		}
		if iterations < 1 || iterations > maxIterations {
			text(w, http.StatusBadRequest, fmt.Sprintf("iterations must be an integer in 1..%d\n", maxIterations))
			return
		}
		piAnswer(w, iterations, "")
	case "/mixed":
		n, given := first(query, "n")
		if given && !integer.MatchString(n) {
			text(w, http.StatusBadRequest, "n must be an integer\n")
			return
		}
		// The last digit decides, so a K too long for an int64 still counts exactly.
		costly := newRand().Float64() < 0.1
		if given {
			costly = strings.HasSuffix(n, "0")
		}
		if costly {
			piAnswer(w, expensive, "expensive")
		} else {
			piAnswer(w, cheap, "cheap")
		}
	default:
		text(w, http.StatusNotFound, "not found\n")
	}
}

// first is the first value of a query parameter, like URLSearchParams.get in Node.
func first(q url.Values, key string) (string, bool) {
	if v, ok := q[key]; ok && len(v) > 0 {
		return v[0], true
	}
	return "", false
}

// listener serves the socket drover passed as fd 3 when it was meant for this process,
// else binds PORT. A LISTEN_PID of another process means the variables leaked through
// a wrapper (`go run`, a shell script), and that process owns the socket.
func listener() (net.Listener, string, error) {
	raw := os.Getenv("LISTEN_FDS")
	fds, err := strconv.Atoi(raw)
	pid, pidSet := os.LookupEnv("LISTEN_PID")
	inherit := err == nil && digits.MatchString(raw) && fds >= 1
	if inherit && (!pidSet || pid == strconv.Itoa(os.Getpid())) {
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
	if id, ok := os.LookupEnv("DROVER_WORKER_ID"); ok {
		worker = &id
		workerHeader = id
	} else {
		workerHeader = strconv.Itoa(os.Getpid())
	}
	label := "-"
	if worker != nil {
		label = *worker
	}

	ln, how, err := listener()
	if err != nil {
		log.Fatalf("pi-server: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(handle)}

	drained := make(chan struct{})
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		name := "SIGTERM"
		if <-signals == syscall.SIGINT {
			name = "SIGINT"
		}
		fmt.Printf("pi-server %s (pid %d): %s, draining\n", label, os.Getpid(), name)
		// Stops accepting, closes idle keep-alive connections, answers busy ones with
		// `Connection: close`, and returns when the last one is done. drover's SIGKILL
		// deadline bounds the wait, so no timeout of our own.
		_ = srv.Shutdown(context.Background())
		close(drained)
	}()

	fmt.Printf("pi-server worker %s (pid %d) listening on %s%s\n", label, os.Getpid(), ln.Addr(), how)
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		log.Fatalf("pi-server: %v", err)
	}
	<-drained
}

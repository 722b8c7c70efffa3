// Command tetra-server is a demo backend for drover, standard library only: the same
// routes and answers as ../../tetra-server.js. It computes tetration, the power tower
//
//	x↑↑n = x^(x^(...^x))   (n copies of x, evaluated from the top down; x↑↑0 = 1)
//
// in 64-bit floats with n calls to math.Pow. There is no shortcut when the tower
// converges (for e^-e ≤ x ≤ e^(1/e) it does), so the height n is also the cost knob.
//
//	GET /tetra/:x[?n=N]        x↑↑N (default N = 4): {x, n, value, worker, pid, ms}
//	                           x: a positive finite decimal number (1.5, 2e-3);
//	                           N: an integer in 0..10000000; anything else is a 400
//	                           naming the parameter, and a tower beyond the largest
//	                           double (2↑↑5 = 2^65536) is a 422
//	GET /mixed[?n=K]           90% cheap (1.2↑↑1e4), 10% expensive (1.2↑↑5e5, ~50×);
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
	"math"
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
	defaultHeight = 4
	// Bounds the CPU one request may ask for.
	maxHeight = 10000000
	// 1.2 lies in the convergent range, so even the expensive tower stays finite.
	mixedX    = 1.2
	cheap     = 10000
	expensive = 500000
)

var (
	worker       *string // DROVER_WORKER_ID; null in answers when unset
	workerHeader string
	// ASCII digits only, the same grammar in all three languages: each one's own
	// number parser accepts different extras (ParseFloat takes "inf", "0x1p3", "1_0").
	decimal = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$`)
	digits  = regexp.MustCompile(`^[0-9]+$`)
	integer = regexp.MustCompile(`^-?[0-9]+$`)
)

type answer struct {
	X      float64 `json:"x"`
	N      int     `json:"n"`
	Value  float64 `json:"value"`
	Worker *string `json:"worker"`
	Pid    int     `json:"pid"`
	Ms     float64 `json:"ms"`
	Kind   string  `json:"kind,omitempty"`
}

func tower(x float64, n int) float64 {
	t := 1.0
	for i := 0; i < n; i++ {
		t = math.Pow(x, t)
		if math.IsInf(t, 1) {
			break
		}
	}
	return t
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

// tetraAnswer: label is x as the client wrote it, so error text matches the other servers.
func tetraAnswer(w http.ResponseWriter, x float64, label string, n int, kind string) {
	started := time.Now()
	value := tower(x, n)
	ms := float64(time.Since(started).Nanoseconds()) / 1e6
	if math.IsInf(value, 1) {
		text(w, http.StatusUnprocessableEntity, fmt.Sprintf("%s^^%d overflows a 64-bit float (it exceeds 1.8e308)\n", label, n))
		return
	}
	body, _ := json.Marshal(answer{x, n, value, worker, os.Getpid(), ms, kind})
	send(w, http.StatusOK, append(body, '\n'), "application/json")
}

func handle(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		text(w, http.StatusMethodNotAllowed, "method not allowed\n")
		return
	}
	// The request target as sent (r.URL.Path is percent-decoded), split by hand as the
	// Node and Python servers do.
	path, rawQuery, _ := strings.Cut(r.RequestURI, "?")
	query, _ := url.ParseQuery(rawQuery)
	switch {
	case path == "/health":
		text(w, http.StatusOK, "ok")
	case path == "/mixed":
		n, given := first(query, "n")
		if given && !integer.MatchString(n) {
			text(w, http.StatusBadRequest, "n must be an integer\n")
			return
		}
		// The last digit decides, so a K too long for an int64 still counts exactly.
		// A generator per request: before Go 1.20 the global one has the same seed in
		// every worker.
		costly := rand.New(rand.NewSource(time.Now().UnixNano())).Float64() < 0.1
		if given {
			costly = strings.HasSuffix(n, "0")
		}
		label := strconv.FormatFloat(mixedX, 'g', -1, 64)
		if costly {
			tetraAnswer(w, mixedX, label, expensive, "expensive")
		} else {
			tetraAnswer(w, mixedX, label, cheap, "cheap")
		}
	case strings.HasPrefix(path, "/tetra/") && !strings.Contains(path[7:], "/"):
		rawX := path[7:]
		x := math.NaN()
		if decimal.MatchString(rawX) {
			// Out of range gives ±Inf or 0 with an error; the check below rejects both.
			x, _ = strconv.ParseFloat(rawX, 64)
		}
		if !(x > 0 && !math.IsInf(x, 1)) {
			text(w, http.StatusBadRequest, fmt.Sprintf("x must be a positive finite decimal number, got \"%s\"\n", rawX))
			return
		}
		n := defaultHeight
		if rawN, ok := first(query, "n"); ok {
			n = -1
			if digits.MatchString(rawN) {
				if v, err := strconv.Atoi(rawN); err == nil {
					n = v
				}
			}
			if n < 0 || n > maxHeight {
				text(w, http.StatusBadRequest, fmt.Sprintf("n must be an integer in 0..%d, got \"%s\"\n", maxHeight, rawN))
				return
			}
		}
		tetraAnswer(w, x, rawX, n, "")
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
		log.Fatalf("tetra-server: %v", err)
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
		fmt.Printf("tetra-server %s (pid %d): %s, draining\n", label, os.Getpid(), name)
		// Stops accepting, closes idle keep-alive connections, answers busy ones with
		// `Connection: close`, and returns when the last one is done. drover's SIGKILL
		// deadline bounds the wait, so no timeout of our own.
		_ = srv.Shutdown(context.Background())
		close(drained)
	}()

	fmt.Printf("tetra-server worker %s (pid %d) listening on %s%s\n", label, os.Getpid(), ln.Addr(), how)
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		log.Fatalf("tetra-server: %v", err)
	}
	<-drained
}

// Command embed runs a tiny login service in preforkd's supervised worker
// processes, with a rate limit that holds across all of them: 3 login
// attempts per minute per client IP, forgiven by a successful login.
//
//	go run ./examples/embed -listen 127.0.0.1:8081
//	curl -i -d password=wrong   http://127.0.0.1:8081/login   # 401, 401, then 200 with the right one:
//	curl -i -d password=correct http://127.0.0.1:8081/login   # the failures are forgiven, 3 attempts again
//
// Three failures use the whole allowance: the next attempt, the right
// password too, is refused with 429 before it reaches the handler, until
// the bucket refills (Retry-After: 20, one attempt every 20 s); then the
// right password is 200 and forgives the failures.
//
// TERM or Ctrl-C drains the workers; HUP replaces them one at a time.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/prefork"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

// run is main in both roles: prefork.Run comes first (after the flags,
// which have no side effects), because in a worker process it serves and
// exits, never returning.
func run() error {
	listen := flag.String("listen", "127.0.0.1:8081", "address to listen on")
	workers := flag.Int("workers", 2, "number of worker processes")
	flag.Parse()

	cfg := config.Config{
		Server: config.Server{Listen: *listen, Workers: *workers, ShutdownTimeout: 10 * time.Second},
		Table:  config.Table{Counters: 4096},
		RateLimits: []config.RateLimit{{
			Name:   "login",
			Path:   "/login",
			Limit:  3,
			Window: time.Minute,
			By:     "ip",
		}},
	}
	return prefork.Run(context.Background(), prefork.Options{
		Config:  cfg,
		Handler: newApp,
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
}

// newApp builds the application, once in each worker. The rate-limit
// middleware wraps it, so the handler sees only the requests the rule let
// through.
func newApp(w *prefork.Worker) (http.Handler, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /login", func(rw http.ResponseWriter, r *http.Request) {
		if r.PostFormValue("password") != "correct" {
			http.Error(rw, "wrong password", http.StatusUnauthorized)
			return
		}
		// A successful login forgives this client's failed attempts, in
		// every worker at once: the count lives in the shared region.
		w.Limiter("login").Reset(w.ClientKey("login", r), w.Region.Now())
		fmt.Fprintf(rw, "welcome (served by worker %d)\n", w.Index)
	})
	return mux, nil
}

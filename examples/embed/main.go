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

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
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
	return prefork.Run(context.Background(), prefork.Options{
		Listen:   *listen,
		Workers:  *workers,
		Region:   shm.Options{Counters: 4096},
		Settings: prefork.Settings{ShutdownTimeout: 10 * time.Second},
		Engine:   newEngine,
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
}

// login is the rule: 3 attempts a minute per client IP.
var login = core.RateLimit{
	Rule:  bucket.Rule{Name: "login", Limit: 3, Window: time.Minute},
	Route: route.MustCompile("/login", []string{"POST"}),
	By:    clientip.MustParseBy("ip"),
}

// newEngine builds what a worker serves with, once in each worker: the
// decision core over the shared region, and net/http in front of the
// application with the core running every request, so that the handler
// sees only the requests the rule let through.
func newEngine(w *prefork.Worker) (prefork.Engine, error) {
	c, err := core.New(w.Region, core.Options{
		RateLimits: []core.RateLimit{login},
		OnResponse: w.Responded, // the worker's recycling limits count responses
		Logger:     w.Logger,
	})
	if err != nil {
		return nil, err
	}
	w.Defer(c.Close)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /login", func(rw http.ResponseWriter, r *http.Request) {
		if r.ParseForm() != nil || r.PostForm.Get("password") != "correct" {
			http.Error(rw, "wrong password", http.StatusUnauthorized)
			return
		}
		// A successful login forgives this client's failed attempts, in
		// every worker at once: the count lives in the shared region.
		if err := nethttp.Reset(c, "login", r); err != nil {
			w.Logger.Warn("login: the failed attempts were not forgiven", "err", err)
		}
		fmt.Fprintf(rw, "welcome (served by worker %d)\n", w.Index)
	})
	return nethttp.NewServer(nethttp.ServerOptions{
		Core:    c,
		Handler: mux,
		Limits:  engine.Limits{IdleTimeout: 30 * time.Second},
		Logger:  w.Logger,
	})
}

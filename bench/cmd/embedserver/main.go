// Command embedserver is the embedded-handler subject of bench/http.sh: a
// prefork server whose workers answer "hello" from an http.Handler, with
// one rate-limit rule on every path or none.
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
		fmt.Fprintln(os.Stderr, "embedserver:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:18090", "listen address")
	workers := flag.Int("workers", 2, "worker processes")
	rules := flag.String("rules", "off", `"off"; "on" (a rule on every path that allows everything); "refuse" (a rule that refuses everything after the first request)`)
	flag.Parse()

	cfg := config.Default()
	cfg.Server.Listen = *listen
	cfg.Server.Workers = *workers
	switch *rules {
	case "off":
	case "on":
		cfg.RateLimits = []config.RateLimit{{Name: "all", Path: "/*", Limit: 1_000_000, Window: time.Second, By: "ip"}}
	case "refuse":
		cfg.RateLimits = []config.RateLimit{{Name: "all", Path: "/*", Limit: 1, Window: time.Hour, By: "ip"}}
	default:
		return fmt.Errorf("-rules %q: want off, on or refuse", *rules)
	}
	hello := []byte("hello\n")
	return prefork.Run(context.Background(), prefork.Options{
		Config: cfg,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Handler: func(*prefork.Worker) (http.Handler, error) {
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				w.Write(hello)
			}), nil
		},
	})
}

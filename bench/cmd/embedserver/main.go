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

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/route"
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

	var rls []core.RateLimit
	every := func(limit int64, window time.Duration) core.RateLimit {
		return core.RateLimit{Rule: bucket.Rule{Name: "all", Limit: limit, Window: window},
			Route: route.MustCompile("/*", nil), By: clientip.MustParseBy("ip")}
	}
	switch *rules {
	case "off":
	case "on":
		rls = append(rls, every(1_000_000, time.Second))
	case "refuse":
		rls = append(rls, every(1, time.Hour))
	default:
		return fmt.Errorf("-rules %q: want off, on or refuse", *rules)
	}
	hello := []byte("hello\n")
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write(hello)
	})
	return prefork.Run(context.Background(), prefork.Options{
		Listen:  *listen,
		Workers: *workers,
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Engine: func(w *prefork.Worker) (prefork.Engine, error) {
			c, err := core.New(w.Region, core.Options{RateLimits: rls, OnResponse: w.Responded, Logger: w.Logger})
			if err != nil {
				return nil, err
			}
			w.Defer(c.Close)
			return nethttp.NewServer(nethttp.ServerOptions{Core: c, Handler: app, Logger: w.Logger})
		},
	})
}

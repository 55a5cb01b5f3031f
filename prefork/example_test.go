package prefork_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/route"
)

// Two worker processes serve one listener; a rate limit of 3 logins per
// client holds across both, since their counts live in the region the
// supervisor made. Each worker builds its engine from what its settings'
// payload says: the decision core over the worker's region, and net/http
// in front of the application.
func Example() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- prefork.Run(ctx, prefork.Options{
			Listener: ln,
			Workers:  2,
			Settings: prefork.Settings{Payload: []byte(`{"login_limit":3}`)}, // what every worker is told
			Engine:   newEngine,
			Logger:   slog.New(slog.DiscardHandler),
			OnStatus: func(st prefork.Status) {
				if st.Ready {
					select {
					case <-ready:
					default:
						close(ready)
					}
				}
			},
		})
	}()
	<-ready
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // new connections: either worker
	for range 4 {
		resp, err := client.Post("http://"+ln.Addr().String()+"/login", "text/plain", nil)
		if err != nil {
			log.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("X-Ratelimit-Remaining"))
	}
	stop() // as TERM would: the workers drain, Run returns
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// 200 2
	// 200 1
	// 200 0
	// 429 0
}

// newEngine builds a worker's engine, once in each worker process.
func newEngine(w *prefork.Worker) (prefork.Engine, error) {
	var conf struct {
		LoginLimit int64 `json:"login_limit"`
	}
	if err := json.Unmarshal(w.Settings.Payload, &conf); err != nil {
		return nil, err
	}
	c, err := core.New(w.Region, core.Options{
		RateLimits: []core.RateLimit{{
			Rule:  bucket.Rule{Name: "login", Limit: conf.LoginLimit, Window: time.Minute},
			Route: route.MustCompile("/login", nil),
			By:    clientip.MustParseBy("ip"),
		}},
		OnResponse: w.Responded,
		Logger:     w.Logger,
	})
	if err != nil {
		return nil, err
	}
	w.Defer(c.Close)
	app := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, "welcome") })
	return nethttp.NewServer(nethttp.ServerOptions{Core: c, Handler: app, Logger: w.Logger})
}

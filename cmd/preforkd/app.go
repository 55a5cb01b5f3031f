package main

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/prefork"
)

const demoUpstream = "builtin:demo"

// appHandler builds the application a worker serves: the reverse proxy to
// server.upstream, or the demo application.
func appHandler(w *prefork.Worker) (http.Handler, error) {
	u, err := upstreamURL(w.Config.Server.Upstream)
	if err != nil {
		return nil, err
	}
	if u == nil {
		return demo(w.Index), nil
	}
	return newProxy(u, w), nil
}

// demo answers every request with 200 and a small JSON body naming the
// method, path and worker, so that preforkd runs with nothing else.
func demo(worker int) http.Handler {
	pid := os.Getpid()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(struct {
			Method string `json:"method"`
			Path   string `json:"path"`
			Worker int    `json:"worker"`
			PID    int    `json:"pid"`
		}{r.Method, r.URL.Path, worker, pid})
	})
}

// newProxy forwards to u. The X-Forwarded-For chain the client sent is
// kept and the peer appended (as nginx's $proxy_add_x_forwarded_for does);
// the rate-limit layer decided already which hops to believe. Upstream
// failures are counted and logged by the worker's decision core, as every
// engine's are.
func newProxy(u *url.URL, wk *prefork.Worker) http.Handler {
	failed := func(kind core.UpstreamError, err error) {
		if c := wk.Core(); c != nil {
			c.UpstreamFailed(kind, u.Host, err)
		}
	}
	transport := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          512,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // an upstream may take as long as it needs
		ForceAttemptHTTP2:     false,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host
			if xff := pr.In.Header.Values("X-Forwarded-For"); len(xff) > 0 {
				pr.Out.Header["X-Forwarded-For"] = xff
			}
			pr.SetXForwarded()
		},
		Transport: brokenBodies{transport, failed},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away: nobody to answer, nothing the upstream did
			}
			var op *net.OpError
			var ne net.Error
			switch {
			case errors.As(err, &op) && op.Op == "dial":
				failed(core.UpstreamConnect, err)
			case errors.As(err, &ne) && ne.Timeout():
				failed(core.UpstreamTimeout, err)
				writeProblem(w, http.StatusGatewayTimeout, "Gateway Timeout", "the upstream application did not answer in time")
				return
			default:
				failed(core.UpstreamResponse, err)
			}
			writeProblem(w, http.StatusBadGateway, "Bad Gateway", "the upstream application did not answer")
		},
		ErrorLog: slog.NewLogLogger(wk.Logger.Handler(), slog.LevelDebug),
	}
}

// brokenBodies reports upstream responses whose body broke off after
// their header went to the client: ReverseProxy only aborts those.
type brokenBodies struct {
	http.RoundTripper
	failed func(core.UpstreamError, error)
}

func (b brokenBodies) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.RoundTripper.RoundTrip(r)
	if err == nil && resp.Body != nil {
		resp.Body = &watchedBody{ReadCloser: resp.Body, req: r, failed: b.failed}
	}
	return resp, err
}

type watchedBody struct {
	io.ReadCloser
	req    *http.Request
	failed func(core.UpstreamError, error)
	done   bool
}

func (w *watchedBody) Read(p []byte) (int, error) {
	n, err := w.ReadCloser.Read(p)
	if err != nil && err != io.EOF && !w.done && w.req.Context().Err() == nil {
		w.done = true
		w.failed(core.UpstreamBroken, err)
	}
	return n, err
}

// writeProblem writes an RFC 9457 problem+json answer.
func writeProblem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail})
}

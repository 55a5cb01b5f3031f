package core

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// The health check on the data port (Options.HealthPath): answered by the
// core before any stage, so that a load balancer or a kubelet that can
// reach only the data port learns whether this instance serves. It is
// never counted by a rule or in the statistics (it is logged), never
// forwarded, and says 503 from the moment the worker was told it is about
// to stop (Drain).

// CheckHealthPath reports whether p may be Options.HealthPath: "" (off)
// or an absolute path without a query.
func CheckHealthPath(p string) error {
	if p == "" {
		return nil
	}
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?# \t") {
		return fmt.Errorf("core: HealthPath %q: want an absolute path (\"/healthz\"), without query", p)
	}
	return nil
}

// Drain makes the health check answer 503 from now on; requests are
// served as before. A worker calls it when it is about to stop serving
// (prefork.Worker.OnDrain).
func (c *Core) Drain() { c.drained.Store(true) }

var (
	healthOK       = []byte("ok\n")
	healthDraining = []byte("draining\n")
	valTextPlain   = []byte("text/plain; charset=utf-8")
)

// health answers a GET or HEAD of the health path: 200 "ok", or 503
// "draining" once Drain was called.
func (ex *Exchange) health() (Verdict, bool) {
	status, body := http.StatusOK, healthOK
	if ex.c.drained.Load() {
		status, body = http.StatusServiceUnavailable, healthDraining
	}
	ex.fields = append(ex.fields, Field{fieldContentType, valTextPlain}, Field{fieldCacheControl, valNoStore})
	n := len(body)
	ex.addField(fieldLength, func(b []byte) []byte { return strconv.AppendInt(b, int64(n), 10) })
	if ex.req.Method() == http.MethodHead {
		body = nil
	}
	ex.resp = Response{Status: status, Fields: ex.fields, Body: body}
	return Respond, true
}

// isHealthCheck reports whether the request is a GET or HEAD of the
// health path.
func (ex *Exchange) isHealthCheck() bool {
	hp := ex.c.healthPath
	if hp == "" || ex.req.Path() != hp {
		return false
	}
	m := ex.req.Method()
	return m == http.MethodGet || m == http.MethodHead
}

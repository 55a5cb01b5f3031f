package core

import (
	"context"
	"log/slog"

	"github.com/preforkd/preforkd/metrics"
)

// UpstreamError is a way the upstream failed a request.
type UpstreamError int

// The kinds an engine reports (UpstreamFailed).
const (
	// UpstreamConnect: refused, unreachable, or no connection within the
	// connect timeout. The engine answers 502.
	UpstreamConnect UpstreamError = metrics.UpstreamConnect
	// UpstreamTimeout: no response header within the upstream timeout. 504.
	UpstreamTimeout UpstreamError = metrics.UpstreamTimeout
	// UpstreamResponse: an invalid response, or the connection closed
	// before one: 502. Also bytes the upstream sent past a response, or
	// unasked on an idle connection (engine.ErrRespStray), which close
	// the connection: the client keeps the whole response it got.
	UpstreamResponse UpstreamError = metrics.UpstreamResponse
	// UpstreamBroken: the response broke off after its header was sent on
	// to the client.
	UpstreamBroken UpstreamError = metrics.UpstreamBroken
)

var upstreamErrorNames = [...]string{"connect", "timeout", "response", "broken"}

// upstreamErrorLines are the log messages of the kinds.
var upstreamErrorLines = [...]string{"upstream unreachable", "upstream timed out", "upstream failed", "upstream response cut off"}

func (k UpstreamError) String() string {
	if k < 0 || int(k) >= len(upstreamErrorNames) {
		return "unknown"
	}
	return upstreamErrorNames[k]
}

// UpstreamFailed counts a request the upstream failed, by kind, and logs
// it at warn, at most one line per kind a second across all workers (the
// line says how many it stands for). Every engine calls it, for the same
// failures: upstream is the upstream's address, err what went wrong.
func (c *Core) UpstreamFailed(kind UpstreamError, upstream string, err error) {
	c.upstreamFailed(kind, upstream, err, nil)
}

// upstreamFailed is UpstreamFailed for the request whose id is rid (nil:
// none known), which the line names.
func (c *Core) upstreamFailed(kind UpstreamError, upstream string, err error, rid []byte) {
	if kind < 0 || int(kind) >= len(c.upstreamLogs) {
		kind = UpstreamResponse
	}
	c.row.Add(metrics.UpstreamErrors, int(kind), 1)
	suppressed, ok := c.upstreamLogs[kind].allow(c.now())
	if !ok {
		return
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	attrs := []slog.Attr{
		slog.String("kind", kind.String()),
		slog.String("upstream", upstream),
		slog.String("err", msg),
	}
	if rid != nil {
		attrs = append(attrs, slog.String("request_id", string(rid)))
	}
	attrs = append(attrs, slog.Uint64("suppressed", suppressed))
	c.logger().LogAttrs(context.Background(), slog.LevelWarn, upstreamErrorLines[kind], attrs...)
}

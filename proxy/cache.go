package proxy

import (
	"context"
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/core"
)

// The engine's part of the response cache (see package core's "What an
// engine does for the response cache"): a fill is forwarded without
// conditional fields (request.unconditional), its response recorded with
// every field (headerFields), a failed one replaced by a stale response
// (Fallback, in relay, upstreamFailed and runApp), and a stale response
// refreshed in the background (refresh).

// isUnconditional reports whether a request field is one a cache fill
// leaves out.
func isUnconditional(name []byte) bool {
	for _, n := range core.UnconditionalFields {
		if len(n) == len(name) && equalFold(name, n) {
			return true
		}
	}
	return false
}

// headerFields copies every field line of h, for core.Recorded.Header:
// the recording outlives the header it comes from.
func headerFields(h *fasthttp.ResponseHeader) []core.Field {
	var out []core.Field
	for k, v := range h.All() {
		out = append(out, core.Field{Name: string(k), Value: append([]byte(nil), v...)})
	}
	return out
}

// refresh sends a copy of r upstream in the background, gives the
// response to ex and releases it: the cache's stale-while-revalidate
// refresh (core.Exchange.Refresh). The copy is made here, before r goes
// back to its pool; a request with a body is not refreshed (its lock is
// given up), nor is one served by Options.App without an upstream.
func (s *Server) refresh(r *request, ex *core.Exchange) {
	if s.up == nil || !r.body.done || len(r.body.bytes()) > 0 || s.draining.Load() {
		ex.Release()
		return
	}
	r.unconditional, r.forward = true, ex.ForwardPath()
	head := r.appendHead(nil)
	s.background.Add(1)
	go s.fetchInBackground(head, ex)
}

// fetchInBackground sends head upstream and records the response for ex.
func (s *Server) fetchInBackground(head []byte, ex *core.Exchange) {
	defer s.background.Done()
	defer ex.Release()
	var h fasthttp.ResponseHeader
	var uc *upConn
	for attempt := 0; ; attempt++ {
		var err error
		uc, err = s.up.get(context.Background())
		if err == nil {
			if _, err = uc.Write(head); err == nil {
				err = readResponseHead(uc.br, &h)
			}
		}
		if err == nil {
			break
		}
		if uc != nil {
			uc.Conn.Close()
			if attempt == 0 && uc.reused && staleConn(err) {
				continue // the upstream had closed the idle connection
			}
		}
		s.warn(warnUpstreamDown, "upstream failed a cache refresh", "upstream", s.up.t.addr, "err", err)
		return
	}
	status := h.StatusCode()
	max, _ := ex.Record()
	rec := newRecorder(max, status, &h)
	ub := &upBody{s: s, uc: uc, reusable: !h.ConnectionClose(), rec: rec}
	switch length := h.ContentLength(); {
	case status < 200 || status == fasthttp.StatusNoContent || status == fasthttp.StatusNotModified:
		ub.eof = true
	case length >= 0:
		ub.left = int64(length)
		ub.eof = length == 0
	case length == -1:
		ub.chunked = true
	default:
		ub.untilClose, ub.reusable = true, false
	}
	bp := tunnelBufPool.Get().(*[]byte)
	for !ub.eof && ub.err == nil {
		_, _ = ub.Read(*bp)
	}
	tunnelBufPool.Put(bp)
	var failed error
	if ub.eof {
		failed = s.upDone(uc, ub.reusable)
	} else {
		uc.Conn.Close()
		failed = errors.New("incomplete")
	}
	rec.complete(ex, failed)
}

// waitBackground waits for the background refreshes, or for ctx.
func (s *Server) waitBackground(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.background.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

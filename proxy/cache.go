package proxy

import (
	"context"
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/upconn"
)

// The engine's part of a background refresh (core.Exchange.Finish): a
// stale response the cache served under stale-while-revalidate is fetched
// again with a copy of its request, its response told to the core.

// refresh sends a copy of r upstream in the background and tells ex its
// response. The copy is made here, before r goes back to its pool; a
// request with a body is not refreshed (its lock is given up), nor is one
// served by Options.App without an upstream, nor one that arrives while
// the server drains.
func (s *Server) refresh(r *request, ex *core.Exchange) {
	if s.up == nil || !r.body.done || len(r.body.bytes()) > 0 || s.draining.Load() {
		ex.Finish(core.ErrNoRefresh)
		return
	}
	r.fwd = ex.Forward()
	head := r.appendHead(nil)
	s.background.Add(1)
	go s.fetchInBackground(head, ex)
}

// fetchInBackground sends head upstream and tells ex the response.
func (s *Server) fetchInBackground(head []byte, ex *core.Exchange) {
	defer s.background.Done()
	var h fasthttp.ResponseHeader
	var uc *upconn.Conn
	for attempt := 0; ; attempt++ {
		var err error
		uc, err = s.up.Get(context.Background())
		if err == nil {
			if _, err = uc.Write(head); err == nil {
				err = readResponseHead(uc, &h, nil) // nobody to tell of interim responses
			}
		}
		if err == nil {
			break
		}
		if uc != nil {
			uc.Conn.Close()
			if attempt == 0 && uc.Reused && !uc.Got() && staleConn(err) {
				continue // the upstream had closed the idle connection
			}
		}
		s.warn(warnUpstreamDown, "upstream failed a cache refresh", "upstream", s.up.Target.Addr, "err", err)
		ex.Finish(err)
		return
	}
	status := h.StatusCode()
	ex.Head(status, (*upHeader)(&h))
	ub := &upBody{s: s, uc: uc, reusable: !h.ConnectionClose(), ex: ex}
	s.up.Relaying(uc)
	switch length := h.ContentLength(); {
	case engine.Bodyless(status, false):
		ub.eof = true
	case length >= 0:
		ub.left = int64(length)
		ub.eof = length == 0
	case length == -1:
		ub.chunked = true
		ub.chunks.Reset(uc.Buf)
	default:
		ub.untilClose, ub.reusable = true, false
	}
	ub.drain()
	ub.end()
	ex.Finish(ub.failed)
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

// errAppStream is an application's streamed body that broke off.
var errAppStream = errors.New("proxy: the application's body stream failed")

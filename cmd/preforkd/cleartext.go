package main

import (
	"context"
	"errors"
	"net"
	"strconv"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/prefork"
)

// cleartextListener names tls.cleartext_listen's socket among the
// supervisor's listeners (prefork.Options.ExtraListen): the name a
// socket unit's FileDescriptorName= gives it under socket activation.
const cleartextListener = "cleartext"

// extraListen is the supervisor's listeners beside server.listen: the
// cleartext port beside a TLS one.
func extraListen(cfg config.Config) []prefork.NamedListen {
	if !cfg.TLS.Enabled() || cfg.TLS.CleartextListen == "" {
		return nil
	}
	return []prefork.NamedListen{{Name: cleartextListener, Addr: cfg.TLS.CleartextListen}}
}

// withCleartext adds to the TLS engine tls the cleartext port's: the
// daemon's cleartext engine (server.engine's) over a view of the same
// core (core.Core.Cleartext: the same counts, stored responses and
// statistics), redirecting to tls.redirect_port or the TLS listener's
// port, or serving, as tls.cleartext says.
func withCleartext(w *prefork.Worker, cfg config.Config, c *core.Core, tls prefork.Engine) (prefork.Engine, error) {
	ln := w.Listener(cleartextListener)
	if ln == nil {
		// The supervisor started without it: a restart opens it.
		return nil, errors.New("tls.cleartext_listen: the supervisor passed no cleartext listener (it was started without one): restart to open it")
	}
	port := 443
	if p := cfg.TLS.RedirectPort; p > 0 {
		port = p
	} else if main := w.Listener(""); main != nil {
		if _, p, err := net.SplitHostPort(main.Addr().String()); err == nil {
			port, _ = strconv.Atoi(p)
		}
	}
	view := c.Cleartext(core.CleartextOptions{Redirect: cfg.WithDefaults().TLS.Cleartext == config.CleartextRedirect, TLSPort: port})
	plain, err := plainEngine(w, cfg, view)
	if err != nil {
		return nil, err
	}
	return &twoEngines{main: tls, extra: plain, extraLn: ln}, nil
}

// twoEngines serves the main listener with main and another with extra,
// and drains both by the same rule.
type twoEngines struct {
	main, extra prefork.Engine
	extraLn     net.Listener
}

// Serve serves both listeners until Shutdown. It returns the first
// error of either (the worker then stops: it cannot go on serving one of
// its ports), or nil once both were shut down.
func (e *twoEngines) Serve(ln net.Listener) error {
	errs := make(chan error, 2)
	go func() { errs <- e.extra.Serve(e.extraLn) }()
	go func() { errs <- e.main.Serve(ln) }()
	for range 2 {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

// Shutdown drains both at once; it returns once neither has a
// connection left, or with ctx's error.
func (e *twoEngines) Shutdown(ctx context.Context) error {
	errs := make(chan error, 1)
	go func() { errs <- e.extra.Shutdown(ctx) }()
	err := e.main.Shutdown(ctx)
	return errors.Join(err, <-errs)
}

package core

import (
	"context"
	"fmt"
	"log/slog"
	"net/textproto"
	"strings"

	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/route"
)

// The application's reset (Options.ResetHeader): a response that carries
// the field, with rule names as its value, resets those rules for the
// request's key, as Control.ResetKey would: the application says "this
// login succeeded". The field is for preforkd alone: the engines drop it
// from every response of the application (Forward.Hide) and from every
// request they forward (Forward.Drop), so that neither a client nor an
// application that echoes request fields can trigger it; it is never
// recorded for a replay or the cache.

// resetFields are the response fields a reset header must not be: the
// ones that frame or route a response, which an engine cannot drop.
var resetFields = []string{"Connection", "Content-Length", "Content-Type", "Content-Encoding",
	"Keep-Alive", "Trailer", "Transfer-Encoding", "Upgrade"}

// CheckResetHeader reports what is wrong with name as Options.ResetHeader:
// not a field name, or one that frames responses.
func CheckResetHeader(name string) error {
	if name == "" {
		return nil
	}
	if !route.IsToken(name) {
		return fmt.Errorf("core: reset header %q is not a valid header name", name)
	}
	name = textproto.CanonicalMIMEHeaderKey(name)
	for _, f := range resetFields {
		if name == f {
			return fmt.Errorf("core: reset header %q frames responses: choose a name of its own, such as Preforkd-Reset", name)
		}
	}
	return nil
}

// compileReset checks Options.ResetHeader and keeps what the engines are
// told about it.
func (c *Core) compileReset(name string) error {
	if err := CheckResetHeader(name); err != nil || name == "" {
		return err
	}
	name = textproto.CanonicalMIMEHeaderKey(name)
	c.reset = name
	c.resetHide = []string{name}
	c.resetDropFill = append(append([]string(nil), unconditionalFields...), name)
	c.resetLog = lineGate{g: metrics.ResetGate(c.region), total: func() uint64 { return 0 }}
	return nil
}

// forwardReset adds the reset header to what f drops from the request and
// hides from the response.
func (ex *Exchange) forwardReset(f *Forward) {
	c := ex.c
	if c.reset == "" {
		return
	}
	if len(f.Hide) == 0 {
		f.Hide = c.resetHide
	} else {
		// A cache block's own targeted field too: rare, and a small
		// allocation.
		f.Hide = append(f.Hide[:len(f.Hide):len(f.Hide)], c.reset)
	}
	switch {
	case len(f.Drop) == 0:
		f.Drop = c.resetHide
	case &f.Drop[0] == &unconditionalFields[0]:
		f.Drop = c.resetDropFill
	default:
		f.Drop = append(f.Drop[:len(f.Drop):len(f.Drop)], c.reset)
	}
}

// isResetField reports whether name is the reset header.
func (c *Core) isResetField(name []byte) bool { return c.reset != "" && asciiEqualFold(name, c.reset) }

// isResetName is isResetField for a name held as a string.
func (c *Core) isResetName(name string) bool { return c.reset != "" && asciiEqualFold(name, c.reset) }

// asciiEqualFold reports whether a equals b in ASCII, ignoring case (no
// Unicode folding: a field name is a token).
func asciiEqualFold[T string | []byte](a T, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(b); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// applicationReset resets the rules the response's reset header names
// for the request's key. A name of no rule is logged (at most one line a
// second across the workers) and skipped; so is a key the request cannot
// give (a key header sent twice). A background refresh has no request to
// key, and resets nothing.
func (ex *Exchange) applicationReset(h Header) {
	c := ex.c
	if c.reset == "" || h == nil || ex.refreshing {
		return
	}
	var names []string
	h.Each(func(name, value []byte) {
		if c.isResetField(name) {
			for n := range strings.SplitSeq(string(value), ",") {
				if n = strings.TrimSpace(n); n != "" {
					names = append(names, n)
				}
			}
		}
	})
	for _, n := range names {
		ru := c.byName[n]
		if ru == nil {
			ex.logReset("reset header names no rule: ignored", slog.String("rule", n))
			continue
		}
		id, value, err := ex.keyOf(ru)
		if err != nil {
			continue // the request was refused for it already
		}
		if err := ex.variantOf(ru, value).reset(id, c.now(), true); err != nil {
			ex.logReset("reset header: rule not reset", slog.String("rule", n), slog.String("err", err.Error()))
		}
	}
}

// logReset writes a line about the application's reset, one a second
// across the workers.
func (ex *Exchange) logReset(msg string, attrs ...slog.Attr) {
	if _, ok := ex.c.resetLog.allow(ex.c.now()); !ok {
		return
	}
	attrs = append(attrs, slog.String("header", ex.c.reset), slog.String("path", ex.match))
	ex.c.logger().LogAttrs(context.Background(), slog.LevelWarn, msg, attrs...)
}

package core_test

import (
	"bytes"
	"errors"
	"net/netip"
	"net/textproto"
	"strings"

	"github.com/preforkd/preforkd/core"
)

// fakeReq is a core.Request built by hand: the tests of this package
// decide without any HTTP engine.
type fakeReq struct {
	method, path, query string
	peer                netip.Addr
	header              map[string][]string
	body                []byte
	// recycled: the engine reused the request's memory, as it may once
	// Finish asked for a background refresh; reading it then panics.
	recycled bool
}

// read panics when the core reads a recycled request: an event loop
// would hand it another request's bytes, or a slice of none.
func (r *fakeReq) read() {
	if r.recycled {
		panic("core read the request view during a background refresh")
	}
}

func newReq(method, target, peer string, kv ...string) *fakeReq {
	path, query, _ := strings.Cut(target, "?")
	r := &fakeReq{method: method, path: path, query: query, peer: netip.MustParseAddr(peer), header: map[string][]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		k := textproto.CanonicalMIMEHeaderKey(kv[i])
		r.header[k] = append(r.header[k], kv[i+1])
	}
	return r
}

func (r *fakeReq) Method() string   { r.read(); return r.method }
func (r *fakeReq) Path() string     { r.read(); return r.path }
func (r *fakeReq) Query() string    { r.read(); return r.query }
func (r *fakeReq) Peer() netip.Addr { r.read(); return r.peer }
func (r *fakeReq) Header(name string) (string, int) {
	r.read()
	vs := r.header[name]
	if len(vs) == 0 {
		return "", 0
	}
	return vs[0], len(vs)
}
func (r *fakeReq) HeaderLines(name string, dst []string) []string {
	r.read()
	return append(dst, r.header[name]...)
}
func (r *fakeReq) Body(max int64) ([]byte, error) {
	r.read()
	if int64(len(r.body)) > max {
		return nil, core.ErrBodyTooLarge
	}
	return r.body, nil
}
func (r *fakeReq) HasBody() bool { r.read(); return len(r.body) > 0 }
func (r *fakeReq) Gone() bool    { r.read(); return false }

// decide runs one request through c and reports its status: the
// application's 200 for Pass.
func decide(c *core.Core, r *fakeReq) int {
	return serve(c, r, func(core.Forward) fakeResp { return fakeResp{status: 200} }).status
}

// fakeResp is the application's response in the fake engine.
type fakeResp struct {
	status int
	header fakeHeader
	body   []byte
	cut    bool // the body broke off
	none   bool // no response at all (the upstream was unreachable)
}

// fakeHeader is a response header as the fake engine holds it.
type fakeHeader []core.Field

func (h fakeHeader) Each(f func(name, value []byte)) {
	for _, fl := range h {
		f([]byte(fl.Name), fl.Value)
	}
}

// answer is what the fake engine's client got.
type answer struct {
	status int
	header fakeHeader
	body   []byte
}

// get is the value of the first field called name.
func (a answer) get(name string) string {
	for _, f := range a.header {
		if strings.EqualFold(f.Name, name) {
			return string(f.Value)
		}
	}
	return ""
}

func answerOf(r *core.Response) answer {
	a := answer{status: r.Status, body: bytes.Clone(r.Body)}
	for _, f := range r.Fields {
		a.header = append(a.header, core.Field{Name: f.Name, Value: bytes.Clone(f.Value)})
	}
	return a
}

var errCut = errors.New("fake: the body broke off")

// serve runs one request through c as every engine does (the protocol in
// core's run.go), with app as the application; a background refresh the
// core asks for is made at once, with the same app, the request's memory
// recycled meanwhile (fakeReq.read). It reports what the client got. It decides as an event loop does: first without waiting
// (NoWait), then, if the core stopped where it would wait, on; an engine
// that decides in one call is what the engines' own tests run.
func serve(c *core.Core, r *fakeReq, app func(core.Forward) fakeResp) answer {
	ex := c.Begin(r)
	var a answer
	var err error
	if decideNow(ex) == core.Respond {
		a = answerOf(ex.Response())
	} else {
		a, err = forward(ex, app)
	}
	if ex.Finish(err) {
		r.recycled = true
		_, err = forward(ex, app)
		ex.Finish(err)
		r.recycled = false
	}
	return a
}

// decideNow decides as an event loop: without waiting, and where the
// core would wait, on with waiting.
func decideNow(ex *core.Exchange) core.Verdict {
	ex.NoWait(true)
	v := ex.Decide()
	if v == core.Wait {
		ex.NoWait(false)
		v = ex.Decide()
	}
	return v
}

// forward gives the application the request that passed, and the core
// its response.
func forward(ex *core.Exchange, app func(core.Forward) fakeResp) (answer, error) {
	fwd := ex.Forward()
	ex.Sending()
	resp := app(fwd)
	if resp.none {
		return answerOf(ex.Failed(core.UpstreamConnect, "fake", errors.New("fake: down"))), nil
	}
	if r := ex.Head(resp.status, resp.header); r != nil {
		return answerOf(r), nil
	}
	// The core's fields alias the exchange, which Finish reuses: copied,
	// as an engine writes them before.
	fwd = ex.Forward()
	a := answer{status: resp.status, body: resp.body}
	for _, f := range resp.header {
		if !fwd.Hidden(f.Name) {
			a.header = append(a.header, f)
		}
	}
	for _, f := range ex.Fields() {
		a.header = append(a.header, core.Field{Name: f.Name, Value: bytes.Clone(f.Value)})
	}
	ex.Body(resp.body)
	if resp.cut {
		return a, errCut
	}
	return a, nil
}

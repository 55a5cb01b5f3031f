package core_test

import (
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

func (r *fakeReq) Method() string   { return r.method }
func (r *fakeReq) Path() string     { return r.path }
func (r *fakeReq) Query() string    { return r.query }
func (r *fakeReq) Peer() netip.Addr { return r.peer }
func (r *fakeReq) Header(name string) (string, int) {
	vs := r.header[name]
	if len(vs) == 0 {
		return "", 0
	}
	return vs[0], len(vs)
}
func (r *fakeReq) HeaderLines(name string, dst []string) []string {
	return append(dst, r.header[name]...)
}
func (r *fakeReq) Body(max int64) ([]byte, error) {
	if int64(len(r.body)) > max {
		return nil, core.ErrBodyTooLarge
	}
	return r.body, nil
}
func (r *fakeReq) Gone() bool { return false }

// decide runs one request through c and reports its status: the
// application's 200 for Pass.
func decide(c *core.Core, r *fakeReq) int {
	ex := c.Begin(r)
	defer ex.Release()
	if ex.Decide() == core.Pass {
		return 200
	}
	return ex.Response().Status
}

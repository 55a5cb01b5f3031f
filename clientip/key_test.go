package clientip

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

func TestParseBy(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"ip", "ip"},
		{"global", "global"},
		{"header:X-Api-Key", "header:X-Api-Key|ip"},
		{"header:x-api-key", "header:X-Api-Key|ip"},
		{"header:X-Api-Key|ip", "header:X-Api-Key|ip"},
		{"header:Authorization|header:X-Api-Key|ip", "header:Authorization|header:X-Api-Key|ip"},
		{"header:Authorization|header:X-Api-Key", "header:Authorization|header:X-Api-Key|ip"},
		{"header:X_Odd~Token!", "header:X_odd~token!|ip"},
		{"cookie:session|ip", "cookie:session|ip"},
		{"cookie:Session", "cookie:Session|ip"}, // cookie names are case-sensitive
		{"query:api_key", "query:api_key|ip"},
		{"path", "path|ip"},
		{"header:X-Api-Key|cookie:sid|query:key|path|ip", "header:X-Api-Key|cookie:sid|query:key|path|ip"},
		{"cookie:a|header:a", "cookie:a|header:A|ip"},
	}
	for _, tt := range tests {
		b, err := ParseBy(tt.in)
		if err != nil {
			t.Errorf("ParseBy(%q): %v", tt.in, err)
			continue
		}
		if got := b.String(); got != tt.want {
			t.Errorf("ParseBy(%q).String() = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got := (By{}).String(); got != "ip" {
		t.Errorf("zero By is %q, want ip", got)
	}
}

func TestParseByErrors(t *testing.T) {
	for _, in := range []string{
		"",
		"header:",
		"header:Bad Name",
		"header:Bad:Name",
		"global|ip",
		"ip|global",
		"header:X|global",
		"cookie:",
		"query:",
		"cookie:a b",
		"query:k=v",
		"path:x",
		"Cookie:x",
		"path|header:X",
		"path|path",
		"cookie:a|cookie:a",
		"IP",
		"Header:X",
		"header:X|",
		"|ip",
		"header:X||ip",
		"ip|header:X",
		"ip|ip",
		"header:X|header:x",
		"header:X | ip",
	} {
		b, err := ParseBy(in)
		if err == nil {
			t.Errorf("ParseBy(%q) = %v, want an error", in, b)
			continue
		}
		if !errors.Is(err, ErrBy) || !strings.HasPrefix(err.Error(), "clientip: ") {
			t.Errorf("ParseBy(%q) error %q does not wrap ErrBy", in, err)
		}
	}
}

func TestAppendKey(t *testing.T) {
	long := strings.Repeat("k", 257)
	tests := []struct {
		by     string
		remote string
		h      http.Header
		want   string
	}{
		{"ip", "203.0.113.7:1", nil, "ip:203.0.113.7"},
		{"ip", "[2001:db8:1:2:3:4:5:6]:1", nil, "ip:2001:db8:1:2::"},
		{"ip", proxy, hdr(xff, "198.51.100.1"), "ip:198.51.100.1"},
		{"ip", "@", nil, "ip:"},
		{"global", "203.0.113.7:1", hdr("X-Api-Key", "k1"), "g"},
		{"header:X-Api-Key", "203.0.113.7:1", hdr("X-Api-Key", "k1"), "h:X-Api-Key:k1"},
		{"header:x-api-key|ip", "203.0.113.7:1", hdr("X-Api-Key", "k1", "X-Api-Key", "k2"), "h:X-Api-Key:k1"},
		{"header:X-Api-Key", "203.0.113.7:1", nil, "ip:203.0.113.7"},
		{"header:X-Api-Key|ip", "203.0.113.7:1", hdr("X-Api-Key", ""), "ip:203.0.113.7"},
		{"header:X-Api-Key", "203.0.113.7:1", hdr("X-Api-Key", "a\x01b"), "ip:203.0.113.7"},
		{"header:X-Api-Key", "203.0.113.7:1", hdr("X-Api-Key", "a\tb"), "ip:203.0.113.7"},
		{"header:X-Api-Key", "203.0.113.7:1", hdr("X-Api-Key", "a\x7fb"), "ip:203.0.113.7"},
		{"header:X-Api-Key", "203.0.113.7:1", hdr("X-Api-Key", long), "H:X-Api-Key:" + digest(long)},
		{"header:X-Api-Key", "203.0.113.7:1", hdr("X-Api-Key", long[:256]), "h:X-Api-Key:" + long[:256]},
		{"header:X-Api-Key", "203.0.113.7:1", hdr("X-Api-Key", "ключ"), "h:X-Api-Key:ключ"},
		{"header:Authorization|header:X-Api-Key|ip", "203.0.113.7:1", hdr("X-Api-Key", "k1"), "h:X-Api-Key:k1"},
		{"header:Authorization|header:X-Api-Key|ip", "203.0.113.7:1", hdr("X-Api-Key", "k1", "Authorization", "Bearer t"), "h:Authorization:Bearer t"},
		{"header:Authorization|header:X-Api-Key|ip", "203.0.113.7:1", hdr("Authorization", long, "X-Api-Key", "k1"), "H:Authorization:" + digest(long)},
		{"header:Authorization|header:X-Api-Key|ip", "203.0.113.7:1", hdr("Authorization", long), "H:Authorization:" + digest(long)},
	}
	for _, tt := range tests {
		b, err := ParseBy(tt.by)
		if err != nil {
			t.Fatal(err)
		}
		dst := []byte("prefix/")
		got := b.AppendKey(dst, &testResolver, tt.remote, tt.h)
		if string(got) != "prefix/"+tt.want {
			t.Errorf("%s AppendKey(%q, %v) = %q, want %q", tt.by, tt.remote, tt.h, got, "prefix/"+tt.want)
		}
	}
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// Long values are hashed, never dropped: two long tokens from one address
// get two keys (a JWT in Authorization fell back to the shared IP key once),
// one long token always the same key, and a short value that spells a
// digest never meets the long value it is the digest of.
func TestAppendKeyLongValues(t *testing.T) {
	b, err := ParseBy("header:Authorization|ip")
	if err != nil {
		t.Fatal(err)
	}
	tokA := "Bearer " + strings.Repeat("a", 900)
	tokB := "Bearer " + strings.Repeat("a", 899) + "b"
	key := func(v string) string {
		return string(b.AppendKey(nil, nil, "203.0.113.7:1", hdr("Authorization", v)))
	}
	ka, kb, ip := key(tokA), key(tokB), string(b.AppendKey(nil, nil, "203.0.113.7:1", nil))
	if ka == kb || ka == ip || kb == ip {
		t.Errorf("long tokens share a key: %q, %q, ip %q", ka, kb, ip)
	}
	if key(tokA) != ka {
		t.Errorf("one long token, two keys")
	}
	if len(ka) > len("H:Authorization:")+43 {
		t.Errorf("hashed key %q is longer than a digest", ka)
	}
	if spelled := key(digest(tokA)); spelled == ka {
		t.Errorf("a short value spelling the digest collides with the long value: %q", spelled)
	}
	h, buf := hdr("Authorization", tokA), make([]byte, 0, 128)
	if n := testing.AllocsPerRun(100, func() { b.AppendKey(buf, nil, "203.0.113.7:1", h) }); n != 0 {
		t.Errorf("AppendKey of a long value: %v allocations", n)
	}
}

// Chain elements never collide: a header value that spells an address, or
// another header's key, stays apart from it.
func TestAppendKeyNamespaces(t *testing.T) {
	b, err := ParseBy("header:A|header:B|ip")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, h := range []http.Header{
		nil,
		hdr("A", "203.0.113.7"),
		hdr("B", "203.0.113.7"),
		hdr("A", "B:203.0.113.7"),
		hdr("B", "A:203.0.113.7"),
		hdr("A", "g"),
	} {
		k := string(b.AppendKey(nil, nil, "203.0.113.7:1", h))
		if prev, dup := keys[k]; dup {
			t.Errorf("key %q from both %s and %v", k, prev, h)
		}
		keys[k] = h.Get("A") + "|" + h.Get("B")
	}
	if g := string(By{global: true}.AppendKey(nil, nil, "203.0.113.7:1", nil)); keys[g] != "" || len(keys) != 6 {
		t.Errorf("global key %q collides", g)
	}
}

func TestAppendKeyDoesNotAllocate(t *testing.T) {
	h := hdr(xff, "2001:db8:1:2:3:4:5:6, 10.0.0.5", "X-Api-Key", "k1")
	for _, by := range []string{"ip", "global", "header:X-Api-Key", "header:Authorization|ip"} {
		b, err := ParseBy(by)
		if err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, 0, 64)
		allocs := testing.AllocsPerRun(100, func() {
			dst = b.AppendKey(dst[:0], &testResolver, proxy, h)
		})
		if allocs != 0 {
			t.Errorf("%s: AppendKey allocates %v times per call, want 0", by, allocs)
		}
	}
}

func BenchmarkKey(b *testing.B) {
	cases := []struct {
		name, by, remote string
		h                http.Header
	}{
		{"direct", "ip", "203.0.113.7:1234", hdr(xff, "198.51.100.1")},
		{"direct-v6", "ip", "[2001:db8:1:2:3:4:5:6]:1234", nil},
		{"xff-3-hops", "ip", proxy, hdr(xff, "198.51.100.1, 198.51.100.2, 10.0.0.5")},
		{"forwarded-quoted-v6", "ip", proxy, hdr(fwd, `for="[2001:db8::1]:4711";proto=https, for=10.0.0.5`)},
		{"both-headers", "ip", proxy, hdr(xff, "198.51.100.2, 10.0.0.5", fwd, "for=198.51.100.2, for=10.0.0.5")},
		{"header", "header:X-Api-Key|ip", "203.0.113.7:1234", hdr("X-Api-Key", "0123456789abcdef")},
		{"header-absent", "header:X-Api-Key|ip", proxy, hdr(xff, "198.51.100.1")},
	}
	for _, c := range cases {
		by, err := ParseBy(c.by)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			dst := make([]byte, 0, 64)
			for b.Loop() {
				dst = by.AppendKey(dst[:0], &testResolver, c.remote, c.h)
			}
		})
	}
	b.Run("xff-3-hops-parallel", func(b *testing.B) {
		h := hdr(xff, "198.51.100.1, 198.51.100.2, 10.0.0.5")
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			dst := make([]byte, 0, 64)
			for pb.Next() {
				dst = By{}.AppendKey(dst[:0], &testResolver, proxy, h)
			}
		})
	})
}

// A key header that is reached and sent twice is refused, not guessed at;
// a repeated header the chain never reaches does not matter.
func TestAppendKeyOfRepeated(t *testing.T) {
	b, err := ParseBy("header:X-Api-Key|header:X-Other|ip")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		h        http.Header
		repeated string // "" = a key
	}{
		{hdr("X-Api-Key", "r123", "X-Api-Key", "k1"), "X-Api-Key"},
		{hdr("X-Other", "a", "X-Other", "b"), "X-Other"},
		{hdr("X-Api-Key", "k1", "X-Other", "a", "X-Other", "b"), ""},
		{hdr("X-Api-Key", "", "X-Api-Key", "k1"), "X-Api-Key"},
	}
	for _, tt := range tests {
		_, err := b.AppendKeyOf(nil, NewHTTPSource(&testResolver, "203.0.113.7:1", tt.h, "/"))
		var re *RepeatedError
		switch {
		case tt.repeated == "" && err != nil:
			t.Errorf("%v: %v", tt.h, err)
		case tt.repeated != "" && (!errors.As(err, &re) || re.What != "the "+tt.repeated+" header"):
			t.Errorf("%v: error %v, want the repeated %s", tt.h, err, tt.repeated)
		}
	}
}

// QueryValue counts as a copy of the parameter every one that some
// application's parser reads as it: its exact decoded name; a name PHP
// reads as it (cut at a NUL, leading spaces dropped, ' ', '+' and '.' as
// '_', a first '[' without a ']' after it as '_', and, from PHP 8, the
// ' ', '.' and '[' after that '[' as '_' too); and one in a pair with a ';', which Rack
// before 3 and Python before 3.9.2 split, counted twice since those read
// another value there than the others do.
func TestQueryValueCopies(t *testing.T) {
	tests := []struct {
		q, name string
		value   string
		n       int
	}{
		{"api_key=k1", "api_key", "k1", 1},
		{"a=1&api_key=k1&b=2", "api_key", "k1", 1},
		{"api_key=k1&api_key=k2", "api_key", "k1", 2},
		{"api_key=k1&api.key=k2", "api_key", "k1", 2},
		{"api.key=k2&api_key=k1", "api_key", "k1", 2}, // the value is the exact name's
		{"api_key=k1&api+key=k2", "api_key", "k1", 2},
		{"api_key=k1&api%20key=k2", "api_key", "k1", 2},
		{"api_key=k1&api%2Ekey=k2", "api_key", "k1", 2},
		{"api_key=k1&+api_key=k2", "api_key", "k1", 2},
		{"api_key=k1&%20%20api_key=k2", "api_key", "k1", 2},
		{"api_key=k1&api[key=k2", "api_key", "k1", 2},
		{"api_key=k1&api%5Bkey=k2", "api_key", "k1", 2},
		{"a_b_c=1&a[b.c=2", "a_b_c", "1", 2}, // PHP 8; PHP 7 reads "a_b.c"
		{"a_b_c=1&a[b[c=2", "a_b_c", "1", 2},
		{"api_key=k1&api_key%00x=k2", "api_key", "k1", 2}, // PHP cuts names at a NUL
		{"api.key=k1&api_key=k2", "api.key", "k1", 2},
		// Not PHP's api_key: an array, a '[' past the first, a '+' as sent.
		{"api_key=k1&api[key]=k2", "api_key", "k1", 1},
		{"api_key=k1&api[key]x=k2", "api_key", "k1", 1},
		{"api_key=k1&api_key_=k2&api-key=k3&api%2Bkey=k4&api_key%20=k5", "api_key", "k1", 1},
		// ';' hides a copy from all but Rack before 3 and Python before
		// 3.9.2, or gives them another value.
		{"x=1;api_key=k1", "api_key", "", 2},
		{"api_key=k1;x=1", "api_key", "k1;x=1", 3},
		{"api_key=k1&x=1;api_key=k2", "api_key", "k1", 3},
		{"api_key;x=1", "api_key", "", 2},
		{"x=1;y=2&api_key=k1", "api_key", "k1", 1},
		{"api_key=k1%3Bx", "api_key", "k1;x", 1},
		{"x=1;api.key=k2&api_key=k1", "api_key", "k1", 1}, // no ';' reader mangles
	}
	for _, tt := range tests {
		v, n := QueryValue(tt.q, tt.name, nil)
		if string(v) != tt.value || n != tt.n {
			t.Errorf("QueryValue(%q, %q) = %q, %d; want %q, %d", tt.q, tt.name, v, n, tt.value, tt.n)
		}
	}
}

// QueryValue allocates nothing when its scratch buffer has room, names
// PHP or Rack could read otherwise included.
func TestQueryValueDoesNotAllocate(t *testing.T) {
	scratch := make([]byte, 0, 64)
	for _, q := range []string{
		"id=7&page=2&api_key=k1",
		"a.b=1&c%20d=2&e[f=3&g[h]=4&x=1;y=2&api_key=k%201",
	} {
		if n := testing.AllocsPerRun(100, func() { QueryValue(q, "api_key", scratch) }); n != 0 {
			t.Errorf("QueryValue(%q): %v allocations", q, n)
		}
	}
}

func BenchmarkQueryValue(b *testing.B) {
	for _, bc := range []struct{ name, q string }{
		{"plain", "id=7&page=2&sort=name&api_key=0123456789abcdef"},
		{"mangled", "a.b=1&c%20d=2&e[f=3&g[h]=4&x=1;y=2&api_key=0123456789abcdef"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			scratch := make([]byte, 0, 64)
			b.ReportAllocs()
			for b.Loop() {
				QueryValue(bc.q, "api_key", scratch)
			}
		})
	}
}

// fakeSource is a Source with fixed answers.
type fakeSource struct {
	headers map[string][]string
	cookie  string // the Cookie header
	query   string
	path    string
}

func (f fakeSource) Header(name string) (string, int) {
	vs := f.headers[name]
	if len(vs) == 0 {
		return "", 0
	}
	return vs[0], len(vs)
}
func (f fakeSource) Cookie(name string) (string, bool) { return CookieValue([]string{f.cookie}, name) }
func (f fakeSource) Query(name string) (string, int) {
	v, n := QueryValue(f.query, name, nil)
	return string(v), n
}
func (f fakeSource) Path() string { return f.path }
func (f fakeSource) ClientKey() netip.Addr {
	return netip.MustParseAddr("192.0.2.1")
}

// Cookie, query and path elements: their keys, fallbacks, long values and
// repeats.
func TestKeysOfCookieQueryPath(t *testing.T) {
	long := strings.Repeat("v", 300)
	tests := []struct {
		by    string
		src   fakeSource
		key   string
		value string
		err   string
	}{
		{"cookie:session|ip", fakeSource{cookie: "a=1; session=s1; b=2"}, "c:session:s1", "s1", ""},
		{"cookie:session|ip", fakeSource{cookie: `session="s 1"`}, "c:session:s 1", "s 1", ""},
		{"cookie:session|ip", fakeSource{cookie: "session=first; session=second"}, "c:session:first", "first", ""},
		{"cookie:session|ip", fakeSource{cookie: "sessionx=1"}, "ip:192.0.2.1", "", ""},
		{"cookie:session|ip", fakeSource{cookie: "session="}, "ip:192.0.2.1", "", ""},
		{"query:key|ip", fakeSource{query: "a=1&key=k1"}, "q:key:k1", "k1", ""},
		{"query:key|ip", fakeSource{query: "key=a%20b+c"}, "q:key:a b c", "a b c", ""},
		{"query:key|ip", fakeSource{query: "%6Bey=%6B1"}, "q:key:k1", "k1", ""},
		{"query:key|ip", fakeSource{query: "key=k1&key=k2"}, "", "", "the key query parameter was sent more than once"},
		{"query:key|ip", fakeSource{query: "keys=1"}, "ip:192.0.2.1", "", ""},
		// What PHP, or Rack before 3 and Python before 3.9.2, read as
		// another copy of key is a repeat too.
		{"query:api_key|ip", fakeSource{query: "api_key=r&api.key=k1"}, "", "", "the api_key query parameter was sent more than once"},
		{"query:api_key|ip", fakeSource{query: "api.key=k1&api_key=r"}, "", "", "the api_key query parameter was sent more than once"},
		{"query:api_key|ip", fakeSource{query: "api_key=r&x=1;api_key=k1"}, "", "", "the api_key query parameter was sent more than once"},
		{"query:api_key|ip", fakeSource{query: "x=1;api_key=k1"}, "", "", "the api_key query parameter was sent more than once"},
		{"query:api_key|ip", fakeSource{query: "api_key=k1;r"}, "", "", "the api_key query parameter was sent more than once"},
		{"query:api_key|ip", fakeSource{query: "x=1;y=2&api_key=k1"}, "q:api_key:k1", "k1", ""},
		{"query:api_key|ip", fakeSource{query: "api_key=k%3B1&api_keys=1&api.key[x]=2"}, "q:api_key:k;1", "k;1", ""},
		{"query:key|ip", fakeSource{query: "key=" + long}, "Q:key:" + digest(long), long, ""},
		{"cookie:s|ip", fakeSource{cookie: "s=" + long}, "C:s:" + digest(long), long, ""},
		{"path", fakeSource{path: "/a"}, "p:/a", "/a", ""},
		{"path", fakeSource{path: "/" + long}, "P:" + digest("/"+long), "/" + long, ""},
		{"header:X-Api-Key|query:key|path", fakeSource{query: "key=q", path: "/a"}, "q:key:q", "q", ""},
		{"header:X-Api-Key|query:key|path", fakeSource{path: "/a"}, "p:/a", "/a", ""},
	}
	for _, tt := range tests {
		b, err := ParseBy(tt.by)
		if err != nil {
			t.Fatal(err)
		}
		key, value, err := b.AppendKeyValue(nil, tt.src)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s %+v: error %v, want %q", tt.by, tt.src, err, tt.err)
			}
			continue
		}
		if err != nil || string(key) != tt.key || value != tt.value {
			t.Errorf("%s %+v: %q, %q, %v; want %q, %q", tt.by, tt.src, key, value, err, tt.key, tt.value)
		}
	}
}

package route

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// normalizeTests are request paths as sent, with the path routes match and
// the path forwarded upstream, or the refusal.
var normalizeTests = []struct {
	raw            string
	match, forward string
	err            error
}{
	// Already normal: returned as is.
	{"/", "/", "/", nil},
	{"", "/", "/", nil}, // RFC 9110 §4.2.3
	{"/api/v1/things", "/api/v1/things", "/api/v1/things", nil},
	{"/a-b_c~d.e/f", "/a-b_c~d.e/f", "/a-b_c~d.e/f", nil},

	// The tricks that dodged a /login rule.
	{"/LOGIN", "/LOGIN", "/LOGIN", nil}, // case is folded by Match, not here
	{"/LoGiN/", "/LoGiN", "/LoGiN/", nil},
	{"/login;x", "/login", "/login;x", nil},
	{"/login;jsessionid=x", "/login", "/login;jsessionid=x", nil},
	{"/.;/login", "", "", errDotParams},
	{"/;x/login", "/login", "/;x/login", nil},
	{"/admin/..;/login", "", "", errDotParams}, // net/http routes it under /admin/
	{"/admin/%2e%2E;x/login", "", "", errDotParams},
	{"/admin/...;/login", "/admin/login", "/admin/...;/login", nil}, // a name with trailing dots
	{"/login;a=1/x", "/login/x", "/login;a=1/x", nil},
	{"/login.", "/login", "/login.", nil},
	{"/login...", "/login", "/login...", nil},
	{"/login.;x", "/login", "/login.;x", nil},
	{"/admin./secret", "/admin/secret", "/admin./secret", nil}, // IIS: each segment
	{"/login%2e", "/login", "/login%2e", nil},
	{"/login%2E%2E", "/login", "/login%2E%2E", nil},
	{"/\\login", "", "", errBackslash},
	{"/login\\", "", "", errBackslash},

	// Dot segments and slashes: removed from both.
	{"//login", "/login", "/login", nil},
	{"/api//v1///things/", "/api/v1/things", "/api/v1/things/", nil},
	{"/a/../login", "/login", "/login", nil},
	{"/a/b/../../../login", "/login", "/login", nil},
	{"/./login", "/login", "/login", nil},
	{"/login/.", "/login", "/login/", nil},
	{"/login/..", "/", "/", nil},
	{"/A/./B/", "/A/B", "/A/B/", nil},
	{"/.", "/", "/", nil},
	{"/..", "/", "/", nil},
	{"/%2e", "/", "/", nil},
	{"/%2e%2e/login", "/login", "/login", nil},
	{"/a/%2e%2e/login", "/login", "/login", nil},
	{"/a/%2E./login", "/login", "/login", nil},
	{"/a/.%2e/login", "/login", "/login", nil},
	{"/a/...", "/a", "/a/...", nil},        // not a dot segment; its dots are trailing
	{"/%2e%2e%2e", "/", "/%2e%2e%2e", nil}, // likewise
	// A dot segment with parameters is refused wherever it stands.
	{"/a/..;/../b", "", "", errDotParams},

	// Percent-encoding: unreserved decoded, the rest upper-cased.
	{"/%6Cogin", "/login", "/%6Cogin", nil},
	{"/%6cogin", "/login", "/%6cogin", nil},
	{"/%4C%4f%47%49%4E", "/LOGIN", "/%4C%4f%47%49%4E", nil},
	{"/%7e%2D%5f%30", "/~-_0", "/%7e%2D%5f%30", nil},
	{"/a%20b", "/a%20b", "/a%20b", nil},
	{"/a%3ab", "/a%3Ab", "/a%3ab", nil},
	{"/%25", "/%25", "/%25", nil}, // an encoded '%' stays encoded: no double decoding
	{"/%252F", "/%252F", "/%252F", nil},
	// An encoded ';' is data, not a parameter separator (as in Tomcat,
	// Jetty and Spring, which split parameters before decoding).
	{"/login%3B", "/login%3B", "/login%3B", nil},
	{"/login%3bx", "/login%3Bx", "/login%3bx", nil},
	// Bytes a client may send unencoded are encoded, so both spellings
	// meet at one route.
	{"/users/@me", "/users/%40me", "/users/@me", nil},
	{"/users/%40me", "/users/%40me", "/users/%40me", nil},
	{"/v1/things:batchGet", "/v1/things%3AbatchGet", "/v1/things:batchGet", nil},
	{"/a b", "/a%20b", "/a b", nil},
	{"/café", "/caf%C3%A9", "/café", nil},
	{"/caf%c3%a9", "/caf%C3%A9", "/caf%c3%a9", nil},
	{"/CAF%C3%89", "/CAF%C3%89", "/CAF%C3%89", nil},
	{"/\xff", "/%FF", "/\xff", nil}, // not UTF-8: bytes all the same

	// Refused.
	{"*", "", "", errNotAbsolute},
	{"login", "", "", errNotAbsolute},
	{"%2Flogin", "", "", errNotAbsolute},
	{"http://example.com/login", "", "", errNotAbsolute},
	{"/%2F", "", "", errEncodedSlash},
	{"/a%2fb", "", "", errEncodedSlash},
	{"/..%2F..%2Fetc", "", "", errEncodedSlash},
	{"/%5C", "", "", errEncodedBackslash},
	{"/a%5cb", "", "", errEncodedBackslash},
	{"/%00", "", "", errNUL},
	{"/login%00.html", "", "", errNUL},
	{"/login%0a", "", "", errEncodedControl},
	{"/login%0D", "", "", errEncodedControl},
	{"/login%09", "", "", errEncodedControl},
	{"/login%7f", "", "", errEncodedControl},
	{"/login%1F", "", "", errEncodedControl},
	{"/login\n", "", "", errControl},
	{"/log\tin", "", "", errControl},
	{"/\x00", "", "", errControl},
	{"/\x7f", "", "", errControl},
	{"/%", "", "", errPercent},
	{"/%4", "", "", errPercent},
	{"/%zz", "", "", errPercent},
	{"/%4g", "", "", errPercent},
	{"/%%41", "", "", errPercent},
	{"/login%", "", "", errPercent},
	{"/login?x=1", "", "", errQuery},
	{"/login#x", "", "", errFragment},
	{"/a%2fb\\", "", "", errEncodedSlash}, // the first problem is reported
}

func TestNormalize(t *testing.T) {
	for _, tt := range normalizeTests {
		match, forward, err := Normalize(tt.raw)
		if tt.err != nil {
			if err != tt.err || !errors.Is(err, ErrBadPath) || match != "" || forward != "" {
				t.Errorf("Normalize(%q) = %q, %q, %v; want %v (wrapping ErrBadPath)", tt.raw, match, forward, err, tt.err)
			}
			continue
		}
		if err != nil || match != tt.match || forward != tt.forward {
			t.Errorf("Normalize(%q) = %q, %q, %v; want %q, %q", tt.raw, match, forward, err, tt.match, tt.forward)
		}
	}
}

func TestNormalizeErrorText(t *testing.T) {
	_, _, err := Normalize("/a%2Fb")
	if got, want := err.Error(), "route: bad request path: encoded slash (%2F)"; got != want {
		t.Errorf("error = %q, want %q", got, want)
	}
	if !errors.Is(err, ErrBadPath) {
		t.Errorf("%v does not wrap ErrBadPath", err)
	}
	if got, want := PathReason(fmt.Errorf("wrapped: %w", err)), "encoded slash (%2F)"; got != want {
		t.Errorf("PathReason = %q, want %q", got, want)
	}
	if got := PathReason(ErrBadPath); got != "" {
		t.Errorf("PathReason(ErrBadPath) = %q, want none", got)
	}
}

func TestNormalizeDoesNotAllocate(t *testing.T) {
	for _, raw := range []string{
		"/api/v1/things",
		"/LOGIN",
		"/",
		"/login/",                    // match is a prefix of raw
		"/login;jsessionid=ABCDEF12", // likewise
		"/login.",                    //
		"/a%2Fb",                     // refusals
		"/%zz",                       //
	} {
		allocs := testing.AllocsPerRun(100, func() { Normalize(raw) })
		if allocs != 0 {
			t.Errorf("Normalize(%q) allocated %v times", raw, allocs)
		}
	}
	// A path that needs work costs at most its two results.
	if allocs := testing.AllocsPerRun(100, func() { Normalize("/API//v1/./%74hings;x/") }); allocs > 2 {
		t.Errorf("Normalize of a path that needs work allocated %v times, want at most 2", allocs)
	}
}

// TestNormalizeLong covers paths longer than the stack buffers.
func TestNormalizeLong(t *testing.T) {
	seg := strings.Repeat("x", 100)
	raw := "/" + strings.Repeat(seg+"//", 5) + "%41;p/./"
	wantMatch := "/" + strings.Repeat(seg+"/", 5) + "A"
	wantForward := "/" + strings.Repeat(seg+"/", 5) + "%41;p/"
	match, forward, err := Normalize(raw)
	if err != nil || match != wantMatch || forward != wantForward {
		t.Errorf("Normalize(%q) = %q, %q, %v; want %q, %q", raw, match, forward, err, wantMatch, wantForward)
	}
}

// refNormalize is Normalize written as plainly as possible, to check the
// real one (its fast path, its in-place popping) against.
func refNormalize(raw string) (match, forward string, ok bool) {
	if raw == "" {
		return "/", "/", true
	}
	if raw[0] != '/' {
		return "", "", false
	}
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c < 0x20 || c == 0x7f || c == '\\' || c == '?' || c == '#' {
			return "", "", false
		}
		if c == '%' {
			if i+2 >= len(raw) {
				return "", "", false
			}
			v, ok := unhex2(raw[i+1], raw[i+2])
			if !ok || v < 0x20 || v == 0x7f || v == '/' || v == '\\' {
				return "", "", false
			}
			i += 2
		}
	}
	isDot := func(seg string) (one, two bool) {
		s := strings.ReplaceAll(strings.ToLower(seg), "%2e", ".")
		return s == ".", s == ".."
	}
	for _, seg := range strings.Split(raw[1:], "/") {
		if name, _, params := strings.Cut(seg, ";"); params {
			if one, two := isDot(name); one || two {
				return "", "", false // "..;": ".." to some applications, a name to others
			}
		}
	}
	var segs []string
	trailing := false
	for _, seg := range strings.Split(raw[1:], "/") {
		one, two := isDot(seg)
		switch {
		case two:
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
			trailing = true
		case one, seg == "":
			trailing = true
		default:
			segs = append(segs, seg)
			trailing = false
		}
	}
	forward = "/" + strings.Join(segs, "/")
	if trailing && len(segs) > 0 {
		forward += "/"
	}

	segs = segs[:0]
	for _, seg := range strings.Split(forward[1:], "/") {
		seg, _, _ = strings.Cut(seg, ";")
		var b strings.Builder
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if c == '%' {
				c, _ = unhex2(seg[i+1], seg[i+2])
				i += 2
			}
			if strings.IndexByte("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~", c) >= 0 {
				b.WriteByte(c)
			} else {
				b.WriteString("%" + strings.ToUpper(string("0123456789abcdef"[c>>4])+string("0123456789abcdef"[c&15])))
			}
		}
		switch s := b.String(); s {
		case ".":
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
		default:
			if s = strings.TrimRight(s, "."); s != "" {
				segs = append(segs, s)
			}
		}
	}
	return "/" + strings.Join(segs, "/"), forward, true
}

func TestRefNormalizeAgreesWithTable(t *testing.T) {
	// The reference is only as good as this: it must pass the table too.
	for _, tt := range normalizeTests {
		match, forward, ok := refNormalize(tt.raw)
		if ok != (tt.err == nil) || ok && (match != tt.match || forward != tt.forward) {
			t.Errorf("refNormalize(%q) = %q, %q, %v; want %q, %q, %v", tt.raw, match, forward, ok, tt.match, tt.forward, tt.err)
		}
	}
}

func FuzzNormalize(f *testing.F) {
	for _, tt := range normalizeTests {
		f.Add(tt.raw)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		match, forward, err := Normalize(raw)

		refMatch, refForward, ok := refNormalize(raw)
		if ok != (err == nil) || match != refMatch || forward != refForward {
			t.Fatalf("Normalize(%q) = %q, %q, %v; reference %q, %q, accepted %v", raw, match, forward, err, refMatch, refForward, ok)
		}

		if err != nil {
			if !errors.Is(err, ErrBadPath) || !strings.HasPrefix(err.Error(), "route: ") {
				t.Fatalf("Normalize(%q): %v does not wrap ErrBadPath", raw, err)
			}
			// A refusal does not depend on what surrounds the problem.
			if raw != "" && raw[0] == '/' {
				if _, _, err2 := Normalize("/x" + raw); err2 != err {
					t.Fatalf("Normalize(%q) = %v, but with a prefix %v", raw, err, err2)
				}
				if _, _, err2 := Normalize(raw + "/x"); err2 != err {
					t.Fatalf("Normalize(%q) = %v, but with a suffix %v", raw, err, err2)
				}
			}
			return
		}

		checkNormal(t, "match", raw, match)
		if match != "/" && strings.HasSuffix(match, "/") {
			t.Fatalf("Normalize(%q): match %q ends in /", raw, match)
		}
		for _, seg := range strings.Split(match[1:], "/") {
			if strings.HasSuffix(seg, ".") {
				t.Fatalf("Normalize(%q): match %q has a segment ending in '.'", raw, match)
			}
		}
		for i := 0; i < len(match); i++ {
			c := match[i]
			switch {
			case c == '/' || isUnreserved(c):
			case c == '%' && i+2 < len(match) && strings.IndexByte(upperHex, match[i+1]) >= 0 && strings.IndexByte(upperHex, match[i+2]) >= 0:
				if v, _ := unhex2(match[i+1], match[i+2]); isUnreserved(v) {
					t.Fatalf("Normalize(%q): match %q keeps an unreserved character encoded", raw, match)
				}
				i += 2
			default:
				t.Fatalf("Normalize(%q): match %q has byte %q at %d", raw, match, c, i)
			}
		}
		checkNormal(t, "forward", raw, forward)

		// Fixed points: the match path is its own normal form, and the
		// application, receiving the forward path, is matched the same.
		if m, f, err := Normalize(match); m != match || f != match || err != nil {
			t.Fatalf("Normalize(%q) = %q; again: %q, %q, %v", raw, match, m, f, err)
		}
		if m, f, err := Normalize(forward); m != match || f != forward || err != nil {
			t.Fatalf("Normalize(%q) = %q, %q; its forward path gives %q, %q, %v", raw, match, forward, m, f, err)
		}
	})
}

// checkNormal fails unless p starts with '/' and has no empty segment
// (but a trailing one) and no dot segment, however spelt.
func checkNormal(t *testing.T, what, raw, p string) {
	t.Helper()
	if p == "" || p[0] != '/' {
		t.Fatalf("Normalize(%q): %s %q does not start with /", raw, what, p)
	}
	if strings.Contains(p, "//") {
		t.Fatalf("Normalize(%q): %s %q has //", raw, what, p)
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if s := strings.ReplaceAll(strings.ToLower(seg), "%2e", "."); s == "." || s == ".." {
			t.Fatalf("Normalize(%q): %s %q has a dot segment", raw, what, p)
		}
	}
}

var sink string

func BenchmarkNormalize(b *testing.B) {
	for _, bc := range []struct{ name, raw string }{
		{"normal", "/api/v1/things"},
		{"trailing-slash", "/api/v1/things/"},
		{"needs-work", "/API//v1/./%74hings;x/"},
		{"refused", "/api/v1%2Fthings"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sink, _, _ = Normalize(bc.raw)
			}
		})
	}
	// What Normalize replaces, for comparison.
	b.Run("Clean/normal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sink = Clean("/api/v1/things")
		}
	})
}

// AppendSpelling gives equivalent spellings one spelling, and is its own
// fixed point.
func TestAppendSpelling(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{"/caf%c3%a9", "/caf%C3%A9"},
		{"/caf%C3%A9", "/caf%C3%A9"},
		{"/caf\xc3\xa9", "/caf%C3%A9"},
		{"/%41%7e%2d", "/A~-"},
		{"q=%7Ea&b", "q%3D~a%26b"},
		{"q%3d~a&b", "q%3D~a%26b"},
		{"a%2fb", "a/b"},
		{"100%", "100%25"},
		{"%zz%4", "%25zz%254"},
		{"a+b c", "a%2Bb%20c"},
	} {
		if got := string(AppendSpelling([]byte("x"), tt.in)); got != "x"+tt.want {
			t.Errorf("AppendSpelling(%q) = %q, want %q", tt.in, got[1:], tt.want)
		}
		if again := string(AppendSpelling(nil, tt.want)); again != tt.want {
			t.Errorf("AppendSpelling(%q) = %q: not a fixed point", tt.want, again)
		}
	}
}

package core

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseCacheControl(t *testing.T) {
	absent := cacheControl{maxAge: -1, sMaxAge: -1, swr: -1, sie: -1}
	with := func(f func(*cacheControl)) cacheControl {
		cc := absent
		f(&cc)
		return cc
	}
	for _, tt := range []struct {
		lines []string
		want  cacheControl
	}{
		{nil, absent},
		{[]string{""}, absent},
		{[]string{"max-age=60"}, with(func(c *cacheControl) { c.maxAge = 60 })},
		{[]string{"MAX-AGE=60, Public"}, with(func(c *cacheControl) { c.maxAge, c.public = 60, true })},
		{[]string{` max-age = 60 , s-maxage="30" `}, with(func(c *cacheControl) { c.maxAge, c.sMaxAge = 60, 30 })},
		{[]string{"max-age=60", "max-age=10"}, with(func(c *cacheControl) { c.maxAge = 60 })}, // the first counts
		{[]string{"max-age=soon"}, with(func(c *cacheControl) { c.maxAge = 0 })},
		{[]string{"max-age="}, with(func(c *cacheControl) { c.maxAge = 0 })},
		{[]string{"max-age=-5"}, with(func(c *cacheControl) { c.maxAge = 0 })},
		{[]string{"max-age=99999999999999999999999"}, with(func(c *cacheControl) { c.maxAge = maxDelta })},
		{[]string{`no-cache="Set-Cookie, X-A", max-age=5`}, with(func(c *cacheControl) { c.noCache, c.maxAge = true, 5 })},
		{[]string{`private="a\"b,c", no-store`}, with(func(c *cacheControl) { c.private, c.noStore = true, true })},
		{[]string{"must-revalidate,proxy-revalidate"}, with(func(c *cacheControl) { c.mustRevalidate, c.proxyRevalidate = true, true })},
		{[]string{"stale-while-revalidate=30, stale-if-error=600"}, with(func(c *cacheControl) { c.swr, c.sie = 30, 600 })},
		{[]string{"max-age-extension=5, nomax-age=7, x=\"max-age=9\""}, absent},
		{[]string{",,, ,max-age=1,,"}, with(func(c *cacheControl) { c.maxAge = 1 })},
	} {
		if got := parseCacheControl(tt.lines); got != tt.want {
			t.Errorf("%q: %+v, want %+v", tt.lines, got, tt.want)
		}
	}
}

func TestParseVary(t *testing.T) {
	for _, tt := range []struct {
		lines []string
		names []string
		star  bool
	}{
		{nil, nil, false},
		{[]string{"accept-encoding"}, []string{"Accept-Encoding"}, false},
		{[]string{"User-Agent, accept-encoding", " Accept-Encoding ,,"}, []string{"Accept-Encoding", "User-Agent"}, false},
		{[]string{"Accept, *"}, []string{"Accept"}, true},
		{[]string{"*"}, nil, true},
	} {
		names, star := parseVary(tt.lines)
		if !slices.Equal(names, tt.names) || star != tt.star {
			t.Errorf("%q: %q %v, want %q %v", tt.lines, names, star, tt.names, tt.star)
		}
	}
}

func TestAppendTags(t *testing.T) {
	tags, ok := appendTags(nil, []string{"a, b%20c,a", "d\te  f/g", ""})
	if !ok || !slices.Equal(tags, []string{"a", "b%20c", "d", "e", "f/g"}) {
		t.Fatalf("%q %v", tags, ok)
	}
	var many []string
	for i := range maxTags + 1 {
		many = append(many, strings.Repeat("t", i+1))
	}
	if tags, ok := appendTags(nil, []string{strings.Join(many[:maxTags], ",")}); !ok || len(tags) != maxTags {
		t.Fatalf("%d tags: %v", len(tags), ok)
	}
	if _, ok := appendTags(nil, []string{strings.Join(many, ",")}); ok {
		t.Fatal("one tag too many accepted")
	}
	if _, ok := appendTags(nil, []string{strings.Repeat("x", maxTagLen+1)}); ok {
		t.Fatal("a tag too long accepted")
	}
}

func TestETagMatch(t *testing.T) {
	for _, tt := range []struct {
		inm  []string
		etag string
		want bool
	}{
		{[]string{`"a"`}, `"a"`, true},
		{[]string{`W/"a"`}, `"a"`, true},
		{[]string{`"a"`}, `W/"a"`, true},
		{[]string{`"x", "a"`}, `"a"`, true},
		{[]string{`"x"`, `"a"`}, `"a"`, true},
		{[]string{`"a,b"`}, `"a,b"`, true},
		{[]string{`"a,b"`}, `"a"`, false},
		{[]string{`*`}, `"a"`, true},
		{[]string{`a`}, `"a"`, false},
		{[]string{`junk, "a"`}, `"a"`, true},
		{[]string{`"b"`}, `"a"`, false},
		{[]string{`"a"`}, `a`, false}, // a stored ETag that is not one matches nothing
		{[]string{`"a`}, `"a"`, false},
	} {
		if got := etagMatch(tt.inm, tt.etag); got != tt.want {
			t.Errorf("If-None-Match %q vs %s: %v", tt.inm, tt.etag, got)
		}
	}
}

func TestEntryRoundTrip(t *testing.T) {
	var w entryWriter
	w.begin(nil, 0, 203, time.Hour, 2*time.Second, time.Minute, 5*time.Second, 6*time.Second, 2)
	w.gen(0, 11, 12)
	w.gen(1, 21, 22)
	w.field("Content-Type", []byte("text/plain"))
	w.field("Link", nil)
	b := w.finish([]byte("body"))
	var e entry
	if !decodeEntry(b, &e) {
		t.Fatal("does not decode")
	}
	if e.status != 203 || e.stored != time.Hour || e.age != 2*time.Second || e.fresh != time.Minute || e.swr != 5*time.Second || e.sie != 6*time.Second ||
		string(e.body) != "body" || len(e.gens) != 32 || le64(e.gens[16:]) != 21 || e.nfields != 2 {
		t.Fatalf("%+v", e)
	}
	if v, ok := e.get("Content-Type"); !ok || v != "text/plain" {
		t.Fatalf("Content-Type %q %v", v, ok)
	}
	if v, ok := e.get("Link"); !ok || v != "" {
		t.Fatalf("Link %q %v", v, ok)
	}
	for i := range len(b) {
		decodeEntry(b[:i], &e) // must not panic
	}
	bad := bytes.Clone(b)
	bad[50] = 3 // one field more than there is
	if decodeEntry(bad, &e) {
		t.Fatal("a miscounted entry decodes")
	}
}

func FuzzCacheControl(f *testing.F) {
	for _, s := range []string{"max-age=60, public", `no-cache="a,b", s-maxage="1"`, "stale-if-error=1,,=,", `x="\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cc := parseCacheControl([]string{s})
		for _, v := range []int64{cc.maxAge, cc.sMaxAge, cc.swr, cc.sie} {
			if v < -1 || v > maxDelta {
				t.Fatalf("%q: %+v", s, cc)
			}
		}
		if strings.Contains(strings.ToLower(s), "no-store") != cc.noStore && !strings.Contains(s, `"`) {
			t.Fatalf("%q: no-store %v", s, cc.noStore)
		}
	})
}

func FuzzVary(f *testing.F) {
	for _, s := range []string{"Accept-Encoding, user-agent", "*", " ,a ,, B"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names, _ := parseVary([]string{s})
		if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
			t.Fatalf("%q: %q", s, names)
		}
		for _, n := range names {
			if n == "" || n == "*" || strings.Contains(n, ",") || trimOWS(n) != n {
				t.Fatalf("%q: name %q", s, n)
			}
		}
	})
}

func FuzzTags(f *testing.F) {
	for _, s := range []string{"a,b c", "a%2Fb, a/b", " , \t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tags, ok := appendTags(nil, []string{s})
		if len(tags) > maxTags {
			t.Fatalf("%d tags", len(tags))
		}
		for _, tag := range tags {
			if tag == "" || strings.ContainsAny(tag, ", \t") || len(tag) > maxTagLen || !strings.Contains(s, tag) {
				t.Fatalf("%q: tag %q", s, tag)
			}
		}
		if len(slices.Compact(slices.Sorted(slices.Values(tags)))) != len(tags) {
			t.Fatalf("%q: repeated tags %q", s, tags)
		}
		_ = ok
	})
}

func FuzzETagMatch(f *testing.F) {
	f.Add(`"a", W/"b"`, `"b"`)
	f.Fuzz(func(t *testing.T, inm, etag string) {
		got := etagMatch([]string{inm}, etag)
		if got && !strings.Contains(inm, "*") {
			tag, ok := opaqueTag(trimOWS(etag))
			if !ok || !strings.Contains(inm, `"`+tag+`"`) {
				t.Fatalf("%q matched %q", inm, etag)
			}
		}
	})
}

func FuzzDecodeEntry(f *testing.F) {
	var w entryWriter
	w.begin(nil, 0, 200, 1, 2, 3, 4, 5, 1)
	w.field("A", []byte("b"))
	f.Add(w.finish([]byte("body")))
	f.Fuzz(func(t *testing.T, b []byte) {
		var e entry
		if !decodeEntry(b, &e) {
			return
		}
		n := 0
		for fl := e.fields; len(fl) > 0; n++ {
			_, _, fl = nextField(fl)
		}
		if n != e.nfields {
			t.Fatalf("%d fields, header says %d", n, e.nfields)
		}
	})
}

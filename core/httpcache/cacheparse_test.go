package httpcache

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/httpfield"
	"github.com/preforkd/preforkd/route"
)

func TestParseCacheControl(t *testing.T) {
	absent := Directives{MaxAge: -1, SMaxAge: -1, SWR: -1, SIE: -1}
	with := func(f func(*Directives)) Directives {
		cc := absent
		f(&cc)
		return cc
	}
	for _, tt := range []struct {
		lines []string
		want  Directives
	}{
		{nil, absent},
		{[]string{""}, absent},
		{[]string{"max-age=60"}, with(func(c *Directives) { c.MaxAge = 60 })},
		{[]string{"MAX-AGE=60, Public"}, with(func(c *Directives) { c.MaxAge, c.Public = 60, true })},
		{[]string{` max-age = 60 , s-maxage="30" `}, with(func(c *Directives) { c.MaxAge, c.SMaxAge = 60, 30 })},
		{[]string{"max-age=60", "max-age=10"}, with(func(c *Directives) { c.MaxAge = 60 })}, // the first counts
		{[]string{"max-age=soon"}, with(func(c *Directives) { c.MaxAge = 0 })},
		{[]string{"max-age="}, with(func(c *Directives) { c.MaxAge = 0 })},
		{[]string{"max-age=-5"}, with(func(c *Directives) { c.MaxAge = 0 })},
		{[]string{"max-age=99999999999999999999999"}, with(func(c *Directives) { c.MaxAge = MaxDelta })},
		{[]string{`no-cache="Set-Cookie, X-A", max-age=5`}, with(func(c *Directives) { c.NoCache, c.MaxAge = true, 5 })},
		{[]string{`private="a\"b,c", no-store`}, with(func(c *Directives) { c.Private, c.NoStore = true, true })},
		{[]string{"must-revalidate,proxy-revalidate"}, with(func(c *Directives) { c.MustRevalidate, c.ProxyRevalidate = true, true })},
		{[]string{"stale-while-revalidate=30, stale-if-error=600"}, with(func(c *Directives) { c.SWR, c.SIE = 30, 600 })},
		{[]string{"max-age-extension=5, nomax-age=7, x=\"max-age=9\""}, absent},
		{[]string{",,, ,max-age=1,,"}, with(func(c *Directives) { c.MaxAge = 1 })},
		// ';' in place of ',': the restrictions count, nothing that loosens.
		{[]string{"private; max-age=600"}, with(func(c *Directives) { c.Private = true })},
		{[]string{"max-age=600; No-Store"}, with(func(c *Directives) { c.MaxAge, c.NoStore = 0, true })},
		{[]string{"no-cache;must-revalidate, max-age=60"}, with(func(c *Directives) { c.NoCache, c.MustRevalidate, c.MaxAge = true, true, 60 })},
		{[]string{"public; max-age=60; must-understand"}, absent},
		// A blank in place of ',', likewise (nginx and Varnish find the
		// word anywhere in the field).
		{[]string{"private max-age=600"}, with(func(c *Directives) { c.Private = true })},
		{[]string{"max-age=600 no-store"}, with(func(c *Directives) { c.MaxAge, c.NoStore = 0, true })},
		{[]string{"no-cache\tmust-revalidate s-maxage=60, max-age=60"}, with(func(c *Directives) { c.NoCache, c.MustRevalidate, c.MaxAge = true, true, 60 })},
		{[]string{"public max-age=60 must-understand"}, absent},
	} {
		if got := ParseCacheControl(tt.lines); got != tt.want {
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
		// Names run together with blanks are each a name, as nginx and
		// Varnish read them.
		{[]string{"Accept-Encoding Cookie"}, []string{"Accept-Encoding", "Cookie"}, false},
		{[]string{"cookie\tAccept-Encoding,  Origin"}, []string{"Accept-Encoding", "Cookie", "Origin"}, false},
		// A member that is no field name varies on what no request field
		// shows, as "*" does.
		{[]string{"Accept, Cookie;"}, []string{"Accept"}, true},
		{[]string{`"Cookie"`}, nil, true},
	} {
		names, star := ParseVary(tt.lines)
		if !slices.Equal(names, tt.names) || star != tt.star {
			t.Errorf("%q: %q %v, want %q %v", tt.lines, names, star, tt.names, tt.star)
		}
	}
}

func TestAppendTags(t *testing.T) {
	tags, ok := AppendTags(nil, []string{"a, b%20c,a", "d\te  f/g", ""})
	if !ok || !slices.Equal(tags, []string{"a", "b%20c", "d", "e", "f/g"}) {
		t.Fatalf("%q %v", tags, ok)
	}
	var many []string
	for i := range MaxTags + 1 {
		many = append(many, strings.Repeat("t", i+1))
	}
	if tags, ok := AppendTags(nil, []string{strings.Join(many[:MaxTags], ",")}); !ok || len(tags) != MaxTags {
		t.Fatalf("%d tags: %v", len(tags), ok)
	}
	if _, ok := AppendTags(nil, []string{strings.Join(many, ",")}); ok {
		t.Fatal("one tag too many accepted")
	}
	if _, ok := AppendTags(nil, []string{strings.Repeat("x", MaxTagLen+1)}); ok {
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
		{[]string{"\t\"x\",\t\"a\"\t"}, `"a"`, true},
		{[]string{`"x", "a"`}, `"a"`, true},
		{[]string{`"x"`, `"a"`}, `"a"`, true},
		{[]string{`"a,b"`}, `"a,b"`, true},
		{[]string{`"a,b"`}, `"a"`, false},
		{[]string{`*`}, `"a"`, true},
		{[]string{`*`}, ``, true},  // a representation without an ETag
		{[]string{`*`}, `a`, true}, // or with one that is not an entity-tag
		{[]string{`"a"`}, ``, false},
		{[]string{`a`}, `"a"`, false},
		{[]string{`junk, "a"`}, `"a"`, true},
		{[]string{`"b"`}, `"a"`, false},
		{[]string{`"a"`}, `a`, false}, // a stored ETag that is not one matches nothing
		{[]string{`"a`}, `"a"`, false},
	} {
		if got := ETagMatch(tt.inm, tt.etag); got != tt.want {
			t.Errorf("If-None-Match %q vs %s: %v", tt.inm, tt.etag, got)
		}
	}
}

func TestEntryRoundTrip(t *testing.T) {
	var w Writer
	w.Begin(nil, 0, 203, time.Hour, 2*time.Second, time.Minute, 5*time.Second, 6*time.Second, 2)
	w.Gen(0, 11, 12)
	w.Gen(1, 21, 22)
	w.Field("Content-Type", []byte("text/plain"), false)
	w.Field("Link", nil, true)
	b := w.Finish([]byte("body"))
	var e Entry
	if !Decode(b, &e) {
		t.Fatal("does not decode")
	}
	if _, g := e.Gen(1); e.Status != 203 || e.Stored != time.Hour || e.Age != 2*time.Second || e.Fresh != time.Minute || e.SWR != 5*time.Second || e.SIE != 6*time.Second ||
		string(e.Body) != "body" || e.NumGens() != 2 || g != 22 || e.NFields != 2 {
		t.Fatalf("%+v", e)
	}
	if v, ok := e.Get("Content-Type"); !ok || v != "text/plain" {
		t.Fatalf("Content-Type %q %v", v, ok)
	}
	if v, ok := e.Get("Link"); !ok || v != "" {
		t.Fatalf("Link %q %v", v, ok)
	}
	for i := range len(b) {
		Decode(b[:i], &e) // must not panic
	}
	bad := bytes.Clone(b)
	bad[50] = 3 // one field more than there is
	if Decode(bad, &e) {
		t.Fatal("a miscounted entry decodes")
	}
}

func FuzzCacheControl(f *testing.F) {
	for _, s := range []string{"max-age=60, public", `no-cache="a,b", s-maxage="1"`, "stale-if-error=1,,=,", `x="\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cc := ParseCacheControl([]string{s})
		for _, v := range []int64{cc.MaxAge, cc.SMaxAge, cc.SWR, cc.SIE} {
			if v < -1 || v > MaxDelta {
				t.Fatalf("%q: %+v", s, cc)
			}
		}
		if noStoreNamed(s) != cc.NoStore && !strings.Contains(s, `"`) {
			t.Fatalf("%q: no-store %v", s, cc.NoStore)
		}
	})
}

// noStoreNamed reports whether a Cache-Control value without quotes has a
// no-store directive: as a directive's name, or as one of the parts
// (separated by ';' or blanks) of a directive run together with others.
// A name that only contains it (x-no-store) or a value alone (a=no-store)
// is not one.
func noStoreNamed(s string) bool {
	for _, d := range strings.Split(s, ",") {
		name, value, _ := strings.Cut(d, "=")
		name, value = strings.Trim(name, " \t"), strings.Trim(value, " \t")
		if strings.ToLower(name) == "no-store" {
			return true
		}
		if !strings.ContainsAny(name+value, "; \t") {
			continue
		}
		for _, part := range strings.FieldsFunc(name+";"+value, func(r rune) bool { return r == ';' || r == ' ' || r == '\t' }) {
			n, _, _ := strings.Cut(part, "=")
			if strings.ToLower(n) == "no-store" {
				return true
			}
		}
	}
	return false
}

func FuzzVary(f *testing.F) {
	for _, s := range []string{"Accept-Encoding, user-agent", "*", " ,a ,, B"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names, _ := ParseVary([]string{s})
		if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
			t.Fatalf("%q: %q", s, names)
		}
		for _, n := range names {
			if !route.IsToken(n) || n == "*" {
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
		tags, ok := AppendTags(nil, []string{s})
		if len(tags) > MaxTags {
			t.Fatalf("%d tags", len(tags))
		}
		for _, tag := range tags {
			if tag == "" || strings.ContainsAny(tag, ", \t") || len(tag) > MaxTagLen || !strings.Contains(s, tag) {
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
		got := ETagMatch([]string{inm}, etag)
		if got && !strings.Contains(inm, "*") {
			tag, ok := opaqueTag(httpfield.TrimOWS(etag))
			if !ok || !strings.Contains(inm, `"`+tag+`"`) {
				t.Fatalf("%q matched %q", inm, etag)
			}
		}
	})
}

func FuzzDecodeEntry(f *testing.F) {
	var w Writer
	w.Begin(nil, 0, 200, 1, 2, 3, 4, 5, 1)
	w.Field("A", []byte("b"), false)
	f.Add(w.Finish([]byte("body")))
	f.Fuzz(func(t *testing.T, b []byte) {
		var e Entry
		if !Decode(b, &e) {
			return
		}
		n := 0
		for fl := e.Fields; len(fl) > 0; n++ {
			_, _, _, fl = NextField(fl)
		}
		if n != e.NFields {
			t.Fatalf("%d fields, header says %d", n, e.NFields)
		}
		// What decodes is what the Writer writes from it (in this
		// version).
		var w Writer
		w.Begin(nil, e.Flags, e.Status, e.Stored, e.Age, e.Fresh, e.SWR, e.SIE, e.NumGens())
		for i := range e.NumGens() {
			hash, gen := e.Gen(i)
			w.Gen(i, hash, gen)
		}
		for fl := e.Fields; len(fl) > 0; {
			name, value, hidden, rest := NextField(fl)
			w.Field(name, value, hidden)
			fl = rest
		}
		again := w.Finish(e.Body)
		if want := append([]byte{EntryVersion}, b[1:]...); !bytes.Equal(again, want) {
			t.Fatalf("%x decodes to %+v, which the Writer writes as %x", b, e, again)
		}
	})
}

func TestParseByteRange(t *testing.T) {
	for _, tt := range []struct {
		v           string
		first, last int64
		suffix, ok  bool
	}{
		{"bytes=0-1", 0, 1, false, true},
		{"BYTES = 5 - 9 ", 0, 0, false, false},
		{"bytes=5-", 5, math.MaxInt64, false, true},
		{"bytes=-5", 0, 5, true, true},
		{" bytes=2-2", 2, 2, false, true},
		{"\tbytes=\t2 - 3\t", 2, 3, false, true}, // OWS is SP or HTAB
		{"bytes=3-1", 0, 0, false, false},
		{"bytes=0-1,3-4", 0, 0, false, false},
		{"bytes=-", 0, 0, false, false},
		{"bytes=a-1", 0, 0, false, false},
		{"items=0-1", 0, 0, false, false},
		{"bytes=99999999999999999999-", 0, 0, false, false},
		{"", 0, 0, false, false},
	} {
		first, last, suffix, ok := ParseByteRange(tt.v)
		if ok != tt.ok || ok && (first != tt.first || last != tt.last || suffix != tt.suffix) {
			t.Errorf("%q: %d %d %v %v", tt.v, first, last, suffix, ok)
		}
	}
}

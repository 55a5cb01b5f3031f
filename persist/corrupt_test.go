package persist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
)

var le = binary.LittleEndian

// fixChecksums recomputes every checksum of a (modified) dump that its
// framing lets it find, so that a test or the fuzzer reaches the guards
// behind the checksums.
func fixChecksums(in []byte) []byte {
	b := bytes.Clone(in)
	if len(b) < 16 {
		return b
	}
	n := int(le.Uint32(b[12:]))
	if n < 4 || n > len(b) {
		return b
	}
	le.PutUint32(b[n-4:], crc32.Checksum(b[:n-4], crcTable))
	for off := n; off+frameSize <= len(b); {
		f := b[off : off+frameSize]
		start := off + frameSize
		if l := le.Uint64(f[8:]); l <= uint64(len(b)-start) {
			le.PutUint32(f[16:], crc32.Checksum(b[start:start+int(l)], crcTable))
			off = start + int(l)
		} else {
			off = len(b)
		}
		le.PutUint32(f[20:], crc32.Checksum(f[:20], crcTable))
	}
	return b
}

// offsets of the parts of a dump's first three sections.
type offsets struct{ counters, countersPayload, responses, responsesPayload, cache, cachePayload int }

func offsetsOf(d []byte) offsets {
	n := int(le.Uint32(d[12:]))
	l := int(le.Uint64(d[n+8:]))
	r := n + frameSize + l
	c := r + frameSize + int(le.Uint64(d[r+8:]))
	return offsets{n, n + frameSize, r, r + frameSize, c, c + frameSize}
}

// collidingNames finds two rule names with the same 16-bit tag.
func collidingNames() (string, string) {
	seen := map[uint16]string{}
	for i := 0; ; i++ {
		name := fmt.Sprint("rule", i)
		tag := bucket.Rule{Name: name}.Tag()
		if other, ok := seen[tag]; ok {
			return other, name
		}
		seen[tag] = name
	}
}

func TestCorruption(t *testing.T) {
	good := goodDump(t, "k")
	at := offsetsOf(good)
	flip := func(i int) func([]byte) []byte {
		return func(d []byte) []byte { d[i] ^= 0x10; return d }
	}
	cut := func(n int) func([]byte) []byte { return func(d []byte) []byte { return d[:n] } }
	fixed := func(f func([]byte)) func([]byte) []byte {
		return func(d []byte) []byte { f(d); return fixChecksums(d) }
	}
	addSection := func(d []byte) []byte {
		d = append(d, frame(99, 4, crc32.Checksum([]byte("abcd"), crcTable))...)
		d = append(d, "abcd"...)
		le.PutUint32(d[88:], 3)
		return fixChecksums(d)
	}
	x, y := collidingNames()
	type want struct {
		refused  []string // "what: reason", in order
		detail   string   // in the first refusal's detail
		loaded   bool
		counters int // restored entries when loaded
	}
	cases := []struct {
		name   string
		mutate func([]byte) []byte
		key    string
		rules  []bucket.Rule
		dir    bool
		want   want
	}{
		{name: "intact", want: want{loaded: true, counters: 7}},
		{name: "empty file", mutate: cut(0), want: want{refused: []string{"dump: truncated"}}},
		{name: "truncated in the magic", mutate: cut(5), want: want{refused: []string{"dump: truncated"}}},
		{name: "truncated in the header", mutate: cut(50), want: want{refused: []string{"dump: truncated"}}},
		{name: "truncated in the counters frame", mutate: cut(at.counters + 10), want: want{refused: []string{"section 1: truncated"}}},
		{name: "truncated in the counters", mutate: cut(at.countersPayload + 40), want: want{refused: []string{"counters: truncated"}}},
		{name: "truncated in the responses frame", mutate: cut(at.responses + 5), want: want{refused: []string{"section 2: truncated"}, loaded: true, counters: 7}},
		{name: "truncated in the responses", mutate: cut(at.responsesPayload + 8), want: want{refused: []string{"responses: truncated"}, loaded: true, counters: 7}},
		{name: "bit flip in the header", mutate: flip(40), want: want{refused: []string{"dump: checksum"}}},
		{name: "bit flip in the build string", mutate: flip(headerFixed), want: want{refused: []string{"dump: checksum"}}},
		{name: "bit flip in the counters frame", mutate: flip(at.counters + 9), want: want{refused: []string{"section 1: checksum"}}},
		{name: "bit flip in a counters rule", mutate: flip(at.countersPayload + countersFix + 3), want: want{refused: []string{"counters: checksum"}}},
		{name: "bit flip in a counter entry", mutate: flip(at.responses - 3), want: want{refused: []string{"counters: checksum"}}},
		{name: "bit flip in the responses frame", mutate: flip(at.responses + 2), want: want{refused: []string{"section 2: checksum"}, loaded: true, counters: 7}},
		{name: "bit flip in the responses", mutate: flip(at.responsesPayload + 3), want: want{refused: []string{"responses: checksum"}, loaded: true, counters: 7}},
		{name: "wrong magic", mutate: flip(2), want: want{refused: []string{"dump: bad magic"}}},
		{name: "other format version", mutate: fixed(func(d []byte) { le.PutUint32(d[8:], 2) }), want: want{refused: []string{"dump: format version"}}},
		{name: "other slot size", mutate: fixed(func(d []byte) { le.PutUint32(d[28:], 128) }), want: want{refused: []string{"dump: layout"}}},
		{name: "other byte order", mutate: fixed(func(d []byte) { binary.BigEndian.PutUint64(d[16:], formatByteOrder) }), want: want{refused: []string{"dump: layout"}}},
		{name: "other seed in the counters", mutate: fixed(func(d []byte) { d[at.countersPayload+3] ^= 1 }), want: want{refused: []string{"counters: seed"}}},
		{name: "other seed in the responses", mutate: fixed(func(d []byte) { d[at.responsesPayload+9] ^= 1 }), want: want{refused: []string{"responses: seed"}, loaded: true, counters: 7}},
		// The good dump's cache section holds no entries: its seeds are
		// judged all the same, as inspect judges them.
		{name: "other seed in the cache", mutate: fixed(func(d []byte) { d[at.cachePayload+1] ^= 1 }), want: want{refused: []string{"cache: seed"}, loaded: true, counters: 7}},
		{name: "rule count beyond the payload", mutate: fixed(func(d []byte) { le.PutUint32(d[at.countersPayload+16:], 1<<30) }), want: want{refused: []string{"counters: malformed"}}},
		{name: "rule limit changed", rules: []bucket.Rule{{Name: "login", Limit: 3, Window: login.Window}, api},
			want: want{refused: []string{"rule login: rule changed"}, detail: "limit 1 → 3: its state is dropped", loaded: true, counters: 6}},
		{name: "rule burst changed", rules: []bucket.Rule{{Name: "login", Limit: 1, Burst: 2, Window: login.Window}, api},
			want: want{refused: []string{"rule login: rule changed"}, detail: "burst 1 → 2", loaded: true, counters: 6}},
		{name: "rule algorithm changed", rules: []bucket.Rule{{Name: "login", Limit: 1, Window: login.Window, Algorithm: bucket.FixedWindow}, api},
			want: want{refused: []string{"rule login: rule changed"}, detail: "algorithm gcra → fixed-window", loaded: true, counters: 6}},
		{name: "burst 0 is burst = limit", rules: []bucket.Rule{{Name: "login", Limit: 1, Burst: 1, Window: login.Window}, api},
			want: want{loaded: true, counters: 7}},
		{name: "rule window changed", rules: []bucket.Rule{login, {Name: "api", Limit: 2, Window: 2 * api.Window, Algorithm: bucket.FixedWindow}},
			want: want{refused: []string{"rule api: rule changed"}, detail: "window 1m0s → 2m0s", loaded: true, counters: 1}},
		{name: "rule removed", rules: []bucket.Rule{api}, want: want{refused: []string{"rule login: rule changed"}, detail: "no longer configured", loaded: true, counters: 6}},
		{name: "a new rule keeps the others' state", rules: []bucket.Rule{login, api, {Name: "new", Limit: 9, Window: login.Window}},
			want: want{loaded: true, counters: 7}},
		{name: "tag collision", rules: []bucket.Rule{{Name: x, Limit: 1, Window: login.Window}, login, {Name: y, Limit: 1, Window: login.Window}, api},
			mutate: func([]byte) []byte { return dumpWithRules(t, x, y) },
			want:   want{refused: []string{"rule " + x + ": rule changed", "rule " + y + ": rule changed"}, loaded: true, counters: 7}},
		// The good dump stores no response: another persist.key drops
		// nothing, so it refuses nothing (TestResponsesGuards drops some).
		{name: "other persist key", key: "other", want: want{loaded: true, counters: 7}},
		{name: "unknown section", mutate: addSection, want: want{loaded: true, counters: 7}},
		{name: "no section", mutate: fixed(func(d []byte) { le.PutUint32(d[88:], 0) }),
			want: want{refused: []string{"dump: malformed"}, detail: "no section to restore"}},
		{name: "trailing bytes", mutate: func(d []byte) []byte { return append(d, 1, 2, 3) }, want: want{loaded: true, counters: 7}},
		{name: "a directory", dir: true, want: want{refused: []string{"dump: unreadable"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "dump")
			switch {
			case tc.dir:
				os.Mkdir(path, 0o700)
			case tc.mutate != nil:
				os.WriteFile(path, tc.mutate(bytes.Clone(good)), 0o600)
			default:
				os.WriteFile(path, good, 0o600)
			}
			key, rs := "k", rules
			if tc.key != "" {
				key = tc.key
			}
			if tc.rules != nil {
				rs = tc.rules
			}
			var inspected strings.Builder
			inspectErr := Inspect(path, &inspected)
			b := region(t, 64)
			log, lines := logBuf()
			rep, err := Load(b, Options{Path: path, Key: key, Rules: rs, Now: wallAt(wall0)}, log)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range rep.Refused {
				got = append(got, f.What+": "+string(f.Reason))
				if !strings.Contains(lines.String(), "persist: "+f.What+" refused: "+string(f.Reason)) {
					t.Errorf("no log line for %v:\n%s", f, lines)
				}
			}
			if !slices.Equal(got, tc.want.refused) {
				t.Errorf("refused %q, want %q\n%s", got, tc.want.refused, lines)
			}
			if tc.want.detail != "" && (len(rep.Refused) == 0 || !strings.Contains(rep.Refused[0].Detail, tc.want.detail)) {
				t.Errorf("refusal %v, want detail %q", rep.Refused, tc.want.detail)
			}
			if rep.Loaded != tc.want.loaded || (tc.want.loaded && rep.Counters != tc.want.counters) {
				t.Errorf("loaded=%v with %d entries (dropped %v), want %v with %d", rep.Loaded, rep.Counters, rep.Dropped, tc.want.loaded, tc.want.counters)
			}
			if n := strings.Count(lines.String(), "level=WARN"); n < len(got) {
				t.Errorf("%d warnings for %d refusals", n, len(got))
			}
			if tc.key == "" && tc.rules == nil {
				inspectAgrees(t, inspected.String(), inspectErr, got)
			}
			// The region serves whatever happened.
			lg := limiter(t, b, login)
			if d := lg.Allow("someone new", t1); !d.Allowed {
				t.Errorf("region unusable after the load: %+v", d)
			}
			restored := tc.want.loaded && !slices.Contains(tc.want.refused, "rule login: rule changed")
			if d := lg.Allow("c", t1); d.Allowed == restored {
				t.Errorf("limited client allowed=%v, restored=%v", d.Allowed, restored)
			}
			if tc.dir {
				if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
					t.Error("the directory was moved")
				}
			} else if _, err := os.Stat(path); err == nil {
				t.Error("the dump was not consumed")
			} else if !rep.Loaded && !strings.Contains(lines.String(), "moved_to="+path+SuffixRefused) {
				// Nothing of it loaded: the operator is told where it went.
				t.Errorf("the dump refused whole went to %q unsaid:\n%s", rep.MovedTo, lines)
			}
		})
	}
}

// inspectAgrees checks that Inspect judged a dump as the load did: out
// and err are what it said, refused the load's refusals ("what: reason"),
// each of which it must name, with ErrRefused exactly when there is one.
// Guards that depend on the configuration are the load's alone: rows that
// change the configuration do not ask.
func inspectAgrees(t *testing.T, out string, err error, refused []string) {
	t.Helper()
	if len(refused) == 0 {
		if err != nil {
			t.Errorf("inspect: %v, the load refused nothing\n%s", err, out)
		}
		return
	}
	if !errors.Is(err, ErrRefused) {
		t.Errorf("inspect: %v, want ErrRefused as the load refused %q\n%s", err, refused, out)
	}
	for _, f := range refused {
		if !strings.Contains(out, f) {
			t.Errorf("inspect does not name %q\n%s", f, out)
		}
	}
}

// dumpWithRules dumps the good state with rules x and y (which share a tag)
// configured beside login and api.
func dumpWithRules(t testing.TB, x, y string) []byte {
	a := region(t, 64)
	exhaust(t, a, "c")
	la := limiter(t, a, api)
	for i := 0; i < 5; i++ {
		la.Allow(fmt.Sprint("other", i), t1)
	}
	limiter(t, a, bucket.Rule{Name: x, Limit: 1, Window: login.Window}).Allow("c", t1)
	path := filepath.Join(t.TempDir(), "dump")
	rs := []bucket.Rule{{Name: x, Limit: 1, Window: login.Window}, login, {Name: y, Limit: 1, Window: login.Window}, api}
	st := dumpTo(t, a, Options{Path: path, Key: "k", Rules: rs, Now: wallAt(wall0)})
	if st.Unowned != 1 {
		t.Fatalf("an entry of a shared tag was dumped: %+v", st)
	}
	d, _ := os.ReadFile(path)
	return d
}

// TestForeignEntries: entries that no dumped rule owns (crafted, or from
// a writer that did not filter them) are dropped, each counted.
func TestForeignEntries(t *testing.T) {
	good := goodDump(t, "k")
	at := offsetsOf(good)
	for name, mutate := range map[string]func(entry []byte){
		"other window":         func(e []byte) { le.PutUint64(e[16:], le.Uint64(e[16:])+1) },
		"unknown tag":          func(e []byte) { le.PutUint64(e[16:], le.Uint64(e[16:])^1<<63) },
		"payload over 48 bits": func(e []byte) { le.PutUint64(e[24:], 1<<48) },
	} {
		d := bytes.Clone(good)
		mutate(d[at.responses-entrySize : at.responses])
		path := filepath.Join(t.TempDir(), "dump")
		os.WriteFile(path, fixChecksums(d), 0o600)
		rep, err := Load(region(t, 64), Options{Path: path, Key: "k", Rules: rules, Now: wallAt(wall0)}, quiet)
		if err != nil || !rep.Loaded || rep.Counters != 6 || rep.Dropped[DropNoRule] != 1 {
			t.Errorf("%s: %+v, %v", name, rep, err)
		}
	}
}

// A large file of another kind at the dump's path is refused for its
// magic from its first bytes, by Load and Inspect alike, never read whole
// (64 GiB here, sparse: reading it would not fit in memory).
func TestLargeForeignFileNotRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dump")
	if err := os.WriteFile(path, []byte("NOTADUMP and more"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 64<<30); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := Inspect(path, &out); !errors.Is(err, ErrRefused) || !strings.Contains(out.String(), string(ReasonMagic)) {
		t.Errorf("Inspect: %v\n%s", err, out.String())
	}
	log, _ := logBuf()
	rep, err := Load(region(t, 64), Options{Path: path, Key: "k"}, log)
	if err != nil || rep.Loaded || len(rep.Refused) != 1 || rep.Refused[0].Reason != ReasonMagic {
		t.Errorf("Load: %+v, %v; want refused for its magic", rep, err)
	}
}

// A dump followed by a large run of bytes that are no part of it (a
// sparse file extended by a truncate, a copy gone wrong) is read only as
// far as its header and frames say: its sections load, the rest is
// counted as trailing and never read into memory. A file of 200 GiB
// with a dump's magic made Load and Inspect allocate its whole size,
// and the daemon die at start with "out of memory".
func TestLongTailNotRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dump")
	good := goodDump(t, "k")
	writeFile(t, path, good)
	const tail = 256 << 20
	if err := os.Truncate(path, int64(len(good))+tail); err != nil {
		t.Fatal(err)
	}
	allocated := func(f func()) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	var out bytes.Buffer
	var ierr error
	if n := allocated(func() { ierr = Inspect(path, &out) }); n > tail/4 {
		t.Errorf("Inspect allocated %d bytes for a %d-byte dump", n, len(good))
	}
	if ierr != nil || !strings.Contains(out.String(), fmt.Sprintf("%d bytes after the last section", tail)) {
		t.Errorf("Inspect: %v\n%s", ierr, out.String())
	}
	var rep Report
	var lerr error
	n := allocated(func() {
		rep, lerr = Load(region(t, 64), Options{Path: path, Key: "k", Rules: rules, Now: wallAt(wall0.Add(time.Second))}, quiet)
	})
	if n > tail/4 {
		t.Errorf("Load allocated %d bytes for a %d-byte dump", n, len(good))
	}
	if lerr != nil || !rep.Loaded || rep.Counters == 0 {
		t.Errorf("Load: %+v, %v", rep, lerr)
	}
}

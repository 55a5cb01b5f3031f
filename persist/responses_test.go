package persist

import (
	"bytes"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

func responseRegion(t testing.TB) *shm.Region {
	t.Helper()
	r, err := shm.CreatePrivate(shm.Options{Counters: 64, MaxWorkers: 8, Responses: 64, ResponseBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	r.SetNow(t1)
	if err := r.Join(1); err != nil {
		t.Fatal(err)
	}
	return r
}

var (
	created = shm.Response{Status: 201, ContentType: "application/json", Location: "/orders/1", Body: []byte(`{"id":1}`)}
	fp1     = shm.Fingerprint{1}
	fp2     = shm.Fingerprint{2}
	kDone   = shm.Key{A: 11, B: 1} // completed, replayable for an hour
	kBig    = shm.Key{A: 12, B: 2} // completed, not replayable
	kFlight = shm.Key{A: 13, B: 3} // reserved, never completed
	kShort  = shm.Key{A: 14, B: 4} // completed, replayable for a minute
)

// redumper makes a response region with client c's counters exhausted
// and its table filled by fill. It returns the region and a function that
// dumps it, with persist key v1, to one path in a temporary directory and
// returns that path: each call writes a fresh dump for a subtest to load
// or corrupt.
func redumper(t *testing.T, fill func(testing.TB, *shm.Region)) (*shm.Region, func() string) {
	a := responseRegion(t)
	exhaust(t, a, "c")
	fill(t, a)
	dir := t.TempDir()
	return a, func() string {
		p := filepath.Join(dir, "dump")
		dumpTo(t, a, Options{Path: p, Key: "v1", Rules: rules, Now: wallAt(wall0)})
		return p
	}
}

// storedResponses fills r's response table with one record of each kind.
func storedResponses(t testing.TB, r *shm.Region) {
	t.Helper()
	tab := r.Responses()
	for _, c := range []struct {
		k    shm.Key
		resp *shm.Response
		ttl  time.Duration
	}{{kDone, &created, time.Hour}, {kBig, nil, time.Hour}, {kFlight, nil, 0}, {kShort, &created, time.Minute}} {
		var scratch shm.Response
		out, tk, err := tab.Begin(c.k, shm.Quota{}, shm.Quota{}, fp1, t1, &scratch)
		if err != nil || out != shm.Reserved {
			t.Fatalf("begin %v: %v %v", c.k, out, err)
		}
		if c.ttl > 0 {
			if _, err := tab.Complete(tk, c.resp, t1, c.ttl); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestResponsesRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dump")
	a := responseRegion(t)
	exhaust(t, a, "c")
	storedResponses(t, a)
	st := dumpTo(t, a, Options{Path: path, Key: "v1", Rules: rules, Now: wallAt(wall0)})
	if st.Responses != 3 || st.Entries != 2 { // api's window rolls over the downtime below
		t.Fatalf("dumped %+v, want 3 responses (the one in flight is not) and 2 entries", st)
	}

	b := responseRegion(t)
	b.SetNow(0)
	rep, err := Load(b, Options{Path: path, Key: "v1", Rules: rules, Now: wallAt(wall0.Add(10 * time.Minute))}, quiet)
	if err != nil || !rep.Loaded || rep.Responses != 2 || rep.DroppedResponses[DropExpired] != 1 || rep.Counters != 1 {
		t.Fatalf("%+v, %v", rep, err)
	}
	if err := b.Join(1); err != nil { // Load claims nothing as a worker: this process joins to serve
		t.Fatal(err)
	}
	tab := b.Responses()
	now := rep.RegionTime
	var got shm.Response
	if out, _, err := tab.Begin(kDone, shm.Quota{}, shm.Quota{}, fp1, now, &got); err != nil || out != shm.Replay || !reflect.DeepEqual(got, created) {
		t.Errorf("replay after the restart: %v %v %+v", out, err, got)
	}
	if out, _, err := tab.Begin(kDone, shm.Quota{}, shm.Quota{}, fp2, now, &got); err != nil || out != shm.Mismatch {
		t.Errorf("other fingerprint after the restart: %v %v", out, err)
	}
	if out, _, err := tab.Begin(kBig, shm.Quota{}, shm.Quota{}, fp1, now, &got); err != nil || out != shm.Unreplayable {
		t.Errorf("unreplayable after the restart: %v %v", out, err)
	}
	for _, k := range []shm.Key{kFlight, kShort} {
		if out, _, err := tab.Begin(k, shm.Quota{}, shm.Quota{}, fp1, now, &got); err != nil || out != shm.Reserved {
			t.Errorf("%v after the restart: %v %v, want a fresh reservation", k, out, err)
		}
	}
	// The response keeps its TTL across the restart: replayable until
	// an hour after it was stored, downtime included.
	if out, _, _ := tab.Begin(kDone, shm.Quota{}, shm.Quota{}, fp1, t1+time.Hour-time.Second, &got); out != shm.Replay {
		t.Errorf("before its expiry: %v", out)
	}
}

func TestResponsesGuards(t *testing.T) {
	a, dump := redumper(t, storedResponses)
	t.Run("persist key changed", func(t *testing.T) {
		log, lines := logBuf()
		rep, err := Load(responseRegion(t), Options{Path: dump(), Key: "v2", Rules: rules, Now: wallAt(wall0)}, log)
		if err != nil || rep.Responses != 0 || rep.Counters != 2 || len(rep.Refused) != 1 || rep.Refused[0].Reason != ReasonKeyChanged {
			t.Fatalf("%+v, %v", rep, err)
		}
		if !strings.Contains(lines.String(), "3 stored responses dropped; counters are kept") {
			t.Errorf("log:\n%s", lines)
		}
	})
	t.Run("no response table", func(t *testing.T) {
		log, lines := logBuf()
		rep, err := Load(region(t, 64), Options{Path: dump(), Key: "v1", Rules: rules, Now: wallAt(wall0)}, log)
		if err != nil || rep.Responses != 0 || rep.Counters != 2 || rep.DroppedResponses[DropNoTable] != 3 {
			t.Fatalf("%+v, %v", rep, err)
		}
		if !strings.Contains(lines.String(), "no response table") {
			t.Errorf("log:\n%s", lines)
		}
	})
	t.Run("all expired", func(t *testing.T) {
		rep, err := Load(responseRegion(t), Options{Path: dump(), Key: "v1", Rules: rules, Now: wallAt(wall0.Add(3 * time.Hour))}, quiet)
		if err != nil || rep.Responses != 0 || rep.DroppedResponses[DropExpired] != 3 {
			t.Fatalf("%+v, %v", rep, err)
		}
	})
	t.Run("counters refused, responses kept", func(t *testing.T) {
		p := dump()
		d := readFile(t, p)
		at := offsetsOf(d)
		d[at.countersPayload+30] ^= 1
		writeFile(t, p, d)
		b := responseRegion(t)
		rep, err := Load(b, Options{Path: p, Key: "v1", Rules: rules, Now: wallAt(wall0)}, quiet)
		if err != nil || !rep.Loaded || rep.Counters != 0 || rep.Responses != 3 {
			t.Fatalf("%+v, %v", rep, err)
		}
		// The region took the dump's seeds for the responses' keys.
		s1, s2 := a.Seeds()
		if b1, b2 := b.Seeds(); b1 != s1 || b2 != s2 {
			t.Fatal("seeds not adopted")
		}
	})
	t.Run("record overruns its section", func(t *testing.T) {
		p := dump()
		d := readFile(t, p)
		at := offsetsOf(d)
		le.PutUint32(d[at.responsesPayload+responsesFix+68:], 1<<20) // body length of the first record
		writeFile(t, p, fixChecksums(d))
		rep, err := Load(responseRegion(t), Options{Path: p, Key: "v1", Rules: rules, Now: wallAt(wall0)}, quiet)
		if err != nil || rep.Counters != 2 || len(rep.Refused) != 1 || !strings.HasPrefix(rep.Refused[0].String(), "responses: malformed: record 1 overruns the payload") {
			t.Fatalf("%+v, %v", rep, err)
		}
	})
	t.Run("inspect", func(t *testing.T) {
		var out bytes.Buffer
		if err := Inspect(dump(), &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "3 stored responses (1 not replayable, 0 expired at dump), 16 body bytes") {
			t.Errorf("inspect:\n%s", out.String())
		}
	})
}

// A stored response's content coding survives the restart: a gzip body
// replayed without its Content-Encoding cannot be read.
func TestResponsesKeepContentEncoding(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dump")
	a := responseRegion(t)
	gz := shm.Response{Status: 201, ContentType: "application/json", Location: "/orders/2", ContentEncoding: "gzip",
		Body: []byte("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")}
	tab := a.Responses()
	var scratch shm.Response
	out, tk, err := tab.Begin(kDone, shm.Quota{}, shm.Quota{}, fp1, t1, &scratch)
	if err != nil || out != shm.Reserved {
		t.Fatalf("begin: %v %v", out, err)
	}
	if _, err := tab.Complete(tk, &gz, t1, time.Hour); err != nil {
		t.Fatal(err)
	}
	dumpTo(t, a, Options{Path: path, Key: "v1", Rules: rules, Now: wallAt(wall0)})

	b := responseRegion(t)
	b.SetNow(0)
	rep, err := Load(b, Options{Path: path, Key: "v1", Rules: rules, Now: wallAt(wall0.Add(time.Minute))}, quiet)
	if err != nil || rep.Responses != 1 {
		t.Fatalf("%+v, %v", rep, err)
	}
	var got shm.Response
	if out, _, err := b.Responses().Begin(kDone, shm.Quota{}, shm.Quota{}, fp1, rep.RegionTime, &got); err != nil || out != shm.Replay || !reflect.DeepEqual(got, gz) {
		t.Fatalf("replay after the restart: %v %v %+v, want %+v", out, err, got, gz)
	}
}

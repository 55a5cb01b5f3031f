package core_test

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
)

// A range of a large entry (streamed) comes whole as the entry was when
// the lookup served it, whatever becomes of the entry before or while it
// is read, and so does another request's of the same entry, from the
// same copy. (Only an entry that changes between the lookup and that
// copy, a moment no test reaches, is cut: ErrBodyCut.)
func TestCacheStreamedRangeIsTheEntryAsServed(t *testing.T) {
	c, _ := storyCore(t, "")
	body := make([]byte, 300<<10)
	for i := range body {
		body[i] = byte(i*7 + i>>9)
	}
	a := &app{t: t}
	fillR := func() {
		t.Helper()
		a.resps = append(a.resps, fakeResp{status: 200, body: body, header: hdr("Cache-Control", "max-age=600")})
		serve(c, newReq("GET", "/r", "192.0.2.1", "Host", "h"), a.serve)
		if r := serve(c, newReq("HEAD", "/r", "192.0.2.1", "Host", "h"), a.serve); r.get("X-Cache") != "HIT" {
			t.Fatalf("not stored: %+v", r)
		}
	}
	// change replaces /r: an unsafe request invalidates it, and the next
	// GET drops it (its record changes) and stores it again.
	change := func() {
		t.Helper()
		a.resps = append(a.resps, fakeResp{status: 200})
		serve(c, newReq("POST", "/r", "192.0.2.1", "Host", "h"), a.serve)
		fillR()
	}
	stream := func(rng string) (*core.Exchange, core.BodyStream) {
		t.Helper()
		ex := c.Begin(newReq("GET", "/r", "192.0.2.1", "Host", "h", "Range", rng))
		if decideNow(ex) != core.Respond {
			t.Fatal("not answered from the cache")
		}
		resp := ex.Response()
		if resp.Status != 206 || resp.Stream == nil {
			t.Fatalf("%s: %d, streamed %v", rng, resp.Status, resp.Stream != nil)
		}
		return ex, resp.Stream
	}
	fillR()

	// The copy is taken as the lookup serves the entry: one that changes
	// before the engine reads the first piece (a refresh that lands
	// while the head is sent) changes nothing of what is sent.
	for _, rng := range []struct {
		spec     string
		from, to int
	}{{"bytes=0-99", 0, 100}, {"bytes=-100", len(body) - 100, len(body)}, {"bytes=70000-70099", 70000, 70100}} {
		ex, st := stream(rng.spec)
		change()
		if p, err := st.Next(); err != nil || !bytes.Equal(p, body[rng.from:rng.to]) {
			t.Errorf("%s, its entry changed before it was read: %d bytes, %v; want the range as it was", rng.spec, len(p), err)
		}
		ex.Finish(nil)
	}

	ex, st := stream("bytes=100-")
	p, err := st.Next()
	if err != nil || !bytes.Equal(p, body[100:100+len(p)]) || len(p) == 0 {
		t.Fatalf("first piece: %d bytes, %v, the entry's %v", len(p), err, bytes.Equal(p, body[100:100+len(p)]))
	}
	other, ost := stream("bytes=0-")
	got := append([]byte(nil), p...)
	change()
	for {
		p, err := st.Next()
		if err != nil {
			if err != io.EOF {
				t.Errorf("after the change: %v, want io.EOF", err)
			}
			break
		}
		got = append(got, p...)
	}
	if !bytes.Equal(got, body[100:]) {
		t.Errorf("%d bytes came, not the range as the entry was", len(got))
	}
	if st.Sent() != len(body)-100 {
		t.Errorf("Sent %d, want %d", st.Sent(), len(body)-100)
	}
	// Begun before the change, first read after it, while the first
	// holds its copy: it shares it (the same record and state).
	var all []byte
	for {
		p, err := ost.Next()
		if err != nil {
			break
		}
		all = append(all, p...)
	}
	if !bytes.Equal(all, body) {
		t.Errorf("the second stream of the changed entry: %d bytes, not the entry as it was", len(all))
	}
	other.Finish(nil)
	ex.Finish(nil)

	// Unchanged, a range comes whole, and then io.EOF.
	ex, st = stream("bytes=65535-65536")
	p, err = st.Next()
	if err != nil || !bytes.Equal(p, body[65535:65537]) {
		t.Errorf("across the piece edge: %q, %v", p, err)
	}
	if _, err := st.Next(); err != io.EOF {
		t.Errorf("after the range: %v, want io.EOF", err)
	}
	ex.Finish(nil)
}

// drain reads what a streamed answer sends.
func drain(t *testing.T, st core.BodyStream) []byte {
	t.Helper()
	var all []byte
	for {
		p, err := st.Next()
		if err == io.EOF {
			return all
		}
		if err != nil {
			t.Fatalf("the stream: %v after %d bytes", err, len(all))
		}
		all = append(all, p...)
	}
}

// A large entry whose head is over headPart (16 KiB) is found in two
// lookups, the head's length read in the first. One replaced between them
// by an entry with a longer head is the new entry, served: neither a
// miss nor an eviction of the good entry another client stored.
func TestCacheLongHeadReplacedBetweenLookups(t *testing.T) {
	c, _ := storyCore(t, "")
	a := &app{t: t}
	entry := func(pad int, b byte) fakeResp {
		return fakeResp{status: 200, body: bytes.Repeat([]byte{b}, 100<<10),
			header: hdr("Cache-Control", "max-age=600", "X-Pad", strings.Repeat("p", pad))}
	}
	fillH := func(r fakeResp) {
		t.Helper()
		a.resps = append(a.resps, r)
		serve(c, newReq("GET", "/h", "192.0.2.1", "Host", "h"), a.serve)
		if r := serve(c, newReq("HEAD", "/h", "192.0.2.1", "Host", "h"), a.serve); r.get("X-Cache") != "HIT" {
			t.Fatalf("not stored: %d %s", r.status, r.get("X-Cache"))
		}
	}
	fillH(entry(17<<10, 'a'))
	replaced := false
	core.SetTestHook(t.Cleanup, func(stage string) {
		if stage != "head" || replaced {
			return
		}
		replaced = true
		// Another client's: an unsafe request invalidates /h, and the
		// next GET stores it again, with a longer head.
		a.resps = append(a.resps, fakeResp{status: 200})
		serve(c, newReq("POST", "/h", "192.0.2.1", "Host", "h"), a.serve)
		fillH(entry(20<<10, 'b'))
	})
	ex := c.Begin(newReq("GET", "/h", "192.0.2.1", "Host", "h"))
	v := decideNow(ex)
	if !replaced {
		t.Fatal("the hook did not run: no second lookup")
	}
	if v != core.Respond {
		ex.Finish(nil)
		t.Fatalf("the entry replaced between the lookups: %v (a miss), want the new entry served", v)
	}
	resp := ex.Response()
	got := answerOf(resp)
	if got.status != 200 || got.get("X-Cache") != "HIT" || len(got.get("X-Pad")) != 20<<10 || resp.Stream == nil {
		t.Fatalf("served: %d %s, X-Pad of %d bytes, streamed %v; want the new entry", got.status, got.get("X-Cache"), len(got.get("X-Pad")), resp.Stream != nil)
	}
	if body := drain(t, resp.Stream); !bytes.Equal(body, entry(0, 'b').body) {
		t.Errorf("the body: %d bytes, not the new entry's", len(body))
	}
	ex.Finish(nil)
	if r := serve(c, newReq("HEAD", "/h", "192.0.2.1", "Host", "h"), a.serve); r.get("X-Cache") != "HIT" {
		t.Errorf("the new entry after the lookup: %d %s, want a HIT (it was evicted)", r.status, r.get("X-Cache"))
	}
}

// An event loop decides with NoWait: its other connections wait while it
// decides. One that meets a large entry another goroutine of its worker
// is copying makes a copy of its own rather than wait for that one (held
// here by the test hook): it is answered while the other copy is still
// being made, and so is the other, from its copy, once done.
func TestCacheLoopNeverWaitsForAnotherCopy(t *testing.T) {
	c, _ := storyCore(t, "")
	a := &app{t: t}
	body := bytes.Repeat([]byte("0123456789abcdef"), 9<<10) // 144 KiB: streamed
	a.resps = append(a.resps, fakeResp{status: 200, body: body, header: hdr("Cache-Control", "max-age=600")})
	serve(c, newReq("GET", "/big", "192.0.2.1", "Host", "h"), a.serve)

	held, release := make(chan struct{}), make(chan struct{})
	var copies atomic.Int32
	core.SetTestHook(t.Cleanup, func(stage string) {
		if stage == "copy" && copies.Add(1) == 1 {
			close(held)
			<-release
		}
	})
	released := sync.OnceFunc(func() { close(release) })
	defer released()

	// A goroutine of the worker (a net/http connection's) copies first,
	// and is held there.
	first := make(chan []byte, 1)
	go func() {
		ex := c.Begin(newReq("GET", "/big", "192.0.2.1", "Host", "h"))
		var got []byte
		if ex.Decide() == core.Respond && ex.Response().Stream != nil {
			got = drain(t, ex.Response().Stream)
		}
		ex.Finish(nil)
		first <- got
	}()
	<-held

	// The loop's request meanwhile.
	done := make(chan core.Verdict, 1)
	ex := c.Begin(newReq("GET", "/big", "192.0.2.1", "Host", "h"))
	go func() {
		ex.NoWait(true)
		done <- ex.Decide()
	}()
	select {
	case v := <-done:
		resp := ex.Response()
		if v != core.Respond || resp.Stream == nil {
			t.Fatalf("the loop's request: %v, streamed %v; want the entry", v, resp.Stream != nil)
		}
		if got := drain(t, resp.Stream); !bytes.Equal(got, body) {
			t.Errorf("the loop's copy: %d bytes, not the entry's", len(got))
		}
	case <-time.After(10 * time.Second):
		released()
		<-done
		t.Fatal("the loop's request waited for another goroutine's copy of the entry: its loop stalled")
	}
	ex.Finish(nil)
	released()
	if got := <-first; !bytes.Equal(got, body) {
		t.Errorf("the first copy's request: %d bytes, not the entry's", len(got))
	}
}

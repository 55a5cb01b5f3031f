package core_test

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/shm"
)

// entries is a core.AccessLog that keeps copies of what it is given.
type entries struct {
	mu   sync.Mutex
	list []core.AccessEntry
}

func (l *entries) Log(e *core.AccessEntry) {
	c := *e
	c.RequestID = bytes.Clone(e.RequestID)
	c.Method, c.Path, c.Query = string([]byte(c.Method)), string([]byte(c.Path)), string([]byte(c.Query))
	l.mu.Lock()
	l.list = append(l.list, c)
	l.mu.Unlock()
}

func (l *entries) last(t *testing.T) core.AccessEntry {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.list) == 0 {
		t.Fatal("no access entry")
	}
	return l.list[len(l.list)-1]
}

// One entry per request, when it ends, saying what the access log says:
// the client, the request, the answer and its size, which rule refused
// it, what the cache did, how long it took and how much of that was the
// application's.
func TestAccessEntries(t *testing.T) {
	var clock time.Duration = time.Hour
	log := &entries{}
	r := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 1 << 20})
	c, err := core.New(r, core.Options{
		RequestID: "X-Request-Id",
		AccessLog: log,
		RateLimits: []core.RateLimit{{Rule: bucket.Rule{Name: "once", Limit: 1, Window: time.Hour},
			Route: mustRoute(t, "/limited")}},
		Caches: core.CacheBlocks(core.Cache{Route: mustRoute(t, "/cached/*", "GET", "HEAD"), TTL: time.Hour, MaxBody: 1 << 20}),
		Now:    func() time.Duration { clock += time.Millisecond; return clock },
		Wall:   func() time.Time { return time.Unix(1700000000, 0) },
	})
	if err != nil {
		t.Fatal(err)
	}
	app := func(body string, hdr ...core.Field) func(core.Forward) fakeResp {
		return func(core.Forward) fakeResp {
			clock += 20 * time.Millisecond // the application's time
			return fakeResp{status: 200, body: []byte(body), header: hdr}
		}
	}
	cacheable := core.Field{Name: "Cache-Control", Value: []byte("max-age=60")}

	serve(c, newReq("GET", "/p", "192.0.2.9", "X-Request-Id", "r1", "User-Agent", "ua/1", "Referer", "https://ref/"), app("hello"))
	e := log.last(t)
	if e.Method != "GET" || e.Path != "/p" || e.Status != 200 || e.Bytes != 5 || e.Client.String() != "192.0.2.9" ||
		string(e.RequestID) != "r1" || e.UserAgent != "ua/1" || e.Referer != "https://ref/" || e.Rule != "" || e.Cache != "" ||
		e.Time != time.Unix(1700000000, 0) || e.Worker != 0 || e.Proto != "HTTP/1.1" {
		t.Errorf("pass: %+v", e)
	}
	if e.Upstream < 20*time.Millisecond || e.Duration < e.Upstream {
		t.Errorf("pass: upstream %v, duration %v; want the application's 20ms within the duration", e.Upstream, e.Duration)
	}

	serve(c, newReq("GET", "/limited?x=1", "192.0.2.9"), app("ok"))
	serve(c, newReq("GET", "/limited?x=2", "192.0.2.9"), app("ok"))
	e = log.last(t)
	if e.Status != 429 || e.Rule != "once" || e.Upstream >= 0 || e.Query != "x=2" || e.Bytes == 0 || len(e.RequestID) != 32 {
		t.Errorf("refusal: %+v", e)
	}

	serve(c, newReq("GET", "/cached/a", "192.0.2.9"), app("stored body", cacheable))
	if e = log.last(t); e.Cache != "MISS" || e.Upstream < 0 || e.Bytes != 11 {
		t.Errorf("miss: %+v", e)
	}
	serve(c, newReq("GET", "/cached/a", "192.0.2.9"), app("never"))
	if e = log.last(t); e.Cache != "HIT" || e.Upstream >= 0 || e.Bytes != 11 || e.Status != 200 {
		t.Errorf("hit: %+v", e)
	}
	serve(c, newReq("HEAD", "/cached/a", "192.0.2.9"), app("never"))
	if e = log.last(t); e.Cache != "HIT" || e.Bytes != 0 {
		t.Errorf("HEAD hit: %+v", e)
	}

	// A refusal to HEAD sends the problem's header section alone: no
	// body byte (nginx's $body_bytes_sent is 0 there too).
	serve(c, newReq("HEAD", "/limited", "192.0.2.9"), app("ok"))
	if e = log.last(t); e.Status != 429 || e.Bytes != 0 {
		t.Errorf("HEAD refusal: %+v", e)
	}
	// Revalidated: the entry says what X-Cache says (a value the log's
	// table once lacked, which panicked).
	etag := core.Field{Name: "Etag", Value: []byte(`"v1"`)}
	serve(c, newReq("GET", "/cached/nc", "192.0.2.9"), app("stored", core.Field{Name: "Cache-Control", Value: []byte("no-cache")}, etag))
	serve(c, newReq("GET", "/cached/nc", "192.0.2.9"), func(core.Forward) fakeResp { return fakeResp{status: 304, header: []core.Field{etag}} })
	if e = log.last(t); e.Cache != "REVALIDATED" || e.Status != 200 || e.Bytes != 6 {
		t.Errorf("revalidated: %+v", e)
	}

	serve(c, newReq("GET", "/down", "192.0.2.9"), func(core.Forward) fakeResp { return fakeResp{none: true} })
	if e = log.last(t); e.Status != 502 || e.Upstream < 0 || e.Bytes == 0 {
		t.Errorf("upstream down: %+v", e)
	}
	if n := len(log.list); n != 10 {
		t.Errorf("%d entries for 10 requests", n)
	}
}

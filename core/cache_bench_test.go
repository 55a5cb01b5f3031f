package core_test

import (
	"bytes"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// cacheCore is a core with one cache block over every path, on a private
// region, with the response for every URL stored by a first miss: a 4 KiB
// body and the fields a typical application sends.
func cacheCore(b testing.TB, urls int) (*core.Core, []*fakeReq) {
	b.Helper()
	r := joinedRegion(b, shm.Options{Counters: 64, Responses: 4096, ResponseBytes: 64 << 20})
	rt, err := route.Compile("/*", []string{"GET", "HEAD"})
	if err != nil {
		b.Fatal(err)
	}
	var clock atomic.Int64
	c, err := core.New(r, core.Options{
		Caches: core.CacheBlocks(core.Cache{Route: rt, TTL: time.Hour, MaxBody: 1 << 20, LockTimeout: time.Second}),
		Now:    func() time.Duration { return time.Hour + time.Duration(clock.Add(1)) },
	})
	if err != nil {
		b.Fatal(err)
	}
	body := bytes.Repeat([]byte("0123456789abcdef"), 256)
	hdr := fakeHeader{
		{Name: "Content-Type", Value: []byte("text/html; charset=utf-8")},
		{Name: "Cache-Control", Value: []byte("public, max-age=600")},
		{Name: "Etag", Value: []byte(`"5f2b-18c"`)},
		{Name: "Last-Modified", Value: []byte("Sat, 01 Mar 2025 12:00:00 GMT")},
		{Name: "Vary", Value: []byte("Accept-Encoding")},
		{Name: "Date", Value: []byte(time.Now().UTC().Format(time.RFC1123))},
	}
	var reqs []*fakeReq
	for i := range urls {
		req := newReq("GET", "/articles/"+strconv.Itoa(i)+"?page=1", "192.0.2.1",
			"Host", "example.com", "Accept-Encoding", "gzip, br", "User-Agent", "bench")
		ex := c.Begin(req)
		if ex.Decide() != core.Pass {
			b.Fatal("the first request is not a miss")
		}
		if ex.Head(200, hdr) != nil {
			b.Fatal("Head replaced a 200")
		}
		ex.Body(body)
		ex.Finish(nil)
		reqs = append(reqs, req)
	}
	return c, reqs
}

// BenchmarkCacheHit: the cache stage answering a GET from the region: the
// path checks, the primary key, the vary stub, the variant's lookup and
// copy (4 KiB body, checksum), the generation checks and the answer's
// fields. The engine's write is not in it.
func BenchmarkCacheHit(b *testing.B) {
	c, reqs := cacheCore(b, 64)
	run := func(b *testing.B, i *int) {
		req := reqs[*i%len(reqs)]
		*i++
		ex := c.Begin(req)
		if ex.Decide() != core.Respond {
			b.Fatal("not a hit")
		}
		if resp := ex.Response(); resp.Status != 200 || len(resp.Body) != 4096 {
			b.Fatalf("hit: %d, %d bytes", resp.Status, len(resp.Body))
		}
		ex.Finish(nil)
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(4096)
		i := 0
		for b.Loop() {
			run(b, &i)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(4096)
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				run(b, &i)
			}
		})
	})
}

package shm_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// The costs of taking and giving back blocks: each fill stores a chain
// of three blocks and drops the key's previous entry (its chain freed);
// each completion stores one and reuses an expired record (its chain
// freed); lookups and replays copy one out.

func benchTable(b *testing.B) (*shm.Region, []shm.Key) {
	r := shmtest.Joined(b, shm.Options{Counters: 1024, Responses: 1024, ResponseBytes: 1024 * 4096, BlockSize: 4096})
	keys := make([]shm.Key, 64)
	for i := range keys {
		keys[i] = r.Counters().KeyOf(9, []byte(fmt.Sprint("bench-", i)))
	}
	return r, keys
}

func BenchmarkCacheFill(b *testing.B) {
	r, keys := benchTable(b)
	tab := r.Responses()
	data := bytes.Repeat([]byte("0123456789abcdef"), 700) // 11,200 bytes: 3 blocks
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now := r.Now()
		tk, held, err := tab.CacheLock(keys[i%len(keys)], now)
		if err != nil || !held {
			b.Fatal(err, held)
		}
		if ok, err := tab.CacheFill(tk, data, now+time.Hour, now); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

func BenchmarkCacheLookup(b *testing.B) {
	r, keys := benchTable(b)
	tab := r.Responses()
	data := bytes.Repeat([]byte("0123456789abcdef"), 700)
	for _, k := range keys {
		now := r.Now()
		tk, _, _ := tab.CacheLock(k, now)
		tab.CacheFill(tk, data, now+time.Hour, now)
	}
	buf := make([]byte, 0, len(data))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		f, err := tab.CacheLookup(keys[i%len(keys)], r.Now(), buf)
		if err != nil || f.Data == nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkResponsesCompleteReplay(b *testing.B) {
	r, keys := benchTable(b)
	tab := r.Responses()
	resp := &shm.Response{Status: 201, Body: bytes.Repeat([]byte("x"), 2000)}
	var got shm.Response
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := keys[i%len(keys)]
		now := time.Duration(i) * time.Millisecond // expired when the key comes back
		out, tk, err := tab.Begin(k, shm.Quota{}, shm.Quota{}, shm.Fingerprint{}, now, &got)
		if err != nil || out != shm.Reserved {
			b.Fatal(out, err)
		}
		if ok, err := tab.Complete(tk, resp, now, 10*time.Millisecond); !ok || err != nil {
			b.Fatal(ok, err)
		}
		if out, _, err := tab.Begin(k, shm.Quota{}, shm.Quota{}, shm.Fingerprint{}, now, &got); err != nil || out != shm.Replay {
			b.Fatal(out, err)
		}
	}
}

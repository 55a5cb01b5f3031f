package nethttp_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// ---- request and response plumbing that costs nothing per iteration ----

// rewindBody is a request body that can be read again.
type rewindBody struct {
	b   []byte
	off int
}

func (r *rewindBody) Read(p []byte) (int, error) {
	if r.off >= len(r.b) {
		return 0, io.EOF
	}
	n := copy(p, r.b[r.off:])
	r.off += n
	return n, nil
}
func (r *rewindBody) Close() error { return nil }

// discardWriter is a ResponseWriter that keeps the status and headers.
type discardWriter struct {
	header http.Header
	status int
	n      int
	at     time.Duration // region time of the answer (waiterChild)
}

func newDiscardWriter() *discardWriter { return &discardWriter{header: http.Header{}} }

func (w *discardWriter) Header() http.Header { return w.header }
func (w *discardWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *discardWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.n += len(p)
	return len(p), nil
}
func (w *discardWriter) reset() {
	clear(w.header)
	w.status, w.n = 0, 0
}

// keyedRequest is a POST /orders with key (none when "") and body.
func keyedRequest(key string, body []byte) *http.Request {
	rb := &rewindBody{b: body}
	r := &http.Request{
		Method:        http.MethodPost,
		URL:           &url.URL{Path: "/orders"},
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer 0123456789abcdef"}},
		Body:          rb,
		ContentLength: int64(len(body)),
		// serve puts the body back: the middleware replaces r.Body with
		// its own reader of what it buffered.
		GetBody:    func() (io.ReadCloser, error) { rb.off = 0; return rb, nil },
		RemoteAddr: "192.0.2.1:4321",
		Host:       "example.com",
	}
	if key != "" {
		r.Header["Idempotency-Key"] = []string{key}
	}
	return r
}

var (
	benchReqBody  = []byte(`{"item":42,"quantity":1,"note":"a typical small JSON order body of about a hundred bytes"}`)
	benchRespBody = []byte(`{"order":"ord_8e03978e","status":"created","total":"42.00","currency":"EUR","items":[{"sku":"42","qty":1}]}`)
)

// created is the application: it reads the body and answers 201.
var created = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/ord_8e03978e")
	w.WriteHeader(http.StatusCreated)
	w.Write(benchRespBody)
})

// serve runs one request through h with a rewound body and a clean writer.
func serve(h http.Handler, r *http.Request, w *discardWriter) {
	r.Body, _ = r.GetBody()
	w.reset()
	h.ServeHTTP(w, r)
}

// serialAndParallel runs op (made per goroutine by mk, which gets the
// goroutine's number) serially and under RunParallel.
func serialAndParallel(b *testing.B, mk func(g int) func()) {
	b.Run("serial", func(b *testing.B) {
		op := mk(0)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			op()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var g atomic.Int32
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			op := mk(int(g.Add(1)))
			for pb.Next() {
				op()
			}
		})
	})
}

func benchMiddleware(b *testing.B, r *shm.Region, blocks []config.Idempotency, opts Options) *handler {
	b.Helper()
	m, err := New(config.Config{Idempotency: blocks}, r, created, opts)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func benchRegion(b *testing.B) *shm.Region {
	b.Helper()
	return newRegion(b, shm.Options{Counters: 8, Responses: 4096, ResponseBytes: 16 << 20})
}

// BenchmarkReplay: a retry answered from the table (the handler does not
// run): key check, body and fingerprint, one Begin that copies the
// response out, the replay.
func BenchmarkReplay(b *testing.B) {
	r := benchRegion(b)
	m := benchMiddleware(b, r, []config.Idempotency{orders()}, Options{})
	serialAndParallel(b, func(g int) func() {
		req, w := keyedRequest("replay-"+strconv.Itoa(g), benchReqBody), newDiscardWriter()
		serve(m, req, w) // the original
		return func() {
			serve(m, req, w)
			if w.status != http.StatusCreated || w.header.Get("Idempotent-Replayed") != "true" {
				b.Fatalf("not a replay: %d %v", w.status, w.header)
			}
		}
	})
}

// BenchmarkReserveComplete: a first request, each with a fresh key: the
// reservation, the handler with the recorder, and the completion that
// stores the response. The clock jumps a second per reading and the ttl is
// a millisecond, so each key finds its predecessors' records expired and
// reusable; keys come from a ring, preformatted, 1024 per goroutine.
func BenchmarkReserveComplete(b *testing.B) {
	r := benchRegion(b)
	var clock atomic.Int64
	blk := orders()
	blk.TTL = time.Millisecond
	// Every key comes from one client: let it hold the whole table, so
	// that the benchmark measures the reuse of expired records and not
	// max_records (whose sweep runs on the real clock, at most once a
	// millisecond).
	blk.MaxRecords = 4096
	m := benchMiddleware(b, r, []config.Idempotency{blk}, Options{
		Now: func() time.Duration { return time.Duration(clock.Add(int64(time.Second))) },
	})
	serialAndParallel(b, func(g int) func() {
		keys := make([][]string, 1024)
		for i := range keys {
			keys[i] = []string{fmt.Sprintf("g%d-key-%d", g, i)}
		}
		req, w := keyedRequest("x", benchReqBody), newDiscardWriter()
		i := 0
		return func() {
			req.Header["Idempotency-Key"] = keys[i%len(keys)]
			i++
			serve(m, req, w)
			if w.status != http.StatusCreated || w.header.Get("Idempotent-Replayed") != "" {
				b.Fatalf("not an execution: %d %v", w.status, w.header)
			}
		}
	})
}

// BenchmarkPassthrough: the same route and handler without idempotency:
// the handler alone, behind a Middleware without blocks, and behind one
// whose block matches but the request has no key.
func BenchmarkPassthrough(b *testing.B) {
	r := benchRegion(b)
	for _, tt := range []struct {
		name string
		h    http.Handler
	}{
		{"handler", created},
		{"no-block", benchMiddleware(b, r, nil, Options{})},
		{"no-key", benchMiddleware(b, r, []config.Idempotency{orders()}, Options{})},
	} {
		b.Run(tt.name, func(b *testing.B) {
			serialAndParallel(b, func(g int) func() {
				req, w := keyedRequest("", benchReqBody), newDiscardWriter()
				return func() { serve(tt.h, req, w) }
			})
		})
	}
}

// ---- wake latency ----

// latencyBlock is the block of the wake-latency trials: every trial has a
// key of its own, and the records expire after 10s. All trials come from
// one client, which may hold the whole table (wakeRegion's).
func latencyBlock() config.Idempotency {
	return config.Idempotency{Path: "/orders", Methods: []string{"POST"}, Wait: config.IdemWait(5 * time.Second), TTL: 10 * time.Second, MaxRecords: wakeRecords}
}

var latencyReqBody = []byte(`{"item":1}`)

// waiter sends a duplicate for key and reports, once it waits, on parked;
// its answer (status, replayed, region time) comes on done.
type waiter interface {
	start(key string) (parked <-chan struct{}, done <-chan waiterResult)
	close()
}

type waiterResult struct {
	status   int
	replayed bool
	at       time.Duration
	err      error
}

// BenchmarkWakeLatency measures the extra latency a duplicate that waits
// for an in-flight original sees once the original is done: per trial,
// from the original handler's last instruction (before the recorder's
// Complete: so Complete, the futex wake, the waiter's Begin and the
// replay are all in it) to the waiter's ServeHTTP returning, on the
// region's clock, which every process reads alike. Reported as p50 and
// p99 over b.N trials ("µs"); ns/op is a whole trial. The waiter is a
// goroutine of this process, or another process on the same region (a
// second worker).
func BenchmarkWakeLatency(b *testing.B) {
	b.Run("goroutine", func(b *testing.B) {
		r := wakeRegion(b)
		m, err := New(config.Config{Idempotency: []config.Idempotency{latencyBlock()}}, r,
			http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "the duplicate ran", http.StatusTeapot) }),
			Options{})
		if err != nil {
			b.Fatal(err)
		}
		wakeLatency(b, r, &goroutineWaiter{r: r, m: m})
	})
	b.Run("process", func(b *testing.B) {
		r := wakeRegion(b)
		w := startProcessWaiter(b, r)
		defer w.close()
		wakeLatency(b, r, w)
	})
}

// wakeRecords is the size of wakeRegion's response table.
const wakeRecords = 1 << 15

// wakeRegion is sized for a few workers, as prefork.RegionOptions sizes a
// daemon's: the waiters poll the statistics to see a duplicate park, and
// a sum over the default 256 worker rows took most of each trial's time.
func wakeRegion(b *testing.B) *shm.Region {
	b.Helper()
	return shmtest.Joined(b, statRegion(shm.Options{Counters: 8, MaxWorkers: 4, Responses: wakeRecords, ResponseBytes: 8 << 20}))
}

func wakeLatency(b *testing.B, r *shm.Region, wt waiter) {
	var completedAt atomic.Int64
	entered := make(chan struct{}, 1)
	var release chan struct{}
	orig, err := New(config.Config{Idempotency: []config.Idempotency{latencyBlock()}}, r,
		http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			entered <- struct{}{}
			<-release
			w.WriteHeader(http.StatusCreated)
			w.Write(benchRespBody)
			completedAt.Store(int64(r.Now()))
		}), Options{})
	if err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	trial := 0
	for b.Loop() {
		trial++
		key := "wake-" + strconv.Itoa(trial) + "-" + strconv.Itoa(os.Getpid())
		release = make(chan struct{})
		origDone := make(chan struct{})
		ow := newDiscardWriter()
		go func() {
			defer close(origDone)
			orig.ServeHTTP(ow, keyedRequest(key, latencyReqBody))
		}()
		select {
		case <-entered:
		case <-origDone:
			b.Fatalf("trial %d: the original did not run: %d %v", trial, ow.status, ow.header)
		}
		parked, done := wt.start(key)
		select {
		case <-parked:
		case res := <-done:
			b.Fatalf("trial %d: the duplicate did not wait: %+v", trial, res)
		}
		time.Sleep(500 * time.Microsecond) // from "waits" to asleep on the futex
		close(release)
		res := <-done
		<-origDone
		if res.err != nil || res.status != http.StatusCreated || !res.replayed {
			b.Fatalf("trial %d: waiter got %+v", trial, res)
		}
		lat = append(lat, res.at-time.Duration(completedAt.Load()))
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		i := min(int(float64(len(lat))*p+0.5), len(lat)-1)
		return float64(lat[max(i, 0)]) / float64(time.Microsecond)
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	b.ReportMetric(float64(lat[len(lat)-1])/float64(time.Microsecond), "max-µs")
}

// goroutineWaiter sends the duplicates from this process.
type goroutineWaiter struct {
	r *shm.Region
	m *handler
}

func (g *goroutineWaiter) start(key string) (<-chan struct{}, <-chan waiterResult) {
	parked, done := make(chan struct{}), make(chan waiterResult, 1)
	before := g.m.IdemStats().Waits
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		w := newDiscardWriter()
		g.m.ServeHTTP(w, keyedRequest(key, latencyReqBody))
		done <- waiterResult{status: w.status, replayed: w.header.Get("Idempotent-Replayed") == "true", at: g.r.Now()}
	}()
	go func() {
		for g.m.IdemStats().Waits == before {
			select {
			case <-answered:
				return
			default:
				time.Sleep(50 * time.Microsecond)
			}
		}
		close(parked)
	}()
	return parked, done
}

func (g *goroutineWaiter) close() {}

// processWaiter sends the duplicates from a child process (waiterChild).
type processWaiter struct {
	b *testing.B
	p *proctest.Proc
}

func startProcessWaiter(b *testing.B, r *shm.Region) *processWaiter {
	return &processWaiter{b, proctest.Start(b, proctest.Options{Role: "waiter", Files: []*os.File{r.File()}})}
}

func (w *processWaiter) start(key string) (<-chan struct{}, <-chan waiterResult) {
	parked, done := make(chan struct{}), make(chan waiterResult, 1)
	if err := w.p.Send(key); err != nil {
		done <- waiterResult{err: err}
		return parked, done
	}
	go func() {
		for {
			line, err := w.p.Line(30 * time.Second)
			if err != nil {
				done <- waiterResult{err: err}
				return
			}
			if line == "parked" {
				close(parked)
				continue
			}
			var rep waiterReport
			if err := json.Unmarshal([]byte(line), &rep); err != nil {
				done <- waiterResult{err: fmt.Errorf("the waiter said %q: %w", line, err)}
				return
			}
			done <- waiterResult{status: rep.Status, replayed: rep.Replayed, at: rep.At}
			return
		}
	}()
	return parked, done
}

func (w *processWaiter) close() {
	w.p.CloseStdin()
	if err := w.p.Wait(10 * time.Second); err != nil {
		w.b.Errorf("the waiter process: %v", err)
	}
}

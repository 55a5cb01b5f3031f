package prefork

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

func TestLimitsTripOnce(t *testing.T) {
	l, err := newLimits(Settings{MaxRequests: 1000}, 0, 0, time.Time{})
	if err != nil || l.maxRequests != 900 {
		t.Fatalf("jitter 0: limit %d (%v), want 900", l.maxRequests, err)
	}
	if l, _ := newLimits(Settings{MaxRequests: 1000}, 0.99999, 0, time.Time{}); l.maxRequests != 1100 {
		t.Errorf("jitter ~1: limit %d, want 1100", l.maxRequests)
	}
	if l, _ := newLimits(Settings{MaxRequests: 1}, 0, 0, time.Time{}); l.maxRequests != 1 {
		t.Errorf("limit 1 with jitter 0: %d, want at least 1", l.maxRequests)
	}
	// Past 2^63 the jittered limit is the largest there is, not 1.
	if l, _ := newLimits(Settings{MaxRequests: math.MaxInt64}, 0.99, 0, time.Time{}); l.maxRequests != math.MaxInt64 {
		t.Errorf("max_requests %d, jitter 0.99: limit %d, want %d", int64(math.MaxInt64), l.maxRequests, int64(math.MaxInt64))
	}
	if l, err := newLimits(Settings{}, 0.5, 0, time.Time{}); l != nil || err != nil {
		t.Errorf("no limit: %v %v", l, err)
	}

	region, err := shm.CreatePrivate(shm.Options{Counters: 64, MaxWorkers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	if err := region.Join(1); err != nil {
		t.Fatal(err)
	}
	w := &Worker{Region: region, limits: l}
	stopped := 0
	trip := w.recycling(func() { stopped++ })
	for range 899 {
		w.Responded(200)
	}
	if len(trip) != 0 || stopped != 0 || w.pastLimit() {
		t.Fatal("tripped before the limit")
	}
	w.Responded(503)
	w.Responded(200)
	if len(trip) != 1 || stopped != 1 || !w.pastLimit() {
		t.Fatalf("%d messages, stopped %d times; want 1 and 1", len(trip), stopped)
	}
	if n := w.served.Load(); n != 901 {
		t.Errorf("served %d, want 901", n)
	}
	ev, err := decodeRecycle(7, <-l.trip)
	if err != nil || ev != (recycleEvent{pid: 7, reason: "max_requests", value: 900, limit: 900}) {
		t.Fatalf("message %+v (%v)", ev, err)
	}

	// RSS: the first response that leaves it past the limit trips.
	rss := int64(100)
	m := &limits{maxRSS: 1000, trip: make(chan []byte, 1), rss: func() (int64, error) { rss += 300; return rss, nil }}
	for range 5 {
		m.check(0)
	}
	if ev, err := decodeRecycle(7, <-m.trip); err != nil || ev.reason != "max_rss" || ev.value != 1300 || ev.limit != 1000 {
		t.Fatalf("rss message %+v (%v)", ev, err)
	}
	m.rss = func() (int64, error) { return 0, errors.New("gone") }
	m.state.Store(limitsArmed)
	m.check(0)
	if len(m.trip) != 0 {
		t.Error("tripped on an error reading the RSS")
	}
}

// Once the instance is stopping (the drain delay's USR2), a worker past
// max_requests keeps accepting: it leaves with the instance, and no
// successor would start. Limits that tripped before stay tripped.
func TestLimitsOffWhenStopping(t *testing.T) {
	l, err := newLimits(Settings{MaxRequests: 10}, 0.5, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{limits: l}
	stopped := 0
	trip := w.recycling(func() { stopped++ })
	w.draining()
	for range 20 {
		w.Responded(200)
	}
	if len(trip) != 0 || stopped != 0 || w.pastLimit() {
		t.Fatalf("a stopping worker tripped: %d messages, stopped %d times", len(trip), stopped)
	}

	m, _ := newLimits(Settings{MaxRequests: 10}, 0.5, 0, time.Now())
	w = &Worker{limits: m}
	w.recycling(func() {})
	for range 10 {
		w.Responded(200)
	}
	w.draining()
	if !w.pastLimit() {
		t.Error("limits that tripped before the drain no longer say so")
	}
}

// With a delay (memory recycling's backoff), the memory is judged only
// from start + delay: responses before then never trip, the first after
// it does.
func TestLimitsRSSDelay(t *testing.T) {
	start := time.Unix(1000, 0)
	now := start
	l, err := newLimits(Settings{MaxRSS: 64 << 20}, 0, 20*time.Second, start)
	if err != nil {
		t.Fatal(err)
	}
	l.now = func() time.Time { return now }
	reads := 0
	l.rss = func() (int64, error) { reads++; return 100 << 20, nil }
	for _, at := range []time.Duration{0, time.Second, 19 * time.Second, 20*time.Second - 1} {
		now = start.Add(at)
		l.check(1)
		if len(l.trip) != 0 || reads != 0 {
			t.Fatalf("at %v, before the delay: %d messages, %d readings", at, len(l.trip), reads)
		}
	}
	now = start.Add(20 * time.Second)
	l.check(2)
	if ev, err := decodeRecycle(1, <-l.trip); err != nil || ev.reason != "max_rss" || reads != 1 {
		t.Fatalf("at the delay: %+v %v, %d readings", ev, err, reads)
	}
	// Without a delay, the first response is judged.
	m, _ := newLimits(Settings{MaxRSS: 64 << 20}, 0, 0, start)
	m.rss = func() (int64, error) { return 100 << 20, nil }
	m.check(1)
	if len(m.trip) != 1 {
		t.Fatal("no delay: the first response over the limit did not trip")
	}
}

func TestRSSReader(t *testing.T) {
	r, err := openRSS()
	if err != nil {
		t.Fatal(err)
	}
	defer r.f.Close()
	before, err := r.read()
	if err != nil || before < 1<<20 {
		t.Fatalf("RSS %d (%v)", before, err)
	}
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"2000 300 40 5 0 100 0\n", 300 * 4096},
		{"2000 0 40", 0},
		{"2000", -1},
		{"2000 x 40", -1},
		{"2000  40", -1},
		{"1 99999999999999999999 0", -1},
	} {
		got, err := parseStatmRSS([]byte(tc.in), 4096)
		if tc.want < 0 && err == nil || tc.want >= 0 && (err != nil || got != tc.want) {
			t.Errorf("%q: %d (%v), want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestRecycleMessage(t *testing.T) {
	b := encodeRecycle(recycleRSS, 5<<20, 4<<20)
	if ev, err := decodeRecycle(1, b); err != nil || ev != (recycleEvent{pid: 1, reason: "max_rss", value: 5 << 20, limit: 4 << 20}) {
		t.Fatalf("%+v %v", ev, err)
	}
	b[1] = 9
	if _, err := decodeRecycle(1, b); err == nil {
		t.Error("an unknown reason was accepted")
	}
	if _, err := decodeRecycle(1, []byte{1, 2, 3}); err == nil {
		t.Error("a short message was accepted")
	}
}

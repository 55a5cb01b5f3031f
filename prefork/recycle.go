package prefork

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"
)

// Worker recycling (README, "Safe deploys"): a worker past server.max_requests (drawn
// within ±10% for each worker, so that workers started together do not
// leave together) or server.max_rss is replaced, its successor ready
// before it leaves.
//
// The worker judges itself, after each response: the supervisor could
// only poll, and a handler that leaks under load would run far past the
// limit between two polls. Past a limit, the worker stops accepting
// connections (the other workers, or its successor, take them from the
// shared listener; nothing is refused), answers with Connection: close
// from then on, and tells the supervisor through its readiness pipe. The
// supervisor starts a successor for its slot and retires the worker once
// the successor is ready; the worker then drains as usual. What it serves
// past the limit is what was in flight: at most one more request on each
// connection it had open.
//
// A max_rss below what a worker needs to serve (about 12 MiB as it
// starts) would recycle every worker as soon as it served, and its
// successor as soon as that one did: a storm of starts. `check` refuses a
// max_rss under MinMaxRSS; past that, a worker recycled for memory
// less than rssEarly after it began judging its memory is reported once
// (a warning), and memory recycling of its slot backs off: the successors
// judge their memory only from a delay after their start, doubling with
// each such recycle from rssBackoffBase up to rssBackoffMax. A memory
// recycle later than that resets the delay, and so does a reload that
// changes max_rss. The delay reaches a worker in envRSSDelay. A worker
// waiting for its delay serves as usual, over max_rss: what the backoff
// trades for the storm.

// Reasons a worker asks to be recycled, as the message carries them.
const (
	recycleRequests byte = 1 // max_requests
	recycleRSS      byte = 2 // max_rss
)

// recycleMsg is the message a worker writes on its readiness pipe, after
// the readiness byte: its first byte, the reason, the value that tripped
// the limit and the limit (little-endian int64s). Less than PIPE_BUF, so
// one write is atomic.
const (
	recycleMsg    byte = 2
	recycleMsgLen      = 1 + 1 + 8 + 8
)

// stoppedMsg is the one byte a worker writes on its readiness pipe once
// it accepts no more connections (stoppedEvent).
const stoppedMsg byte = 3

// Memory recycling's backoff (see above).
const (
	rssEarly       = 10 * time.Second
	rssBackoffBase = 10 * time.Second
	rssBackoffMax  = 5 * time.Minute
)

func newRSSBackoff() backoff {
	return backoff{base: rssBackoffBase, max: rssBackoffMax, stable: rssEarly}
}

// recycleEvent is a worker's request to be recycled, for the loop.
type recycleEvent struct {
	pid          int
	reason       string // "max_requests" or "max_rss"
	value, limit int64
}

func encodeRecycle(reason byte, value, limit int64) []byte {
	b := make([]byte, recycleMsgLen)
	b[0], b[1] = recycleMsg, reason
	binary.LittleEndian.PutUint64(b[2:], uint64(value))
	binary.LittleEndian.PutUint64(b[10:], uint64(limit))
	return b
}

// decodeRecycle reads a message of recycleMsgLen bytes.
func decodeRecycle(pid int, b []byte) (recycleEvent, error) {
	if len(b) != recycleMsgLen || b[0] != recycleMsg {
		return recycleEvent{}, fmt.Errorf("prefork: worker %d sent %q on its readiness pipe", pid, b)
	}
	ev := recycleEvent{pid: pid, value: int64(binary.LittleEndian.Uint64(b[2:])), limit: int64(binary.LittleEndian.Uint64(b[10:]))}
	switch b[1] {
	case recycleRequests:
		ev.reason = "max_requests"
	case recycleRSS:
		ev.reason = "max_rss"
	default:
		return recycleEvent{}, fmt.Errorf("prefork: worker %d asked to be recycled for reason %d", pid, b[1])
	}
	return ev, nil
}

// limits is a worker's view of its recycling limits. check trips at most
// once: it calls stop, then hands the message to the worker's loop on
// trip. stop runs before the response that tripped is flushed to its
// client (the handler has not returned yet), so that a client that waits
// for that response before it connects again is never accepted by this
// worker.
type limits struct {
	maxRequests int64 // this worker's draw; 0 = none
	maxRSS      int64 // bytes; 0 = none
	rss         func() (int64, error)
	// rssFrom is when the worker begins judging its memory (see
	// envRSSDelay); rssWaits is set until then.
	rssFrom  time.Time
	rssWaits atomic.Bool
	now      func() time.Time
	stop     func()       // stop accepting; nil = nothing to do
	state    atomic.Int32 // limitsArmed, then limitsTripped or limitsOff for good
	trip     chan []byte  // capacity 1
}

// What a worker's limits may still do: trip once, or nothing, once the
// instance is stopping (off): a worker that leaves with it anyway must
// not stop accepting for a successor that will never start, during the
// drain delay, when the supervisor starts none.
const (
	limitsArmed int32 = iota
	limitsTripped
	limitsOff
)

// disarm turns the limits off, unless they tripped already.
func (l *limits) disarm() { l.state.CompareAndSwap(limitsArmed, limitsOff) }

// newLimits returns the limits of cfg for this worker, which started at
// start and judges its memory only from rssDelay after it; nil when there
// are none. jitter is uniform in [0, 1).
func newLimits(cfg Settings, jitter float64, rssDelay time.Duration, start time.Time) (*limits, error) {
	if cfg.MaxRequests <= 0 && cfg.MaxRSS <= 0 {
		return nil, nil
	}
	l := &limits{trip: make(chan []byte, 1), maxRSS: cfg.MaxRSS, now: time.Now}
	if rssDelay > 0 {
		l.rssFrom = start.Add(rssDelay)
		l.rssWaits.Store(true)
	}
	if cfg.MaxRequests > 0 {
		l.maxRequests = math.MaxInt64
		// float64(math.MaxInt64) is 2^63: at or past it the conversion
		// would overflow (to a limit of 1 after max).
		if n := math.Round(float64(cfg.MaxRequests) * (0.9 + 0.2*jitter)); n < math.MaxInt64 {
			l.maxRequests = max(1, int64(n))
		}
	}
	if l.maxRSS > 0 {
		r, err := openRSS()
		if err != nil {
			return nil, err
		}
		l.rss = r.read
	}
	return l, nil
}

func randomJitter() float64 { return rand.Float64() }

// check is called after each response, with the responses served so far.
func (l *limits) check(served int64) {
	if l.state.Load() != limitsArmed {
		return
	}
	if l.maxRequests > 0 && served >= l.maxRequests {
		l.fire(recycleRequests, served, l.maxRequests)
		return
	}
	if l.maxRSS > 0 && l.judgesRSS() {
		if rss, err := l.rss(); err == nil && rss > l.maxRSS {
			l.fire(recycleRSS, rss, l.maxRSS)
		}
	}
}

// judgesRSS reports whether the worker's memory is judged now: once its
// delay has passed (a clock read per response until then only).
func (l *limits) judgesRSS() bool {
	if !l.rssWaits.Load() {
		return true
	}
	if l.now().Before(l.rssFrom) {
		return false
	}
	l.rssWaits.Store(false)
	return true
}

// inheritedRSSDelay reads the delay the supervisor gave this worker
// before it judges its memory (envRSSDelay), and removes it from the
// environment, as the worker's other markers.
func inheritedRSSDelay() (time.Duration, error) {
	v, ok := os.LookupEnv(envRSSDelay)
	if !ok {
		return 0, nil
	}
	os.Unsetenv(envRSSDelay)
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("prefork: %s=%q is not a delay", envRSSDelay, v)
	}
	return d, nil
}

func (l *limits) fire(reason byte, value, limit int64) {
	if l.state.CompareAndSwap(limitsArmed, limitsTripped) {
		if l.stop != nil {
			l.stop()
		}
		l.trip <- encodeRecycle(reason, value, limit)
	}
}

// rssReader reads this process's resident set size from /proc/self/statm,
// kept open: one pread per reading, no allocation.
type rssReader struct {
	f    *os.File
	page int64
}

func openRSS() (*rssReader, error) {
	f, err := os.Open("/proc/self/statm")
	if err != nil {
		return nil, fmt.Errorf("prefork: max_rss: %w", err)
	}
	return &rssReader{f: f, page: int64(os.Getpagesize())}, nil
}

// read returns the resident set size in bytes: the second field of statm,
// in pages.
func (r *rssReader) read() (int64, error) {
	var buf [128]byte
	n, err := r.f.ReadAt(buf[:], 0)
	if n == 0 {
		return 0, fmt.Errorf("prefork: reading /proc/self/statm: %w", err)
	}
	return parseStatmRSS(buf[:n], r.page)
}

func parseStatmRSS(b []byte, page int64) (int64, error) {
	_, rest, ok := bytes.Cut(b, []byte{' '})
	field, _, _ := bytes.Cut(rest, []byte{' '})
	var pages int64
	for _, c := range field {
		if c < '0' || c > '9' || pages > math.MaxInt64/100/page {
			ok = false
			break
		}
		pages = pages*10 + int64(c-'0')
	}
	if !ok || len(field) == 0 {
		return 0, errors.New("prefork: /proc/self/statm: no resident size")
	}
	return pages * page, nil
}

// onRecycle handles a worker's request to be replaced: step starts its
// successor. Once the instance is stopping none would start (a worker
// that passed its limit as the drain began, before it saw sigDrain): it
// leaves with the instance, and is not counted as recycled.
func (s *supervisor) onRecycle(ev recycleEvent) {
	p := s.procs[ev.pid]
	if p == nil || p.retiring || p.recycle != "" || s.draining {
		return
	}
	p.recycle = ev.reason
	s.recycled++
	attrs := []any{"pid", p.pid, "index", p.index, "slot", p.slot, "generation", p.gen, "reason", ev.reason}
	if ev.reason == "max_rss" {
		attrs = append(attrs, "rss_bytes", ev.value, "limit_bytes", ev.limit)
		if d := s.backOffMemory(p, ev); d > 0 {
			attrs = append(attrs, "memory_checked_after", d)
		}
	} else {
		attrs = append(attrs, "requests", ev.value, "limit", ev.limit)
	}
	s.log.Info("worker recycling", attrs...)
}

// backOffMemory sets the delay after which p's successors judge their
// memory: doubled when p passed max_rss less than rssEarly after it began
// judging its own (reported once), none when it passed it later. It
// returns the delay.
func (s *supervisor) backOffMemory(p *proc, ev recycleEvent) time.Duration {
	sl := &s.slots[p.slot]
	judged := s.env.now().Sub(p.start) - p.rssDelay
	if judged >= rssEarly {
		sl.rssBackoff, sl.rssDelay = newRSSBackoff(), 0
		return 0
	}
	sl.rssDelay = sl.rssBackoff.failure(judged)
	if !s.rssWarned {
		s.rssWarned = true
		s.log.Warn("worker passed max_rss soon after it started: max_rss may be below what a worker needs; memory recycling backs off",
			"pid", p.pid, "rss_bytes", ev.value, "limit_bytes", ev.limit, "after", judged.Round(time.Millisecond),
			"memory_checked_after", sl.rssDelay, "backoff_max", rssBackoffMax)
	}
	return sl.rssDelay
}

// resetMemoryBackoff forgets memory recycling's backoff (a reload changed
// max_rss): the next early recycle is reported again.
func (s *supervisor) resetMemoryBackoff() {
	for i := range s.slots {
		s.slots[i].rssBackoff, s.slots[i].rssDelay = newRSSBackoff(), 0
	}
	s.rssWarned = false
}

package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/internal/cpuquota"
	"github.com/preforkd/preforkd/prefork"
)

// preforkd tune: advice on the table sizes and the number of workers of a
// running instance, each with the evidence it rests on, and a list of
// what it did not measure. It reads the instance's admin endpoint
// (/status, /metrics: no token needed) and this host's /proc, and times a
// few requests to the upstream and through preforkd.

func setupTune(fs *flag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
	var o tuneOptions
	fs.StringVar(&o.admin, "admin", "", "the instance's admin address `ADDR` (admin.listen), e.g. 127.0.0.1:9901 or unix:/run/preforkd/admin.sock")
	fs.StringVar(&o.upstream, "upstream", "", "upstream `URL` to time, when /status cannot give it (its password is masked there)")
	fs.StringVar(&o.path, "path", "/", "`PATH` of the timed requests (GET), to the upstream and through preforkd")
	fs.IntVar(&o.requests, "requests", 20, "`N` timed requests each way, one after the other")
	fs.IntVar(&o.upstreamPID, "upstream-pid", 0, "`PID` of the upstream's process on this host, for its CPU time and memory (default: the process listening on the upstream's port)")
	return func(ctx context.Context, args []string, stdout, _ io.Writer) error {
		if err := noArgs(args); err != nil {
			return err
		}
		if o.admin == "" {
			return &usageError{"-admin ADDR is required"}
		}
		if err := config.CheckAdminAddr(o.admin); err != nil {
			return &usageError{fmt.Sprintf("-admin: %v", err)}
		}
		if o.requests < 1 || o.requests > 10000 {
			return &usageError{"-requests: want 1 to 10000"}
		}
		if !strings.HasPrefix(o.path, "/") {
			return &usageError{"-path: want a path starting with /"}
		}
		if o.upstreamPID < 0 {
			return &usageError{"-upstream-pid: want the pid of a process of this host"}
		}
		rep, err := tune(ctx, o)
		if err != nil {
			return err
		}
		_, err = io.WriteString(stdout, rep.String())
		return err
	}
}

type tuneOptions struct {
	admin, upstream, path string
	requests              int
	upstreamPID           int // 0: found by the upstream's port
}

// tuneReport is what tune found and advises.
type tuneReport struct {
	b           strings.Builder
	notMeasured []string
}

func (r *tuneReport) String() string {
	s := r.b.String()
	if len(r.notMeasured) > 0 {
		s += "\nnot measured\n"
		for _, n := range r.notMeasured {
			s += "  - " + n + "\n"
		}
	}
	return s
}

func (r *tuneReport) section(title string) { fmt.Fprintf(&r.b, "\n%s\n", title) }
func (r *tuneReport) evidence(f string, a ...any) {
	fmt.Fprintf(&r.b, "  evidence: %s\n", fmt.Sprintf(f, a...))
}
func (r *tuneReport) advice(f string, a ...any) {
	fmt.Fprintf(&r.b, "  advice:   %s\n", fmt.Sprintf(f, a...))
}
func (r *tuneReport) reasoning(f string, a ...any) {
	fmt.Fprintf(&r.b, "  why:      %s\n", fmt.Sprintf(f, a...))
}
func (r *tuneReport) skip(f string, a ...any) {
	r.notMeasured = append(r.notMeasured, fmt.Sprintf(f, a...))
}

func tune(ctx context.Context, o tuneOptions) (*tuneReport, error) {
	c, base := adminClient(o.admin, 10*time.Second)
	var st statusJSON
	if err := getJSON(ctx, c, base+"/status", &st); err != nil {
		return nil, err
	}
	m, err := getMetrics(ctx, c, base+"/metrics")
	if err != nil {
		return nil, err
	}
	r := &tuneReport{}
	uptime := time.Duration(st.UptimeSeconds * float64(time.Second)).Round(time.Second)
	fmt.Fprintf(&r.b, "preforkd tune: the instance of %s (version %s, up %v, %d workers, generation %d)\n",
		st.Config, st.Version, uptime, len(st.Workers), st.Generation)
	fmt.Fprintf(&r.b, "Counts are since the supervisor started, %v ago.\n", uptime)
	if uptime < time.Hour {
		r.skip("a busy hour: the instance has run for %v only; the peaks these counts show may not be the peaks it will see", uptime)
	} else {
		r.skip("the peaks within the %v the counts cover: occupancies are as of now, events since start", uptime)
	}
	adviseCounters(r, m)
	adviseResponses(r, m)
	via, up := adviseWorkers(ctx, r, st, o)
	adviseMemory(r, via, up)
	r.skip("the traffic's mix and concurrency: the timed requests are sequential GETs of one path")
	return r, nil
}

// adviseCounters is the counter table's advice: from its occupancy and the
// decisions that found no slot.
func adviseCounters(r *tuneReport, m metricsPage) {
	slots, used := m.get("preforkd_table_slots"), m.get("preforkd_table_slots_used")
	full := m.get(`preforkd_table_full_total{reason="no_slot"}`)
	timeouts := m.get(`preforkd_table_full_total{reason="lock_timeout"}`)
	reclaims := m.get("preforkd_table_reclaims_total")
	r.section(fmt.Sprintf("counter table (table.counters = %.0f)", slots))
	if slots == 0 {
		r.evidence("the page has no preforkd_table_slots")
		return
	}
	occ := used / slots
	r.evidence("%.0f of %.0f slots hold a key (%.1f%%); %.0f decisions found no slot (on_full answered), %.0f waited too long for an insert lock; %.0f slots were reclaimed from keys as fresh",
		used, slots, 100*occ, full, timeouts, reclaims)
	switch {
	case full > 0:
		r.advice("table.counters = %d: decisions found no slot, and their rules' on_full answered instead of the limit (a table twice the keys it holds keeps probe windows short)",
			pow2AtLeast(max(2*used, 2*slots)))
	case occ > 0.7:
		r.advice("table.counters = %d: the table is %.0f%% full; a burst of new clients would find no slot", pow2AtLeast(2*used), 100*occ)
	case occ < 0.02 && slots > 16384:
		r.advice("table.counters can be smaller, e.g. %d (4 times the keys held now), to save %s of memory, if today is a typical day",
			pow2AtLeast(max(4*used, 16384)), humanBytes((slots-float64(pow2AtLeast(max(4*used, 16384))))*64))
	default:
		r.advice("keep table.counters: %.1f%% used, no decision without a slot", 100*occ)
	}
	if timeouts > 0 {
		r.advice("insert locks were held too long %.0f times: a worker stalled (CPU starved or stopped) while installing a key", timeouts)
	}
}

// adviseResponses is the response table's advice: records and blocks in
// use, refusals for want of either, and the sizes of stored responses.
func adviseResponses(r *tuneReport, m metricsPage) {
	records := m.get("preforkd_responses_records")
	r.section(fmt.Sprintf("stored responses (table.responses = %.0f, table.response_bytes = %s)", records,
		humanBytes(m.get("preforkd_responses_blocks")*m.get("preforkd_responses_block_size_bytes"))))
	if records == 0 {
		r.evidence("no response table: no [[idempotency]] block")
		return
	}
	used, full := m.get("preforkd_responses_records_used"), m.get("preforkd_responses_full_total")
	blocks, bused, bsize := m.get("preforkd_responses_blocks"), m.get("preforkd_responses_blocks_used"), m.get("preforkd_responses_block_size_bytes")
	noBlocks := m.get("preforkd_responses_no_blocks_total")
	n, sum := m.get("preforkd_idempotency_stored_bytes_count"), m.get("preforkd_idempotency_stored_bytes_sum")
	r.evidence("%.0f of %.0f records in use; %.0f reservations found no record (503); %.0f of %.0f blocks of %s in use; %.0f responses went unstored for want of blocks",
		used, records, full, bused, blocks, humanBytes(bsize), noBlocks)
	mean := 0.0
	if n > 0 {
		mean = sum / n
		r.evidence("%.0f responses stored, %s on average, 95%% of them at most %s",
			n, humanBytes(mean), humanBytes(m.quantile("preforkd_idempotency_stored_bytes", 0.95)))
	} else {
		r.skip("stored-response sizes: none was stored yet")
	}
	advised := false
	if full > 0 || used/records > 0.7 {
		r.advice("table.responses = %d: reservations were refused or the records are %.0f%% used", pow2AtLeast(max(2*used, 2*records)), 100*used/records)
		advised = true
	}
	if noBlocks > 0 || bused/blocks > 0.7 {
		need := 2 * bused * bsize
		if mean > 0 {
			// Blocks a response takes, with the chain word of each block.
			per := math.Ceil(mean/(bsize-8)) * bsize
			need = max(need, 2*used*per)
		}
		r.advice("table.response_bytes = %s: responses went unstored (their retries get 409) or the pool is %.0f%% used", humanBytes(need), 100*bused/blocks)
		advised = true
	}
	if !advised {
		r.advice("keep the response table: no refusal, %.0f%% of the records and %.0f%% of the pool in use", 100*used/records, 100*bused/blocks)
	}
}

// adviseWorkers is the advice on server.workers: from the CPU a request
// costs the upstream (when it runs on this host) and the workers, against
// the requests' wall time. It returns the timings, for adviseMemory: the
// requests through preforkd (nil when none could be timed) and to the
// upstream (nil when it was not timed).
func adviseWorkers(ctx context.Context, r *tuneReport, st statusJSON, o tuneOptions) (via, up *timing) {
	cpus := cpuquota.CPUs() // a container's or a unit's CPU limit, if any
	r.section(fmt.Sprintf("workers (now %d, %d CPUs here)", len(st.Workers), cpus))
	r.reasoning("the requests are timed one after the other, without a load generator: each one's CPU time, in the workers and in the upstream, is then its own (no other request overlaps it), " +
		"its wall time against its CPU time tells an application that computes from one that waits, and a few requests one at a time disturb neither a running site nor its numbers; " +
		"what they cannot show is the cost of contention under load (see \"not measured\")")
	upstream := o.upstream
	if upstream == "" {
		upstream = st.Upstream
	}
	var pids []int
	for _, w := range st.Workers {
		if w.State == "ready" {
			pids = append(pids, w.PID)
		}
	}

	// The upstream alone: wall time, and its CPU time if it runs here.
	switch u, err := url.Parse(upstream); {
	case upstream == "" || upstream == demoUpstream:
		r.evidence("the upstream is the built-in demo application: nothing to time")
		r.skip("the upstream: the instance serves the demo application")
	case err != nil || u.Host == "" || strings.Contains(upstream, "xxxxx"):
		r.skip("the upstream: %q is not a URL tune can call (give -upstream)", upstream)
	default:
		target := strings.TrimSuffix(upstream, "/") + o.path
		var upPIDs []int
		switch pid, err := upstreamPID(u); {
		case o.upstreamPID > 0:
			upPIDs = []int{o.upstreamPID}
		case err == nil:
			upPIDs = []int{pid}
		default:
			r.skip("the upstream's CPU time and memory: %v (give -upstream-pid)", strings.TrimPrefix(err.Error(), "tune: "))
		}
		up = timeRequests(ctx, target, o.requests, upPIDs)
		r.evidence("%d GETs of %s: %s", o.requests, target, up.summary())
		if len(up.walls) == 0 {
			r.skip("the upstream: it answered none of the timed requests")
			up = nil
		} else if up.cpuErr != nil && len(upPIDs) > 0 {
			r.skip("the upstream's CPU time: %v", strings.TrimPrefix(up.cpuErr.Error(), "tune: "))
		} else if up.cpuErr == nil && len(upPIDs) > 0 {
			r.evidence("the upstream's process (pid %d) used %v of CPU per request: %.0f%% of the wall time it did not spend waiting for a CPU (%v in all), %s",
				upPIDs[0], up.cpuPer().Round(time.Microsecond), 100*up.cpuShare(), up.waited.Round(time.Millisecond), boundness(up.cpuShare()))
		}
	}

	// Through preforkd: what a request costs the workers.
	listen := st.Listen
	if ap, err := netip.ParseAddrPort(listen); err == nil && ap.Addr().IsUnspecified() {
		lo := netip.MustParseAddr("127.0.0.1")
		if ap.Addr().Is6() {
			lo = netip.IPv6Loopback()
		}
		listen = netip.AddrPortFrom(lo, ap.Port()).String()
	}
	via = timeRequests(ctx, "http://"+listen+o.path, o.requests, pids)
	r.evidence("%d GETs of %s through preforkd: %s", o.requests, o.path, via.summary())
	if len(via.walls) == 0 {
		r.skip("a request through preforkd: none was answered at %s", listen)
		r.advice("server.workers = %d (the CPUs of this host): nothing could be timed through preforkd", cpus)
		return nil, up
	}
	if via.cpuErr != nil {
		r.skip("the workers' CPU time: %v (run tune on the instance's host)", strings.TrimPrefix(via.cpuErr.Error(), "tune: "))
		r.advice("server.workers = %d (the CPUs of this host) unless the application runs here too: the workers' CPU could not be read", cpus)
		return via, up
	}
	w := via.cpuPer()
	r.evidence("the workers used %v of CPU per request (less %v a second they use with no request)", w.Round(time.Microsecond), (via.idle * time.Second / idleWindow).Round(time.Microsecond))
	if via.statuses[http.StatusTooManyRequests] > 0 {
		r.evidence("%d of the requests through preforkd were refused (429): their cost is a refusal's, not a forward's", via.statuses[http.StatusTooManyRequests])
	}

	switch {
	case up == nil || up.cpuErr != nil || up.pids == 0:
		r.advice("server.workers = %d (the CPUs of this host): the upstream's CPU is not on this host's books, so the workers are the CPU users here", cpus)
	case up.cpuShare() < cpuBound:
		r.advice("server.workers = %d (one per CPU): the application mostly waits (its CPU time is %.0f%% of its requests' wall time, less what it waited for a CPU), so this host's CPU is the workers' to use; processes of one CPU each (GOMAXPROCS 1) serve more than fewer, larger ones",
			cpus, 100*up.cpuShare())
	default:
		u := up.cpuPer()
		share := 1.0
		if u+w > 0 {
			share = float64(w) / float64(u+w)
		}
		n := min(max(int(math.Ceil(float64(cpus)*share)), 1), cpus)
		why := fmt.Sprintf("the application is CPU-bound (its CPU time is %.0f%% of its requests' wall time, less what it waited for a CPU); a request costs it %v of CPU and the workers %v, so when this host's CPUs are all busy preforkd needs %.0f%% of them",
			100*up.cpuShare(), u.Round(time.Microsecond), w.Round(time.Microsecond), 100*share)
		if n < cpus {
			why += "; more workers would only compete with the application for CPU (a worker serves any number of connections)"
		}
		r.advice("server.workers = %d: %s", n, why)
		if n == 1 && cpus > 1 {
			r.advice("or 2, if a worker's crash must not pause the service while its replacement starts (about 100ms)")
		}
	}
	r.skip("workers under load: the CPU per request was measured on sequential requests; locks, the GC and contention add to it at high rates")
	return via, up
}

// adviseMemory is the advice on server.max_rss: from the workers'
// resident memory after the warm-up request, its growth over the timed
// requests and the most each ever held (and the upstream's, when its
// process is known).
func adviseMemory(r *tuneReport, via, up *timing) {
	r.section("memory (server.max_rss)")
	if via == nil || via.memErr != nil || len(via.memAfter) == 0 {
		why := "no request through preforkd was answered"
		switch {
		case via != nil && via.memErr != nil:
			why = strings.TrimPrefix(via.memErr.Error(), "tune: ") + " (run tune on the instance's host)"
		case via != nil && via.pids == 0:
			why = "no worker was ready"
		}
		r.skip("the workers' memory: %s", why)
		r.advice("keep server.max_rss: the workers' memory could not be read")
		return
	}
	var peak, resident, shared, growth int64
	for i, m := range via.memAfter {
		peak = max(peak, m.peak)
		resident += m.resident
		shared += m.shared
		growth += m.resident - via.memBefore[i].resident
	}
	n := int64(len(via.memAfter))
	per := float64(growth) / float64(max(len(via.walls), 1))
	r.evidence("%d workers hold %s resident on average after a warm-up request (of which %s shared: the region's pages they touched, mapped by every worker); the most one ever held is %s (VmHWM)",
		n, humanBytes(float64(resident/n)), humanBytes(float64(shared/n)), humanBytes(float64(peak)))
	r.evidence("over the %d timed requests they grew by %s in all: %s per request", len(via.walls), signedBytes(float64(growth)), signedBytes(per))
	if up != nil && up.memErr == nil && len(up.memAfter) > 0 {
		u := up.memAfter[0]
		r.evidence("the upstream's process (pid %d) holds %s resident, %s at most so far; %s per request over its %d timed requests",
			up.pidList[0], humanBytes(float64(u.resident)), humanBytes(float64(u.peak)),
			signedBytes(float64(u.resident-up.memBefore[0].resident)/float64(max(len(up.walls), 1))), len(up.walls))
	} else if up != nil && up.memErr != nil && len(up.pidList) > 0 {
		r.skip("the upstream's memory: %v", strings.TrimPrefix(up.memErr.Error(), "tune: "))
	}
	limit := suggestMaxRSS(peak)
	why := fmt.Sprintf("about twice the most a worker held (%s), so that a worker is replaced when its memory doubles (a leak, a cache that never stops growing) and never in normal use", humanBytes(float64(peak)))
	if limit == prefork.MinMaxRSS {
		why = fmt.Sprintf("the least max_rss there is (twice the most a worker held, %s, is below it): a worker is replaced only when its memory grows far past what it needs", humanBytes(float64(peak)))
	}
	r.advice("server.max_rss = %q: %s", config.Size(limit).String(), why)
	if per >= 1024 {
		r.advice("at %s per request a worker would reach it after about %.0f more requests: if that is sooner than the worker should live, the application's memory grows (a leak, or caches filling: measure again later, after more traffic)",
			signedBytes(per), float64(limit-peak)/per)
	}
	if up != nil && up.memErr == nil && len(up.memAfter) > 0 {
		r.advice("this host then needs room for %d × %s of workers (less the region's pages, which they share) beside the upstream's %s", n, config.Size(limit).String(), humanBytes(float64(up.memAfter[0].peak)))
	}
	r.skip("memory under load: measured on sequential requests; many connections at once hold a buffer each, so the busy hour's peak may be higher (watch preforkd_worker_resident_memory_bytes then, and measure again)")
}

// suggestMaxRSS is max_rss for workers whose peak resident memory is
// peak: about twice it, rounded up to a whole MiB, never below the least
// max_rss.
func suggestMaxRSS(peak int64) int64 {
	const mib = 1 << 20
	return max(prefork.MinMaxRSS, (2*peak+mib-1)/mib*mib)
}

// signedBytes is humanBytes with a sign.
func signedBytes(n float64) string {
	if n < 0 {
		return "-" + humanBytes(-n)
	}
	return "+" + humanBytes(n)
}

// cpuBound is the share of its wall time an application spends on the CPU
// from which tune calls it CPU-bound.
const cpuBound = 0.5

func boundness(share float64) string {
	switch {
	case share >= cpuBound:
		return "CPU-bound"
	case share < 0.2:
		return "mostly waiting (I/O, sleeps, other services)"
	}
	return "partly CPU-bound"
}

// upstreamPID finds the process of this host that listens on u's address.
func upstreamPID(u *url.URL) (int, error) {
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	ips, err := net.LookupIP(host)
	if err != nil || len(ips) == 0 {
		return 0, fmt.Errorf("tune: %s does not resolve", host)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("tune: port %q", port)
	}
	a, _ := netip.AddrFromSlice(ips[0])
	return listener(netip.AddrPortFrom(a.Unmap(), uint16(p)))
}

// timing is n sequential requests to one URL.
type timing struct {
	url      string
	n        int
	statuses map[int]int
	errs     int
	walls    []time.Duration
	wall     time.Duration // of all the requests, first to last
	cpu      time.Duration // of the pids over the same span, less their idle use
	idle     time.Duration // of the pids over idleWindow without requests
	waited   time.Duration // the pids' threads ready to run, waiting for a CPU, over the span
	pids     int
	pidList  []int
	cpuErr   error
	// The pids' memory after the warm-up request and after the timed
	// requests.
	memBefore, memAfter []memSample
	memErr              error
}

// idleWindow is how long tune watches the processes' CPU without
// requests, to subtract what they use anyway (timers, the GC).
const idleWindow = 250 * time.Millisecond

func timeRequests(ctx context.Context, target string, n int, pids []int) *timing {
	t := &timing{url: target, n: n, statuses: map[int]int{}, pids: len(pids), pidList: pids}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1}}
	defer c.CloseIdleConnections()
	// One request first, untimed: the connection and the process warm.
	if req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil); err == nil {
		if resp, err := c.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	// What the processes use with no request: subtracted below.
	quiet, err := ofEach(pids, cpuTime)
	time.Sleep(idleWindow)
	before, berr := ofEach(pids, cpuTime)
	t.idle = usedBetween(quiet, before)
	err = errors.Join(err, berr)
	if len(pids) == 0 {
		err = errors.New("tune: no process to read")
	}
	var merr error
	if len(pids) > 0 {
		t.memBefore, merr = ofEach(pids, memOf)
	}
	start := time.Now()
	for range n {
		req, rerr := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if rerr != nil {
			t.errs++
			continue
		}
		s := time.Now()
		resp, rerr := c.Do(req)
		if rerr != nil {
			t.errs++
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		t.walls = append(t.walls, time.Since(s))
		t.statuses[resp.StatusCode]++
	}
	t.wall = time.Since(start)
	after, aerr := ofEach(pids, cpuTime)
	t.cpu = max(usedBetween(before, after)-t.idle*t.wall/idleWindow, 0)
	t.waited = waitedBetween(before, after)
	t.cpuErr = errors.Join(err, aerr)
	if merr == nil && len(pids) > 0 {
		t.memAfter, merr = ofEach(pids, memOf)
	}
	t.memErr = merr
	slices.Sort(t.walls)
	return t
}

func (t *timing) median() time.Duration {
	if len(t.walls) == 0 {
		return 0
	}
	return t.walls[len(t.walls)/2]
}

func (t *timing) cpuPer() time.Duration { return t.cpu / time.Duration(max(len(t.walls), 1)) }

// cpuShare is the CPU time over the wall time of the requests, less the
// time the processes waited for a CPU: on a busy host a CPU-bound handler
// waits its turn, which says nothing of what it does once it runs.
func (t *timing) cpuShare() float64 {
	wall := max(t.wall-t.waited, t.cpu)
	if wall <= 0 {
		return 0
	}
	return float64(t.cpu) / float64(wall)
}

func (t *timing) summary() string {
	if len(t.walls) == 0 {
		return fmt.Sprintf("none answered (%d failed)", t.errs)
	}
	var codes []string
	for _, c := range slices.Sorted(func(yield func(int) bool) {
		for c := range t.statuses {
			if !yield(c) {
				return
			}
		}
	}) {
		codes = append(codes, fmt.Sprintf("%d×%d", t.statuses[c], c))
	}
	if t.errs > 0 {
		codes = append(codes, fmt.Sprintf("%d failed", t.errs))
	}
	return fmt.Sprintf("median %v, fastest %v, slowest %v (%s)", t.median().Round(10*time.Microsecond),
		first(t.walls).Round(10*time.Microsecond), last(t.walls).Round(10*time.Microsecond), strings.Join(codes, ", "))
}

func first(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[0]
}

func last(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[len(d)-1]
}

// metricsPage is a /metrics answer: each sample by its name and labels as
// written.
type metricsPage map[string]float64

func (m metricsPage) get(sample string) float64 { return m[sample] }

// quantile estimates the q-quantile of histogram name from its buckets:
// the upper bound of the first bucket that holds it (an upper bound).
func (m metricsPage) quantile(name string, q float64) float64 {
	total := m[name+"_count"]
	if total == 0 {
		return 0
	}
	type bucket struct{ le, n float64 }
	var bs []bucket
	prefix := name + `_bucket{le="`
	for k, v := range m {
		if s, ok := strings.CutPrefix(k, prefix); ok {
			le, err := strconv.ParseFloat(strings.TrimSuffix(s, `"}`), 64)
			if err == nil {
				bs = append(bs, bucket{le, v})
			}
		}
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	for _, b := range bs {
		if b.n >= q*total {
			return b.le
		}
	}
	return math.Inf(1)
}

func getJSON(ctx context.Context, c *http.Client, u string, v any) error {
	b, err := fetch(ctx, c, u)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("tune: %s: %w", u, err)
	}
	return nil
}

func getMetrics(ctx context.Context, c *http.Client, u string) (metricsPage, error) {
	b, err := fetch(ctx, c, u)
	if err != nil {
		return nil, err
	}
	m := metricsPage{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("tune: %s: %w", u, err)
	}
	return m, nil
}

func fetch(ctx context.Context, c *http.Client, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("tune: %w", err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("tune: the admin endpoint: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("tune: %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("tune: %s answered %d", u, resp.StatusCode)
	}
	return b, nil
}

// pow2AtLeast is the least power of two at or above n (at least 8).
func pow2AtLeast(n float64) int {
	if n <= 8 {
		return 8
	}
	return 1 << bits.Len(uint(math.Ceil(n))-1)
}

func humanBytes(n float64) string {
	switch {
	case n >= 1<<30:
		return strconv.FormatFloat(n/(1<<30), 'f', 1, 64) + "GiB"
	case n >= 1<<20:
		return strconv.FormatFloat(n/(1<<20), 'f', 1, 64) + "MiB"
	case n >= 1<<10:
		return strconv.FormatFloat(n/(1<<10), 'f', 1, 64) + "KiB"
	}
	return strconv.FormatFloat(n, 'f', 0, 64) + "B"
}

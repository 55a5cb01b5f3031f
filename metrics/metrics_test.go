package metrics

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// statRegion is a private region with room for the statistics of rules,
// joined as worker 0.
func statRegion(t testing.TB, rules int) *shm.Region {
	t.Helper()
	o := shm.Options{Counters: 8, MaxWorkers: 4}
	Geometry(&o, rules)
	return shmtest.Private(t, o)
}

// The names follow Prometheus' conventions, which promtool checks: a
// counter ends in _total, a histogram in its base unit, no name says its
// type; a label's values are a fixed list.
func TestFamilyNames(t *testing.T) {
	seen := map[string]bool{}
	for f := range numFamilies {
		s := &specs()[f]
		if s.name == "" || helps[f].family == "" || seen[s.name] || (s.hist != "") != (helps[f].hist != "") {
			t.Errorf("family %d: name %q, help %q, histogram %q help %q: missing or repeated", f, s.name, helps[f].family, s.hist, helps[f].hist)
		}
		seen[s.name] = true
		if !strings.HasPrefix(s.name, "preforkd_") || strings.Contains(s.name, "counter") {
			t.Errorf("%s: want the preforkd_ prefix and no type in the name", s.name)
		}
		switch s.kind {
		case counter, perWorker:
			if !strings.HasSuffix(s.name, "_total") {
				t.Errorf("counter %s does not end in _total", s.name)
			}
		case connGauge:
			if strings.HasSuffix(s.name, "_total") || s.label == "" {
				t.Errorf("gauge %s: want no _total, and a label", s.name)
			}
		case codeHistogram:
			if !strings.HasSuffix(s.name, "_total") || !strings.HasSuffix(s.hist, "_seconds") || helps[f].hist == "" {
				t.Errorf("%s: want a counter name and a histogram in seconds", s.name)
			}
		case histogram:
			if !strings.HasSuffix(s.name, "_seconds") && !strings.HasSuffix(s.name, "_bytes") || s.per == 0 || len(s.bounds) == 0 {
				t.Errorf("histogram %s: want a base unit (_seconds, _bytes), a scale and bounds", s.name)
			}
			for i := 1; i < len(s.bounds); i++ {
				if s.bounds[i] <= s.bounds[i-1] {
					t.Errorf("histogram %s: bounds not increasing at %d", s.name, i)
				}
			}
		}
		if (s.label == "") != (len(s.values) == 0) {
			t.Errorf("%s: a label needs values and values a label", s.name)
		}
	}
}

// The duration histograms' buckets are a contract (dashboards and alerts
// name them): the same ladder from 1ms to 60s for a request and for its
// upstream, so that the two read against each other bucket by bucket.
func TestDurationBuckets(t *testing.T) {
	const want = "0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 5 10 30 60 +Inf"
	var p Text
	var s Snapshot
	Read(statRegion(t, 1), &s)
	s.AppendFamilies(&p, nil)
	for _, name := range []string{"preforkd_http_request_duration_seconds", "preforkd_upstream_response_duration_seconds"} {
		var les []string
		for line := range strings.Lines(string(p.Bytes())) {
			if le, ok := strings.CutPrefix(line, name+`_bucket{le="`); ok {
				les = append(les, le[:strings.IndexByte(le, '"')])
			}
		}
		if got := strings.Join(les, " "); got != want {
			t.Errorf("%s buckets: %s, want %s", name, got, want)
		}
	}
}

// Counting lands where reading looks, for fixed and per-rule families and
// histograms, and a rule beyond the rows' room is not counted.
func TestRowAndSnapshot(t *testing.T) {
	r := statRegion(t, 1)
	row := NewRow(r)
	login, api := RuleIndex(r, "login"), RuleIndex(r, "api")
	if login < 0 || api < 0 || login == api {
		t.Fatalf("rule indexes %d, %d", login, api)
	}
	row.AddRule(RateLimitRequests, login, Limited, 3)
	row.AddRule(RateLimitRequests, api, Allowed, 1)
	row.AddRule(RateLimitRequests, -1, Allowed, 1) // no index: nowhere
	row.Response(200, 700*time.Microsecond)
	row.Response(503, 3*time.Second)
	row.Response(999, 0)
	row.Add(UpstreamErrors, UpstreamTimeout, 2)
	row.Observe(IdempotencyStoredBytes, 5000)
	row.Upstream(3 * time.Millisecond)
	row.Upstream(-time.Second) // a clock that went back: 0

	var s Snapshot
	Read(r, &s)
	for _, c := range []struct {
		got, want uint64
		what      string
	}{
		{s.RuleValue(RateLimitRequests, login, Limited), 3, "login limited"},
		{s.RuleValue(RateLimitRequests, api, Allowed), 1, "api allowed"},
		{s.RuleValue(RateLimitRequests, api, Limited), 0, "api limited"},
		{s.Value(HTTPRequests, 200-minCode), 1, "200s"},
		{s.Value(HTTPRequests, maxCode-minCode+1), 1, "other codes"},
		{s.Requests(), 3, "requests"},
		{s.Errors5xx(), 1, "5xx"},
		{Total(r, UpstreamErrors, UpstreamTimeout), 2, "upstream timeouts (Total)"},
		{RuleTotal(r, RateLimitRequests, login, Limited), 3, "login limited (RuleTotal)"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
	var p Text
	s.AppendFamilies(&p, []Rule{{Name: "login", Index: login}, {Name: "unseen", Index: -1}})
	page := string(p.Bytes())
	for _, want := range []string{
		`preforkd_ratelimit_requests_total{rule="login",result="limited"} 3`,
		`preforkd_ratelimit_requests_total{rule="unseen",result="allowed"} 0`,
		`preforkd_http_request_duration_seconds_bucket{le="0.001"} 2`, // 700µs and 0
		`preforkd_http_request_duration_seconds_bucket{le="2.5"} 2`,
		`preforkd_http_request_duration_seconds_bucket{le="5"} 3`,
		`preforkd_http_request_duration_seconds_sum 3.0007`,
		`preforkd_http_requests_total{code="other"} 1`,
		`preforkd_idempotency_stored_bytes_bucket{le="4096"} 0`,
		`preforkd_idempotency_stored_bytes_bucket{le="16384"} 1`,
		`preforkd_upstream_errors_total{kind="timeout"} 2`,
		`preforkd_upstream_response_duration_seconds_bucket{le="0.001"} 1`,
		`preforkd_upstream_response_duration_seconds_bucket{le="0.005"} 2`,
		`preforkd_upstream_response_duration_seconds_sum 0.003`,
		`preforkd_upstream_response_duration_seconds_count 2`,
	} {
		if !strings.Contains(page, want+"\n") {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(page, `code="404"`) {
		t.Error("the page lists a status code never sent")
	}
}

// Connections by state: every worker counts its own in one word, a change
// of state one add; the sum is every worker's, and a reaped worker's
// connections leave the gauges while its accepted ones stay counted.
func TestConns(t *testing.T) {
	o := shm.Options{Counters: 8, MaxWorkers: 4}
	Geometry(&o, 1)
	if o.StatGauges != 1 {
		t.Fatalf("Geometry: %d gauge words, want 1", o.StatGauges)
	}
	sup := shmtest.Create(t, o)
	w1, w2 := NewRow(shmtest.Attach(t, sup, 1)).Conns(), NewRow(shmtest.Attach(t, sup, 2)).Conns()
	open := func(c Conns, n int, to ...ConnState) {
		for range n {
			c.Accepted()
			c.Move(ConnClosed, ConnReading)
			from := ConnReading
			for _, st := range to {
				c.Move(from, st)
				from = st
			}
		}
	}
	open(w1, 3)                                       // reading
	open(w1, 2, ConnWriting)                          // writing
	open(w1, 4, ConnWriting, ConnIdle)                // idle
	open(w1, 1, ConnWriting, ConnIdle, ConnReading)   // the next request's header
	open(w2, 5, ConnWriting, ConnIdle, ConnClosed)    // gone
	open(w2, 2, ConnWriting, ConnIdle, ConnWriting)   // the next request
	open(w2, 1, ConnWriting, ConnWriting, ConnClosed) // a Move to the same state is none
	w1.MaxReached()
	var zero Conns // counts nothing, and does not fail
	zero.Accepted()
	zero.Move(ConnClosed, ConnReading)
	zero.MaxReached()

	check := func(when string, reading, writing, idle, accepted uint64) {
		t.Helper()
		var s Snapshot
		Read(sup, &s)
		got := [4]uint64{s.Conns(ConnReading), s.Conns(ConnWriting), s.Conns(ConnIdle), s.Value(ConnectionsAccepted, 0)}
		if want := [4]uint64{reading, writing, idle, accepted}; got != want {
			t.Fatalf("%s: reading, writing, idle, accepted = %v, want %v", when, got, want)
		}
	}
	check("two workers", 4, 4, 4, 18)

	var s Snapshot
	Read(sup, &s)
	var p Text
	s.AppendFamilies(&p, nil)
	page := string(p.Bytes())
	for _, want := range []string{
		"# TYPE preforkd_connections gauge",
		`preforkd_connections{state="reading"} 4`,
		`preforkd_connections{state="writing"} 4`,
		`preforkd_connections{state="idle"} 4`,
		"preforkd_connections_accepted_total 18",
		"preforkd_connections_max_reached_total 1",
	} {
		if !strings.Contains(page, want+"\n") {
			t.Errorf("page lacks %q", want)
		}
	}

	if _, err := sup.Reap(1); err != nil {
		t.Fatal(err)
	}
	check("worker 1 reaped with 10 open", 0, 2, 0, 18)
	w2.Move(ConnWriting, ConnClosed)
	w2.Move(ConnWriting, ConnIdle)
	check("worker 2 closed one, finished one", 0, 0, 1, 18)
}

// A region of an older build, without gauge words, counts the states of
// a process for itself alone: summed, they would outlive its worker.
func TestConnsWithoutGauges(t *testing.T) {
	o := shm.Options{Counters: 8, MaxWorkers: 4}
	Geometry(&o, 1)
	o.StatGauges = 0
	sup := shmtest.Create(t, o)
	c := NewRow(shmtest.Attach(t, sup, 1)).Conns()
	c.Accepted()
	c.Move(ConnClosed, ConnReading)
	var s Snapshot
	Read(sup, &s)
	if s.Conns(ConnReading) != 0 || s.Value(ConnectionsAccepted, 0) != 1 {
		t.Fatalf("reading %d (want 0: not shared), accepted %d (want 1)", s.Conns(ConnReading), s.Value(ConnectionsAccepted, 0))
	}
}

// A region has room for DefaultRules names at least; beyond its room a
// rule gets no index, and its counts go nowhere rather than into another
// rule's.
func TestRuleRoom(t *testing.T) {
	r := statRegion(t, 1)
	for i := range DefaultRules {
		if RuleIndex(r, "r"+strings.Repeat("x", i)) < 0 {
			t.Fatalf("rule %d has no index", i)
		}
	}
	if RuleIndex(r, "one too many") != -1 {
		t.Fatal("a rule beyond the room got an index")
	}
	o := shm.Options{}
	Geometry(&o, 1000)
	if o.StatNames != 4000 {
		t.Fatalf("Geometry for 1000 rules: %d names, want room for 4 times as many", o.StatNames)
	}
}

func TestTextEscaping(t *testing.T) {
	var p Text
	p.Family("x_total", "counter", "a \\ help\nline")
	p.Uint("x_total", 1, "l", "a\"b\\c\nd")
	want := "# HELP x_total a \\\\ help\\nline\n# TYPE x_total counter\nx_total{l=\"a\\\"b\\\\c\\nd\"} 1\n"
	if got := string(p.Bytes()); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// BenchmarkCountRequest is what counting adds to a request that one rule
// matches: its result, and the response's status and duration. Each
// worker process has its own row; the parallel run shares one row
// between goroutines, the worst case within a worker.
func BenchmarkCountRequest(b *testing.B) {
	r := statRegion(b, 64)
	row := NewRow(r)
	rule := RuleIndex(r, "login")
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			row.AddRule(RateLimitRequests, rule, Allowed, 1)
			row.Response(200, time.Duration(i&1023)*time.Microsecond)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				row.AddRule(RateLimitRequests, rule, Allowed, 1)
				row.Response(200, time.Duration(i&1023)*time.Microsecond)
			}
		})
	})
}

// near_limit: at least 80% of the limit used after the request.
func TestIsNearLimit(t *testing.T) {
	for _, c := range []struct {
		remaining, limit int64
		want             bool
	}{
		{4, 5, false}, {2, 5, false}, {1, 5, true}, {0, 5, true},
		{3, 10, false}, {2, 10, true},
		{0, 1, true}, {1, 1, false},
		{250, 1000, false}, {200, 1000, true},
		{0, 0, false},
	} {
		if got := IsNearLimit(c.remaining, c.limit); got != c.want {
			t.Errorf("IsNearLimit(%d, %d) = %v, want %v", c.remaining, c.limit, got, c.want)
		}
	}
}

// The layout tag changes with anything that moves a word of a row: a
// family added, renamed, reordered, given more words or made per rule.
func TestLayoutTag(t *testing.T) {
	var o shm.Options
	Geometry(&o, 0)
	if o.StatLayout == 0 || o.StatLayout != tagOf(specs()) {
		t.Fatalf("Geometry's tag %#x", o.StatLayout)
	}
	changes := map[string]func(f *[numFamilies]spec){
		"renamed":   func(f *[numFamilies]spec) { f[HTTPRequests].name += "_x" },
		"reordered": func(f *[numFamilies]spec) { f[CacheFills], f[CacheWaits] = f[CacheWaits], f[CacheFills] },
		"a word more": func(f *[numFamilies]spec) {
			f[UpstreamErrors].values = append(slices.Clone(f[UpstreamErrors].values), "x")
		},
		"per rule": func(f *[numFamilies]spec) { f[UpstreamErrors].perRule = true },
	}
	for name, change := range changes {
		f := *specs()
		change(&f)
		if tagOf(&f) == o.StatLayout {
			t.Errorf("%s: the same tag", name)
		}
	}
}

// The Redis families: counted in the row like the others, written by
// AppendRedis only (a page has them while [redis] is configured), the
// call durations in buckets from 100µs to 1s.
func TestRedisFamilies(t *testing.T) {
	r := statRegion(t, 1)
	row := NewRow(r)
	row.RedisCall(RedisOK, 300*time.Microsecond)
	row.RedisCall(RedisOK, 2*time.Millisecond)
	row.RedisCall(RedisTimeout, 25*time.Millisecond)
	row.RedisCall(RedisError, -time.Second) // a clock that went back: 0
	row.Add(RedisShortCircuits, 0, 4)
	row.Add(RedisDenyCacheHits, 0, 5)
	row.Add(RedisFlushes, RedisOK, 6)
	row.Add(RedisFlushes, RedisError, 1)
	row.Add(RedisNoScript, 0, 2)

	var s Snapshot
	Read(r, &s)
	var p Text
	s.AppendFamilies(&p, nil)
	if page := string(p.Bytes()); strings.Contains(page, "preforkd_redis_") {
		t.Errorf("AppendFamilies writes Redis families:\n%s", page)
	}
	p.Reset()
	s.AppendRedis(&p)
	page := string(p.Bytes())
	for _, want := range []string{
		"# TYPE preforkd_redis_calls_total counter\n",
		`preforkd_redis_calls_total{result="ok"} 2` + "\n",
		`preforkd_redis_calls_total{result="error"} 1` + "\n",
		`preforkd_redis_calls_total{result="timeout"} 1` + "\n",
		"# TYPE preforkd_redis_call_duration_seconds histogram\n",
		`preforkd_redis_call_duration_seconds_bucket{le="0.0001"} 1` + "\n", // the 0
		`preforkd_redis_call_duration_seconds_bucket{le="0.0005"} 2` + "\n",
		`preforkd_redis_call_duration_seconds_bucket{le="0.0025"} 3` + "\n",
		`preforkd_redis_call_duration_seconds_bucket{le="0.025"} 4` + "\n",
		`preforkd_redis_call_duration_seconds_bucket{le="1"} 4` + "\n",
		`preforkd_redis_call_duration_seconds_bucket{le="+Inf"} 4` + "\n",
		"preforkd_redis_call_duration_seconds_sum 0.0273\n",
		"preforkd_redis_call_duration_seconds_count 4\n",
		"preforkd_redis_short_circuits_total 4\n",
		"preforkd_redis_deny_cache_hits_total 5\n",
		`preforkd_redis_flushes_total{result="ok"} 6` + "\n",
		`preforkd_redis_flushes_total{result="error"} 1` + "\n",
		`preforkd_redis_flushes_total{result="timeout"} 0` + "\n",
		"preforkd_redis_noscript_total 2\n",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("AppendRedis: no %q in\n%s", want, page)
		}
	}
	if n := strings.Count(page, "# TYPE "); n != 6 {
		t.Errorf("AppendRedis wrote %d families, want 6:\n%s", n, page)
	}
	if a := testing.AllocsPerRun(100, func() { row.RedisCall(RedisOK, time.Millisecond) }); a != 0 {
		t.Errorf("RedisCall allocates %v", a)
	}
}

package main

import (
	"fmt"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/prefork"
)

// BenchmarkScrape is one GET /metrics of an instance of 16 workers and 64
// rules, every worker having counted for every rule and many status
// codes: the sums of the rows and the page.
func BenchmarkScrape(b *testing.B) {
	cfg := config.Config{Server: config.Server{Workers: 16}, Table: config.Table{Counters: 1024}}
	for i := range 64 {
		cfg.RateLimits = append(cfg.RateLimits, config.RateLimit{Name: fmt.Sprintf("rule-%d", i), Path: fmt.Sprintf("/r%d", i), Limit: 10, Window: time.Minute})
	}
	cfg = cfg.WithDefaults()
	ro := cfg.RegionOptions()
	ro.MaxWorkers = 34
	region := shmtest.Create(b, ro)
	st := prefork.Status{Settings: prefork.Settings{Config: cfg}, Serving: true}
	for w := range 16 {
		wr := shmtest.Attach(b, region, w)
		row := metrics.NewRow(wr)
		for i, rl := range cfg.RateLimits {
			row.AddRule(metrics.RateLimitRequests, metrics.RuleIndex(wr, rl.Name), i%5, uint64(w+i))
		}
		for _, code := range []int{200, 201, 204, 301, 304, 400, 401, 403, 404, 429, 500, 502, 503, 504} {
			row.Response(code, time.Duration(code)*time.Microsecond)
		}
		st.Workers = append(st.Workers, prefork.WorkerStatus{PID: 1000 + w, Index: w, Ready: true})
	}
	a := &admin{region: region, log: slog.New(slog.DiscardHandler), adminInfo: adminInfo{version: "v", commit: "c"}}
	a.status.Store(&st)
	rec := httptest.NewRecorder()
	a.serveMetrics(rec, httptest.NewRequest("GET", "/metrics", nil))
	b.ReportMetric(float64(rec.Body.Len()), "page-bytes")
	b.ReportAllocs()
	for b.Loop() {
		rec.Body.Reset()
		a.serveMetrics(rec, httptest.NewRequest("GET", "/metrics", nil))
	}
}

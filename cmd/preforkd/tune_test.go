package main

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// max_rss is about twice the largest peak, rounded up to a whole MiB,
// never below the 32 MiB floor.
func TestSuggestMaxRSS(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct{ peak, want int64 }{
		{0, 32 * mib},
		{12 * mib, 32 * mib},
		{16 * mib, 32 * mib},
		{16*mib + 1, 33 * mib},
		{40*mib + 300<<10, 81 * mib},
		{1 << 30, 2 << 30},
	} {
		if got := suggestMaxRSS(tc.peak); got != tc.want {
			t.Errorf("suggestMaxRSS(%d) = %d, want %d", tc.peak, got, tc.want)
		}
	}
}

// A metrics page tune cannot read whole (a line past the reader's 1 MiB)
// is an error, not a page of what came before it, which would advise
// from figures missing.
func TestTuneRefusesAPageItCannotRead(t *testing.T) {
	page := "preforkd_ready 1\n# " + strings.Repeat("x", 2<<20) + "\npreforkd_workers{state=\"ready\"} 2\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(page)) }))
	defer srv.Close()
	if m, err := getMetrics(context.Background(), srv.Client(), srv.URL); err == nil {
		t.Fatalf("getMetrics read %d figures of a page with a 2 MiB line, and no error", len(m))
	}
}

// Buckets of equal bounds, and +Inf, sort without a comparison that
// breaks the sort's contract.
func TestQuantileBounds(t *testing.T) {
	m := metricsPage{
		"d_count": 10, `d_bucket{le="+Inf"}`: 10, `d_bucket{le="0.5"}`: 9, `d_bucket{le="0.1"}`: 5, `d_bucket{le="0.25"}`: 5,
	}
	for q, want := range map[float64]float64{0.5: 0.1, 0.9: 0.5, 0.95: math.Inf(1)} {
		if got := m.quantile("d", q); got != want {
			t.Errorf("quantile(%v) = %v, want %v", q, got, want)
		}
	}
}

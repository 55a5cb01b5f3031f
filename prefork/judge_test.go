package prefork

import (
	"math"
	"testing"
)

// The statistics of the canary with fixed counts. The p-values were
// computed apart, with exact rational arithmetic for Fisher's test.
func TestJudge(t *testing.T) {
	rc := func(errors, requests uint64) RequestCounts {
		return RequestCounts{Requests: requests, Errors: errors}
	}
	for _, tc := range []struct {
		name          string
		canary, fleet RequestCounts
		min           int
		delta         float64
		want          Verdict
		test          string
		p             float64 // 0: not checked
	}{
		// A broken upstream: far above, by any test.
		{"broken", rc(71, 112), rc(0, 305), 50, 2, VerdictUnhealthy, testZ, 6.52994e-53},
		// Small counts are judged exactly: 3 of 50 against 0 of 200 is
		// significant (p 0.0076), 2 of 50 is not (p 0.039), though the
		// normal approximation would call both (p 0.00025, 0.0023).
		{"exact, significant", rc(3, 50), rc(0, 200), 50, 2, VerdictUnhealthy, testFisher, 0.00761757},
		{"exact, not significant", rc(2, 50), rc(0, 200), 50, 2, VerdictHealthy, testFisher, 0.0393574},
		{"exact, few fleet errors", rc(10, 60), rc(1, 300), 50, 2, VerdictUnhealthy, testFisher, 8.12498e-08},
		{"exact, tiny fleet", rc(60, 60), rc(0, 3), 50, 2, VerdictUnhealthy, testFisher, 2.51819e-05},
		{"exact, every request failed everywhere", rc(100, 100), rc(300, 300), 50, 2, VerdictHealthy, testFisher, 1},
		// The fleet-wide-count bug: old workers with a 5% error baseline
		// and a canary with the same must not abort.
		{"same 5% baseline", rc(50, 1000), rc(150, 3000), 50, 2, VerdictHealthy, testZ, 0.5},
		{"same 5% baseline, just at Cochran's 5", rc(5, 100), rc(45, 900), 50, 2, VerdictHealthy, testZ, 0.5},
		// Significant but within the allowed delta (3% vs 2%), then beyond it.
		{"significant, within delta", rc(300, 10000), rc(2000, 100000), 50, 2, VerdictHealthy, testZ, 1.33382e-11},
		{"significant, beyond delta", rc(450, 10000), rc(2000, 100000), 50, 2, VerdictUnhealthy, testZ, 5.42515e-59},
		// A delta of exactly the threshold is "at least" it (12% − 10%
		// is 1.9999999999999991 points in floating point).
		{"exactly the delta", rc(1200, 10000), rc(1000, 10000), 50, 2, VerdictUnhealthy, testZ, 0},
		{"exactly a delta of 6", rc(700, 10000), rc(100, 10000), 50, 6, VerdictUnhealthy, testZ, 0},
		{"significant, beyond a delta of 0.5", rc(300, 10000), rc(2000, 100000), 50, 0.5, VerdictUnhealthy, testZ, 1.33382e-11},
		// A canary better than the fleet is healthy.
		{"better than the fleet", rc(0, 500), rc(100, 1000), 50, 2, VerdictHealthy, testZ, 0},
		// Too little evidence: a canary that served nothing (a quiet
		// site), fewer than the minimum (even if every one failed), or a
		// fleet that served nothing to compare with.
		{"zero-traffic canary", rc(0, 0), rc(0, 3000), 50, 2, VerdictInconclusive, "", 1},
		{"zero traffic anywhere", rc(0, 0), rc(0, 0), 50, 2, VerdictInconclusive, "", 1},
		{"below the minimum", rc(49, 49), rc(0, 3000), 50, 2, VerdictInconclusive, "", 1},
		{"at the minimum", rc(50, 50), rc(0, 3000), 50, 2, VerdictUnhealthy, testFisher, 0},
		{"no fleet traffic", rc(60, 60), rc(0, 0), 50, 2, VerdictInconclusive, "", 1},
		// One fleet request: the most extreme window has p 1/(n1+1), not
		// significant below 100 canary requests, so no verdict is earned.
		{"one fleet request", rc(60, 60), rc(0, 1), 50, 2, VerdictInconclusive, "", 1},
		{"one fleet request, 99 canary", rc(99, 99), rc(0, 1), 50, 2, VerdictInconclusive, "", 1},
		{"one fleet request, 100 canary, 1 failed", rc(1, 100), rc(0, 1), 50, 2, VerdictHealthy, testFisher, 0.990099},
		{"one fleet request, 100 canary", rc(100, 100), rc(0, 1), 50, 2, VerdictUnhealthy, testFisher, 0.00990099},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := judge(tc.canary, tc.fleet, tc.min, tc.delta)
			if j.verdict != tc.want || j.test != tc.test {
				t.Errorf("verdict %s by %q (p %g), want %s by %q", j.verdict, j.test, j.pValue, tc.want, tc.test)
			}
			if tc.p != 0 && math.Abs(j.pValue-tc.p) > 1e-5*tc.p {
				t.Errorf("p-value %g, want %g", j.pValue, tc.p)
			}
			if j.canaryRate != rate(tc.canary) || j.fleetRate != rate(tc.fleet) {
				t.Errorf("rates %v, %v", j.canaryRate, j.fleetRate)
			}
		})
	}
}

// Fisher's tail against exact sums, over a grid of small tables; and on
// counts large enough that a naive sum would overflow.
func TestFisherUpper(t *testing.T) {
	choose := func(n, k uint64) float64 {
		if k > n {
			return 0
		}
		r := 1.0
		for i := uint64(1); i <= k; i++ {
			r = r * float64(n-k+i) / float64(i)
		}
		return r
	}
	for total := uint64(1); total <= 40; total += 3 {
		for k := uint64(0); k <= total; k += 2 {
			for n := uint64(0); n <= total; n += 3 {
				for x := uint64(0); x <= min(n, k); x++ {
					var want float64
					for i := x; i <= min(n, k); i++ {
						want += choose(k, i) * choose(total-k, n-i)
					}
					want /= choose(total, n)
					if got := fisherUpper(x, n, k, total); math.Abs(got-want) > 1e-9*max(want, 1e-300) && math.Abs(got-want) > 1e-15 {
						t.Fatalf("fisherUpper(%d, %d, %d, %d) = %g, want %g", x, n, k, total, got, want)
					}
				}
			}
		}
	}
	// Every request an error but one, 10^5 of them: the tail from 0 is 1.
	if p := fisherUpper(0, 50000, 99999, 100000); math.Abs(p-1) > 1e-12 {
		t.Errorf("tail from 0: %g, want 1", p)
	}
	if p := fisherUpper(50000, 50000, 99999, 100000); math.Abs(p-0.5) > 1e-9 {
		t.Errorf("tail at the top: %g, want 0.5", p)
	}
}

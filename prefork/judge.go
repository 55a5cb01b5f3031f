package prefork

import (
	"math"
)

// Verdict is the outcome of a reload's canary.
type Verdict string

const (
	// VerdictHealthy: the canary's 5xx rate is not significantly above
	// the other workers', or above them by less than the allowed delta.
	// The reload rolls on.
	VerdictHealthy Verdict = "healthy"
	// VerdictUnhealthy: significantly above, and by at least the allowed
	// delta. The reload is aborted.
	VerdictUnhealthy Verdict = "unhealthy"
	// VerdictInconclusive: too few requests to tell (fewer than
	// canary_min_requests for the canary, or too few for the others for
	// any outcome to be significant). The reload continues or aborts as
	// canary_inconclusive says.
	VerdictInconclusive Verdict = "inconclusive"
	// VerdictFailed: the canary could not start, exited, or never became
	// ready. The reload is aborted at once.
	VerdictFailed Verdict = "failed"
)

// canaryAlpha is the significance level of the one-sided test: the
// probability of calling a canary unhealthy when its 5xx rate is in truth
// no higher than the others'. Low, because a false alarm aborts a good
// deploy, while a bad canary is rarely near the boundary (a broken
// upstream or rule answers most requests with 5xx) and the delta gate
// already keeps small excesses from aborting.
const canaryAlpha = 0.01

// Names of the tests judge makes.
const (
	testFisher = "fisher"
	testZ      = "z"
)

// judgement is what judge concludes from the counts of one window.
type judgement struct {
	verdict Verdict
	test    string  // testFisher or testZ; "" when no test was made
	pValue  float64 // one-sided; 1 when no test was made
	// canaryRate and fleetRate are the 5xx rates (0..1); 0 without requests.
	canaryRate, fleetRate float64
}

// judge compares a canary's requests and 5xx over a window with those of
// the rest of the fleet over the same window (never with a fleet-wide
// count that includes the canary: the canary's own errors would raise
// the baseline it is compared with).
//
// The canary is unhealthy when both hold: its rate exceeds the fleet's by
// at least maxDelta (in percentage points), and the excess is significant
// in a one-sided two-proportion test (H0: canary rate <= fleet rate) at
// canaryAlpha. The test is Fisher's exact test while any expected cell of
// the 2×2 table (canary/fleet × 5xx/other) is below 5, and the pooled
// two-proportion z-test otherwise (Cochran's rule: from there the normal
// approximation is close, and the exact tail would cost a sum over up to
// every request of the window). A binomial test against the fleet's rate
// would treat that rate as known; Fisher's conditions on both groups, as
// the fleet is a sample too.
//
// With fewer than minRequests canary requests, or no fleet request at
// all, there is nothing to judge by: inconclusive. So is a fleet too small
// for any outcome to be significant (one request, against fewer than 100
// of the canary's): even a canary whose every request failed, beside a
// fleet that failed none, would pass the test, and "healthy" would claim
// evidence that the window did not hold.
func judge(canary, fleet RequestCounts, minRequests int, maxDelta float64) judgement {
	j := judgement{pValue: 1, canaryRate: rate(canary), fleetRate: rate(fleet)}
	if canary.Requests < uint64(max(minRequests, 1)) || fleet.Requests == 0 || !canTell(canary, fleet) {
		j.verdict = VerdictInconclusive
		return j
	}
	j.test, j.pValue = proportionTest(canary, fleet)
	if j.overDelta(maxDelta) && j.pValue < canaryAlpha {
		j.verdict = VerdictUnhealthy
	} else {
		j.verdict = VerdictHealthy
	}
	return j
}

// canTell reports whether the window's sizes leave any outcome
// significant: the most extreme one, every canary request a 5xx and no
// fleet request one, has Fisher's p-value 1/C(n1+n2, n1).
func canTell(canary, fleet RequestCounts) bool {
	n := canary.Requests
	return fisherUpper(n, n, n, n+fleet.Requests) < canaryAlpha
}

// overDelta reports whether the canary's rate exceeds the fleet's by at
// least maxDelta percentage points. The rates are ratios of counts: a
// delta of exactly maxDelta can come out a hair below it in floating
// point (12% − 10% is 1.9999999999999991 points), hence the tolerance,
// far below any count's step.
func (j judgement) overDelta(maxDelta float64) bool {
	return (j.canaryRate-j.fleetRate)*100 >= maxDelta-1e-9
}

func rate(c RequestCounts) float64 {
	if c.Requests == 0 {
		return 0
	}
	return float64(c.Errors) / float64(c.Requests)
}

// proportionTest returns the test used and the one-sided p-value of the
// canary's error rate being above the fleet's; both must have requests.
func proportionTest(canary, fleet RequestCounts) (string, float64) {
	n1, n2 := float64(canary.Requests), float64(fleet.Requests)
	x1, x2 := float64(canary.Errors), float64(fleet.Errors)
	n, k := n1+n2, x1+x2
	if min(n1*k/n, n1*(n-k)/n, n2*k/n, n2*(n-k)/n) < 5 {
		return testFisher, fisherUpper(canary.Errors, canary.Requests, canary.Errors+fleet.Errors, canary.Requests+fleet.Requests)
	}
	p := k / n
	z := (x1/n1 - x2/n2) / math.Sqrt(p*(1-p)*(1/n1+1/n2))
	return testZ, 0.5 * math.Erfc(z/math.Sqrt2)
}

// fisherUpper is the upper tail P(X >= x) of the hypergeometric
// distribution of X, the errors among n draws (the canary's requests) from
// total requests of which k are errors: the one-sided p-value of Fisher's
// exact test. Requires x <= n <= total and x <= k <= total.
func fisherUpper(x, n, k, total uint64) float64 {
	hi := min(n, k)
	if x > hi {
		return 0
	}
	// Terms are summed in units of the largest one in the tail (at the
	// mode, or at x when x is past it), so that none overflows; past the
	// mode they only shrink, and the sum stops once they no longer change it.
	logTerm := func(i uint64) float64 {
		return logChoose(k, i) + logChoose(total-k, n-i) - logChoose(total, n)
	}
	mode := uint64(float64(n+1) * float64(k+1) / float64(total+2))
	ref := logTerm(min(max(x, mode), hi))
	sum := 0.0
	for i := x; i <= hi; i++ {
		t := math.Exp(logTerm(i) - ref)
		sum += t
		if i > mode && t < sum*1e-17 {
			break
		}
	}
	return min(1, math.Exp(ref)*sum)
}

// logChoose is log(n choose k), for k <= n.
func logChoose(n, k uint64) float64 {
	a, _ := math.Lgamma(float64(n) + 1)
	b, _ := math.Lgamma(float64(k) + 1)
	c, _ := math.Lgamma(float64(n-k) + 1)
	return a - b - c
}

// RequestCounts are responses sent, and the 5xx among them: what a canary
// is judged by, from the per-worker statistics of the region
// (metrics.Snapshot.Requests and Errors5xx).
type RequestCounts struct {
	Requests uint64
	Errors   uint64 // status 500..599
}

// Sub returns c − earlier: what was counted between two samples.
func (c RequestCounts) Sub(earlier RequestCounts) RequestCounts {
	return RequestCounts{Requests: c.Requests - earlier.Requests, Errors: c.Errors - earlier.Errors}
}

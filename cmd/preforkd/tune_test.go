package main

import "testing"

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

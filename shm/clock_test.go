package shm_test

import (
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// A re-attached region's clock: kept when it is this boot's and agrees
// with the last beat; otherwise continued from the beat by the wall-clock
// downtime, never negative.
func TestResumeClock(t *testing.T) {
	const down = 5 * time.Second
	tests := []struct {
		name   string
		skew   func(r *shm.Region) // what happened to the region while down
		reason string              // "" = kept
		want   time.Duration       // region time after the resume, ± slack (kept: unchecked)
	}{
		{"same boot, downtime counted", func(r *shm.Region) {}, "", 0},
		{"time base 60s ahead", func(r *shm.Region) { r.SetNow(r.Now() - 60*time.Second) }, "time base ahead of the clock", 10*time.Second + down},
		{"another boot", func(r *shm.Region) { r.SetBootID(12345) }, "another boot", 10*time.Second + down},
		{"clock 1h ahead", func(r *shm.Region) { r.SetNow(r.Now() + time.Hour) }, "clock ahead of the wall clock", 10*time.Second + down},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := shm.CreatePrivate(shm.Options{Counters: 8})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			r.SetNow(10 * time.Second)
			beat := time.Now()
			r.Beat(beat)
			tt.skew(r)
			// Resume as if the wall clock said `down` passed since the beat.
			res := r.ResumeClock(beat.Add(down))
			if got := res.Reason; got != tt.reason || res.Rebased != (tt.reason != "") {
				t.Fatalf("ResumeClock: %+v, want reason %q", res, tt.reason)
			}
			now := r.Now()
			if now < 0 {
				t.Fatalf("region time %v after the resume", now)
			}
			if tt.reason != "" && (now < tt.want || now > tt.want+time.Second) {
				t.Fatalf("region time %v after the resume, want %v", now, tt.want)
			}
		})
	}
}

// A region from another boot continues from its last beat plus the
// wall-clock time since, within bounds: a wall clock that went backwards
// while down grants nothing, and one far ahead of the beat (wrong then,
// right now: 1970 on a machine without a real-time clock) counts
// MaxDowntime at most, so that the region's times stay within their
// 48-bit range.
func TestResumeClockBounds(t *testing.T) {
	for _, tt := range []struct {
		name      string
		wall      time.Duration // the wall clock at the resume, from the beat
		continued time.Duration // the downtime counted
	}{
		{"wall clock went back", -time.Hour, 0},
		{"56 years", 56 * 365 * 24 * time.Hour, shm.MaxDowntime},
	} {
		r, err := shm.CreatePrivate(shm.Options{Counters: 8})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		r.SetNow(time.Minute)
		beat := time.Now()
		r.Beat(beat)
		r.SetBootID(1)
		r.ResumeClock(beat.Add(tt.wall))
		if now, want := r.Now(), time.Minute+tt.continued; now < want || now > want+time.Second {
			t.Errorf("%s: region time %v, want the beat's 1m and %v", tt.name, now, tt.continued)
		}
	}
}

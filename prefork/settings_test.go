//go:build linux

package prefork

import (
	"context"
	"errors"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// Settings' zero values are the documented defaults; a value out of range
// is refused with the field it names.
func TestSettingsDefaults(t *testing.T) {
	got, err := Settings{}.withDefaults()
	want := Settings{ShutdownTimeout: DefaultShutdownTimeout, Canary: Canary{
		Window: DefaultCanaryWindow, MinRequests: DefaultCanaryMinRequests, MaxErrorDelta: DefaultCanaryMaxErrorDelta,
	}}
	if err != nil || got.ShutdownTimeout != want.ShutdownTimeout || got.Canary != want.Canary || got.MaxRequests != 0 || got.MaxRSS != 0 {
		t.Fatalf("zero settings: %+v (%v), want %+v", got, err, want)
	}
	set := Settings{ShutdownTimeout: time.Second, MaxRequests: 10, MaxRSS: MinMaxRSS, Canary: Canary{
		Off: true, Window: minCanaryWindow, MinRequests: 1, MaxErrorDelta: 100, Inconclusive: InconclusiveAbort,
	}}
	if got, err := set.withDefaults(); err != nil || got.ShutdownTimeout != set.ShutdownTimeout || got.Canary != set.Canary ||
		got.MaxRequests != 10 || got.MaxRSS != MinMaxRSS {
		t.Fatalf("settings at their bounds: %+v (%v), want them kept", got, err)
	}

	for _, tc := range []struct {
		edit  func(*Settings)
		field string
		err   string
	}{
		{func(s *Settings) { s.ShutdownTimeout = -time.Second }, "ShutdownTimeout", "must be positive, got -1s"},
		{func(s *Settings) { s.MaxRequests = -1 }, "MaxRequests", "must not be negative (0 means never), got -1"},
		{func(s *Settings) { s.MaxRSS = -1 }, "MaxRSS", "must not be negative, got -1"},
		{func(s *Settings) { s.MaxRSS = MinMaxRSS - 1 }, "MaxRSS", "must be at least 32MiB"},
		{func(s *Settings) { s.Canary.Window = minCanaryWindow - 1 }, "Canary.Window", "must be between 100ms and 1h0m0s, got 99.999999ms"},
		{func(s *Settings) { s.Canary.Window = maxCanaryWindow + 1 }, "Canary.Window", "got 1h0m0.000000001s"},
		{func(s *Settings) { s.Canary.MinRequests = -1 }, "Canary.MinRequests", "must be at least 1, got -1"},
		{func(s *Settings) { s.Canary.MaxErrorDelta = -0.5 }, "Canary.MaxErrorDelta", "got -0.5"},
		{func(s *Settings) { s.Canary.MaxErrorDelta = 100.5 }, "Canary.MaxErrorDelta", "got 100.5"},
		{func(s *Settings) { s.Canary.MaxErrorDelta = math.NaN() }, "Canary.MaxErrorDelta", "got NaN"},
		{func(s *Settings) { s.Canary.Inconclusive = InconclusiveAbort + 1 }, "Canary.Inconclusive", "unknown value 2"},
	} {
		s := Settings{}
		tc.edit(&s)
		_, err := s.withDefaults()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Msg, tc.err) ||
			!strings.HasPrefix(err.Error(), "prefork: Settings."+tc.field+" (") {
			t.Errorf("%+v: %v, want an error of %s with %q", s, err, tc.field, tc.err)
		}
	}
}

// Run refuses to start without an engine, and settings that are not
// valid, before it starts anything; it closes the listener it was given.
func TestRunRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		err  string
	}{
		{Options{}, "prefork: Options.Engine is nil"},
		{Options{Engine: testEngine, Workers: -3}, "prefork: Options.Workers -3 is negative"},
		{Options{Engine: testEngine, Settings: Settings{MaxRSS: 1}}, "prefork: Settings.MaxRSS (server.max_rss): must be at least 32MiB"},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tc.opts.Listener = ln
		if err := Run(context.Background(), tc.opts); err == nil || !strings.HasPrefix(err.Error(), tc.err) {
			t.Errorf("Run: %v, want %q", err, tc.err)
		}
		if _, err := ln.Accept(); err == nil {
			t.Error("Run left its listener open")
		}
	}
}

// A NewRegion that makes a region of its own geometry rather than the
// one it is given lacks the statistics rows the workers count in: Run
// refuses it at once, saying to use the given options, rather than
// start workers that each refuse the region, respawned without end
// under a message about another build.
func TestRunRefusesNewRegionOfOtherGeometry(t *testing.T) {
	for _, tc := range []struct {
		geo  shm.Options
		want string
	}{
		{shm.Options{Counters: 1024, MaxWorkers: 16}, "statistics"},
		{shm.Options{Counters: 1024, MaxWorkers: 2}, "room for 2 workers"},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = Run(ctx, Options{
			Listener:  ln,
			Workers:   1,
			Engine:    testEngine,
			Logger:    quietLog(),
			NewRegion: func(shm.Options) (*shm.Region, error) { return shm.Create(tc.geo) },
		})
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "the shm.Options it is given") {
			t.Errorf("%+v: Run: %v, want an error about %q that says to use the options NewRegion is given", tc.geo, err, tc.want)
		}
	}
}

// A MaxRSS below MinMaxRSS is refused with the way to no limit that the
// field and the file share (0): a Go program has no "" to give an int64.
func TestMaxRSSErrorSaysZero(t *testing.T) {
	_, err := Settings{MaxRSS: 1 << 20}.WithDefaults()
	if err == nil || !strings.HasSuffix(err.Error(), "or 0 for no limit; got 1MiB") {
		t.Errorf("Check: %v, want it to say 0 is no limit", err)
	}
}

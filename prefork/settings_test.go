package prefork

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
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
		edit func(*Settings)
		err  string
	}{
		{func(s *Settings) { s.ShutdownTimeout = -time.Second }, "ShutdownTimeout -1s is negative"},
		{func(s *Settings) { s.MaxRequests = -1 }, "MaxRequests -1 is negative"},
		{func(s *Settings) { s.MaxRSS = -1 }, "MaxRSS -1: want 0 (no limit) or at least 33554432 (32 MiB)"},
		{func(s *Settings) { s.MaxRSS = MinMaxRSS - 1 }, "MaxRSS 33554431: want 0"},
		{func(s *Settings) { s.Canary.Window = minCanaryWindow - 1 }, "Canary.Window 99.999999ms: want 100ms to 1h0m0s"},
		{func(s *Settings) { s.Canary.Window = maxCanaryWindow + 1 }, "Canary.Window 1h0m0.000000001s"},
		{func(s *Settings) { s.Canary.MinRequests = -1 }, "Canary.MinRequests -1 is negative"},
		{func(s *Settings) { s.Canary.MaxErrorDelta = -0.5 }, "Canary.MaxErrorDelta -0.5: want 0 to 100 points"},
		{func(s *Settings) { s.Canary.MaxErrorDelta = 100.5 }, "Canary.MaxErrorDelta 100.5"},
		{func(s *Settings) { s.Canary.Inconclusive = InconclusiveAbort + 1 }, "unknown Canary.Inconclusive 2"},
	} {
		s := Settings{}
		tc.edit(&s)
		if _, err := s.withDefaults(); err == nil || !strings.HasPrefix(err.Error(), "prefork: ") || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%+v: %v, want an error with %q", s, err, tc.err)
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
		{Options{Engine: testEngine, Settings: Settings{MaxRSS: 1}}, "prefork: Settings.MaxRSS 1"},
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

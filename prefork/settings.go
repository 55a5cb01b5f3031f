package prefork

import (
	"fmt"
	"log/slog"
	"time"
)

// Settings are what one configuration asks of the supervisor and of the
// workers it starts. A reload (Options.Reload) may change them; each
// worker runs the Settings of its generation. Zero values are the
// documented defaults.
type Settings struct {
	// ShutdownTimeout bounds a worker's graceful drain; past it, what is
	// left is cut, and the supervisor kills a worker that still runs. 0
	// means 30s.
	ShutdownTimeout time.Duration
	// Canary is how a reload to these settings is judged.
	Canary Canary
	// MaxRequests recycles a worker after it served about this many
	// requests (each worker draws its own limit within ±10%, so that they
	// do not recycle together). 0 means never.
	MaxRequests int
	// MaxRSS recycles a worker whose resident memory grew past it, in
	// bytes; at least MinMaxRSS. 0 means never.
	MaxRSS int64
	// Payload is handed to every worker started with these settings
	// (Worker.Settings.Payload): the configuration it serves, in whatever
	// form the program chose. The daemon sends its configuration file's
	// contents as JSON; an embedding program that builds everything in Go
	// needs none.
	Payload []byte
	// Config is the configuration these settings come from, as the
	// supervisor's program holds it; the supervisor only keeps it, for
	// Status.Settings. It is not sent to workers.
	Config any `json:"-"`
	// LogAttrs are added to the supervisor's "reload begun" line of the
	// reload that takes these settings: what it changes (never secret
	// values). They are not kept for the next.
	LogAttrs []slog.Attr `json:"-"`
}

// DefaultShutdownTimeout is Settings.ShutdownTimeout's default.
const DefaultShutdownTimeout = 30 * time.Second

// MinMaxRSS is the smallest Settings.MaxRSS: below it, a worker would be
// past its limit from its start (a Go worker starts at about 12 MiB).
const MinMaxRSS = 32 << 20

// Canary is how a reload is judged (README "Safe deploys"). The zero
// value judges it with the defaults.
type Canary struct {
	// Off replaces the workers without a canary.
	Off bool
	// Window is how long the canary is compared with the rest of the
	// fleet. 0 means 10s; 100ms to 1h.
	Window time.Duration
	// MinRequests is how many requests the canary must serve in the
	// window for a verdict; fewer is inconclusive. 0 means 50.
	MinRequests int
	// MaxErrorDelta is how many points the canary's 5xx rate may be above
	// the fleet's before it is unhealthy (if significantly so). 0 means 2.
	MaxErrorDelta float64
	// Inconclusive is what an inconclusive verdict does.
	Inconclusive Inconclusive
}

// Defaults of Canary.
const (
	DefaultCanaryWindow        = 10 * time.Second
	DefaultCanaryMinRequests   = 50
	DefaultCanaryMaxErrorDelta = 2.0

	minCanaryWindow = 100 * time.Millisecond
	maxCanaryWindow = time.Hour
)

// Inconclusive is what an inconclusive canary does.
type Inconclusive uint8

const (
	// InconclusiveContinue goes on with the reload, loudly logged.
	InconclusiveContinue Inconclusive = iota
	// InconclusiveAbort aborts it.
	InconclusiveAbort
)

// withDefaults checks s and fills in its defaults.
func (s Settings) withDefaults() (Settings, error) {
	if s.ShutdownTimeout < 0 {
		return s, fmt.Errorf("prefork: Settings.ShutdownTimeout %v is negative", s.ShutdownTimeout)
	}
	if s.ShutdownTimeout == 0 {
		s.ShutdownTimeout = DefaultShutdownTimeout
	}
	switch {
	case s.MaxRequests < 0:
		return s, fmt.Errorf("prefork: Settings.MaxRequests %d is negative", s.MaxRequests)
	case s.MaxRSS < 0 || s.MaxRSS > 0 && s.MaxRSS < MinMaxRSS:
		return s, fmt.Errorf("prefork: Settings.MaxRSS %d: want 0 (no limit) or at least %d (32 MiB)", s.MaxRSS, MinMaxRSS)
	}
	c := &s.Canary
	switch {
	case c.Window == 0:
		c.Window = DefaultCanaryWindow
	case c.Window < minCanaryWindow || c.Window > maxCanaryWindow:
		return s, fmt.Errorf("prefork: Canary.Window %v: want %v to %v", c.Window, minCanaryWindow, maxCanaryWindow)
	}
	switch {
	case c.MinRequests == 0:
		c.MinRequests = DefaultCanaryMinRequests
	case c.MinRequests < 0:
		return s, fmt.Errorf("prefork: Canary.MinRequests %d is negative", c.MinRequests)
	}
	switch {
	case c.MaxErrorDelta == 0:
		c.MaxErrorDelta = DefaultCanaryMaxErrorDelta
	case c.MaxErrorDelta < 0 || c.MaxErrorDelta > 100:
		return s, fmt.Errorf("prefork: Canary.MaxErrorDelta %v: want 0 to 100 points", c.MaxErrorDelta)
	}
	if c.Inconclusive > InconclusiveAbort {
		return s, fmt.Errorf("prefork: unknown Canary.Inconclusive %d", c.Inconclusive)
	}
	return s, nil
}

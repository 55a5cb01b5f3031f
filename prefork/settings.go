package prefork

import (
	"cmp"
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
	// DrainDelay is how long, after TERM or QUIT (or the context's end),
	// the workers go on serving before they drain, while readiness
	// (Status.Serving) and their health checks say the instance is
	// stopping: Kubernetes' preStop. A worker's core answers its
	// core.Options.HealthPath with 503 once the engine's factory had
	// w.OnDrain(c.Drain). 0 means none.
	DrainDelay time.Duration
	// UpgradeTimeout bounds a binary upgrade (USR2): a new supervisor
	// not ready by then is killed, and the old one serves on. 0 means
	// 30s.
	UpgradeTimeout time.Duration
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
	Config any
	// LogAttrs are added to the supervisor's "reload begun" line of the
	// reload that takes these settings: what it changes (never secret
	// values). They are not kept for the next.
	LogAttrs []slog.Attr
}

// DefaultShutdownTimeout is Settings.ShutdownTimeout's default.
const DefaultShutdownTimeout = 30 * time.Second

// DefaultUpgradeTimeout is Settings.UpgradeTimeout's default.
const DefaultUpgradeTimeout = 30 * time.Second

// MaxDrainDelay bounds Settings.DrainDelay.
const MaxDrainDelay = 10 * time.Minute

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

// FieldError is a setting the supervisor refuses: Field names it as the
// field of Settings ("Canary.Window"), Table and Key as the configuration
// file's ("reload", "canary_window"), so that a caller can point at
// either.
type FieldError struct {
	Field, Table, Key, Msg string
}

func (e *FieldError) Error() string {
	return "prefork: Settings." + e.Field + " (" + e.Table + "." + e.Key + "): " + e.Msg
}

// WithDefaults returns s with its zero values replaced by the defaults,
// checked (Check).
func (s Settings) WithDefaults() (Settings, error) {
	s.ShutdownTimeout = cmp.Or(s.ShutdownTimeout, DefaultShutdownTimeout)
	s.UpgradeTimeout = cmp.Or(s.UpgradeTimeout, DefaultUpgradeTimeout)
	c := &s.Canary
	c.Window = cmp.Or(c.Window, DefaultCanaryWindow)
	c.MinRequests = cmp.Or(c.MinRequests, DefaultCanaryMinRequests)
	c.MaxErrorDelta = cmp.Or(c.MaxErrorDelta, DefaultCanaryMaxErrorDelta)
	return s, s.Check()
}

// fieldError is Check's error. Not inlined: Check refuses a setting in
// ten places, each of which would otherwise carry a copy of it.
//
//go:noinline
func fieldError(field, table, key, format string, args []any) error {
	return &FieldError{field, table, key, fmt.Sprintf(format, args...)}
}

// Check reports what is wrong with s taken as it is (a zero timeout is a
// zero timeout here: WithDefaults fills the defaults first); every error
// is a *FieldError.
func (s Settings) Check() error {
	fail := func(field, table, key, format string, args ...any) error {
		return fieldError(field, table, key, format, args)
	}
	switch {
	case s.ShutdownTimeout <= 0:
		return fail("ShutdownTimeout", "server", "shutdown_timeout", "must be positive, got %v", s.ShutdownTimeout)
	case s.UpgradeTimeout <= 0 || s.UpgradeTimeout > time.Hour:
		return fail("UpgradeTimeout", "server", "upgrade_timeout", "must be more than 0s and at most 1h, got %v", s.UpgradeTimeout)
	case s.DrainDelay < 0 || s.DrainDelay > MaxDrainDelay:
		return fail("DrainDelay", "server", "drain_delay", "must be between 0s and %v, got %v", MaxDrainDelay, s.DrainDelay)
	case s.MaxRequests < 0:
		return fail("MaxRequests", "server", "max_requests", "must not be negative (0 means never), got %d", s.MaxRequests)
	case s.MaxRSS < 0:
		return fail("MaxRSS", "server", "max_rss", "must not be negative, got %d", s.MaxRSS)
	case s.MaxRSS > 0 && s.MaxRSS < MinMaxRSS:
		return fail("MaxRSS", "server", "max_rss", "must be at least 32MiB (a worker takes about 12 MiB as it starts: a limit below what it needs recycles every worker as soon as it serves), or 0 for no limit; got %s", mib(s.MaxRSS))
	}
	c := s.Canary
	switch {
	case c.Window < minCanaryWindow || c.Window > maxCanaryWindow:
		return fail("Canary.Window", "reload", "canary_window", "must be between %v and %v, got %v", minCanaryWindow, maxCanaryWindow, c.Window)
	case c.MinRequests < 1:
		return fail("Canary.MinRequests", "reload", "canary_min_requests", "must be at least 1, got %d", c.MinRequests)
	case !(c.MaxErrorDelta > 0 && c.MaxErrorDelta <= 100):
		return fail("Canary.MaxErrorDelta", "reload", "canary_max_error_delta", "must be more than 0 and at most 100 (percentage points), got %v", c.MaxErrorDelta)
	case c.Inconclusive > InconclusiveAbort:
		return fail("Canary.Inconclusive", "reload", "canary_inconclusive", "unknown value %d", c.Inconclusive)
	}
	return nil
}

// withDefaults is WithDefaults, for the supervisor.
func (s Settings) withDefaults() (Settings, error) { return s.WithDefaults() }

// mib writes a size in MiB when it is whole MiB, else in bytes.
func mib(n int64) string {
	if n > 0 && n%(1<<20) == 0 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%d", n)
}

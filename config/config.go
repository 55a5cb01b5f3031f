package config

import (
	"math/bits"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Config is the whole configuration of preforkd. The TOML file is one way to
// fill it; an embedder may fill it in Go, call [Config.Validate], and pass
// [Config.WithDefaults] to whatever consumes it.
//
// Fields whose zero value is not a meaningful setting (an empty listen
// address, a zero window) mean "the default" to [Config.Validate] and
// [Config.WithDefaults]. Fields whose zero value is meaningful (Workers,
// Burst, Wait, Responses) keep it; their comments say what zero does.
type Config struct {
	Server      Server
	Admin       Admin
	Table       Table
	Persist     Persist
	RateLimits  []RateLimit   // TOML [[ratelimit]]
	Idempotency []Idempotency // TOML [[idempotency]]
}

// Server is the [server] table: the proxy itself.
type Server struct {
	// Listen is the address of the one socket shared by all workers.
	// "" means "127.0.0.1:8080".
	Listen string
	// Workers is the number of worker processes; 0 means one per CPU
	// (see [Server.WorkerCount]).
	Workers int
	// Upstream is "builtin:demo" or an absolute http:// or https:// URL of
	// the application. "" means "builtin:demo".
	Upstream string
	// TrustedProxies are the peers whose X-Forwarded-For and Forwarded
	// headers are believed. Empty: none is.
	TrustedProxies []netip.Prefix
	// IPv6Prefix is the prefix length IPv6 clients are keyed by, 1..128.
	// 0 means 64.
	IPv6Prefix int
	// ShutdownTimeout bounds the graceful drain. 0 means 30s.
	ShutdownTimeout time.Duration
	// Headers selects the rate-limit response headers: "ietf", "x", "both"
	// or "none". "" means "both".
	Headers string
	// MaxRequestBody is the largest request body buffered for an
	// idempotency fingerprint, in bytes; larger ones get 413. 0 means 1 MiB.
	MaxRequestBody int64
}

// Admin is the [admin] table. Zero is "off".
type Admin struct {
	Listen    string // address of /metrics and /status; "" = off
	TokenFile string // file holding the bearer token for mutating endpoints; "" = none
}

// Table is the [table] table: the geometry of the shared-memory region.
type Table struct {
	// Counters is the number of counter slots (64 bytes each), 8..1<<26.
	// Parse and WithDefaults round it up to a power of two. 0 means 262144.
	Counters int
	// Responses is the number of stored-response records. 0 means none: no
	// idempotency rule can then be configured. Default() sets 16384.
	Responses int
	// ResponseBytes is the size of the block pool for stored bodies, in
	// bytes. 0 means none, as for Responses. Default() sets 64 MiB.
	ResponseBytes int64
}

// Persist is the [persist] table. Zero is "off".
type Persist struct {
	Path string // dump file written on graceful shutdown and loaded at boot; "" = off
	Key  string // application version; stored responses are dropped when it changes
	Live string // tmpfs path for the region itself, to survive a crash; "" = off
}

// RateLimit is one [[ratelimit]] rule.
type RateLimit struct {
	// Name identifies the rule and its state across restarts: unique,
	// 1..64 of [A-Za-z0-9_.-]. Required.
	Name string
	// Path is an exact path ("/login") or a prefix ending in "/*"
	// ("/api/*"). Required.
	Path string
	// Methods are upper-case HTTP methods; empty means every method.
	Methods []string
	// Limit requests are allowed per Window; 1..1048575. Required.
	Limit int64
	// Window is at least 1ms, at most 2^44µs (~203 days), in whole
	// microseconds. Required.
	Window time.Duration
	// Algorithm is "gcra" or "fixed-window". "" means "gcra".
	Algorithm string
	// Burst is the gcra bucket size, 0..1048575; 0 means Limit (see
	// [RateLimit.EffectiveBurst]). Must be 0 with "fixed-window".
	Burst int64
	// By is the key: "ip", "global", "header:NAME", or a fallback chain such
	// as "header:X-Api-Key|ip" (the first present element wins, ip last).
	// "" means "ip".
	By string
	// Mode is "enforce" or "shadow" (count and send headers, never refuse).
	// "" means "enforce".
	Mode string
	// OnFull decides when no slot can be had for a new key: "open" (allow)
	// or "closed" (503). "" means "open".
	OnFull string
	// Line is the line of the file where this rule starts; 0 when the rule
	// does not come from a file. Errors about the rule carry it.
	Line int
}

// Idempotency is one [[idempotency]] block.
type Idempotency struct {
	// Path has the same syntax as [RateLimit.Path]. Required.
	Path string
	// Methods are upper-case HTTP methods. nil means POST and PATCH.
	Methods []string
	// Header carries the idempotency key. "" means "Idempotency-Key".
	Header string
	// Required makes a request without the header a 400.
	Required bool
	// TTL is how long a completed response is replayable, at most 2^44µs.
	// 0 means 24h.
	TTL time.Duration
	// Wait is how long a duplicate waits for an in-flight original before
	// it gets 409. 0 means it does not wait; Default and the file use 10s.
	Wait time.Duration
	// By is the key namespace, same syntax as [RateLimit.By].
	// "" means "header:Authorization|ip".
	By string
	// MaxBody is the largest response stored for replay, in bytes; larger
	// ones are passed through but not replayable. 0 means 1 MiB.
	MaxBody int64
	// Line is the line where this block starts; 0 when not from a file.
	Line int
}

// Defaults that are not the zero value.
const (
	defaultListen          = "127.0.0.1:8080"
	defaultUpstream        = "builtin:demo"
	defaultIPv6Prefix      = 64
	defaultShutdownTimeout = 30 * time.Second
	defaultHeaders         = "both"
	defaultMaxRequestBody  = 1 << 20
	defaultCounters        = 262144
	defaultResponses       = 16384
	defaultResponseBytes   = 64 << 20
	defaultAlgorithm       = "gcra"
	defaultBy              = "ip"
	defaultMode            = "enforce"
	defaultOnFull          = "open"
	defaultIdemHeader      = "Idempotency-Key"
	defaultIdemTTL         = 24 * time.Hour
	defaultIdemWait        = 10 * time.Second
	defaultIdemBy          = "header:Authorization|ip"
	defaultIdemMaxBody     = 1 << 20
)

// Limits of the values, dictated by the layout of the shared table: a
// count has 20 bits, a time 44 bits of microseconds.
const (
	maxLimit      = 1<<20 - 1
	minWindow     = time.Millisecond
	maxWindow     = (1 << 44) * time.Microsecond
	maxWindowText = "2^44µs (~203 days)"
	minCounters   = 8
	maxCounters   = 1 << 26 // 4 GiB of 64-byte slots
	maxNameLen    = 64
)

func defaultIdemMethods() []string { return []string{"POST", "PATCH"} }

// Default returns the configuration with every default filled in and no
// rules: what an empty file parses to.
func Default() Config {
	return Config{
		Server: Server{
			Listen:          defaultListen,
			Upstream:        defaultUpstream,
			IPv6Prefix:      defaultIPv6Prefix,
			ShutdownTimeout: defaultShutdownTimeout,
			Headers:         defaultHeaders,
			MaxRequestBody:  defaultMaxRequestBody,
		},
		Table: Table{
			Counters:      defaultCounters,
			Responses:     defaultResponses,
			ResponseBytes: defaultResponseBytes,
		},
	}
}

// defaultRateLimit is a rule before the file's keys are applied.
func defaultRateLimit() RateLimit {
	return RateLimit{Algorithm: defaultAlgorithm, By: defaultBy, Mode: defaultMode, OnFull: defaultOnFull}
}

// defaultIdempotency is a block before the file's keys are applied.
func defaultIdempotency() Idempotency {
	return Idempotency{
		Methods: defaultIdemMethods(),
		Header:  defaultIdemHeader,
		TTL:     defaultIdemTTL,
		Wait:    defaultIdemWait,
		By:      defaultIdemBy,
		MaxBody: defaultIdemMaxBody,
	}
}

// WithDefaults returns a copy of c in which every zero value that stands for
// a default holds that default, Table.Counters is rounded up to a power of
// two and methods are upper-cased. Zero values that are settings of their own
// (Workers, Burst, Wait, Table.Responses, Table.ResponseBytes) are kept.
// [Parse] returns configurations that already went through it. It does not
// validate: an invalid c stays invalid.
func (c Config) WithDefaults() Config {
	s := &c.Server
	setDefault(&s.Listen, defaultListen)
	setDefault(&s.Upstream, defaultUpstream)
	setDefault(&s.IPv6Prefix, defaultIPv6Prefix)
	setDefault(&s.ShutdownTimeout, defaultShutdownTimeout)
	setDefault(&s.Headers, defaultHeaders)
	setDefault(&s.MaxRequestBody, defaultMaxRequestBody)
	s.TrustedProxies = append([]netip.Prefix(nil), s.TrustedProxies...)

	setDefault(&c.Table.Counters, defaultCounters)
	if n := c.Table.Counters; n >= minCounters && n <= maxCounters {
		c.Table.Counters = 1 << bits.Len(uint(n-1))
	}

	c.RateLimits = append([]RateLimit(nil), c.RateLimits...)
	for i := range c.RateLimits {
		r := &c.RateLimits[i]
		r.Methods = upperAll(r.Methods)
		setDefault(&r.Algorithm, defaultAlgorithm)
		setDefault(&r.By, defaultBy)
		setDefault(&r.Mode, defaultMode)
		setDefault(&r.OnFull, defaultOnFull)
	}
	c.Idempotency = append([]Idempotency(nil), c.Idempotency...)
	for i := range c.Idempotency {
		d := &c.Idempotency[i]
		if d.Methods == nil {
			d.Methods = defaultIdemMethods()
		} else {
			d.Methods = upperAll(d.Methods)
		}
		setDefault(&d.Header, defaultIdemHeader)
		setDefault(&d.TTL, defaultIdemTTL)
		setDefault(&d.By, defaultIdemBy)
		setDefault(&d.MaxBody, defaultIdemMaxBody)
	}
	return c
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// upperAll returns an upper-cased copy, so that a caller's slice is never
// modified; nil stays nil.
func upperAll(ms []string) []string {
	if ms == nil {
		return nil
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = strings.ToUpper(m)
	}
	return out
}

// MaxWorkers bounds server.workers: far beyond any machine's CPUs, and
// within what the region's worker table can hold during a reload (twice
// the workers, plus two).
const MaxWorkers = 4096

// WorkerCount is the number of workers to start: Workers, or the number of
// CPUs when Workers is 0.
func (s Server) WorkerCount() int {
	if s.Workers > 0 {
		return s.Workers
	}
	return runtime.NumCPU()
}

// EffectiveBurst is the gcra bucket size: Burst, or Limit when Burst is 0.
func (r RateLimit) EffectiveBurst() int64 {
	if r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

// Error is a configuration problem, with the file and line it comes from
// when they are known. Parse, Load and Validate return it as *Error.
type Error struct {
	File string // as given to Parse or Load; "" for a Config built in Go
	Line int    // 1-based; 0 when unknown
	Msg  string
}

// Error formats e as "config: FILE:LINE: MSG"; ":LINE" is left out when Line
// is 0, and "FILE:" when File is "".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	switch {
	case e.File != "" && e.Line > 0:
		b.WriteString(e.File + ":" + strconv.Itoa(e.Line) + ": ")
	case e.File != "":
		b.WriteString(e.File + ": ")
	case e.Line > 0:
		b.WriteString("line " + strconv.Itoa(e.Line) + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

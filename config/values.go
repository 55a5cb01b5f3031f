package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/internal/textvalue"
)

// The types of this file read and write their own text forms, for the file
// (through the TOML decoder) and for the handoff of a configuration to the
// workers (as JSON). Their errors start with "config: ".

// Size is a number of bytes. A file gives it as an integer, or as a string
// with an optional decimal (KB, MB, GB, TB) or binary (KiB, ...) unit:
// "512", "64KiB", "1MB".
type Size int64

// String writes s with the largest binary unit that divides it.
func (s Size) String() string {
	for _, u := range []string{"TiB", "GiB", "MiB", "KiB"} {
		if n := sizeUnits[u]; s > 0 && int64(s)%n == 0 {
			return strconv.FormatInt(int64(s)/n, 10) + u
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

func (s *Size) UnmarshalText(b []byte) error {
	t := strings.TrimSpace(string(b))
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	unit, ok := sizeUnits[strings.TrimSpace(t[i:])]
	switch n, err := strconv.ParseInt(t[:i], 10, 64); {
	case strings.HasPrefix(t, "-"):
		return fmt.Errorf("config: negative size %q", b)
	case i == 0 || !ok:
		return fmt.Errorf("config: invalid size %q: want a whole number of bytes with an optional unit B, KB, MB, GB, TB, KiB, MiB, GiB or TiB", b)
	case err != nil || n > math.MaxInt64/unit:
		return fmt.Errorf("config: size %q is too large", b)
	default:
		*s = Size(n * unit)
		return nil
	}
}

var sizeUnits = map[string]int64{
	"": 1, "B": 1,
	"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
	"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
}

// IdemWait is how long a duplicate of an [[idempotency]] request waits
// for its original in flight: a duration ("10s"; "0s" does not wait), or
// UntilDone, written "until-done".
type IdemWait time.Duration

// UntilDone is the IdemWait of a duplicate that waits as long as its
// original runs: its bound is the longest an original waits for its
// application's answer to begin (see [Server.UntilDone]).
const UntilDone IdemWait = -1

func (w IdemWait) String() string {
	if w == UntilDone {
		return "until-done"
	}
	return time.Duration(w).String()
}

func (w IdemWait) MarshalText() ([]byte, error) { return []byte(w.String()), nil }

func (w *IdemWait) UnmarshalText(b []byte) error {
	s := string(b)
	if s == "until-done" {
		*w = UntilDone
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf(`config: invalid wait %q: want a duration such as "10s" ("0s": no wait), or "until-done"`, s)
	}
	*w = IdemWait(d)
	return nil
}

// SizeLimit is a Size that may be off: 0, written "" or 0 in a file,
// means no limit.
type SizeLimit Size

// String is "" for no limit, else the Size.
func (s SizeLimit) String() string {
	if s == 0 {
		return ""
	}
	return Size(s).String()
}

func (s SizeLimit) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

func (s *SizeLimit) UnmarshalText(b []byte) error {
	if strings.TrimSpace(string(b)) == "" {
		*s = 0
		return nil
	}
	return (*Size)(s).UnmarshalText(b)
}

// Toggle is a setting that is on or off, true or false in a file, whose
// zero value stands for the key's default, so that a Config built in Go
// that leaves it out behaves as a file that leaves it out.
// [Config.WithDefaults] replaces the zero value by On or Off.
type Toggle uint8

const (
	ToggleDefault Toggle = iota // the key's default
	On                          // true
	Off                         // false
)

// IsOn reports whether t is On, or the default and def is true.
func (t Toggle) IsOn(def bool) bool { return t == On || t == ToggleDefault && def }

// String is "true", "false", or "default" for the zero value.
func (t Toggle) String() string {
	switch t {
	case On:
		return "true"
	case Off:
		return "false"
	case ToggleDefault:
		return "default"
	}
	return strconv.Itoa(int(t))
}

func (t Toggle) check() error {
	if t > Off {
		return fmt.Errorf("config: %d is not a toggle (true or false)", t)
	}
	return nil
}

// UnmarshalTOML reads true or false.
func (t *Toggle) UnmarshalTOML(v any) error {
	b, ok := v.(bool)
	if !ok {
		return fmt.Errorf("config: want true or false, got %s", typeName(v))
	}
	*t = Off
	if b {
		*t = On
	}
	return nil
}

// MarshalJSON writes true, false, or null for the default.
func (t Toggle) MarshalJSON() ([]byte, error) {
	if t == ToggleDefault {
		return []byte("null"), nil
	}
	if err := t.check(); err != nil {
		return nil, err
	}
	return []byte(t.String()), nil
}

func (t *Toggle) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case "true":
		*t = On
	case "false":
		*t = Off
	case "null":
		*t = ToggleDefault
	default:
		return errors.New("config: a toggle is true, false or null")
	}
	return nil
}

// Inconclusive is what a reload does when its canary served too few
// requests to be judged.
type Inconclusive uint8

const (
	InconclusiveContinue Inconclusive = iota // roll on, and log it as a warning ("continue")
	InconclusiveAbort                        // abort the reload ("abort")
)

var inconclusiveNames = enum[Inconclusive]{"continue", "abort"}

func (i Inconclusive) String() string                { return inconclusiveNames.name(i) }
func (i Inconclusive) MarshalText() ([]byte, error)  { return inconclusiveNames.marshal(i) }
func (i *Inconclusive) UnmarshalText(b []byte) error { return inconclusiveNames.unmarshal(b, i) }

// Prefixes are CIDR prefixes. A file gives them as an array of strings,
// each a CIDR ("10.0.0.0/8"; host bits are cleared, so "10.1.2.3/8" is
// 10.0.0.0/8) or a single address ("192.0.2.1" is 192.0.2.1/32). A
// []netip.Prefix converts to Prefixes and back without a conversion.
type Prefixes []netip.Prefix

// UnmarshalTOML decodes an array of strings. (A netip.Prefix reads only the
// strict CIDR form, so the array decodes itself.)
func (ps *Prefixes) UnmarshalTOML(v any) error {
	a, ok := v.([]any)
	if !ok {
		return fmt.Errorf("config: want an array of strings, got %s", typeName(v))
	}
	out := make(Prefixes, 0, len(a))
	for i, e := range a {
		s, ok := e.(string)
		if !ok {
			return &elemError{i, "want a string, got " + typeName(e)}
		}
		if !strings.Contains(s, "/") {
			a, err := netip.ParseAddr(s)
			if err != nil || a.Zone() != "" {
				return &elemError{i, fmt.Sprintf("invalid IP address or CIDR %q", s)}
			}
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return &elemError{i, fmt.Sprintf("invalid CIDR %q", s)}
		}
		out = append(out, p.Masked())
	}
	*ps = out
	return nil
}

// An elemError is a problem with element i of a value that decodes itself.
type elemError struct {
	i   int
	msg string
}

func (e *elemError) Error() string { return fmt.Sprintf("config: element %d: %s", e.i+1, e.msg) }

// Mode is what a rule does with a request over its limit.
type Mode uint8

const (
	Enforce Mode = iota // refuse it ("enforce")
	Shadow              // count it, log it and send the headers, but serve it ("shadow")
)

// Headers selects the rate-limit headers sent on the responses of a
// matching route: the decision core's own type, so that one list of
// names exists.
type Headers = core.HeaderMode

const (
	HeadersBoth = core.HeadersBoth // RateLimit-Policy and RateLimit, and X-RateLimit-* ("both")
	HeadersIETF = core.HeadersIETF // RateLimit-Policy and RateLimit ("ietf")
	HeadersX    = core.HeadersX    // X-RateLimit-Limit, -Remaining, -Reset ("x")
	HeadersNone = core.HeadersNone // none ("none")
)

var modeNames = enum[Mode]{"enforce", "shadow"}

// Engine is the HTTP/1.1 engine the workers serve with.
type Engine uint8

const (
	EngineLoop     Engine = iota // package engine/loop ("loop")
	EngineFasthttp               // package proxy, on fasthttp ("fasthttp")
)

var engineNames = enum[Engine]{"loop", "fasthttp"}

func (e Engine) String() string                { return engineNames.name(e) }
func (e Engine) MarshalText() ([]byte, error)  { return engineNames.marshal(e) }
func (e *Engine) UnmarshalText(b []byte) error { return engineNames.unmarshal(b, e) }

// LogFormat is how log lines are written.
type LogFormat uint8

const (
	LogText LogFormat = iota // logfmt: key=value pairs ("text")
	LogJSON                  // one JSON object a line ("json")
)

var logFormatNames = enum[LogFormat]{"text", "json"}

func (f LogFormat) String() string                { return logFormatNames.name(f) }
func (f LogFormat) MarshalText() ([]byte, error)  { return logFormatNames.marshal(f) }
func (f *LogFormat) UnmarshalText(b []byte) error { return logFormatNames.unmarshal(b, f) }

// LogLevel is the least level of the lines written.
type LogLevel uint8

const (
	LogInfo  LogLevel = iota // "info"
	LogDebug                 // "debug"
	LogWarn                  // "warn"
	LogError                 // "error"
)

var logLevelNames = enum[LogLevel]{"info", "debug", "warn", "error"}

func (l LogLevel) String() string                { return logLevelNames.name(l) }
func (l LogLevel) MarshalText() ([]byte, error)  { return logLevelNames.marshal(l) }
func (l *LogLevel) UnmarshalText(b []byte) error { return logLevelNames.unmarshal(b, l) }

// Slog is the level as log/slog has it.
func (l LogLevel) Slog() slog.Level {
	switch l {
	case LogDebug:
		return slog.LevelDebug
	case LogWarn:
		return slog.LevelWarn
	case LogError:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (m Mode) String() string                { return modeNames.name(m) }
func (m Mode) MarshalText() ([]byte, error)  { return modeNames.marshal(m) }
func (m *Mode) UnmarshalText(b []byte) error { return modeNames.unmarshal(b, m) }

// Store is where a rule's counts live.
type Store uint8

const (
	StoreLocal Store = iota // this host's table ("local")
	StoreRedis              // the [redis] table, shared by every host ("redis")
)

var storeNames = enum[Store]{"local", "redis"}

func (s Store) String() string                { return storeNames.name(s) }
func (s Store) MarshalText() ([]byte, error)  { return storeNames.marshal(s) }
func (s *Store) UnmarshalText(b []byte) error { return storeNames.unmarshal(b, s) }

// enum holds the names of a small integer type's values, in order: the
// first is the zero value's, which is the default. Its errors start with
// "config: ".
type enum[T ~uint8] textvalue.Enum[T]

func (e enum[T]) name(v T) string { return textvalue.Enum[T](e).String(v, "") }

// check refuses a value that has no name (one set in Go).
func (e enum[T]) check(v T) error { return textvalue.Enum[T](e).Check("config", v) }

func (e enum[T]) marshal(v T) ([]byte, error) { return textvalue.Enum[T](e).Marshal("config", v) }

func (e enum[T]) unmarshal(b []byte, v *T) error {
	return textvalue.Enum[T](e).Unmarshal("config", b, v)
}

// Cleartext is what [TLS]'s cleartext listener does: "redirect" (the
// zero value: 308 to https, but the health check) or "serve" (as the TLS
// listener).
type Cleartext uint8

const (
	CleartextRedirect Cleartext = iota // "redirect"
	CleartextServe                     // "serve"
)

var cleartextNames = enum[Cleartext]{"redirect", "serve"}

func (v Cleartext) String() string                { return cleartextNames.name(v) }
func (v Cleartext) MarshalText() ([]byte, error)  { return cleartextNames.marshal(v) }
func (v *Cleartext) UnmarshalText(b []byte) error { return cleartextNames.unmarshal(b, v) }

// TLSVersion is the least TLS version of [TLS]: "1.2" (the zero value) or
// "1.3".
type TLSVersion uint8

const (
	TLS12 TLSVersion = iota // "1.2"
	TLS13                   // "1.3"
)

var tlsVersionNames = enum[TLSVersion]{"1.2", "1.3"}

func (v TLSVersion) String() string                { return tlsVersionNames.name(v) }
func (v TLSVersion) MarshalText() ([]byte, error)  { return tlsVersionNames.marshal(v) }
func (v *TLSVersion) UnmarshalText(b []byte) error { return tlsVersionNames.unmarshal(b, v) }

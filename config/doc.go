// Package config reads, checks and describes the configuration of preforkd:
// the [server], [admin], [table] and [persist] tables and the [[ratelimit]]
// and [[idempotency]] rules of a TOML file (see examples/preforkd.toml).
//
// Most users want one call:
//
//	cfg, err := config.Load("preforkd.toml")
//
// which reads the file, fills in every default and validates the result.
//
// # Strictness
//
// Nothing is silently ignored. An unknown key or table (also one that
// differs from a known key only in case), a value of the wrong type, a
// duration that is not Go syntax ("30s", "5m", "1h30m"), a size that is not
// a whole number of bytes with an optional unit ("512", "64KiB", "1MB"), a
// bad CIDR, an unknown mode or algorithm, a limit out of range, a malformed
// path or key chain, or a duplicate rule name is an *[Error] that names the
// file and the line of the offending key:
//
//	config: preforkd.toml:12: unknown key "lisen" in server (did you mean "listen"?)
//
// When a file has several problems, the first in the file is reported.
//
// # Limits
//
// They follow from the layout of the shared table: a limit or a burst is at
// most 1048575 (20 bits); a window is 1ms to 2^44µs (about 203 days), in
// whole microseconds, and a gcra rule allows at most one request per
// microsecond; the table has 8 to 2^26 counter slots.
//
// # Embedding
//
// [Config] is a plain struct, and the file is only one way to fill it.
// Start from [Default], or leave fields zero: a zero value that is not a
// meaningful setting (an empty listen address, an empty mode) stands for its
// default, and [Config.WithDefaults] fills it in. [Config.Validate] applies
// the same checks as [Parse]; a consumer of a Config built in Go should use
// c.WithDefaults() after validating it.
//
// The package does no I/O except in [Load], keeps no state, and its values
// are safe to share between goroutines as long as nobody modifies them.
package config

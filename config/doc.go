// Package config reads, checks and describes the configuration of preforkd:
// the [server], [admin], [table], [persist], [log], [redis] and [reload]
// tables and the [[ratelimit]], [[idempotency]] and [[cache]] blocks of a
// TOML file (see examples/preforkd.toml).
//
// Most users want one call:
//
//	cfg, err := config.Load("preforkd.toml")
//
// which reads the file, fills in every default and validates the result.
//
// Nothing is silently ignored. An unknown key (also one that differs from a
// known key only in case), a value of the wrong type, a value its type or
// its owner refuses, or a duplicate rule name is an *[Error] that names the
// file and the line of the offending key:
//
//	config: preforkd.toml:12: unknown key "lisen" in server (did you mean "listen"?)
//
// Of several problems, the first in the file is reported: first among the
// keys and their types, then among the settings.
//
// Each setting is checked where it is applied: a rule's path and methods by
// route.Compile, its limit, window, burst, algorithm and on_full by
// bucket.Rule.Compile (with the limits of the shared table), its key by
// clientip.ParseBy. config adds the line; what it accepts, workers run.
//
// [Config] is a plain struct, and the file is only one way to fill it: a
// zero value that is not a meaningful setting stands for its default, which
// [Config.WithDefaults] fills in, and [Config.Validate] applies the same
// checks as [Parse]. The package does no I/O except in [Load].
package config

package main

import (
	"flag"
	"io"
	"log/slog"
	"strings"
)

// logFlags are -log-format and -log-level: how the supervisor and its
// workers (which run with the same arguments) write their log.
type logFlags struct {
	format string
	level  string
}

func (lf *logFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&lf.format, "log-format", "", "log `FORMAT`: text (logfmt, when not given) or json, one line per event")
	fs.StringVar(&lf.level, "log-level", "", "least `LEVEL` logged: debug, info (when not given), warn or error")
}

// logger is the daemon's logger on w, or a usage error for a bad flag.
func (lf *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if lf.level != "" && (level.UnmarshalText([]byte(lf.level)) != nil || !knownLevel(lf.level)) {
		return nil, &usageError{"-log-level " + lf.level + ": want debug, info, warn or error"}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch lf.format {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, &usageError{"-log-format " + lf.format + ": want text or json"}
}

// knownLevel accepts the four names only, not slog's offsets ("info+2"):
// an operator's level is one of the four.
func knownLevel(s string) bool {
	switch strings.ToLower(s) {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}

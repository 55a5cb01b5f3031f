package prefork

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// The settings as a worker inherits them: a line "name value" for each
// field (durations in Go's form, numbers in decimal), an empty line, then
// Payload's bytes as they are. Text of our own rather than encoding/json:
// the handoff is all of prefork that would need a reflecting encoder, and
// a program that embeds prefork should not link one for ten numbers.
// A reload's workers run the binary on disk (spawn_linux.go), which may
// be a build newer than the supervisor's: a name the worker does not know
// is passed over, and one it knows but is not sent keeps its zero value
// (the default), as they were with JSON. Settings from a supervisor of a
// build that still sent JSON are refused with a message saying so.
// TestSettingsHandoffRoundTrip fills every field, so that one left out of
// handoffFields fails it.

// handoffField is one field of Settings sent to workers: a pointer to it
// in one Settings value.
type handoffField struct {
	name string
	ptr  any // *time.Duration, *int, *int64, *bool, *float64 or *Inconclusive
}

// handoffFields lists what s sends, pointing into s. Config and LogAttrs
// stay with the supervisor; Payload follows the fields.
func handoffFields(s *Settings) []handoffField {
	return []handoffField{
		{"shutdown_timeout", &s.ShutdownTimeout},
		{"drain_delay", &s.DrainDelay},
		{"upgrade_timeout", &s.UpgradeTimeout},
		{"canary_off", &s.Canary.Off},
		{"canary_window", &s.Canary.Window},
		{"canary_min_requests", &s.Canary.MinRequests},
		{"canary_max_error_delta", &s.Canary.MaxErrorDelta},
		{"canary_inconclusive", &s.Canary.Inconclusive},
		{"max_requests", &s.MaxRequests},
		{"max_rss", &s.MaxRSS},
	}
}

// appendHandoff appends s's encoding to b.
func (s Settings) appendHandoff(b []byte) []byte {
	for _, f := range handoffFields(&s) {
		b = append(b, f.name...)
		b = append(b, ' ')
		switch p := f.ptr.(type) {
		case *time.Duration:
			b = strconv.AppendInt(b, int64(*p), 10)
		case *int:
			b = strconv.AppendInt(b, int64(*p), 10)
		case *int64:
			b = strconv.AppendInt(b, *p, 10)
		case *bool:
			b = strconv.AppendBool(b, *p)
		case *float64:
			b = strconv.AppendFloat(b, *p, 'g', -1, 64)
		case *Inconclusive:
			b = strconv.AppendUint(b, uint64(*p), 10)
		}
		b = append(b, '\n')
	}
	b = append(b, '\n')
	return append(b, s.Payload...)
}

// parseHandoff decodes what appendHandoff wrote.
func parseHandoff(b []byte) (Settings, error) {
	var s Settings
	if len(b) > 0 && b[0] == '{' {
		return Settings{}, errors.New("the supervisor is of an older build (its settings are JSON): restart the service to run this one")
	}
	fields := handoffFields(&s)
	for {
		line, rest, ok := bytes.Cut(b, []byte{'\n'})
		if !ok {
			return Settings{}, fmt.Errorf("no end to the fields (%d bytes left)", len(b))
		}
		b = rest
		if len(line) == 0 {
			break
		}
		name, value, _ := bytes.Cut(line, []byte{' '})
		i := 0
		for i < len(fields) && fields[i].name != string(name) {
			i++
		}
		if i == len(fields) {
			continue // a field of another build
		}
		if err := parseHandoffValue(fields[i].ptr, string(value)); err != nil {
			return Settings{}, fmt.Errorf("%s: %w", name, err)
		}
	}
	if len(b) > 0 {
		s.Payload = bytes.Clone(b)
	}
	return s, nil
}

func parseHandoffValue(ptr any, v string) (err error) {
	switch p := ptr.(type) {
	case *time.Duration:
		var n int64
		n, err = strconv.ParseInt(v, 10, 64)
		*p = time.Duration(n)
	case *int:
		*p, err = strconv.Atoi(v)
	case *int64:
		*p, err = strconv.ParseInt(v, 10, 64)
	case *bool:
		*p, err = strconv.ParseBool(v)
	case *float64:
		*p, err = strconv.ParseFloat(v, 64)
	case *Inconclusive:
		var n uint64
		n, err = strconv.ParseUint(v, 10, 8)
		*p = Inconclusive(n)
	}
	return err
}

// Package logtest gives tests a log destination that the code under test
// may write to from many goroutines while the test reads it.
package logtest

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// Buffer keeps what is written to it; it is safe for concurrent use. The
// zero value is an empty buffer ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Lines returns, in order and trimmed of surrounding space, the lines
// written so far in slog's text format whose message is msg.
func (b *Buffer) Lines(msg string) []string {
	field := " " + msgField(msg) + " "
	var out []string
	for line := range strings.Lines(b.String()) {
		line = strings.TrimSpace(line)
		if strings.Contains(" "+line+" ", field) {
			out = append(out, line)
		}
	}
	return out
}

// msgField is the msg=… field slog's text handler writes for msg, quoted
// as the handler quotes it.
func msgField(msg string) string {
	var sb strings.Builder
	onlyMsg := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key != slog.MessageKey {
			return slog.Attr{}
		}
		return a
	}
	slog.New(slog.NewTextHandler(&sb, &slog.HandlerOptions{ReplaceAttr: onlyMsg})).Info(msg)
	return strings.TrimSuffix(sb.String(), "\n")
}

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
)

// A configuration changes the format and level of loggers made before it,
// with their attributes; a flag given stays over the file.
func TestLogSwitch(t *testing.T) {
	var buf bytes.Buffer
	sw := newLogSwitch(&buf, logFlags{})
	log := sw.logger().With("worker", 3)
	log.Debug("hidden")
	log.Info("as text")
	sw.configure(config.Log{Format: config.LogJSON, Level: config.LogDebug})
	log.Debug("as json")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `msg="as text" worker=3`) {
		t.Fatalf("lines %q", lines)
	}
	var v struct {
		Msg    string
		Worker int
	}
	if err := json.Unmarshal([]byte(lines[1]), &v); err != nil || v.Msg != "as json" || v.Worker != 3 {
		t.Fatalf("after the switch: %q (%v)", lines[1], err)
	}

	buf.Reset()
	flagged := newLogSwitch(&buf, logFlags{level: "error"})
	flagged.configure(config.Log{Level: config.LogDebug})
	flagged.logger().Warn("below the flag's level")
	if buf.Len() != 0 {
		t.Fatalf("the file's level won over the flag: %q", buf.String())
	}
	if err := (&logFlags{format: "xml"}).check(); err == nil {
		t.Fatal("-log-format xml accepted")
	}
	// Either flag in any case.
	upper := logFlags{format: "JSON", level: "WARN"}
	if err := upper.check(); err != nil {
		t.Fatalf("-log-format JSON -log-level WARN: %v", err)
	}
	if got := upper.effective(config.Log{}); got.Format != config.LogJSON || got.Level != config.LogWarn {
		t.Fatalf("-log-format JSON -log-level WARN: %+v", got)
	}
}

// In the JSON format a duration is a number of seconds, also inside a
// group and among a logger's attributes; the text format keeps "30s".
func TestLogDurationsInSeconds(t *testing.T) {
	var buf bytes.Buffer
	sw := newLogSwitch(&buf, logFlags{format: "json"})
	sw.logger().With("timeout", 30*time.Second).Info("drain",
		"downtime", 6039320691*time.Nanosecond,
		slog.Group("redis", "backoff", 250*time.Millisecond), "count", 3)
	var v struct {
		Timeout  any
		Downtime any
		Redis    struct{ Backoff any }
		Count    any
	}
	if err := json.Unmarshal(buf.Bytes(), &v); err != nil {
		t.Fatalf("%q: %v", buf.String(), err)
	}
	if v.Timeout != 30.0 || v.Downtime != 6.039320691 || v.Redis.Backoff != 0.25 || v.Count != 3.0 {
		t.Errorf("JSON line %s: want timeout 30, downtime 6.039320691, redis.backoff 0.25, count 3", buf.String())
	}

	buf.Reset()
	newLogSwitch(&buf, logFlags{}).logger().Info("drain", "timeout", 30*time.Second)
	if !strings.Contains(buf.String(), "timeout=30s") {
		t.Errorf("text line %q: want timeout=30s", buf.String())
	}
}

// The worker's line queue writes every line in order once started, none
// of them from the writer's goroutine, and writes at once before Start
// and after Close.
func TestLineQueue(t *testing.T) {
	var out lockedBuffer
	q := newLineQueue(&out)
	q.Write([]byte("before\n"))
	if out.String() != "before\n" {
		t.Fatalf("before Start: %q", out.String())
	}
	out.block()
	q.Start()
	for i := range 10 {
		q.Write([]byte(fmt.Sprintf("line %d\n", i)))
	}
	// The writer is blocked: the lines wait, Write did not.
	out.unblock()
	q.Close()
	q.Write([]byte("after\n"))
	var want strings.Builder
	want.WriteString("before\n")
	for i := range 10 {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	want.WriteString("after\n")
	if out.String() != want.String() {
		t.Errorf("got %q, want %q", out.String(), want.String())
	}
}

// lockedBuffer is a writer a test can block.
type lockedBuffer struct {
	mu   sync.Mutex
	gate sync.Mutex
	b    strings.Builder
}

func (l *lockedBuffer) block()   { l.gate.Lock() }
func (l *lockedBuffer) unblock() { l.gate.Unlock() }
func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.gate.Lock()
	defer l.gate.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Lines dropped by a full queue are told of in the log's own format: with
// log.format = "json" every line is JSON, and the lines written and the
// ones the notices count are all the lines.
func TestLineQueueDropNoticeInFormat(t *testing.T) {
	var out lockedBuffer
	q, sw, log := workerLogs(&out, logFlags{})
	sw.configure(config.Log{Format: config.LogJSON})
	out.block()
	q.Start()
	const sent = lineQueueSize + 50
	for i := range sent {
		log.Info("line", "i", i)
	}
	out.unblock()
	q.Close()
	written, dropped := 0, 0
	for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		var rec struct {
			Msg   string `json:"msg"`
			Lines int    `json:"lines"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		if rec.Msg == "line" {
			written++
		} else {
			dropped += rec.Lines
		}
	}
	if dropped == 0 || written+dropped != sent {
		t.Errorf("%d lines written, %d told dropped; want some dropped, %d in all", written, dropped, sent)
	}
}

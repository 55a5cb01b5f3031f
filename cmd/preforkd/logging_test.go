package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

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
}

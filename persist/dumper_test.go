package persist

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// An interval of 0 (persist.interval's "off", as a program that mirrors
// the key passes it through) starts a Dumper that never dumps, and whose
// Stop returns: not a panic in a goroutine of its own, which no caller
// can recover, taking the supervisor down.
func TestDumperWithoutInterval(t *testing.T) {
	r, err := shm.CreatePrivate(shm.Options{Counters: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	path := filepath.Join(t.TempDir(), "dump")
	for _, every := range []time.Duration{0, -time.Second} {
		d := StartDumper(r, every, func() Options { return Options{Path: path} }, nil)
		time.Sleep(20 * time.Millisecond)
		d.Stop()
	}
}

//go:build unix

package smallfile

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A FIFO that nothing writes is refused at once, not waited on.
func TestReadFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(fifo, 8, nil); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a FIFO nothing writes: %v", err)
	}
}

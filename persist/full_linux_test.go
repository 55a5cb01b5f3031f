package persist

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/proctest"
)

// TestDumpOnAFullDisk: a dump that cannot be written whole (the file
// size limit, as a full disk) is an error naming the cause, leaves the
// previous dump as it was and no temporary file.
func TestDumpOnAFullDisk(t *testing.T) {
	good := goodDump(t, "k")
	dir := t.TempDir()
	path := filepath.Join(dir, "dump")
	line := childOnDump(t, "dumpfull", path, good)
	if !strings.Contains(line, "file too large") {
		t.Errorf("the dump's error: %q; want it to name the cause (EFBIG)", line)
	}
	if got := readFile(t, path); !bytes.Equal(got, good) {
		t.Errorf("the previous dump was changed: %d bytes, had %d", len(got), len(good))
	}
	if des, _ := os.ReadDir(dir); len(des) != 1 {
		t.Errorf("files left beside the dump: %v", des)
	}
}

// TestLoadUnreadableKeepsTheDump: a dump that cannot be read (here: no
// descriptor left to open it) is an error naming the cause, and the file
// is moved to PATH.refused unread, as it was, so that the dump written at
// the stop (or at once, with persist.interval) does not replace the state
// it holds.
func TestLoadUnreadableKeepsTheDump(t *testing.T) {
	good := goodDump(t, "k")
	path := filepath.Join(t.TempDir(), "dump")
	line := childOnDump(t, "loadnofd", path, good)
	if !strings.Contains(line, "too many open files") || !strings.Contains(line, path+SuffixRefused) {
		t.Errorf("the load's error: %q; want the cause (EMFILE) and where the dump is kept", line)
	}
	if _, err := os.Lstat(path); err == nil {
		t.Errorf("the unread dump is still at %s, where the next dump replaces it", path)
	}
	if got := readFile(t, path+SuffixRefused); !bytes.Equal(got, good) {
		t.Errorf("the kept dump: %d bytes, had %d", len(got), len(good))
	}
}

// childOnDump writes dump at path, runs the child role on it, and
// returns the line it says.
func childOnDump(t *testing.T, role, path string, dump []byte) string {
	t.Helper()
	if err := os.WriteFile(path, dump, 0o600); err != nil {
		t.Fatal(err)
	}
	line, err := proctest.Start(t, proctest.Options{Role: role, Spec: path}).Line(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return line
}

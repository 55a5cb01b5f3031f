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
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	p := proctest.Start(t, proctest.Options{Role: "dumpfull", Spec: path})
	line, err := p.Line(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
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

package persist

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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

// TestDumpOnAFullFileSystemMakesRoom: a dump that finds its file system
// full while the consumed dumps beside it take the room (PATH.loaded, the
// dump the start loaded, and PATH.superseded: older state than the one
// being written, never loaded again) removes them and is written; a
// refused dump (PATH.refused, state no load took) is kept. The file
// system is a small tmpfs of the child's own (a user and mount namespace),
// where the consumed dumps leave too little room for the new one.
func TestDumpOnAFullFileSystemMakesRoom(t *testing.T) {
	ns := &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
	}
	probe := exec.Command("/bin/true")
	probe.SysProcAttr = ns
	if err := probe.Run(); err != nil {
		// CI runs where namespaces can be made: there, a failure to is
		// the test's.
		if os.Getenv("CI") != "" {
			t.Fatalf("no user and mount namespace for a file system of the test's own: %v", err)
		}
		t.Skipf("no user and mount namespace for a file system of the test's own: %v", err)
	}
	p := proctest.Start(t, proctest.Options{Role: "dumpnospace", Spec: t.TempDir(), SysProcAttr: ns})
	line, err := p.Line(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var got noSpaceReport
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		t.Fatalf("%v: %q", err, line)
	}
	if got.Err != "" {
		t.Fatalf("the dump failed: %s (files: %v)", got.Err, got.Files)
	}
	want := map[string]int64{"dump": got.Bytes, "dump" + SuffixRefused: noSpaceRefused}
	if !maps.Equal(got.Files, want) {
		t.Errorf("files after the dump: %v, want %v", got.Files, want)
	}
	if !strings.Contains(got.Inspect, "loadable") || got.Entries != noSpaceKeys {
		t.Errorf("the dump: %d entries, want %d; inspect says:\n%s", got.Entries, noSpaceKeys, got.Inspect)
	}
	if got.Removed != 2 {
		t.Errorf("DumpStats.Removed = %d, want 2 (PATH.loaded and PATH.superseded)", got.Removed)
	}
}

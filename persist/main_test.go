//go:build linux

package persist

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/shm"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	proctest.Main(map[string]proctest.Role{"orphan": orphan, "decide": decideChild, "dumpfull": dumpFull, "loadnofd": loadNoFD, "dumpnospace": dumpNoSpace})
	code := m.Run()
	cleanupBench()
	os.Exit(code)
}

// orphan is a worker of a supervisor that died, still mapping the live
// region at the path its spec names, until it is killed.
func orphan(c *proctest.Child) error {
	var path string
	if err := c.Spec(&path); err != nil {
		return err
	}
	r, err := shm.OpenFile(path)
	if err != nil {
		return err
	}
	if err := r.Join(2); err != nil {
		return err
	}
	if err := c.Ready(); err != nil {
		return err
	}
	time.Sleep(time.Minute) // until killed
	return nil
}

// dumpFull dumps a fresh region to the path its spec names with a file
// size limit of 64 bytes, less than any dump (a full disk, as the
// process sees it), and reports the error.
func dumpFull(c *proctest.Child) error {
	path, r, err := limitedRegion(c, unix.RLIMIT_FSIZE, 64)
	if err != nil {
		return err
	}
	_, err = Dump(r, Options{Path: path, Rules: rules})
	return c.Say("%v", err)
}

// loadNoFD loads the dump at the path its spec names into a fresh region
// once no file can be opened (the descriptors are used up: an I/O error
// as the process sees it), and reports the error.
func loadNoFD(c *proctest.Child) error {
	path, r, err := limitedRegion(c, unix.RLIMIT_NOFILE, 64)
	if err != nil {
		return err
	}
	var held []*os.File
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		held = append(held, f)
	}
	_, err = Load(r, Options{Path: path, Rules: rules}, quiet)
	for _, f := range held {
		f.Close()
	}
	return c.Say("%v", err)
}

// limitedRegion is the set-up of a child that meets a resource limit:
// the path its spec names, a fresh region, and the process's limit of
// resource lowered to n.
func limitedRegion(c *proctest.Child, resource int, n uint64) (string, *shm.Region, error) {
	var path string
	if err := c.Spec(&path); err != nil {
		return "", nil, err
	}
	r, err := shm.CreatePrivate(shm.Options{Counters: 64, MaxWorkers: 4})
	if err != nil {
		return "", nil, err
	}
	return path, r, unix.Setrlimit(resource, &unix.Rlimit{Cur: n, Max: n})
}

// The child of TestDumpOnAFullFileSystemMakesRoom: the sizes of what it
// finds beside the dump, on a tmpfs of 64 KiB.
const (
	noSpaceKeys    = 1200     // counters dumped: 32 bytes each, about 38 KiB of dump
	noSpaceLoaded  = 28 << 10 // PATH.loaded and PATH.superseded: 56 KiB, with the dump more than the file system holds
	noSpaceRefused = 4 << 10  // PATH.refused: kept
	noSpaceFSBytes = 64 << 10 // the tmpfs
)

// noSpaceReport is what dumpNoSpace says, as JSON.
type noSpaceReport struct {
	Err     string           // Dump's error
	Bytes   int64            // DumpStats.Bytes
	Entries int              // DumpStats.Entries
	Removed int              // DumpStats.Removed
	Files   map[string]int64 // the directory's files and sizes after the dump
	Inspect string           // what Inspect says of the dump
}

// dumpNoSpace mounts a tmpfs of noSpaceFSBytes on the directory its spec
// names (in the mount namespace it was started in), fills it with
// consumed dumps and a refused one, dumps a region of noSpaceKeys
// counters there and reports (noSpaceReport).
func dumpNoSpace(c *proctest.Child) error {
	var dir string
	if err := c.Spec(&dir); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", noSpaceFSBytes)); err != nil {
		return fmt.Errorf("mounting a tmpfs: %w", err)
	}
	path := filepath.Join(dir, "dump")
	for name, n := range map[string]int{SuffixLoaded: noSpaceLoaded, SuffixSuperseded: noSpaceLoaded, SuffixRefused: noSpaceRefused} {
		if err := os.WriteFile(path+name, bytes.Repeat([]byte{1}, n), 0o600); err != nil {
			return err
		}
	}
	r, err := shm.CreatePrivate(shm.Options{Counters: 4 * noSpaceKeys, MaxWorkers: 4})
	if err != nil {
		return err
	}
	r.SetNow(t1)
	if err := r.Join(1); err != nil {
		return err
	}
	l, err := bucket.NewLimiter(login, r.Counters())
	if err != nil {
		return err
	}
	for i := range noSpaceKeys {
		l.Allow(fmt.Sprint("client-", i), t1)
	}
	st, err := Dump(r, Options{Path: path, Rules: rules})
	rep := noSpaceReport{Bytes: st.Bytes, Entries: st.Entries, Removed: st.Removed, Files: map[string]int64{}}
	if err != nil {
		rep.Err = err.Error()
	}
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		if fi, err := de.Info(); err == nil {
			rep.Files[de.Name()] = fi.Size()
		}
	}
	var out bytes.Buffer
	Inspect(path, &out)
	rep.Inspect = out.String()
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	return c.Say("%s", b)
}

//go:build linux

package persist

import (
	"os"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/shm"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	proctest.Main(map[string]proctest.Role{"orphan": orphan, "decide": decideChild, "dumpfull": dumpFull, "loadnofd": loadNoFD})
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

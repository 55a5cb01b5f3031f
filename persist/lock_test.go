package persist

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/shm"
)

// One supervisor per dump path: a second one is refused with the path and
// the holder's pid, until the first lets go.
func TestPathLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dump")
	geo := shm.Options{Counters: 64, MaxWorkers: 8}
	for _, o := range []Options{{Path: path}, {Path: path, Live: filepath.Join(t.TempDir(), "live")}} {
		r, lock, _, err := OpenRegion(o, geo, quiet)
		if err != nil || lock == nil {
			t.Fatalf("first supervisor: %v %v", lock, err)
		}
		_, _, _, err = OpenRegion(Options{Path: path}, geo, quiet)
		want := fmt.Sprintf("%s (pid %d holds %s.lock)", path, os.Getpid(), path)
		if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), want) {
			t.Fatalf("second supervisor: %v, want ErrInUse naming %q", err, want)
		}
		r.Close()
		lock.Unlock()
		r, lock, _, err = OpenRegion(Options{Path: path}, geo, quiet)
		if err != nil {
			t.Fatalf("after the first let go: %v", err)
		}
		r.Close()
		lock.Unlock()
	}
}

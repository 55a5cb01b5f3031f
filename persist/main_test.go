//go:build linux

package persist

import (
	"os"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/shm"
)

func TestMain(m *testing.M) {
	proctest.Main(map[string]proctest.Role{"orphan": orphan, "decide": decideChild})
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

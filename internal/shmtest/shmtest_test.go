package shmtest_test

import (
	"os"
	"slices"
	"testing"

	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// Each region is joined as its doc says, an attached one shares the
// creator's memory, and every file is closed when its test ends.
func TestRegions(t *testing.T) {
	o := shm.Options{Counters: 8, MaxWorkers: 4}
	var created, attached *shm.Region
	t.Run("make", func(t *testing.T) {
		created = shmtest.Create(t, o)
		if w := created.Worker(); w != -1 {
			t.Errorf("Create: joined as %d, want not joined", w)
		}
		if w := shmtest.Joined(t, o).Worker(); w != 0 {
			t.Errorf("Joined: joined as %d, want 0", w)
		}
		if w := shmtest.Private(t, o).Worker(); w != 0 {
			t.Errorf("Private: joined as %d, want 0", w)
		}
		attached = shmtest.Attach(t, created, 2)
		if w := attached.Worker(); w != 2 {
			t.Errorf("Attach: joined as %d, want 2", w)
		}
		if attached.File().Fd() == created.File().Fd() {
			t.Error("Attach maps the creator's descriptor, not a duplicate")
		}
		want := shm.WorkerInfo{Index: 2, Incarnation: 1, PID: os.Getpid()}
		if got := created.Workers(); !slices.Contains(got, want) {
			t.Errorf("the creator sees workers %+v, want %+v among them", got, want)
		}
	})
	for name, r := range map[string]*shm.Region{"created": created, "attached": attached} {
		if _, err := r.File().Stat(); err == nil {
			t.Errorf("the %s region's file is still open after its test", name)
		}
	}
}

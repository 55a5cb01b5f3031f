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

// A lock file that another user could have planted in a shared directory
// (/dev/shm) is refused, and what it points at is left as it was: a
// symbolic link (followed, the truncation would have rewritten any file
// the service may write), a hard link, a file of another user's.
func TestUntrustedLockRefused(t *testing.T) {
	geo := shm.Options{Counters: 64, MaxWorkers: 8}
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, lock, victim string)
		want  string
	}{
		{"symbolic link", func(t *testing.T, lock, victim string) {
			if err := os.Symlink(victim, lock); err != nil {
				t.Fatal(err)
			}
		}, "is a symbolic link"},
		{"hard link", func(t *testing.T, lock, victim string) {
			if err := os.Link(victim, lock); err != nil {
				t.Fatal(err)
			}
		}, "has 2 names"},
		{"another user's", func(t *testing.T, lock, _ string) {
			if err := os.WriteFile(lock, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(lock, os.Geteuid()+1, -1); err != nil {
				t.Fatalf("chown (the test runs as root in CI): %v", err)
			}
		}, "is owned by uid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "another user's" && os.Geteuid() != 0 {
				t.Log("not root: no file of another user's can be made here")
				return
			}
			dir := t.TempDir()
			live := filepath.Join(dir, "region")
			victim := filepath.Join(t.TempDir(), "secret")
			if err := os.WriteFile(victim, []byte("keep me\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, live+".lock", victim)
			r, lock, _, err := OpenRegion(Options{Live: live}, geo, quiet)
			if err == nil {
				r.Close()
				lock.Unlock()
				t.Fatal("the planted lock was used")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), live+".lock") {
				t.Errorf("error %q, want one naming the lock and %q", err, tc.want)
			}
			if b, _ := os.ReadFile(victim); string(b) != "keep me\n" {
				t.Errorf("the file behind the lock was changed: %q", b)
			}
		})
	}
}

// OpenRegion refuses a live region named as a file kept beside the dump
// (or the reverse): a load would rename the consumed dump over it.
func TestOpenRegionRefusesOverlappingNames(t *testing.T) {
	d := filepath.Join(t.TempDir(), "dump")
	t.Chdir(filepath.Dir(d))
	for _, o := range []Options{{Path: d, Live: d + SuffixLoaded}, {Path: d + ".lock", Live: d}, {Path: d, Live: "./dump.lock"}} {
		if r, _, _, err := OpenRegion(o, shm.Options{Counters: 64, MaxWorkers: 4}, quiet); err == nil {
			r.Close()
			t.Errorf("OpenRegion(path %s, live %s) made a region", o.Path, o.Live)
		}
	}
}

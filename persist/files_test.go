package persist

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/shm"
)

// nobody is the uid a root test gives files it wants another user to own.
const nobody = 65534

// chownNobody makes path another user's, or skips when that takes root.
func chownNobody(t *testing.T, path string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("giving a file to another user takes root")
	}
	if err := os.Chown(path, nobody, nobody); err != nil {
		t.Fatal(err)
	}
}

// untrustedFiles are the ways a file that a load reads (a dump, a live
// region) becomes one it must not trust, each with the reason it gives.
var untrustedFiles = []struct {
	name    string
	prepare func(t *testing.T, path string)
	detail  string
}{
	{"writable by others", func(t *testing.T, p string) { os.Chmod(p, 0o606) }, "writable by group or others"},
	{"writable by group", func(t *testing.T, p string) { os.Chmod(p, 0o620) }, "writable by group or others"},
	{"writable by group and others", func(t *testing.T, p string) { os.Chmod(p, 0o666) }, "writable by group or others"},
	{"another user's", chownNobody, "owned by uid 65534"},
}

func TestCheckDirs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	readOnly := filepath.Join(dir, "ro")
	os.Mkdir(readOnly, 0o500)
	// Lock files that OpenRegion refuses (TestUntrustedLockRefused): the
	// start must not get past the check to find them.
	plantedLink, plantedDir := t.TempDir(), t.TempDir()
	os.Symlink(file, filepath.Join(plantedLink, "dump.lock"))
	os.Mkdir(filepath.Join(plantedDir, "live.lock"), 0o700)
	// A hard link is refused too; another user's lock is left to the
	// start: check runs as root beside a service whose lock is its user's.
	consumed := t.TempDir()
	os.Mkdir(filepath.Join(consumed, "dump"+SuffixRefused), 0o700)
	linked, others := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(linked, "dump.lock"), nil, 0o600)
	os.Link(filepath.Join(linked, "dump.lock"), filepath.Join(linked, "other"))
	os.WriteFile(filepath.Join(others, "dump.lock"), nil, 0o600)
	othersOwned := os.Chown(filepath.Join(others, "dump.lock"), os.Geteuid()+1, -1) == nil
	for _, tc := range []struct {
		name string
		o    Options
		want string // "" for no error
	}{
		{"nothing to persist", Options{}, ""},
		{"writable", Options{Path: filepath.Join(dir, "dump"), Live: filepath.Join(dir, "live")}, ""},
		{"missing directory", Options{Path: filepath.Join(dir, "missing", "dump")}, "does not exist"},
		{"not a directory", Options{Path: filepath.Join(file, "dump")}, "is not a directory"},
		// Not even root can create files in /proc/self.
		{"not writable", Options{Path: "/proc/self/dump"}, "is not writable"},
		{"live region's directory", Options{Live: filepath.Join(dir, "missing", "live")}, "persist.live"},
		{"path is a directory", Options{Path: readOnly}, `persist.path "` + readOnly + `" is not a regular file (d---------): name a file, e.g. ` + readOnly + "/dump"},
		{"live is a directory", Options{Live: readOnly}, "persist.live"},
		{"an existing dump", Options{Path: file}, ""},
		{"a directory at PATH.refused", Options{Path: filepath.Join(consumed, "dump")}, `persist.path "` + consumed + `/dump": ` + consumed + "/dump.refused is a directory, where a consumed dump is renamed: remove it"},
		{"lock is a symbolic link", Options{Path: filepath.Join(plantedLink, "dump")}, "persist.path " + `"` + plantedLink + `/dump": lock ` + plantedLink + "/dump.lock is a symbolic link: refused"},
		{"live lock is a directory", Options{Live: filepath.Join(plantedDir, "live")}, "persist.live " + `"` + plantedDir + `/live": lock ` + plantedDir + "/live.lock is not a regular file: refused"},
		{"lock is a hard link", Options{Path: filepath.Join(linked, "dump")}, "dump.lock has 2 names (a hard link): refused"},
		{"lock of another user", Options{Path: filepath.Join(others, "dump")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "lock of another user" && !othersOwned {
				t.Skip("giving a file to another user takes root")
			}
			err := CheckDirs(tc.o)
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckDirs(%+v) = %v, want %q", tc.o, err, tc.want)
			}
			if err != nil && !strings.HasPrefix(err.Error(), "persist: ") {
				t.Errorf("error without its package: %v", err)
			}
		})
	}
	if os.Geteuid() != 0 {
		if err := CheckDirs(Options{Path: filepath.Join(readOnly, "dump")}); err == nil || !strings.Contains(err.Error(), "not writable") {
			t.Errorf("read-only directory: %v", err)
		}
	}
	if des, _ := os.ReadDir(dir); len(des) != 2 {
		t.Errorf("CheckDirs left files behind: %v", des)
	}
}

// A dump another user owns or may write is refused with its reason and
// not restored; the server starts cold, and the file is left where it is.
func TestLoadRefusesUntrustedDump(t *testing.T) {
	for _, tc := range untrustedFiles {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "dump")
			os.WriteFile(path, goodDump(t, ""), 0o600)
			tc.prepare(t, path)
			log, lines := logBuf()
			b := region(t, 64)
			rep, err := Load(b, Options{Path: path, Rules: rules, Now: wallAt(wall0)}, log)
			if err != nil || rep.Loaded || rep.Counters != 0 || len(rep.Refused) != 1 ||
				rep.Refused[0].Reason != ReasonUntrusted || !strings.Contains(rep.Refused[0].Detail, tc.detail) {
				t.Fatalf("%+v, %v", rep, err)
			}
			if !strings.Contains(lines.String(), "dump refused: untrusted") || !strings.Contains(lines.String(), tc.detail) {
				t.Errorf("no log line naming the reason:\n%s", lines)
			}
			if st := b.Counters().Stats(); st.Live != 0 {
				t.Fatalf("an untrusted dump was restored: %+v", st)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("an untrusted dump was moved: %v", err)
			}
		})
	}
	t.Run("own and private", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "dump")
		os.WriteFile(path, goodDump(t, ""), 0o600)
		os.Chmod(path, 0o644) // readable by others is no threat to what it says
		if rep, err := Load(region(t, 64), Options{Path: path, Rules: rules, Now: wallAt(wall0)}, quiet); err != nil || !rep.Loaded || rep.Counters != 7 {
			t.Fatalf("%+v, %v", rep, err)
		}
	})
}

// A live region another user owns or may write is refused with its reason
// and replaced by a fresh one of this user's.
func TestOpenRegionRefusesUntrustedLive(t *testing.T) {
	for _, tc := range untrustedFiles {
		t.Run(tc.name, func(t *testing.T) {
			o := liveOptions(t)
			geo := shm.Options{Counters: 64, MaxWorkers: 8}
			r, lock, _, err := OpenRegion(o, geo, quiet)
			if err != nil {
				t.Fatal(err)
			}
			r.SetNow(t1)
			exhaust(t, r, "c")
			r.Close()
			lock.Unlock()
			tc.prepare(t, o.Live)

			log, lines := logBuf()
			r2, lock2, reattached, err := OpenRegion(o, geo, log)
			if err != nil || reattached {
				t.Fatalf("reattached=%v err=%v", reattached, err)
			}
			defer lock2.Unlock()
			defer r2.Close()
			if !strings.Contains(lines.String(), "live region refused") || !strings.Contains(lines.String(), tc.detail) {
				t.Errorf("no log line naming the reason:\n%s", lines)
			}
			if st := r2.Counters().Stats(); st.Live != 0 {
				t.Fatalf("state of an untrusted live region kept: %+v", st)
			}
			fi, err := os.Stat(o.Live)
			if err != nil || untrusted(fi) != "" || fi.Mode().Perm() != 0o600 {
				t.Fatalf("the fresh live region: %v %v", fi.Mode(), err)
			}
		})
	}
}

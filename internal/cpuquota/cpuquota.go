package cpuquota

import (
	"bufio"
	"bytes"
	"io/fs"
	"math"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
)

// CPUs is the number of CPUs this process may use: its cgroup's CPU
// limit rounded up, at least 1 and at most runtime.NumCPU(); NumCPU when
// no limit is set.
func CPUs() int { return cpus(os.DirFS("/"), runtime.NumCPU()) }

// cpus is CPUs with the file system's root and the host's CPU count as
// parameters: a directory of fixture files stands for / in tests.
func cpus(root fs.FS, ncpu int) int {
	ncpu = max(ncpu, 1)
	limit, ok := Limit(root)
	if !ok {
		return ncpu
	}
	return min(max(int(math.Ceil(limit)), 1), ncpu)
}

// Limit is the CPU bandwidth limit of this process's cgroup under root
// (the file system's root, without a leading slash: os.DirFS("/")), in
// CPUs (1.5 for a quota of 150ms per 100ms period); ok is false without
// one.
func Limit(root fs.FS) (cpus float64, ok bool) {
	groups, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	mounts, err := fs.ReadFile(root, "proc/self/mountinfo")
	if err != nil {
		return 0, false
	}
	// A cpu controller of cgroup v1 takes precedence: on a hybrid host
	// the v2 hierarchy is mounted too, without the cpu controller.
	if p, ok := cgroupPath(groups, true); ok {
		if dir, top, ok := cgroupDir(mounts, p, true); ok {
			return tightest(root, dir, top, v1Limit)
		}
	}
	if p, ok := cgroupPath(groups, false); ok {
		if dir, top, ok := cgroupDir(mounts, p, false); ok {
			return tightest(root, dir, top, v2Limit)
		}
	}
	return 0, false
}

// cgroupPath is the path of this process's cgroup in the v1 hierarchy
// of the cpu controller (v1) or in the v2 hierarchy, from
// /proc/self/cgroup: "ID:CONTROLLERS:PATH" lines, "0::PATH" for v2.
func cgroupPath(groups []byte, v1 bool) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(groups))
	for sc.Scan() {
		id, rest, ok1 := strings.Cut(sc.Text(), ":")
		controllers, p, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 {
			continue
		}
		switch {
		case v1 && id != "0" && hasWord(controllers, "cpu"):
			return p, true
		case !v1 && id == "0" && controllers == "":
			return p, true
		}
	}
	return "", false
}

// cgroupDir is where the cgroup at path p is, relative to the root of
// the file system, and where its hierarchy is mounted (the walk up stops
// there), from /proc/self/mountinfo. In a container the mount's root is
// the container's own cgroup: p is then below it, or outside it (the
// host's path, without a cgroup namespace), when the mount itself is the
// process's cgroup.
func cgroupDir(mountinfo []byte, p string, v1 bool) (dir, top string, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
		pre, post, found := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !found || len(f) < 5 || len(g) < 3 {
			continue
		}
		switch {
		case v1 && g[0] == "cgroup" && hasWord(g[2], "cpu"):
		case !v1 && g[0] == "cgroup2":
		default:
			continue
		}
		mroot, mpoint := unescape(f[3]), strings.TrimPrefix(path.Clean(unescape(f[4])), "/")
		rel := p
		if mroot != "/" {
			var under bool
			if rel, under = strings.CutPrefix(p, mroot); !under || (rel != "" && rel[0] != '/') {
				rel = "/"
			}
		}
		return strings.TrimPrefix(path.Join(mpoint, path.Clean("/"+rel)), "/"), mpoint, true
	}
	return "", "", false
}

// tightest is the lowest limit that read finds in dir and its parents up
// to top.
func tightest(root fs.FS, dir, top string, read func(fs.FS, string) (float64, bool)) (float64, bool) {
	best, found := math.Inf(1), false
	for {
		if l, ok := read(root, dir); ok && l < best {
			best, found = l, true
		}
		if dir == top || dir == "." || dir == "" || !strings.HasPrefix(dir, top) {
			return best, found
		}
		dir = path.Dir(dir)
	}
}

// v2Limit reads cpu.max in dir: "QUOTA PERIOD" in µs, or "max PERIOD".
func v2Limit(root fs.FS, dir string) (float64, bool) {
	b, err := fs.ReadFile(root, path.Join(dir, "cpu.max"))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 || f[0] == "max" {
		return 0, false
	}
	period := 100000.0 // the kernel's default, when only the quota is written
	if len(f) > 1 {
		p, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return 0, false
		}
		period = p
	}
	return ratio(f[0], period)
}

// v1Limit reads cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us in dir.
func v1Limit(root fs.FS, dir string) (float64, bool) {
	q, err1 := fs.ReadFile(root, path.Join(dir, "cpu.cfs_quota_us"))
	p, err2 := fs.ReadFile(root, path.Join(dir, "cpu.cfs_period_us"))
	if err1 != nil || err2 != nil {
		return 0, false
	}
	period, err := strconv.ParseFloat(strings.TrimSpace(string(p)), 64)
	if err != nil {
		return 0, false
	}
	return ratio(strings.TrimSpace(string(q)), period)
}

// ratio is quota/period for a positive quota and period.
func ratio(quota string, period float64) (float64, bool) {
	q, err := strconv.ParseFloat(quota, 64)
	if err != nil || q <= 0 || period <= 0 || math.IsInf(q, 0) || math.IsNaN(period) {
		return 0, false
	}
	return q / period, true
}

// hasWord reports whether the comma-separated list s holds w.
func hasWord(s, w string) bool {
	for _, x := range strings.Split(s, ",") {
		if x == w {
			return true
		}
	}
	return false
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash (\040, \011, \012, \134).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

package cpuquota

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Each directory of testdata stands for / on a host or in a container:
// its /proc/self/cgroup, /proc/self/mountinfo and cgroup files.
func TestCPUs(t *testing.T) {
	for _, tc := range []struct {
		root string
		ncpu int
		want int
	}{
		{"v2-service", 8, 2},          // a systemd service with CPUQuota=150%: rounded up
		{"v2-parent", 8, 1},           // the slice above the service has the limit: 0.5, at least 1
		{"v2-container", 2, 2},        // --cpus=4 on a host of 2: not above the host's CPUs
		{"v2-container", 16, 4},       // --cpus=4 on a host of 16
		{"v2-unlimited", 8, 8},        // cpu.max "max": the host's CPUs
		{"v2-garbage", 8, 8},          // an unreadable quota is no limit
		{"v1-docker", 16, 3},          // v1 without a cgroup namespace: the mount is the container's cgroup
		{"v1-hybrid-unlimited", 4, 4}, // v1 cpu controller unlimited; the v2 mount's cpu.max is not this process's
		{"v1-nested", 8, 3},           // v1 with the limit on a parent, a mount point with an escaped space
		{"no-cgroup", 6, 6},           // no /proc/self/cgroup
		{"absent", 0, 1},              // nothing at all, and a host that reports no CPU: at least 1
	} {
		t.Run(tc.root, func(t *testing.T) {
			if got := cpus(os.DirFS(filepath.Join("testdata", tc.root)), tc.ncpu); got != tc.want {
				t.Errorf("cpus(%s, NumCPU %d) = %d, want %d", tc.root, tc.ncpu, got, tc.want)
			}
		})
	}
}

func TestLimit(t *testing.T) {
	for root, want := range map[string]float64{"v2-service": 1.5, "v2-parent": 0.5, "v1-docker": 2.5, "v1-nested": 3} {
		if got, ok := Limit(os.DirFS(filepath.Join("testdata", root))); !ok || got != want {
			t.Errorf("Limit(%s) = %v, %v; want %v", root, got, ok, want)
		}
	}
	if got, ok := Limit(os.DirFS(filepath.Join("testdata", "v2-unlimited"))); ok {
		t.Errorf("Limit(v2-unlimited) = %v, want none", got)
	}
}

// This host, whatever its cgroups: between 1 and its CPUs.
func TestCPUsHere(t *testing.T) {
	if n := CPUs(); n < 1 || n > runtime.NumCPU() {
		t.Fatalf("CPUs() = %d on a host of %d", n, runtime.NumCPU())
	}
}

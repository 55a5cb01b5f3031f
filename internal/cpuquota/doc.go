// Package cpuquota says how many CPUs this process may use: the CPU
// bandwidth limit of its cgroup (a container's --cpus, systemd's
// CPUQuota=), rounded up, when there is one; else the CPUs of the host.
//
// [CPUs] is the call: at most runtime.NumCPU(), at least 1. It reads the
// cgroup of the process (/proc/self/cgroup) where it is mounted
// (/proc/self/mountinfo), then cpu.max (cgroup v2) or cpu.cfs_quota_us
// and cpu.cfs_period_us (cgroup v1, whose cpu controller a hybrid host
// keeps there) of that cgroup and of each of its parents up to the
// mount, and takes the tightest. A file it cannot read or parse means no
// limit at that level: the answer is never below what a limit allows.
// It reads a few small files on every call, so that a limit changed
// while the process runs (docker update) is seen by the next call.
package cpuquota

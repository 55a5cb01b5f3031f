package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// What tune reads of this host's /proc: the CPU time of processes, and
// which process listens on a local port.

// cpuSample is the CPU time a process has used so far, read two ways:
// fine, the sum of /proc/PID/task/*/schedstat (nanoseconds, but only of
// the threads alive now), and coarse, utime+stime of /proc/PID/stat (every
// thread's, exited ones too, in 10ms clock ticks).
type cpuSample struct {
	fine, coarse time.Duration
	// waited is the time its live threads were ready to run but waited
	// for a CPU (schedstat's second field): on a busy host, time that
	// counts in the wall time but is neither work nor waiting for I/O.
	waited time.Duration
}

// userHZ is the unit of /proc/PID/stat's times: USER_HZ, 100 on Linux.
const userHZ = 100

func cpuTime(pid int) (cpuSample, error) {
	var s cpuSample
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("tune: no CPU time for pid %d (not on this host, or gone)", pid)
	}
	// pid (comm) state ppid ...: utime and stime are fields 14 and 15.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
		if f := strings.Fields(string(stat[i+1:])); len(f) > 12 {
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			s.coarse = time.Duration(ut+st) * time.Second / userHZ
		}
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited meanwhile
		}
		if f := strings.Fields(string(b)); len(f) > 1 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				s.fine += time.Duration(ns)
			}
			if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				s.waited += time.Duration(ns)
			}
		}
	}
	return s, nil
}

// used is the CPU time from s to later: the fine count, unless the coarse
// one says more than its ticks can explain, which means threads that
// exited in between did the work (a server with a thread per request).
func (s cpuSample) used(later cpuSample) time.Duration {
	fine, coarse := later.fine-s.fine, later.coarse-s.coarse
	if coarse > fine+2*time.Second/userHZ {
		return coarse
	}
	return max(fine, 0)
}

// ofEach reads one sample of every pid; a missing process makes it fail.
func ofEach[S any](pids []int, read func(pid int) (S, error)) ([]S, error) {
	out := make([]S, len(pids))
	for i, pid := range pids {
		s, err := read(pid)
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// usedBetween is the CPU time the processes used between two readings.
func usedBetween(before, after []cpuSample) time.Duration {
	var d time.Duration
	for i := range min(len(before), len(after)) {
		d += before[i].used(after[i])
	}
	return d
}

// waitedBetween is the time the processes' threads waited for a CPU
// between two readings.
func waitedBetween(before, after []cpuSample) time.Duration {
	var d time.Duration
	for i := range min(len(before), len(after)) {
		d += max(after[i].waited-before[i].waited, 0)
	}
	return d
}

// listener finds the process of this host that listens on addr (a TCP
// address of this host), from /proc/net/tcp{,6} and the processes' open
// descriptors. It fails for another host's address, or a process this
// user may not look into.
func listener(addr netip.AddrPort) (int, error) {
	inode := ""
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Scan() // the header line
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
				continue
			}
			local, ok := parseProcAddr(f[1])
			if !ok || local.Port() != addr.Port() {
				continue
			}
			if a := local.Addr(); a.IsUnspecified() || a == addr.Addr() || a.Unmap() == addr.Addr().Unmap() {
				inode = f[9]
				break
			}
		}
		if inode != "" {
			break
		}
	}
	if inode == "" || inode == "0" {
		return 0, fmt.Errorf("tune: nothing of this host listens on %s", addr)
	}
	want := "socket:[" + inode + "]"
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); l == want {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("tune: the process listening on %s is not one this user may look into", addr)
}

// parseProcAddr parses /proc/net/tcp's "0100007F:1F90" (the address in
// the host's byte order, 32-bit words).
func parseProcAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(h)
	port, perr := strconv.ParseUint(p, 16, 16)
	if err != nil || perr != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, false
	}
	// Each 32-bit word is little-endian on the hosts preforkd runs on.
	for i := 0; i < len(raw); i += 4 {
		raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	a, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(a.Unmap(), uint16(port)), true
}

// memSample is a process's memory as max_rss judges it: resident is
// /proc/PID/statm's resident set (what a worker compares with max_rss),
// peak is the most it ever was (VmHWM), shared the part of it that is
// shared memory (RssShmem: for a worker, the pages of the region it
// touched, which every worker maps).
type memSample struct {
	resident, peak, shared int64
}

// memOf reads the memory of pid.
func memOf(pid int) (memSample, error) {
	var m memSample
	statm, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return m, fmt.Errorf("tune: no memory for pid %d (not on this host, or gone)", pid)
	}
	f := strings.Fields(string(statm))
	if len(f) < 2 {
		return m, fmt.Errorf("tune: /proc/%d/statm: no resident size", pid)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return m, fmt.Errorf("tune: /proc/%d/statm: %w", pid, err)
	}
	m.resident = pages * int64(os.Getpagesize())
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, fmt.Errorf("tune: no memory for pid %d (not on this host, or gone)", pid)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmHWM":
			m.peak = kb << 10
		case "RssShmem":
			m.shared = kb << 10
		}
	}
	// The peak is never below what is resident now (VmHWM is updated
	// lazily, at page-table events).
	m.peak = max(m.peak, m.resident)
	return m, nil
}

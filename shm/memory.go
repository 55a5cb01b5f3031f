package shm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// memoryAvailable reports how many bytes this process can still make
// resident: the kernel's MemAvailable, capped by the cgroup's memory.max
// headroom. ok is false when neither can be read. A memfd has no size
// limit of its own, so without this check an oversized region would be
// filled page by page until the OOM killer chose a victim.
func memoryAvailable() (avail uint64, ok bool) {
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) >= 2 && f[0] == "MemAvailable:" {
				if kb, err := strconv.ParseUint(f[1], 10, 64); err == nil {
					avail, ok = kb*1024, true
				}
			}
		}
	}
	if max, err := readUint("/sys/fs/cgroup/memory.max"); err == nil {
		cur, _ := readUint("/sys/fs/cgroup/memory.current")
		head := uint64(0)
		if max > cur {
			head = max - cur
		}
		if !ok || head < avail {
			avail, ok = head, true
		}
	}
	return avail, ok
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64) // "max" fails: no limit
}

// ErrNoRoom is wrapped by the error of a region that does not fit in the
// memory available.
var ErrNoRoom = errors.New("does not fit in the memory available")

// checkFits refuses a region that the machine cannot hold.
func checkFits(size uint64) error {
	if avail, ok := memoryAvailable(); ok && size > avail {
		return fmt.Errorf("shm: a region of %s %w (%s)", human(size), ErrNoRoom, human(avail))
	}
	return nil
}

func human(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

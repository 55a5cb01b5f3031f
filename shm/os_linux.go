package shm

import (
	"fmt"
	"math"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The Linux calls of a region: an anonymous memory file sealed against
// resizing, and futexes on words of a shared mapping.

// memfd makes an anonymous memory file that can be sealed.
func memfd(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("shm: memfd_create: %w", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// seal forbids f to change size, and its seals to change.
func seal(f *os.File) error {
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fmt.Errorf("shm: sealing the region: %w", err)
	}
	return nil
}

// allocate reserves f's pages up to size (fallocate): a region that does
// not fit fails here, not with SIGBUS on a later write.
func allocate(f *os.File, size uint64) error { return unix.Fallocate(int(f.Fd()), 0, 0, int64(size)) }

// adviseHuge asks for huge pages for a shared mapping (a no-op where the
// kernel does not allow them for shared memory).
func adviseHuge(m []byte) { _ = unix.Madvise(m, unix.MADV_HUGEPAGE) }

// futexWait sleeps while *addr == val, up to d. No FUTEX_PRIVATE_FLAG: the
// word is in a shared mapping and the waker is another process.
func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), 0 /* FUTEX_WAIT */, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), 1 /* FUTEX_WAKE */, math.MaxInt32, 0, 0, 0)
}

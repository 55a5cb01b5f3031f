package main

import (
	"os"
	"testing"
)

// The readers of /proc, on texts as the kernel writes them, and on this
// very process.
func TestProcParsers(t *testing.T) {
	ppid, ticks, ok := parseProcStat([]byte("4242 (pre forkd) (x)) S 17 4242 4242 0 -1 4194560 1375 0 0 0 151 49 0 0 20 0 8 0 123 1000 500 18446744073709551615\n"))
	if !ok || ppid != 17 || ticks != 200 {
		t.Errorf("parseProcStat: ppid %d, ticks %d, %v; want 17, 151+49", ppid, ticks, ok)
	}
	if _, _, ok := parseProcStat([]byte("4242 (x) S 17")); ok {
		t.Error("parseProcStat of a cut line: ok")
	}
	if n, ok := statmResident([]byte("312345 2048 512 300 0 4000 0\n")); !ok || n != 2048 {
		t.Errorf("statmResident = %d %v, want 2048", n, ok)
	}
	limits := "Limit                     Soft Limit           Hard Limit           Units     \n" +
		"Max cpu time              unlimited            unlimited            seconds   \n" +
		"Max open files            524288               524288               files     \n"
	if n, ok := openFilesLimit([]byte(limits)); !ok || n != 524288 {
		t.Errorf("openFilesLimit = %d %v, want 524288", n, ok)
	}
	if n, ok := openFilesLimit([]byte("Max open files            unlimited            unlimited            files\n")); !ok || n != -1 {
		t.Errorf("openFilesLimit(unlimited) = %d %v, want -1", n, ok)
	}

	// This process, as its parent sees it.
	f, ok := readProc(os.Getpid(), os.Getppid())
	if !ok || f.rss < 1<<20 || f.fds < 3 || f.maxFDs < f.fds || f.cpu < 0 {
		t.Errorf("readProc(self) = %+v, %v", f, ok)
	}
	if _, ok := readProc(os.Getpid(), os.Getpid()); ok {
		t.Error("readProc with the wrong parent: ok (a reused pid would pass)")
	}
}

// Package smallfile reads the small files a configuration names beside
// itself: a token, a password, a key version, a certificate. Each is read
// whole, at every start and reload, from a regular file of bounded size,
// so that a directory, a device or a file too large is an error saying
// so rather than an endless read or a silent truncation.
package smallfile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Read reads the regular file at path, of at most limit bytes. check, if
// not nil, sees the open file and its information before anything is
// read: a file that holds a secret refuses there the modes or owners it
// must not have. Errors name path; callers add what the file is for.
func Read(path string, limit int64, check func(f *os.File, fi fs.FileInfo) error) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO that nothing writes returns at once (and
	// is then refused as not a regular file) rather than blocking the
	// reader, a supervisor's reload among them.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	if check != nil {
		if err := check(f, fi); err != nil {
			return nil, err
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: longer than %d bytes", path, limit)
	}
	return b, nil
}

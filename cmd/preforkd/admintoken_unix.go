//go:build unix

package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/internal/smallfile"
)

// readToken reads the bearer token of admin.token_file: the file's
// content without surrounding blanks (a trailing newline). It refuses a
// file that group or others may read or write (the token would be
// everybody's on the machine; an ACL that grants only this process's user
// is not that: aclKeepsOthersOut), one owned by another user than this
// process's or root, and a token shorter than minTokenLen.
func readToken(path string) ([]byte, error) {
	b, err := smallfile.Read(path, maxTokenFile, func(f *os.File, fi fs.FileInfo) error {
		if perm := fi.Mode().Perm(); perm&0o066 != 0 && !aclKeepsOthersOut(f, perm) {
			return fmt.Errorf("%s: mode %#o lets group or others read or write the token; chmod 600 %s", path, perm, path)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != uint32(os.Geteuid()) && st.Uid != 0 {
			return fmt.Errorf("%s: owned by uid %d, not by this user (%d) or root", path, st.Uid, os.Geteuid())
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("admin.token_file: %w", err)
	}
	tok := bytes.TrimSpace(b)
	if len(tok) < minTokenLen {
		return nil, fmt.Errorf("admin.token_file: %s: a token of %d characters is too short (at least %d; e.g. head -c 32 /dev/urandom | base64 > %s)",
			path, len(tok), minTokenLen, path)
	}
	if bytes.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		// No request carries a control character in a field: the
		// actions would stay locked.
		return nil, fmt.Errorf("admin.token_file: %s: the token has blanks or control characters inside: a bearer token cannot", path)
	}
	return tok, nil
}

// POSIX ACL of a file (the system.posix_acl_access attribute, Linux's
// format: a version word, then 8-byte entries of tag, permissions, id).
const (
	aclXattr     = "system.posix_acl_access"
	aclVersion   = 2
	aclUserObj   = 0x01
	aclUser      = 0x02
	aclGroupObj  = 0x04
	aclGroup     = 0x08
	aclMask      = 0x10
	aclOther     = 0x20
	aclReadWrite = 0x06
)

// aclKeepsOthersOut reports whether f, whose mode shows group bits perm,
// has an access ACL under which only its owner and this process's user
// may read or write it. With an ACL the mode's group bits are the ACL's
// mask, not what the file's group may do: systemd's LoadCredential=
// writes a credential root-owned with mode 0400 and grants the service's
// user read access by an ACL entry, so it reads as mode 0440 although no
// group can read it.
func aclKeepsOthersOut(f *os.File, perm os.FileMode) bool {
	if perm&0o006 != 0 { // others: no ACL entry narrows them
		return false
	}
	buf := make([]byte, 4+8*64)
	n, err := unix.Fgetxattr(int(f.Fd()), aclXattr, buf)
	if err != nil || n < 4 || (n-4)%8 != 0 || binary.LittleEndian.Uint32(buf) != aclVersion {
		return false // no ACL (or one this reading does not know): the mode says it all
	}
	entries := buf[4:n]
	mask := uint16(aclReadWrite | 1)
	for e := entries; len(e) >= 8; e = e[8:] {
		if binary.LittleEndian.Uint16(e) == aclMask {
			mask = binary.LittleEndian.Uint16(e[2:])
		}
	}
	self := uint32(os.Geteuid())
	for e := entries; len(e) >= 8; e = e[8:] {
		tag, p, id := binary.LittleEndian.Uint16(e), binary.LittleEndian.Uint16(e[2:])&mask, binary.LittleEndian.Uint32(e[4:])
		switch tag {
		case aclUserObj, aclMask:
		case aclUser:
			if p&aclReadWrite != 0 && id != self && id != 0 {
				return false
			}
		case aclGroupObj, aclGroup, aclOther:
			if p&aclReadWrite != 0 {
				return false
			}
		default:
			return false
		}
	}
	return true
}

package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// minTokenLen is the shortest token accepted: 16 characters of a random
// token are 96 bits or more, beyond guessing over an admin listener.
const minTokenLen = 16

// maxTokenFile bounds what is read of a token file.
const maxTokenFile = 4 << 10

// readToken reads the bearer token of admin.token_file: the file's
// content without surrounding blanks (a trailing newline). It refuses a
// file that group or others may read or write (the token would be
// everybody's on the machine; an ACL that grants only this process's user
// is not that: aclKeepsOthersOut), one owned by another user than this
// process's or root, and a token shorter than minTokenLen.
func readToken(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("admin.token_file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("admin.token_file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("admin.token_file %s: not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o066 != 0 && !aclKeepsOthersOut(f, perm) {
		return nil, fmt.Errorf("admin.token_file %s: mode %#o lets group or others read or write the token; chmod 600 %s", path, perm, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != uint32(os.Geteuid()) && st.Uid != 0 {
		return nil, fmt.Errorf("admin.token_file %s: owned by uid %d, not by this user (%d) or root", path, st.Uid, os.Geteuid())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return nil, fmt.Errorf("admin.token_file: %w", err)
	}
	if len(b) > maxTokenFile {
		return nil, fmt.Errorf("admin.token_file %s: longer than %d bytes", path, maxTokenFile)
	}
	tok := bytes.TrimSpace(b)
	if len(tok) < minTokenLen {
		return nil, fmt.Errorf("admin.token_file %s: a token of %d characters is too short (at least %d; e.g. head -c 32 /dev/urandom | base64 > %s)",
			path, len(tok), minTokenLen, path)
	}
	if bytes.ContainsAny(tok, " \t\r\n") {
		return nil, fmt.Errorf("admin.token_file %s: the token has blanks inside: a bearer token cannot", path)
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

// authorize guards an admin action: 403 when no token file is configured
// (actions are off), 401 without the right bearer token, 503 when the file
// cannot be read now. The file is read at every action, so that a token
// is rotated by rewriting the file; the comparison takes the same time
// whatever the tokens (SHA-256 of both, compared in constant time).
func (a *admin) authorize(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := a.status.Load()
		path := ""
		if st != nil {
			path = runningConfig(st).Admin.TokenFile
		}
		if path == "" {
			writeProblem(w, http.StatusForbidden, "Forbidden", "admin actions are off: set admin.token_file to enable them")
			return
		}
		want, err := readToken(path)
		if err != nil {
			a.log.Error("admin action refused: token file unusable", "err", err)
			writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable", "the admin token file cannot be used; see the log")
			return
		}
		got, ok := bearer(r.Header.Get("Authorization"))
		ws, gs := sha256.Sum256(want), sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(ws[:], gs[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="preforkd admin"`)
			writeProblem(w, http.StatusUnauthorized, "Unauthorized", "send Authorization: Bearer with the token of admin.token_file")
			if suppressed, ok := a.unauthorized.allow(time.Now()); ok {
				a.log.Warn("admin action refused: wrong or missing token", "method", r.Method, "path", r.URL.Path,
					"client", r.RemoteAddr, "suppressed", suppressed)
			}
			return
		}
		next(w, r)
	})
}

// secondGate lets one log line a second through and counts the others:
// a client guessing tokens must not flood the log.
type secondGate struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (g *secondGate) allow(now time.Time) (suppressed int, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.last.IsZero() && now.Sub(g.last) < time.Second {
		g.suppressed++
		return 0, false
	}
	suppressed, g.suppressed, g.last = g.suppressed, 0, now
	return suppressed, true
}

// bearer is the token of an Authorization: Bearer header value.
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

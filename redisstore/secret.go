package redisstore

import (
	"crypto/x509"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"github.com/preforkd/preforkd/internal/smallfile"
)

// Secret is a password. It prints as "xxxxx" (fmt, and slog through
// LogValue), so that Options or a configuration printed by mistake does
// not show it; its value is the string itself, and so is its JSON (a
// configuration travels to the workers as JSON).
type Secret string

// String is "xxxxx", or "" for no secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return "xxxxx"
}

// GoString is String quoted: %#v does not show the secret either.
func (s Secret) GoString() string { return fmt.Sprintf("%q", s.String()) }

// LogValue is String.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// Bounds of the files ReadPasswordFile and ReadCAFile read.
const (
	maxPasswordFile = 4 << 10
	maxCAFile       = 1 << 20
)

// ReadPasswordFile reads a password kept in a file of its own (a
// systemd credential, a mounted secret): the file's content without one
// final newline. A file every user may read or write, empty, longer than
// 4 KiB or of several lines is an error: the password is then refused
// rather than used. Call it where the configuration is read (at start,
// at every reload), so that a rotated password is taken with the next
// reload.
func ReadPasswordFile(path string) (Secret, error) {
	b, err := readFile(path, maxPasswordFile, true)
	if err != nil {
		return "", err
	}
	s := string(b)
	s = strings.TrimSuffix(strings.TrimSuffix(s, "\n"), "\r")
	switch {
	case s == "":
		return "", fmt.Errorf("redisstore: %s is empty", path)
	case strings.ContainsAny(s, "\r\n"):
		return "", fmt.Errorf("redisstore: %s has several lines: a password file holds the password alone", path)
	}
	return Secret(s), nil
}

// ReadCAFile reads PEM certificates that a Redis server's certificate must
// chain to (Options.CA), and checks that there is at least one.
func ReadCAFile(path string) ([]byte, error) {
	b, err := readFile(path, maxCAFile, false)
	if err != nil {
		return nil, err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("redisstore: %s holds no PEM certificate", path)
	}
	return b, nil
}

// readFile reads a regular file of at most limit bytes; one that holds a
// secret must be closed to other users (not to the file's group: a
// credential may be shared with a group of services).
func readFile(path string, limit int64, secret bool) ([]byte, error) {
	b, err := smallfile.Read(path, limit, func(_ *os.File, fi fs.FileInfo) error {
		if perm := fi.Mode().Perm(); secret && perm&0o006 != 0 {
			return fmt.Errorf("%s has mode %#o: every user may read or write the password; chmod o-rwx %s", path, perm, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	return b, nil
}

package redistest

import (
	"path/filepath"
	"testing"

	"github.com/preforkd/preforkd/internal/tlstest"
)

// makeCerts makes a CA of the test's own and a server certificate it
// issued for 127.0.0.1 and localhost, in the server's directory: the
// CA's as ca.pem (Server.CAFile), the server's as server.crt and
// server.key.
func (s *Server) makeCerts() {
	s.tb.Helper()
	s.ca = tlstest.NewCA(s.tb)
	s.CAFile = filepath.Join(s.dir, "ca.pem")
	s.ca.WriteFile(s.tb, s.CAFile)
	s.certFile, s.keyFile = s.ca.Files(s.tb, s.dir, "server", "127.0.0.1", "localhost")
}

// WriteCA writes the certificate of a new CA, which issued nothing, to
// path: a CA that a server's certificate does not chain to.
func WriteCA(tb testing.TB, path string) {
	tb.Helper()
	tlstest.NewCA(tb).WriteFile(tb, path)
}

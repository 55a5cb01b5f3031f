package accesslog_test

import (
	"os"
	"testing"

	"github.com/preforkd/preforkd/internal/proctest"
)

// roles are what a child of this test binary may do; a system's own
// tests add theirs (full_linux_test.go).
var roles = map[string]proctest.Role{}

func TestMain(m *testing.M) {
	proctest.Main(roles)
	os.Exit(m.Run())
}

package persist

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// orphanEnv selects the role of a re-executed test binary: a worker of a
// supervisor that died, still mapping the live region at its path.
const orphanEnv = "PERSIST_TEST_ORPHAN"

func TestMain(m *testing.M) {
	if path := os.Getenv(orphanEnv); path != "" {
		os.Exit(orphan(path))
	}
	code := m.Run()
	cleanupBench()
	os.Exit(code)
}

func orphan(path string) int {
	r, err := shm.OpenFile(path)
	if err == nil {
		err = r.Join(2)
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("ready")
	time.Sleep(time.Minute) // until killed
	return 0
}

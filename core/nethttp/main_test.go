package nethttp_test

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/shm"
)

// childEnv selects the role of a re-executed test binary (see
// waiterChild); the region travels as fd 3.
const childEnv = "IDEMPOTENCY_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "waiter":
		if err := waiterChild(); err != nil {
			fmt.Fprintln(os.Stderr, "waiter:", err)
			os.Exit(1)
		}
		os.Exit(0)
	default:
		fmt.Fprintln(os.Stderr, "unknown child role", os.Getenv(childEnv))
		os.Exit(2)
	}
}

// waiterChild is a second worker process on the parent's region: for each
// key it reads from stdin it sends a duplicate keyed POST through its own
// Middleware, prints "parked" once the duplicate waits for the parent's
// original, and "done STATUS REPLAYED NOW" when it has its answer, NOW
// being the region's clock (one clock for both processes).
func waiterChild() error {
	region, err := shm.Attach(os.NewFile(3, "region"))
	if err != nil {
		return err
	}
	if err := region.Join(1); err != nil {
		return err
	}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "the duplicate ran", http.StatusTeapot)
	})
	m, err := New(config.Config{Idempotency: []config.Idempotency{latencyBlock()}}, region, next, Options{})
	if err != nil {
		return err
	}
	out := bufio.NewWriter(os.Stdout)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		key := strings.TrimSpace(sc.Text())
		before := m.IdemStats().Waits
		answered := make(chan *discardWriter, 1)
		go func() {
			w := newDiscardWriter()
			m.ServeHTTP(w, keyedRequest(key, latencyReqBody))
			w.at = region.Now()
			answered <- w
		}()
		var w *discardWriter
	parking:
		for {
			select {
			case w = <-answered:
				break parking // not in flight any more: answered at once
			default:
			}
			if m.IdemStats().Waits > before {
				fmt.Fprintln(out, "parked")
				out.Flush()
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
		if w == nil {
			w = <-answered
		}
		fmt.Fprintf(out, "done %d %v %d\n", w.status, w.header.Get("Idempotent-Replayed") == "true", int64(w.at))
		out.Flush()
	}
	return sc.Err()
}

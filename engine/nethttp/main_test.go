package nethttp_test

import (
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/shm"
)

// The waiter role (internal/proctest) is a second worker process on the
// parent's region, which it inherits as fd 3.
func TestMain(m *testing.M) {
	proctest.Main(map[string]proctest.Role{"waiter": waiterChild})
	os.Exit(m.Run())
}

// waiterReport is what the waiter reports for each duplicate: its status,
// whether it was a replay, and the region's clock when it was answered
// (one clock for both processes).
type waiterReport struct {
	Status   int
	Replayed bool
	At       time.Duration
}

// waiterChild: for each key the test sends, it sends a duplicate keyed
// POST through its own Middleware, says "parked" once the duplicate waits
// for the parent's original, and reports (waiterReport) when it has its
// answer.
func waiterChild(c *proctest.Child) error {
	region, err := shm.Attach(c.File(0))
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
	return c.EachLine(func(key string) error {
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
				if err := c.Say("parked"); err != nil {
					return err
				}
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
		if w == nil {
			w = <-answered
		}
		return c.Report(waiterReport{Status: w.status, Replayed: w.header.Get("Idempotent-Replayed") == "true", At: w.at})
	})
}

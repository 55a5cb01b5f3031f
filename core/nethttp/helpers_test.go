package nethttp_test

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/core/nethttp"
	"github.com/preforkd/preforkd/shm"
)

// Options are the knobs the tests turn on the core.
type Options struct {
	Logger *slog.Logger
	Now    func() time.Duration
	Wall   func() time.Time
	Refuse func(http.ResponseWriter, *http.Request, *core.Refusal)
}

// handler is the adapter with the accessors the tests use.
type handler struct{ *nethttp.Handler }

// Stats are the rate-limit rules' counts in this process.
func (h *handler) Stats() []core.RuleStats { return h.Core().RuleStats() }

// IdemStats are the idempotency stage's counts in this process.
func (h *handler) IdemStats() core.IdempotencyStats { return h.Core().IdempotencyStats() }

// Limiter is the limiter of rule name.
func (h *handler) Limiter(name string) *bucket.Limiter { return h.Core().Limiter(name) }

// New builds the adapter as a worker does: the core compiled from cfg
// (config.Config.CoreOptions) over region, in front of next.
func New(cfg config.Config, region *shm.Region, next http.Handler, opts Options) (*handler, error) {
	if next == nil {
		return nil, errors.New("nil next handler")
	}
	o, err := cfg.CoreOptions()
	if err != nil {
		return nil, err
	}
	o.Logger, o.Now, o.Wall = opts.Logger, opts.Now, opts.Wall
	c, err := core.New(region, o)
	if err != nil {
		return nil, err
	}
	return &handler{nethttp.New(c, next, nethttp.Options{Refuse: opts.Refuse})}, nil
}

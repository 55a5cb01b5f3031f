package prefork

import (
	"log/slog"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/shm"
)

// NewCore builds the decision core of a worker from its configuration
// (config.Config.CoreOptions) over region, joined by this process. Every
// engine a worker serves with decides by it.
func NewCore(cfg config.Config, region *shm.Region, log *slog.Logger) (*core.Core, error) {
	o, err := cfg.CoreOptions()
	if err != nil {
		return nil, err
	}
	o.Logger = log
	return core.New(region, o)
}

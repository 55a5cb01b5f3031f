//go:build !linux

package main

import (
	"fmt"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/shm"
)

// loopEngine: the event loop polls with epoll. (Never reached: a worker
// does not start off Linux.)
func loopEngine(*prefork.Worker, config.Config, *core.Core) (prefork.Engine, error) {
	return nil, fmt.Errorf("the event-loop engine: %w", shm.ErrNeedsLinux)
}

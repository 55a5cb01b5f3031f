package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/preforkd/preforkd/config"
)

// defaultAdminAddr is the admin address `health` asks when -admin is not
// given: the one examples/preforkd.toml and the Dockerfile use.
const defaultAdminAddr = "127.0.0.1:9901"

// notReadyError is an instance that answered /readyz with something else
// than 200, or did not answer: exit 1.
type notReadyError struct{ msg string }

func (e *notReadyError) Error() string { return e.msg }

// preforkd health: GET /readyz of the admin endpoint, for a container's
// HEALTHCHECK in an image without curl. It prints what /readyz answered
// ("ready", "not ready: draining") and exits 0 only for a 200.
func setupHealth(fs *flag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
	addr := fs.String("admin", defaultAdminAddr, "the instance's admin address `ADDR` (admin.listen): host:port or unix:PATH")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after `D` (the answer then counts as not ready)")
	return func(ctx context.Context, args []string, stdout, _ io.Writer) error {
		if err := noArgs(args); err != nil {
			return err
		}
		if *timeout <= 0 {
			return &usageError{"-timeout must be positive"}
		}
		if err := config.CheckAdminAddr(*addr); err != nil {
			return &usageError{fmt.Sprintf("-admin: %v", err)}
		}
		c, base := adminClient(*addr, *timeout)
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		if err != nil {
			return &usageError{fmt.Sprintf("-admin %s: %v", *addr, err)}
		}
		resp, err := c.Do(req)
		if err != nil {
			var ue interface{ Unwrap() error }
			if errors.As(err, &ue) {
				err = ue.Unwrap()
			}
			return &notReadyError{fmt.Sprintf("health: %s: %v", *addr, err)}
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		answer := strings.TrimSpace(string(body))
		if resp.StatusCode != http.StatusOK {
			return &notReadyError{fmt.Sprintf("health: %s: %d %s", *addr, resp.StatusCode, answer)}
		}
		fmt.Fprintln(stdout, answer)
		return nil
	}
}

package proxy_test

import "github.com/preforkd/preforkd/internal/wiretest"

// The recording upstream the tests forward to: every request as it
// arrived, answered as the test scripts (internal/wiretest, shared with
// the other engines' tests).
type (
	rawUpstream = wiretest.Upstream
	seenRequest = wiretest.Seen
)

var startUpstream = wiretest.StartUpstream

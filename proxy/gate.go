package proxy

import "github.com/preforkd/preforkd/core"

// Gate is the decision core as the server calls it, once per request that
// passed the framing checks: rate limits, idempotent replay. Its Begin
// must be safe for concurrent use.
type Gate interface {
	// Begin starts the decision about r. The server calls Release on what
	// it returns when it is done with the request, response included.
	Begin(r core.Request) Exchange
}

// Exchange is the Gate's decision about one request, and what it needs to
// see of the response.
type Exchange interface {
	// Decide decides; it may block (a duplicate of an idempotent request
	// in flight waits for the original's response).
	Decide() core.Verdict
	// Response is the answer when Decide said core.Respond.
	Response() *core.Response
	// ForwardPath is the request's path as the upstream gets it (dot
	// segments removed, slashes merged), when Decide said core.Pass.
	ForwardPath() string
	// Fields are header fields to add to the application's response.
	Fields() []core.Field
	// Record reports whether the response must be recorded, and the most
	// body bytes to keep.
	Record() (max int64, ok bool)
	// Complete hands the recorded response back.
	Complete(rec *core.Recorded)
	// Release ends the exchange; an idempotency reservation that was not
	// completed is released.
	Release()
}

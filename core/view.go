package core

import (
	"errors"
	"net/netip"

	"github.com/preforkd/preforkd/core/httpcache"
)

// Request is the core's view of one HTTP request. Each engine's adapter
// implements it over its own request type. The strings it returns may
// alias the engine's buffers: the core uses them only during the call
// that was given the Request, and copies what it keeps.
type Request interface {
	// Method is the request method as sent.
	Method() string
	// Path is the path of the request target as sent on the wire:
	// percent-encoded, without the query ("/a%20b", not "/a b").
	Path() string
	// Query is the raw query, without the '?'.
	Query() string
	// Peer is the TCP peer's address, unmapped and without zone; the zero
	// Addr when there is none (a Unix socket).
	Peer() netip.Addr
	// Header returns the value of the first field line called name (in
	// canonical form, "X-Api-Key") and how many field lines have that
	// name; lines is 0 when there is none.
	Header(name string) (first string, lines int)
	// HeaderLines appends the value of every field line called name to
	// dst, in order, and returns the extended slice.
	HeaderLines(name string, dst []string) []string
	// Body reads the whole request body into memory. A body longer than
	// max bytes is ErrBodyTooLarge; a client that went away as it came (a
	// reset connection) is an error wrapping ErrClientGone; a body that
	// cannot be read otherwise (ended short, bad chunking) is any other
	// error. It is called at most once per request, and only for requests
	// the core must fingerprint.
	Body(max int64) ([]byte, error)
	// HasBody reports whether the request has content: a Content-Length
	// other than 0, or a chunked body (RFC 9112 §6.3), read or not.
	HasBody() bool
	// Gone reports whether the client has gone away, so that a request
	// waiting for another to finish can stop. An engine that cannot tell
	// returns false: the wait is bounded anyway.
	Gone() bool
}

// ErrBodyTooLarge is what Request.Body returns for a body over its limit.
var ErrBodyTooLarge = errors.New("core: request body too large")

// Verdict is what the core decided about a request.
type Verdict uint8

const (
	// Pass: the application (the upstream, or the embedded handler) serves
	// the request, and its response carries Exchange.Fields.
	Pass Verdict = iota
	// Respond: the core answers; the application never sees the request.
	// The answer is Exchange.Response.
	Respond
	// Wait: the decision stopped where it would wait, as the engine asked
	// (Exchange.NoWait); the engine goes on with it where it may block.
	Wait
)

// Field is one response header field the core wants sent. Name is in
// canonical form. Value aliases the Exchange's memory: valid until the
// Exchange is released.
type Field struct {
	Name  string
	Value []byte
}

// Response is a complete answer of the core's own: a refusal, a problem, a
// replayed response.
type Response struct {
	Status int
	// Fields are its header fields, Content-Type and Content-Length
	// included when the response has a body.
	Fields []Field
	// Body is sent as is; nil for none. Aliases the Exchange's (or the
	// table's copy's) memory.
	Body []byte
	// Stream, when not nil, is the body instead (Body is nil): a large
	// cached body, sent a piece at a time as the client takes it. It is
	// the Exchange's, read until Finish.
	Stream BodyStream
	// Close asks the engine to close the connection after the response:
	// the request's framing cannot be trusted (RFC 9112 §6.3).
	Close bool
}

// recorded is what Head and Body kept of the application's response to a
// request whose stages need it (Exchange.record), given to them by
// Finish.
type recorded struct {
	// Status is the final status sent to the client (not 1xx but 101).
	Status int
	// ContentType, Location and ContentEncoding are those header fields
	// as sent (Content-Encoding's lines joined).
	ContentType, Location, ContentEncoding string
	// Header is every field line of the response as sent (names in any
	// case), in order; the core's own fields (Exchange.Fields) may be
	// among them. The response cache needs it; the values may alias the
	// engine's memory until Complete returns.
	Header []httpcache.Field
	// Body is the body as sent, when it was at most the limit Record gave.
	Body []byte
	// Overflow means the body went over that limit: Body is incomplete.
	Overflow bool
	// Hijacked means the connection was taken over (an upgrade): what was
	// sent is unknown.
	Hijacked bool
	// Failed means the application gave no whole response (an upstream
	// that broke off mid-body, a handler that panicked): nothing can be
	// stored.
	Failed bool
}

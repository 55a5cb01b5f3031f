package idempotency

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// The answers this layer gives of its own: RFC 9457 problem+json, with
// Cache-Control: no-store (a cache must not answer a retry with them),
// formatted once per block when the Middleware is built. Their detail says
// what is wrong with the request, never anything about the table or the
// worker. The type is about:blank: the status says what kind of problem it
// is, and the title is the status text.

// problemKind is an answer this layer gives instead of the handler's.
type problemKind uint8

const (
	problemNone problemKind = iota
	problemMissing
	problemEmpty
	problemTooLong
	problemControl
	problemRepeated
	problemMalformed
	problemUnreadable
	problemTooLarge
	problemMismatch
	problemInFlight
	problemUnreplayable
	problemUnavailable
	nProblems
)

func keyProblemKind(p keyProblem) problemKind {
	switch p {
	case keyMissing:
		return problemMissing
	case keyEmpty:
		return problemEmpty
	case keyTooLong:
		return problemTooLong
	case keyControl:
		return problemControl
	case keyRepeated:
		return problemRepeated
	}
	return problemMalformed
}

// problemText is one RFC 9457 answer, formatted once per block.
type problemText struct {
	status     int
	retryAfter string // "" for none
	body       []byte
}

func newProblem(p problemKind, header string, maxReq int64) problemText {
	status, retry, detail := http.StatusBadRequest, 0, ""
	switch p {
	case problemNone:
		return problemText{}
	case problemMissing:
		detail = "this request needs the " + header + " header"
	case problemEmpty:
		detail = "the " + header + " header is empty"
	case problemTooLong:
		detail = "the " + header + " is longer than " + strconv.Itoa(MaxKeyLen) + " bytes"
	case problemControl:
		detail = "the " + header + " contains control characters"
	case problemRepeated:
		detail = "send exactly one " + header + " header, with one key"
	case problemMalformed:
		detail = "the " + header + ` must be a quoted string ("...") or a token`
	case problemUnreadable:
		detail = "the request body could not be read"
	case problemTooLarge:
		status = http.StatusRequestEntityTooLarge
		detail = "a request with the " + header + " header may have a body of at most " + strconv.FormatInt(maxReq, 10) + " bytes"
	case problemMismatch:
		status = http.StatusUnprocessableEntity
		detail = "this " + header + " was already used for a request with another method, path, query or body"
	case problemInFlight:
		status, retry = http.StatusConflict, retryInFlight
		detail = "a request with this " + header + " is still being processed; retry later"
	case problemUnreplayable:
		status = http.StatusConflict
		detail = "a request with this " + header + " was already processed, and its response cannot be sent again"
	case problemUnavailable:
		status, retry = http.StatusServiceUnavailable, retryFull
		detail = "this request cannot be made idempotent right now; retry in " + strconv.Itoa(retryFull) + " second"
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{"about:blank", http.StatusText(status), status, detail}); err != nil {
		panic(err) // strings and an int always encode
	}
	pt := problemText{status: status, body: out.Bytes()}
	if retry > 0 {
		pt.retryAfter = strconv.Itoa(retry)
	}
	return pt
}

// problem answers with b's problem p.
func (m *Middleware) problem(w http.ResponseWriter, b *block, p problemKind) {
	pt := &b.problems[p]
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if pt.retryAfter != "" {
		h.Set("Retry-After", pt.retryAfter)
	}
	h.Set("Content-Length", strconv.Itoa(len(pt.body)))
	w.WriteHeader(pt.status)
	_, _ = w.Write(pt.body) // the client went away: nothing to do
}

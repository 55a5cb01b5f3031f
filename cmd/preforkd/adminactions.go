package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/redisstore"
)

// adminAction is one action of the admin endpoint. Every action needs the
// bearer token (admin.authorize); adding one is an entry here, documented
// in README's "Admin actions".
type adminAction struct {
	pattern string // net/http ServeMux pattern: method and path
	serve   func(a *admin, w http.ResponseWriter, r *http.Request)
}

var adminActions = []adminAction{
	{"GET /ratelimit/{rule}", (*admin).serveKeyState},
	{"POST /ratelimit/{rule}/reset", (*admin).serveKeyReset},
	{"DELETE /idempotency", (*admin).serveForgetResponse},
	{"POST /cache/purge", (*admin).serveCachePurge},
}

// keyStateJSON is one key's state as the actions report it. It names the
// element of the rule's by the key is, never its value (which may be a
// secret); seconds are rounded up, as Retry-After is.
type keyStateJSON struct {
	Rule       string `json:"rule"`
	Element    string `json:"element"`
	Stored     bool   `json:"stored"`
	Override   bool   `json:"override"`
	Limit      int64  `json:"limit"`
	Remaining  int64  `json:"remaining"`
	Limited    bool   `json:"limited"`
	RetryAfter int64  `json:"retry_after_seconds"`
	ResetAfter int64  `json:"reset_after_seconds"`
}

func newKeyStateJSON(s core.KeyState) keyStateJSON {
	return keyStateJSON{
		Rule: s.Rule, Element: s.Element, Stored: s.Stored, Override: s.Override, Limit: s.Limit,
		Remaining: s.Remaining, Limited: s.Limited,
		RetryAfter: ceilSeconds(s.RetryAfter.Nanoseconds()), ResetAfter: ceilSeconds(s.ResetAfter.Nanoseconds()),
	}
}

func ceilSeconds(ns int64) int64 { return (ns + 1e9 - 1) / 1e9 }

// serveKeyState is GET /ratelimit/{rule}?key=K: the state of one key.
func (a *admin) serveKeyState(w http.ResponseWriter, r *http.Request) {
	if st, ok := a.keyAction(w, r, (*core.Control).KeyState); ok {
		writeJSON(w, newKeyStateJSON(st))
	}
}

// serveKeyReset is POST /ratelimit/{rule}/reset?key=K: forget one key; its
// next request finds the whole allowance. The answer is the state before.
func (a *admin) serveKeyReset(w http.ResponseWriter, r *http.Request) {
	before, ok := a.keyAction(w, r, (*core.Control).ResetKey)
	if !ok {
		return
	}
	a.log.Info("admin: key reset", "rule", before.Rule, "element", before.Element, "was_limited", before.Limited, "client", r.RemoteAddr)
	writeJSON(w, struct {
		Reset  bool         `json:"reset"`
		Before keyStateJSON `json:"before"`
	}{true, newKeyStateJSON(before)})
}

// serveForgetResponse is DELETE /idempotency?key=K&by=V: drop the response
// stored for idempotency key K of the client V, so that its retry runs
// again. 404 when none is stored, 409 while its request runs.
func (a *admin) serveForgetResponse(w http.ResponseWriter, r *http.Request) {
	q, ok := query(w, r)
	if !ok || badParams(w, q, []string{"key", "by"}, nil) {
		return
	}
	key, by := q.Get("key"), q.Get("by")
	if key == "" || by == "" {
		writeProblem(w, http.StatusBadRequest, "Bad Request",
			"give ?key= (the Idempotency-Key as the client sent it) and ?by= (the client, as the block's by sees it: ip:192.0.2.1, header:NAME:VALUE, ...)")
		return
	}
	ctl, ok := a.control(w)
	if !ok {
		return
	}
	n, err := ctl.ForgetResponse(key, by)
	switch {
	case errors.Is(err, core.ErrInFlight):
		writeProblem(w, http.StatusConflict, "Conflict", "the request with this key is still running; try again when it is done")
		return
	case a.keyError(w, err):
		return
	case n == 0:
		writeProblem(w, http.StatusNotFound, "Not Found", "no stored response for this key and client")
		return
	}
	a.log.Info("admin: stored response dropped", "records", n, "client", r.RemoteAddr)
	writeJSON(w, struct {
		Deleted int `json:"deleted"`
	}{n})
}

// keyAction runs op (Control.KeyState or Control.ResetKey) on the rule
// {rule} and the key ?key=. When ok is false it has answered the request
// with the problem.
func (a *admin) keyAction(w http.ResponseWriter, r *http.Request,
	op func(ctl *core.Control, rule, key string) (core.KeyState, error)) (st core.KeyState, ok bool) {
	q, ok := query(w, r)
	if !ok || badParams(w, q, []string{"key"}, nil) {
		return core.KeyState{}, false
	}
	key := q.Get("key")
	if key == "" {
		writeProblem(w, http.StatusBadRequest, "Bad Request",
			"give ?key=: an address (ip:192.0.2.1 or 192.0.2.1), header:NAME:VALUE, cookie:NAME:VALUE, query:NAME:VALUE, path:PATH or global")
		return core.KeyState{}, false
	}
	ctl, ok := a.control(w)
	if !ok {
		return core.KeyState{}, false
	}
	st, err := op(ctl, r.PathValue("rule"), key)
	if a.keyError(w, err) {
		return core.KeyState{}, false
	}
	return st, true
}

// query is r's query parameters; when ok is false it has answered 400:
// a pair that cannot be read (a bad escape, a ';') is never dropped, as
// URL.Query drops it, for it may be a value given twice or a misspelled
// name that badParams would refuse.
func query(w http.ResponseWriter, r *http.Request) (url.Values, bool) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "Bad Request", "the query cannot be read: "+err.Error())
		return nil, false
	}
	return q, true
}

// badParams answers 400 and reports true when params hold a parameter
// that is neither one of once nor one of many, or one of once more than
// once: an action never acts on the first of two values, or without a
// target whose name was mistyped, and answers 200 as if it had done
// what was asked.
func badParams(w http.ResponseWriter, params url.Values, once, many []string) bool {
	names := make([]string, 0, len(params))
	for name := range params {
		names = append(names, name)
	}
	slices.Sort(names)
	takes := strings.Join(append(slices.Clone(once), many...), "=, ") + "="
	for _, name := range names {
		switch {
		case slices.Contains(many, name):
		case !slices.Contains(once, name):
			writeProblem(w, http.StatusBadRequest, "Bad Request", fmt.Sprintf("unknown parameter %q: this action takes %s", name, takes))
			return true
		case len(params[name]) > 1:
			writeProblem(w, http.StatusBadRequest, "Bad Request", fmt.Sprintf("parameter %q given %d times: give it once (one action per request)", name, len(params[name])))
			return true
		}
	}
	return false
}

// keyError answers a Control error: 404 for an unknown rule, 400 for a key
// the rule does not have, 503 when Redis did not answer for a Redis rule
// (the cause is logged, not sent).
func (a *admin) keyError(w http.ResponseWriter, err error) bool {
	var ke *core.KeyError
	switch {
	case err == nil:
		return false
	case errors.Is(err, core.ErrUnknownRule):
		writeProblem(w, http.StatusNotFound, "Not Found", strings.TrimPrefix(err.Error(), "core: "))
	case errors.As(err, &ke):
		writeProblem(w, http.StatusBadRequest, "Bad Request", strings.TrimPrefix(err.Error(), "core: "))
	case errors.Is(err, redisstore.ErrUnavailable):
		a.log.Warn("admin action: Redis did not answer", "err", err)
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable", "this rule's state is kept in Redis, which did not answer; try again")
	default:
		a.log.Error("admin action failed", "err", err)
		writeProblem(w, http.StatusInternalServerError, "Internal Server Error", "see the log")
	}
	return true
}

package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
	"time"
)

// minTokenLen is the shortest token accepted: 16 characters of a random
// token are 96 bits or more, beyond guessing over an admin listener.
const minTokenLen = 16

// maxTokenFile bounds what is read of a token file.
const maxTokenFile = 4 << 10

// authorize guards an admin action: 403 when no token file is configured
// (actions are off), 401 without the right bearer token (or with more
// than one Authorization field), 503 when the file cannot be read now, or
// before the supervisor's first status snapshot.
// The file is read at every action, so that a token is rotated by
// rewriting the file; the comparison takes the same time whatever the
// tokens (SHA-256 of both, compared in constant time).
func (a *admin) authorize(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.acting.RLock()
		defer a.acting.RUnlock()
		if a.stopped {
			writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable",
				"the instance is stopping: its state is being dumped, and an action now would not be kept")
			return
		}
		st := a.status.Load()
		if st == nil {
			// The endpoint serves before the supervisor's first
			// snapshot, which holds the running configuration (and its
			// token file): whether actions are on is not known yet.
			w.Header().Set("Retry-After", "1")
			writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable", "the workers have not started yet; try again")
			return
		}
		path := runningConfig(st).Admin.TokenFile
		if path == "" {
			writeProblem(w, http.StatusForbidden, "Forbidden", "admin actions are off: set admin.token_file to enable them")
			return
		}
		want, err := readToken(path)
		if err != nil {
			// Logged at most once a second: the request that finds it
			// need not carry a token at all.
			if args, ok := a.tokenUnusable.Args(time.Now(), "err", err); ok {
				a.log.Error("admin action refused: token file unusable", args...)
			}
			writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable", "the admin token file cannot be used; see the log")
			return
		}
		// Exactly one Authorization field: of two, which was meant cannot
		// be told (an intermediary may have added either), so the request
		// is refused rather than authorized by the first.
		got, ok := "", false
		if fields := r.Header.Values("Authorization"); len(fields) == 1 {
			got, ok = bearer(fields[0])
		}
		ws, gs := sha256.Sum256(want), sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(ws[:], gs[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="preforkd admin"`)
			writeProblem(w, http.StatusUnauthorized, "Unauthorized", "send Authorization: Bearer with the token of admin.token_file")
			if suppressed, ok := a.unauthorized.Pass(time.Now()); ok {
				a.log.Warn("admin action refused: wrong or missing token", "method", r.Method, "path", r.URL.Path,
					"client", r.RemoteAddr, "suppressed", suppressed)
			}
			return
		}
		next(w, r)
	})
}

// stopActions waits for the actions under way and refuses those that
// come after: called before the final dump, so that an action answered
// 200 (a purge, a reset) is one the dump holds, never one that runs while
// it is written and is lost at the next start. /metrics, /status and the
// health endpoints serve on.
func (a *admin) stopActions() {
	a.acting.Lock()
	a.stopped = true
	a.acting.Unlock()
}

// bearer is the token of an Authorization: Bearer header value.
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

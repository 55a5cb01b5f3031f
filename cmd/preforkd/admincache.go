package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/shm"
)

// serveCachePurge is POST /cache/purge: tag=T purges the responses a
// Cache-Tag or Surrogate-Key field tagged T (the value as the response
// sent it), key=URL the responses of a URL (a path with its query as a
// client sends it, or an absolute URL whose host is ignored); both may
// repeat, in the query or a form body. A purge is one generation bump in
// the region: the next request in any worker is a miss. Every target is
// checked before anything is purged, so a bad one purges nothing.
func serveCachePurge(r *shm.Region, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		if err := req.ParseForm(); err != nil {
			adminProblem(w, http.StatusBadRequest, "Bad Request", "the form cannot be read: "+err.Error())
			return
		}
		tags, keys := req.Form["tag"], req.Form["key"]
		if len(tags)+len(keys) == 0 {
			adminProblem(w, http.StatusBadRequest, "Bad Request", "give tag=TAG or key=URL (each may repeat)")
			return
		}
		if r.Tags().Len() == 0 {
			adminProblem(w, http.StatusNotFound, "Not Found", "this instance has no response cache (table.responses is 0)")
			return
		}
		for _, t := range tags {
			if t == "" {
				adminProblem(w, http.StatusBadRequest, "Bad Request", "an empty tag=")
				return
			}
		}
		for _, k := range keys {
			if err := core.CheckPurgeURL(k); err != nil {
				adminProblem(w, http.StatusBadRequest, "Bad Request", fmt.Sprintf("key %q: %s", k, strings.TrimPrefix(err.Error(), "core: ")))
				return
			}
		}
		for _, k := range keys {
			core.PurgeURL(r, k)
		}
		for _, t := range tags {
			core.PurgeTag(r, t)
		}
		log.Info("admin: cache purged", "tags", len(tags), "keys", len(keys), "client", req.RemoteAddr)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(map[string]int{"purged_tags": len(tags), "purged_keys": len(keys)})
	}
}

// withToken guards an admin action with the bearer token of
// admin.token_file (of the configuration in force), read at every request
// so that rewriting the file rotates it: 403 when no token file is configured (actions are off), 503
// when it cannot be read or others may read it, 401 without the right
// token. Tokens are compared by their SHA-256, in constant time.
func withToken(tokenFile func() string, log *slog.Logger, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		path := tokenFile()
		if path == "" {
			adminProblem(w, http.StatusForbidden, "Forbidden", "admin actions are off: set admin.token_file to enable them")
			return
		}
		want, err := readTokenFile(path)
		if err != nil {
			log.Error("admin: token file", "err", err)
			adminProblem(w, http.StatusServiceUnavailable, "Service Unavailable", "the admin token cannot be read; see the log")
			return
		}
		got, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
		a, b := sha256.Sum256([]byte(strings.TrimSpace(got))), sha256.Sum256(want)
		if !ok || subtle.ConstantTimeCompare(a[:], b[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="preforkd admin"`)
			adminProblem(w, http.StatusUnauthorized, "Unauthorized", "this action needs Authorization: Bearer with the admin token")
			return
		}
		next(w, req)
	}
}

// readTokenFile reads the token (the file without surrounding blanks),
// refusing a file that group or others may read or write.
func readTokenFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("admin.token_file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("admin.token_file: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o066 != 0 {
		return nil, fmt.Errorf("admin.token_file %s: mode %#o lets group or others read or write the token; chmod 600 %s", path, perm, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, 4<<10))
	if err != nil {
		return nil, fmt.Errorf("admin.token_file: %w", err)
	}
	tok := bytes.TrimSpace(b)
	if len(tok) == 0 {
		return nil, fmt.Errorf("admin.token_file %s: empty", path)
	}
	return tok, nil
}

// adminProblem answers an admin request with an RFC 9457 problem.
func adminProblem(w http.ResponseWriter, status int, title, detail string) {
	body := (&core.Problem{Status: status, Title: title, Detail: detail}).AppendJSON(nil)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(body)
}

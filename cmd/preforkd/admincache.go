package main

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/preforkd/preforkd/core"
)

// serveCachePurge is POST /cache/purge: tag=T purges the responses a
// Cache-Tag or Surrogate-Key field tagged T (the value as the response
// sent it), key=URL the responses of a URL (a path with its query as a
// client sends it, or an absolute URL whose host is ignored); both may
// repeat, in the query or a form body. A purge is one generation bump in
// the region: the next request in any worker is a miss. Every target is
// checked before anything is purged, so a bad one purges nothing.
func (a *admin) serveCachePurge(w http.ResponseWriter, req *http.Request) {
	if err := req.ParseForm(); err != nil {
		writeProblem(w, http.StatusBadRequest, "Bad Request", "the form cannot be read: "+err.Error())
		return
	}
	if badParams(w, req.Form, nil, []string{"tag", "key"}) {
		return
	}
	tags, keys := req.Form["tag"], req.Form["key"]
	if len(tags)+len(keys) == 0 {
		writeProblem(w, http.StatusBadRequest, "Bad Request", "give tag=TAG or key=URL (each may repeat)")
		return
	}
	if a.region.Tags().Len() == 0 {
		writeProblem(w, http.StatusNotFound, "Not Found", "this instance has no response cache: its region has no response table (no [[idempotency]] or [[cache]] block at start, or table.responses = 0)")
		return
	}
	for _, t := range tags {
		if t == "" {
			writeProblem(w, http.StatusBadRequest, "Bad Request", "an empty tag=")
			return
		}
	}
	for _, k := range keys {
		if err := core.CheckPurgeURL(k); err != nil {
			writeProblem(w, http.StatusBadRequest, "Bad Request", fmt.Sprintf("key %q: %s", k, strings.TrimPrefix(err.Error(), "core: ")))
			return
		}
	}
	for _, k := range keys {
		core.PurgeURL(a.region, k)
	}
	for _, t := range tags {
		core.PurgeTag(a.region, t)
	}
	a.log.Info("admin: cache purged", "tags", len(tags), "keys", len(keys), "client", req.RemoteAddr)
	writeJSON(w, map[string]int{"purged_tags": len(tags), "purged_keys": len(keys)})
}

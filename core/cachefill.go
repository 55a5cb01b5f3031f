package core

import (
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/preforkd/preforkd/core/httpcache"
	"github.com/preforkd/preforkd/internal/httpfield"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// The cache's side of Complete: whether the application's response may be
// stored (RFC 9111 §3, as a shared cache), for how long (§4.2), under
// which key (Vary) and tags; and, from Head, the invalidation that a
// successful unsafe request makes (§4.4).

// completeCache ends the cache's part of a recorded exchange.
func (ex *Exchange) completeCache(rec *recorded) {
	if ex.cache.flags&cFill == 0 {
		return
	}
	ex.cache.flags &^= cFill
	c := ex.c
	tab := c.region.Responses()
	now := c.now()
	var p fillPlan
	var drop bool
	switch {
	case ex.cache.flags&cRefreshed != 0:
		p = ex.cache.refreshed // a 304 refreshed the entry
	case ex.cache.flags&cRevalidate != 0 && ex.cache.dropAfter:
		drop = true // validated, but no longer to be stored
	default:
		p, drop = ex.storable(rec, now)
	}
	if p.data == nil {
		tab.CacheUnlock(ex.cache.lock)
		if drop {
			// A newer response the origin does not let be stored: the old
			// one must not be served any more, not even stale.
			tab.CacheDrop(ex.cache.key)
		}
		c.row.Add(metrics.CacheFills, metrics.CacheNotStored, 1)
		return
	}
	if ex.put(&p, now) {
		c.row.Add(metrics.CacheFills, metrics.CacheStored, 1)
	} else {
		c.row.Add(metrics.CacheFills, metrics.CacheNotStored, 1)
	}
}

// endFillAtHead ends a fill whose response's head h already says it
// will not be stored (no-store, private, a stream, a status never stored:
// httpcache.Judge). The key's lock is let go at once, not when the body
// ends: the misses waiting on it go on (an event stream may never end),
// and nothing of the body is recorded, nor read on for the store once
// its client is gone (Keep).
func (ex *Exchange) endFillAtHead(status int, h Header) {
	var fields []httpcache.Field
	if h != nil {
		h.Each(func(name, value []byte) { fields = append(fields, httpcache.Field{Name: string(name), Value: value}) })
	}
	c := ex.c
	j := httpcache.Judge(status, fields, &ex.cache.blk.policy, ex.cache.flags&cAuth != 0, c.wall(), max(c.now()-ex.clock(), 0))
	if j.Store {
		return
	}
	ex.cache.flags &^= cFill
	tab := c.region.Responses()
	tab.CacheUnlock(ex.cache.lock)
	if j.Outdates {
		tab.CacheDrop(ex.cache.key) // as completeCache drops it
	}
	c.row.Add(metrics.CacheFills, metrics.CacheNotStored, 1)
}

// fillPlan is a response that may be stored.
type fillPlan struct {
	data   []byte        // the entry
	expiry time.Duration // when its record may be reclaimed
	names  []string      // its Vary names
}

// Fields a cache never stores: hop-by-hop fields (RFC 9110 §7.6.1), the
// ones it computes (Content-Length, Age), its own, and Set-Cookie (a
// response with one is not stored at all). Proxy-* fields are unstored
// too.
var unstoredFields = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true, "Age": true, hdrXCache: true, "Set-Cookie": true,
}

// unstored reports whether the response field called name (canonical) is
// never stored: one of unstoredFields, or any Proxy-* field (Proxy-Status,
// Proxy-Authentication-Info), which the engines take for hop-by-hop and
// never pass on (engine.ClassifyField): a hit has no field that a miss
// would not have given its client.
func unstored(name string) bool {
	return unstoredFields[name] || len(name) > 6 && name[:6] == "Proxy-"
}

// maxStoredFields bounds the field lines of a stored response.
const maxStoredFields = 1024

// storable decides whether rec may be stored and makes its entry; when it
// may not, drop says whether the key's stored response is outdated by it
// (a newer response that is not to be stored), rather than by a failure
// of the application (5xx, no whole response), after which a stale entry
// may still be served under stale-if-error.
func (ex *Exchange) storable(rec *recorded, now time.Duration) (p fillPlan, drop bool) {
	switch s := rec.Status; {
	case rec.Failed, rec.Hijacked:
		return p, false
	case s < 200 || s == http.StatusPartialContent || s == http.StatusNotModified || s > 599:
		return p, false
	case rec.Overflow || int64(len(rec.Body)) > ex.cache.blk.maxBody:
		return p, s < 500
	}
	return ex.plan(rec.Status, rec.Header, rec.Body, now)
}

// plan makes the entry of a response (RFC 9111 as httpcache.Judge reads
// it), arrived at now, when it may be stored, with the generations its
// URL and tags had before it was fetched; drop is as for storable.
func (ex *Exchange) plan(status int, h []httpcache.Field, body []byte, now time.Duration) (p fillPlan, drop bool) {
	b, c := ex.cache.blk, ex.c
	wall := c.wall()
	j := httpcache.Judge(status, h, &b.policy, ex.cache.flags&cAuth != 0, wall, max(now-ex.clock(), 0))
	if !j.Store {
		return p, j.Outdates
	}
	p.names = j.Names
	p.expiry = now - j.Age + j.Fresh + max(j.SWR, j.SIE) + j.Keep
	if p.expiry <= now {
		return p, true
	}

	// Generations: the URL's as it was before the fetch, the tags' as
	// they are now, unless a tag purge ran since the fetch began.
	var lb [8]string
	var tb [httpcache.MaxTags]string
	tagList := tb[:0]
	for _, name := range b.tagHeaders {
		var ok bool
		if tagList, ok = httpcache.AppendTags(tagList, httpcache.Lines(h, name, lb[:0])); !ok {
			return p, true
		}
	}
	tags := c.region.Tags()
	if tags.Gen(ex.cache.urlHash) != ex.cache.urlGen {
		return p, false // invalidated while it was fetched
	}
	var w httpcache.Writer
	w.Begin(make([]byte, 0, httpcache.EntryFixed+16*(1+len(tagList))+256+len(body)), 0, status, now, j.Age, j.Fresh, j.SWR, j.SIE, 1+len(tagList))
	w.Gen(0, ex.cache.urlHash, ex.cache.urlGen)
	for i, t := range tagList {
		th := tagHash(c.region, t)
		w.Gen(1+i, th, tags.Gen(th))
	}
	if len(tagList) > 0 && tags.Epoch() != ex.cache.epoch {
		return p, false // a tag purge ran since the fetch began
	}

	// Fields: everything end to end, but what the core added and what the
	// Connection field names; the block's own targeted field is kept
	// hidden. A response without a valid Date gets the time it arrived.
	var cb [8]string
	conn := httpcache.Lines(h, "Connection", cb[:0])
	n := 0
	for _, f := range h {
		name := textproto.CanonicalMIMEHeaderKey(f.Name)
		switch {
		case unstored(name), ex.coreField(name), httpfield.HasToken(conn, name), j.NoDate && name == "Date":
			continue
		case len(f.Value) > httpcache.MaxFieldValue || len(name) > httpcache.MaxFieldName || n == maxStoredFields:
			return p, true
		}
		w.Field(name, f.Value, name == b.own)
		n++
	}
	if j.NoDate {
		w.Field("Date", wall.UTC().AppendFormat(nil, http.TimeFormat), false)
	}
	if !BodyAllowed(status) {
		body = nil
	}
	p.data = w.Finish(body)
	return p, false
}

// put stores the entry of p: in the fill lock's record when it is for the
// same key, else under the key the response's Vary calls for, with the
// primary key's stub naming the Vary fields. The variant is stored before
// the stub, so that whoever waits on the primary key's lock finds it when
// the stub wakes them.
func (ex *Exchange) put(p *fillPlan, now time.Duration) bool {
	tab := ex.c.region.Responses()
	lock, variant := ex.cache.lock, ex.cache.flags&cVariant != 0
	if len(p.names) == 0 {
		if !variant {
			ok, _ := tab.CacheFill(lock, p.data, p.expiry, now)
			return ok
		}
		// The response no longer varies: it replaces the stub.
		tab.CacheUnlock(lock)
		return ex.fillKey(ex.cache.primary, p.data, p.expiry, now)
	}
	h := namesHash(p.names)
	if variant && ex.cache.namesHash == h {
		ok, _ := tab.CacheFill(lock, p.data, p.expiry, now)
		return ok
	}
	if ex.cache.flags&cRefresh != 0 {
		// The Vary fields changed and the request is gone: its values
		// for the new fields are unknown.
		tab.CacheUnlock(lock)
		return false
	}
	k1 := ex.c.region.Counters().KeyOf(nsCacheVariant, ex.appendVariant(ex.keyBuf[:0], p.names))
	stored := ex.fillKey(k1, p.data, p.expiry, now)
	var w httpcache.Writer
	w.Begin(nil, httpcache.EntryStub, 0, now, 0, 0, 0, 0, 0)
	for _, n := range p.names {
		w.Field(n, nil, false)
	}
	stub, stubExpiry := w.Finish(nil), p.expiry+ex.cache.blk.ttl
	if !variant {
		tab.CacheFill(lock, stub, stubExpiry, now)
	} else {
		tab.CacheUnlock(lock)
		ex.fillKey(ex.cache.primary, stub, stubExpiry, now)
	}
	return stored
}

// fillKey stores data as k's entry, unless another request holds k's fill
// lock (its response will be stored).
func (ex *Exchange) fillKey(k shm.Key, data []byte, expiry, now time.Duration) bool {
	tab := ex.c.region.Responses()
	lock, held, err := tab.CacheLock(k, now)
	if err != nil || !held {
		return false
	}
	ok, _ := tab.CacheFill(lock, data, expiry, now)
	return ok
}

// coreField reports whether name is a field the core added to the
// response (rate-limit fields, X-Cache, the request id): never stored.
// The request id is named on its own: a background refresh adds no field
// to its response, yet is forwarded with the id, which an application
// echoes.
func (ex *Exchange) coreField(name string) bool {
	if name == ex.c.ridName && name != "" {
		return true
	}
	for i := range ex.fields {
		if ex.fields[i].Name == name {
			return true
		}
	}
	return false
}

// invalidateOnSuccess makes the invalidation of a successful unsafe
// request (RFC 9111 §4.4) when its response head is known, before it is
// sent: a client that saw the answer finds the URL invalid in every
// process, whichever its next request reaches. The status says the
// application did it, even if the body then does not reach the client
// whole.
func (ex *Exchange) invalidateOnSuccess(status int, h Header) {
	if ex.cache.flags&cInvalidate == 0 || status < 200 || status >= 400 {
		return
	}
	ex.cache.flags &^= cInvalidate
	var loc, cloc string
	if h != nil {
		h.Each(func(name, value []byte) {
			switch {
			case loc == "" && strings.EqualFold(string(name), "Location"):
				loc = string(value)
			case cloc == "" && strings.EqualFold(string(name), "Content-Location"):
				cloc = string(value)
			}
		})
	}
	ex.invalidate(loc, cloc)
}

// invalidate advances the generation of the request's URL, and of the
// Location and Content-Location of the response (loc, cloc) when they are
// on the same host (RFC 9111 §4.4): every stored response of those URLs,
// every variant in every process, is invalid from now on.
func (ex *Exchange) invalidate(loc, cloc string) {
	c := ex.c
	tags := c.region.Tags()
	tags.Bump(ex.cache.urlHash)
	c.row.Add(metrics.CacheInvalidations, 0, 1)
	host, _ := ex.req.Header("Host")
	for _, v := range [...]string{loc, cloc} {
		path, query, ok := sameOrigin(v, host)
		if !ok {
			continue
		}
		if _, fwd, err := route.Normalize(path); err == nil {
			tags.Bump(c.urlHash(appendURLID(ex.keyBuf[:0], fwd, query)))
		}
	}
}

// sameOrigin splits a Location or Content-Location value into path and
// query when it names a URL on host: an absolute path ("/a?b"), or an
// http(s) URL with that host.
func sameOrigin(v, host string) (path, query string, ok bool) {
	v, _, _ = strings.Cut(v, "#")
	switch {
	case strings.HasPrefix(v, "//"):
		return "", "", false
	case strings.HasPrefix(v, "/"):
	default:
		rest, found := strings.CutPrefix(v, "http://")
		if !found {
			if rest, found = strings.CutPrefix(v, "https://"); !found {
				return "", "", false
			}
		}
		i := strings.IndexAny(rest, "/?")
		h := rest
		if i >= 0 {
			h, rest = rest[:i], rest[i:]
		} else {
			rest = "/"
		}
		if host == "" || !strings.EqualFold(h, host) {
			return "", "", false
		}
		if rest[0] == '?' {
			rest = "/" + rest
		}
		v = rest
	}
	path, query, _ = strings.Cut(v, "?")
	return path, query, true
}

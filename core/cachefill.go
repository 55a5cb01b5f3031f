package core

import (
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/preforkd/preforkd/core/httpcache"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// The cache's side of Complete: whether the application's response may be
// stored (RFC 9111 §3, as a shared cache), for how long (§4.2), under
// which key (Vary) and tags; and the invalidation that a successful unsafe
// request makes (§4.4).

// completeCache ends the cache's part of a recorded exchange.
func (ex *Exchange) completeCache(rec *recorded) {
	// The status says the application did it, even when the body did not
	// reach the client whole.
	if ex.cache.flags&cInvalidate != 0 && rec.Status >= 200 && rec.Status < 400 {
		ex.invalidate(rec)
	}
	if ex.cache.flags&cFill == 0 {
		return
	}
	ex.cache.flags &^= cFill
	c := ex.c
	tab := c.region.Responses()
	now := c.now()
	p, drop := ex.storable(rec, now)
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

// fillPlan is a response that may be stored.
type fillPlan struct {
	data   []byte        // the entry
	expiry time.Duration // when its record may be reclaimed
	names  []string      // its Vary names
}

// Fields a cache never stores: hop-by-hop fields (RFC 9110 §7.6.1), the
// ones it computes (Content-Length, Age), its own, and Set-Cookie (a
// response with one is not stored at all).
var unstoredFields = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true, "Age": true, hdrXCache: true, "Set-Cookie": true,
}

// maxStoredFields bounds the field lines of a stored response.
const maxStoredFields = 1024

// heuristicStatus are the statuses a heuristic freshness may apply to
// (RFC 9110 §15.1, but 206 and 501: partial and error responses are
// never stored here).
func heuristicStatus(s int) bool {
	switch s {
	case 200, 203, 204, 300, 301, 308, 404, 405, 410, 414:
		return true
	}
	return false
}

// storable decides whether rec may be stored and makes its entry; when it
// may not, drop says whether the key's stored response is outdated by it
// (a newer response that is not to be stored), rather than by a failure
// of the application (5xx, no whole response), after which a stale entry
// may still be served under stale-if-error.
func (ex *Exchange) storable(rec *recorded, now time.Duration) (p fillPlan, drop bool) {
	switch s := rec.Status; {
	case rec.Failed, rec.Hijacked, s >= 500:
		return p, false
	case s < 200 || s == http.StatusPartialContent || s == http.StatusNotModified:
		return p, false
	case rec.Overflow || int64(len(rec.Body)) > ex.cache.blk.maxBody:
		return p, true
	}
	b, c := ex.cache.blk, ex.c
	h := rec.Header
	var lb [8]string
	cc := httpcache.ParseCacheControl(fieldLines(h, "Cache-Control", lb[:0]))
	switch {
	case cc.NoStore, cc.Private, cc.NoCache:
		// no-cache: every use needs a validation, which this cache does
		// not make; the response is as good as not storable.
		return p, true
	case hasField(h, "Set-Cookie"):
		return p, true
	case ex.cache.flags&cAuth != 0 && !cc.Public && cc.SMaxAge < 0 && !cc.MustRevalidate:
		// RFC 9111 §3.5: the response to a request with credentials is
		// for its client only. The stored response (of a request without)
		// is not outdated by it.
		return p, false
	}
	names, star := httpcache.ParseVary(fieldLines(h, "Vary", lb[:0]))
	if star || len(names) > maxVary {
		return p, true
	}
	p.names = names

	// Freshness (RFC 9111 §4.2.1): s-maxage, max-age, Expires - Date, or
	// a heuristic when the block allows one.
	wall := c.wall()
	date := wall
	if d, n := firstField(h, "Date"); n > 0 {
		if t, err := http.ParseTime(d); err == nil {
			date = t
		}
	}
	fresh := time.Duration(-1)
	switch {
	case cc.SMaxAge >= 0:
		fresh = time.Duration(cc.SMaxAge) * time.Second
	case cc.MaxAge >= 0:
		fresh = time.Duration(cc.MaxAge) * time.Second
	default:
		if e, n := firstField(h, "Expires"); n > 0 {
			fresh = 0 // an invalid date ("0") is in the past
			if t, err := http.ParseTime(e); err == nil {
				fresh = max(t.Sub(date), 0)
			}
		} else if lm, n := firstField(h, "Last-Modified"); n > 0 && b.heuristic && heuristicStatus(rec.Status) {
			if t, err := http.ParseTime(lm); err == nil {
				fresh = max(date.Sub(t)/10, 0)
			}
		}
	}
	if fresh < 0 {
		return p, true // no freshness: nothing to serve it for
	}
	fresh = min(fresh, b.ttl)
	swr := min(time.Duration(max(cc.SWR, 0))*time.Second, b.ttl)
	sie := min(time.Duration(max(cc.SIE, 0))*time.Second, b.ttl)
	if cc.MustRevalidate || cc.ProxyRevalidate {
		swr, sie = 0, 0 // never served stale (RFC 9111 §5.2.2.2)
	}

	// Age (RFC 9111 §4.2.3): the larger of what the clocks say and what
	// the Age field plus the round trip say.
	ageValue := time.Duration(0)
	if a, n := firstField(h, "Age"); n > 0 {
		ageValue = time.Duration(httpcache.ParseDelta(trimOWS(a))) * time.Second
	}
	apparent := max(wall.Sub(date), 0)
	corrected := ageValue + max(now-ex.clock(), 0)
	age := max(apparent, corrected)
	p.expiry = now - age + fresh + max(swr, sie)
	if p.expiry <= now {
		return p, true // stale on arrival, and too stale to serve
	}

	// Generations: the URL's as it was before the fetch, the tags' as
	// they are now, unless a tag purge ran since the fetch began.
	var tb [httpcache.MaxTags]string
	tagList := tb[:0]
	for _, name := range b.tagHeaders {
		var ok bool
		if tagList, ok = httpcache.AppendTags(tagList, fieldLines(h, name, lb[:0])); !ok {
			return p, true
		}
	}
	tags := c.region.Tags()
	if tags.Gen(ex.cache.urlHash) != ex.cache.urlGen {
		return p, false // invalidated while it was fetched
	}
	var w httpcache.Writer
	w.Begin(make([]byte, 0, httpcache.EntryFixed+16*(1+len(tagList))+256+len(rec.Body)), 0, rec.Status, now, age, fresh, swr, sie, 1+len(tagList))
	w.Gen(0, ex.cache.urlHash, ex.cache.urlGen)
	for i, t := range tagList {
		th := tagHash(c.region, t)
		w.Gen(1+i, th, tags.Gen(th))
	}
	if len(tagList) > 0 && tags.Epoch() != ex.cache.epoch {
		return p, false // a tag purge ran since the fetch began
	}

	// Fields: everything end to end, but what the core added and what the
	// Connection field names.
	var cb [8]string
	conn := fieldLines(h, "Connection", cb[:0])
	n := 0
	for _, f := range h {
		name := textproto.CanonicalMIMEHeaderKey(f.Name)
		switch {
		case unstoredFields[name], ex.coreField(name), connectionNames(conn, name):
			continue
		case len(f.Value) > httpcache.MaxFieldValue || n == maxStoredFields:
			return p, true
		}
		w.Field(name, f.Value)
		n++
	}
	body := rec.Body
	if !BodyAllowed(rec.Status) {
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
		w.Field(n, nil)
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
// response (rate-limit fields, X-Cache): never stored.
func (ex *Exchange) coreField(name string) bool {
	for i := range ex.fields {
		if ex.fields[i].Name == name {
			return true
		}
	}
	return false
}

// connectionNames reports whether the Connection field lines name name.
func connectionNames(conn []string, name string) bool {
	for _, line := range conn {
		for f := range strings.SplitSeq(line, ",") {
			if strings.EqualFold(trimOWS(f), name) {
				return true
			}
		}
	}
	return false
}

// invalidate advances the generation of the request's URL, and of the
// Location and Content-Location of the response when they are on the same
// host (RFC 9111 §4.4): every stored response of those URLs, every variant
// in every process, is invalid from now on.
func (ex *Exchange) invalidate(rec *recorded) {
	c := ex.c
	tags := c.region.Tags()
	tags.Bump(ex.cache.urlHash)
	c.row.Add(metrics.CacheInvalidations, 0, 1)
	host, _ := ex.req.Header("Host")
	loc := rec.Location
	if loc == "" {
		loc, _ = firstField(rec.Header, "Location")
	}
	cloc, _ := firstField(rec.Header, "Content-Location")
	for _, v := range [...]string{loc, cloc} {
		path, query, ok := sameOrigin(v, host)
		if !ok {
			continue
		}
		if _, fwd, err := route.Normalize(path); err == nil {
			id := append(append(append(ex.keyBuf[:0], fwd...), '?'), query...)
			tags.Bump(c.urlHash(id))
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

// fieldLines appends the values of the field lines called name (case-
// insensitively: engines may keep names as sent) to dst.
func fieldLines(h []Field, name string, dst []string) []string {
	for _, f := range h {
		if strings.EqualFold(f.Name, name) {
			dst = append(dst, string(f.Value))
		}
	}
	return dst
}

// firstField is the value of the first field line called name, and how
// many there are.
func firstField(h []Field, name string) (string, int) {
	first, n := "", 0
	for _, f := range h {
		if strings.EqualFold(f.Name, name) {
			if n == 0 {
				first = string(f.Value)
			}
			n++
		}
	}
	return first, n
}

func hasField(h []Field, name string) bool {
	_, n := firstField(h, name)
	return n > 0
}

package core

import (
	"net/http"
	"strconv"
	"time"

	"github.com/preforkd/preforkd/core/httpcache"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// The cache stage: GET and HEAD requests of a cache block are answered
// from the responses stored in the region (RFC 9111, as a shared cache),
// and misses fill it, one upstream fetch per key across every process.

// cacheState is the cache stage's part of an exchange.
type cacheState struct {
	blk       *cacheBlock
	xc        xcache // what X-Cache says
	flags     uint16
	fieldsAt  int        // index of X-Cache in fields, on a pass
	primary   shm.Key    // the request's primary key
	key       shm.Key    // the key looked up last (primary or variant)
	namesHash uint64     // hash of the Vary names of the stub looked through
	lock      shm.Ticket // the fill lock, while cFill
	entryTk   shm.Ticket // the entry in ent
	urlHash   uint64
	urlGen    uint64          // the URL's generation before the fetch
	epoch     uint64          // the tag epoch before the fetch
	buf       []byte          // the entry found, copied out of the table
	ent       httpcache.Entry // buf decoded
	part      bool            // buf is the entry's head: its body is streamed (BodyStream)
	stream    BodyStream      // the body of a part entry served (a *cacheStream), or nil
	varyNames [httpcache.MaxVary]string

	// A revalidation: the validators sent (Forward.Add), and the entry a
	// 304 refreshed, stored when the exchange completes.
	validators [2]Field
	nval       int
	refreshed  fillPlan
	dropAfter  bool // the 304 made the entry unstorable: it goes
}

// What the X-Cache field says, and what the exchange is counted as.
type xcache uint8

const (
	xNone xcache = iota
	xHit
	xStale
	xMiss
	xBypass
	xRevalidated
)

// xcacheNames are what X-Cache and the access log's cache field say: one
// table, so that the two cannot disagree (or one lack a value).
var xcacheNames = [...]string{xHit: "HIT", xStale: "STALE", xMiss: "MISS", xBypass: "BYPASS", xRevalidated: "REVALIDATED"}

// xcacheValues are xcacheNames as field values.
var xcacheValues = func() (v [len(xcacheNames)][]byte) {
	for i, s := range xcacheNames {
		v[i] = []byte(s)
	}
	return v
}()

const hdrXCache = "X-Cache"

// Exchange.cflags.
const (
	cFill       = 1 << iota // the exchange holds the fill lock of ckey
	cRefresh                // the fill is a background refresh (the request is gone)
	cVariant                // ckey is a variant of cprimary (the lookup went through a vary stub)
	cInvalidate             // an unsafe request: invalidate its URL if it succeeds
	cAuth                   // the request has Authorization
	cStale                  // cent (in cbuf) is a stale entry stale-if-error may serve
	cRevalidate             // the fill is a conditional request for the entry in ent
	cRefreshed              // a 304 refreshed it: refreshed is the new entry
)

// decideCache runs a request of the first cache block whose path matches it.
func (ex *Exchange) decideCache() (Verdict, bool) {
	b := ex.matchCache()
	if b == nil {
		return Pass, false
	}
	ex.cache.blk = b
	switch m := ex.req.Method(); {
	case m == http.MethodGet, m == http.MethodHead && b.head:
	case !safeMethod(m):
		ex.cache.flags |= cInvalidate
		ex.cache.urlHash = ex.c.urlHash(ex.appendURL(ex.keyBuf[:0]))
		return ex.cachePass(xBypass)
	default:
		return ex.cachePass(xBypass)
	}
	if ex.idem.reserved {
		return ex.cachePass(xBypass) // an idempotency block runs it
	}
	// Content in a GET is the application's to read ("fat GET"), and the
	// key has none of it: an answer stored for one body would be every
	// other client's, and a stored one is no answer to a body.
	if ex.req.HasBody() {
		return ex.cachePass(xBypass)
	}
	// An upgrade is the upstream's to grant, never a stored response's
	// (nginx operators write proxy_cache_bypass $http_upgrade for it).
	if _, n := ex.req.Header("Upgrade"); n > 0 {
		return ex.cachePass(xBypass)
	}
	// Preconditions other than If-None-Match and If-Modified-Since are the
	// application's to judge (a 412 from the cache would need its rules).
	if _, n := ex.req.Header("If-Match"); n > 0 {
		return ex.cachePass(xBypass)
	}
	if _, n := ex.req.Header("If-Unmodified-Since"); n > 0 {
		return ex.cachePass(xBypass)
	}
	if _, n := ex.req.Header("Authorization"); n > 0 {
		ex.cache.flags |= cAuth
	}
	c := ex.c
	ex.cache.urlHash = c.urlHash(ex.appendURL(ex.keyBuf[:0]))
	ex.cache.primary = c.region.Counters().KeyOf(nsCachePrimary, ex.appendPrimary(ex.keyBuf[:0]))
	return ex.lookup()
}

// lookup answers from the cache, takes the fill lock (a miss the engine
// forwards and records) or waits for another request's fill and looks
// again.
func (ex *Exchange) lookup() (Verdict, bool) {
	c, b := ex.c, ex.cache.blk
	tab, tags := c.region.Responses(), c.region.Tags()
	now := ex.clock()
	var deadline time.Time
	waited := false
	for {
		// Snapshots before anything is fetched, taken again at each look:
		// an invalidation or purge after them makes what is fetched
		// unusable (plan), while one that ran as this request waited for
		// another's fetch came before its own.
		ex.cache.urlGen, ex.cache.epoch = tags.Gen(ex.cache.urlHash), tags.Epoch()
		f, err := ex.cacheLookup(ex.cache.primary, now)
		if err != nil {
			return ex.cachePass(xMiss) // New rules out a region without a table
		}
		f = ex.found(f)
		ex.cache.key, ex.cache.flags = ex.cache.primary, ex.cache.flags&^cVariant
		if f.Data != nil && ex.cache.ent.Stub() {
			names := stubNames(&ex.cache.ent, ex.cache.varyNames[:0])
			ex.cache.namesHash = namesHash(names)
			ex.cache.key = c.region.Counters().KeyOf(nsCacheVariant, ex.appendVariant(ex.keyBuf[:0], names))
			ex.cache.flags |= cVariant
			if f, err = ex.cacheLookup(ex.cache.key, now); err != nil {
				return ex.cachePass(xMiss)
			}
			if f = ex.found(f); f.Data != nil && ex.cache.ent.Stub() {
				tab.CacheEvict(f.Entry) // a stub under a variant key: not ours
				f.Data = nil
			}
		}
		state, age := stAbsent, time.Duration(0)
		if f.Data != nil {
			state, age = ex.judge(now)
		}
		switch {
		case state == stFresh:
			if !ex.takeCopy() {
				continue // it changed: look again
			}
			return ex.serve(age, xHit)
		case state == stRevalidate:
			// The refresh is a copy of the request: a HEAD's would store
			// no body.
			if !f.Filling && ex.req.Method() == http.MethodGet {
				if lock, held, err := tab.CacheLock(ex.cache.key, now); err == nil && held {
					if !ex.wholeEntry() {
						tab.CacheUnlock(lock)
						continue // it changed: look again
					}
					ex.cache.lock = lock
					ex.cache.flags |= cFill | cRefresh
					ex.conditional()
					c.row.Add(metrics.CacheRefreshes, 0, 1)
				}
			}
			if !ex.takeCopy() { // made whole above if it took the fill lock
				continue // it changed: look again
			}
			return ex.serve(age, xStale)
		case state == stIfError && waited && !f.Filling:
			// The fetch waited for ended without a new entry: it failed.
			if !ex.takeCopy() {
				continue
			}
			return ex.serve(age, xStale)
		}
		if ex.req.Method() == http.MethodHead {
			return ex.cachePass(xMiss) // a HEAD response has no body to store
		}
		if waited && !f.Filling {
			// The fetch this one waited for ended and left nothing to
			// serve (the response was not storable, or failed): fetched
			// at once, not stored, rather than in turn behind yet another
			// fetch of the same (every request for a private page
			// would queue behind the one before).
			return ex.cachePass(xMiss)
		}
		if !f.Filling {
			lock, held, err := tab.CacheLock(ex.cache.key, now)
			if err != nil {
				return ex.cachePass(xMiss) // no record: fetched, not stored
			}
			if held {
				if state != stAbsent && !ex.wholeEntry() {
					tab.CacheUnlock(lock)
					continue // it changed: look again
				}
				ex.cache.lock = lock
				ex.cache.flags |= cFill
				if state == stIfError {
					ex.cache.flags |= cStale // keep it for Fallback
				}
				if state != stAbsent {
					ex.conditional() // a stale entry: validated if it can be
				}
				return ex.cachePass(xMiss)
			}
			f.Fill = lock
		}
		// Another request fetches this response: wait for it, or let the
		// engine wait elsewhere (NoWait), which looks again from the start.
		if ex.giveUp {
			// No goroutine was free to wait (GiveUpWait): as if the wait
			// had run out.
			c.row.Add(metrics.CacheWaits, metrics.CacheLockTimeout, 1)
			return ex.cachePass(xMiss)
		}
		if ex.nowait {
			ex.step = stepCacheWait
			return Wait, false
		}
		if !waited {
			waited, deadline = true, time.Now().Add(b.lockTimeout)
			c.row.Add(metrics.CacheWaits, metrics.CacheWaited, 1)
		}
		left := time.Until(deadline)
		if left <= 0 || ex.req.Gone() {
			if left <= 0 {
				c.row.Add(metrics.CacheWaits, metrics.CacheLockTimeout, 1)
			}
			return ex.cachePass(xMiss)
		}
		tab.Wait(f.Fill, min(left, waitSlice))
		now = c.now()
	}
}

// cacheLookup looks key up at now, into ex.cache.buf: an entry longer
// than streamOver is copied in part, its head (and what of its body fits
// in headPart, or as much as a longer head is). A head longer than
// headPart takes a second lookup, which may find another entry (the key's
// was replaced meanwhile) with a longer head still: that one is looked up
// again for its own head, a few times at most, and then it is a miss,
// never an entry cut short, which found would evict as damaged.
func (ex *Exchange) cacheLookup(key shm.Key, now time.Duration) (shm.CacheFind, error) {
	tab := ex.c.region.Responses()
	f, err := tab.CacheLookupPart(key, now, ex.cache.buf[:0], streamOver, headPart)
	for tries := 0; ; tries++ {
		if err != nil || f.Data == nil || len(f.Data) == f.Size {
			return f, err
		}
		head, ok := httpcache.HeadSize(f.Data)
		if !ok || head <= len(f.Data) || head > f.Size {
			return f, err // the head is whole (or the entry damaged: found evicts it)
		}
		if tries == headTries {
			f.Data = nil // it kept changing
			return f, err
		}
		if testHook != nil {
			testHook("head")
		}
		f, err = tab.CacheLookupPart(key, now, f.Data[:0], streamOver, head)
	}
}

// headTries bounds the lookups of a large entry's head, which a key's
// entry replaced by one with a longer head each time makes longer.
const headTries = 4

// wholeEntry makes the entry in ex.cache.ent whole, when the lookup copied
// its head alone: a fill that may store it again (a 304 refreshes it) or
// serve it for a failure (stale-if-error) needs its body. False when the
// entry changed meanwhile (it is evicted, in case its bytes are damaged).
func (ex *Exchange) wholeEntry() bool {
	if !ex.cache.part {
		return true
	}
	tab := ex.c.region.Responses()
	e := &ex.cache.ent
	whole, ok := tab.CacheCopy(ex.cache.entryTk, nil)
	if !ok || !httpcache.Decode(whole, e) {
		tab.CacheEvict(ex.cache.entryTk)
		return false
	}
	ex.cache.buf, ex.cache.part = whole, false
	return true
}

// found decodes what a lookup found into ex.cent, keeping the buffer; an
// entry that does not decode is evicted and is no entry. An entry copied
// in part has its head decoded (ex.cache.part).
func (ex *Exchange) found(f shm.CacheFind) shm.CacheFind {
	if f.Data == nil {
		return f
	}
	ex.cache.buf, ex.cache.entryTk = f.Data, f.Entry
	ex.cache.part = len(f.Data) < f.Size
	var ok bool
	if ex.cache.part {
		ok = httpcache.DecodeHead(f.Data, f.Size, &ex.cache.ent)
	} else {
		ok = httpcache.Decode(f.Data, &ex.cache.ent)
	}
	if !ok {
		ex.c.region.Responses().CacheEvict(f.Entry)
		ex.c.row.Add(metrics.CachePurged, 0, 1)
		f.Data = nil
	}
	return f
}

// What an entry found is good for.
const (
	stAbsent     = iota // none, or purged
	stFresh             // serve it
	stRevalidate        // stale within stale-while-revalidate: serve it, refresh it
	stIfError           // stale within stale-if-error: serve it only if a fetch fails
	stStale             // too stale to serve: fetched again, conditionally if it has a validator
)

// judge says what the entry in ex.cent is good for at now, and its age. A
// purged entry (a generation it recorded moved on) is dropped.
func (ex *Exchange) judge(now time.Duration) (state int, age time.Duration) {
	e := &ex.cache.ent
	// Stored before the block (re)appeared: unsafe requests may have
	// changed it unseen (Cache.Since).
	if e.Stored < ex.cache.blk.since || !ex.gensCurrent(e) {
		ex.c.region.Responses().CacheEvict(ex.cache.entryTk)
		ex.c.row.Add(metrics.CachePurged, 0, 1)
		return stAbsent, 0
	}
	age = max(e.Age+now-e.Stored, 0)
	// The block's ttl caps the freshness and each stale window as they
	// are judged, not only as they were stored: a reload that lowers it
	// applies to the entries stored under the higher one.
	ttl := ex.cache.blk.ttl
	fresh := min(e.Fresh, ttl)
	switch {
	case age < fresh:
		return stFresh, age
	case age-fresh < min(e.SWR, ttl):
		return stRevalidate, age
	case age-fresh < min(e.SIE, ttl):
		return stIfError, age
	}
	return stStale, age
}

// gensCurrent reports whether every generation e recorded is current.
func (ex *Exchange) gensCurrent(e *httpcache.Entry) bool {
	tags := ex.c.region.Tags()
	for i := range e.NumGens() {
		if hash, gen := e.Gen(i); tags.Gen(hash) != gen {
			return false
		}
	}
	return true
}

// cachePass lets the request through to the application with X-Cache.
func (ex *Exchange) cachePass(x xcache) (Verdict, bool) {
	ex.cache.xc = x
	ex.cache.fieldsAt = len(ex.fields)
	ex.fields = append(ex.fields, Field{hdrXCache, xcacheValues[x]})
	return Pass, true
}

// serve answers with the entry in ex.cache.ent, of age age: 304 to a
// conditional request it satisfies (If-None-Match, else
// If-Modified-Since), else its status, fields and body (none to HEAD),
// with Age and X-Cache. Hidden fields are not sent.
func (ex *Exchange) serve(age time.Duration, x xcache) (Verdict, bool) {
	e := &ex.cache.ent
	ex.cache.xc = x
	status := e.Status
	notModified := status >= 200 && status < 300 && ex.notModified(e)
	if notModified {
		status = http.StatusNotModified
		ex.c.row.Add(metrics.CacheNotModified, 0, 1)
	}
	from, to, ranged := 0, e.BodySize, rangeWhole
	if status == http.StatusOK && ex.req.Method() == http.MethodGet {
		if from, to, ranged = ex.byteRange(e); ranged == rangePart {
			status = http.StatusPartialContent
		} else if ranged == rangeNone {
			status = http.StatusRequestedRangeNotSatisfiable
		}
	}
	_, hasETag := e.Get("Etag")
	for f := e.Fields; len(f) > 0; {
		var name string
		var value []byte
		var hidden bool
		name, value, hidden, f = httpcache.NextField(f)
		// The reset header is never sent: one an entry has was stored
		// before the reset header was configured (a reload, a restore).
		// A part or a 416 has the cache's Content-Range only: one the
		// application sent with its 200 means nothing there, and would
		// contradict it.
		if hidden || notModified && !in304(name, hasETag) || ranged == rangeNone && name != "Date" ||
			ex.c.isResetName(name) || ranged == rangePart && name == "Content-Range" {
			continue
		}
		ex.fields = append(ex.fields, Field{name, value})
	}
	if ranged != rangeWhole {
		n := e.BodySize
		ex.addField("Content-Range", func(b []byte) []byte {
			if ranged == rangeNone {
				b = append(b, "bytes */"...)
			} else {
				b = append(b, "bytes "...)
				b = strconv.AppendInt(b, int64(from), 10)
				b = append(b, '-')
				b = strconv.AppendInt(b, int64(to-1), 10)
				b = append(b, '/')
			}
			return strconv.AppendInt(b, int64(n), 10)
		})
	}
	ex.addField("Age", func(b []byte) []byte {
		return strconv.AppendInt(b, int64(min(age/time.Second, httpcache.MaxDelta)), 10)
	})
	ex.fields = append(ex.fields, Field{hdrXCache, xcacheValues[x]})
	var body []byte
	var stream BodyStream
	if !notModified && BodyAllowed(status) && ranged != rangeNone {
		if ranged == rangeWhole {
			from, to = 0, e.BodySize
		}
		n := to - from
		ex.addField(fieldLength, func(b []byte) []byte { return strconv.AppendInt(b, int64(n), 10) })
		switch {
		case ex.req.Method() == http.MethodHead:
		case ex.cache.part:
			// Counted as it goes (cacheStream.release): it may be cut.
			s, ok := ex.cache.stream.(*cacheStream)
			if !ok {
				// Not taken by the lookup (no path does so): taken now,
				// and cut if the entry changed.
				if s, ok = ex.copyEntry(); !ok {
					s.cut()
				}
			}
			s.at, s.end, s.n = e.BodyAt+from, e.BodyAt+from+n, n
			stream = s
		default:
			ex.c.row.Add(metrics.CacheSentBytes, 0, uint64(n))
			body = e.Body[from:to]
		}
	}
	ex.resp = Response{Status: status, Fields: ex.fields, Body: body, Stream: stream}
	return Respond, true
}

// in304 reports whether a stored field goes into a 304 (RFC 9110
// §15.4.5): the fields a 200 would have had that guide caches, and
// Last-Modified when there is no ETag.
func in304(name string, hasETag bool) bool {
	switch name {
	case "Cache-Control", "Content-Location", "Date", "Etag", "Expires", "Vary":
		return true
	case "Last-Modified":
		return !hasETag
	}
	return false
}

// notModified evaluates the request's If-None-Match against the entry's
// ETag, or, without it, If-Modified-Since against its Last-Modified (or
// Date) (RFC 9110 §13.2.2).
func (ex *Exchange) notModified(e *httpcache.Entry) bool {
	if inm := ex.req.HeaderLines("If-None-Match", ex.lines[:0]); len(inm) > 0 {
		etag, _ := e.Get("Etag") // "*" matches an entry without one too
		return httpcache.ETagMatch(inm, etag)
	}
	ims, n := ex.req.Header("If-Modified-Since")
	if n != 1 {
		return false
	}
	wall := ex.c.wall()
	since, ok := httpcache.ParseHTTPDate(ims, wall)
	if !ok {
		return false
	}
	lm, ok := e.Get("Last-Modified")
	if !ok {
		if lm, ok = e.Get("Date"); !ok {
			return false
		}
	}
	mod, ok := httpcache.ParseHTTPDate(lm, wall)
	return ok && !mod.After(since)
}

// fallback is the stored response that stale-if-error lets the cache
// serve (X-Cache: STALE) in place of a failure of the application: no
// response (the 502 or 504 the engine would answer), or a final status of
// 500, 502, 503 or 504 of which nothing was sent yet; nil for none.
func (ex *Exchange) fallback(status int) *Response {
	if ex.cache.flags&(cFill|cStale) != cFill|cStale {
		return nil
	}
	switch status {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
	default:
		return nil
	}
	state, age := ex.judge(ex.c.now())
	if state != stRevalidate && state != stIfError {
		return nil
	}
	ex.fields = ex.fields[:ex.cache.fieldsAt] // no X-Cache: MISS
	ex.serve(age, xStale)
	return &ex.resp
}

// matchCache returns the first cache block whose path covers the request,
// whatever its method.
func (ex *Exchange) matchCache() *cacheBlock {
	for _, b := range ex.c.caches {
		if b.route.Match(http.MethodGet, ex.match) || b.route.Match(http.MethodHead, ex.match) {
			return b
		}
	}
	return nil
}

// safeMethod reports whether a method is safe (RFC 9110 §9.2.1).
func safeMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// releaseCache ends the cache's part of an exchange: a fill lock never
// completed is given up, and the request is counted by its X-Cache.
func (ex *Exchange) releaseCache() {
	c := ex.c
	ex.releaseStream()
	if ex.cache.flags&cFill != 0 {
		c.region.Responses().CacheUnlock(ex.cache.lock)
	}
	switch ex.cache.xc {
	case xHit:
		c.row.Add(metrics.CacheRequests, metrics.CacheHit, 1)
	case xStale:
		c.row.Add(metrics.CacheRequests, metrics.CacheStale, 1)
	case xMiss:
		c.row.Add(metrics.CacheRequests, metrics.CacheMiss, 1)
	case xBypass:
		c.row.Add(metrics.CacheRequests, metrics.CacheBypass, 1)
	case xRevalidated:
		c.row.Add(metrics.CacheRequests, metrics.CacheRevalidated, 1)
	}
}

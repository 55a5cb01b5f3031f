package core

import (
	"bytes"
	"net/http"
	"net/textproto"
	"strings"
	"unsafe"

	"github.com/preforkd/preforkd/core/httpcache"
	"github.com/preforkd/preforkd/internal/httpfield"
)

// Revalidation (RFC 9111 §4.3): the fill of a stale entry with a
// validator asks the application whether it changed, and a 304 makes the
// stored response fresh again without its body being sent again.

// conditional makes the fill of a stale entry (in ex.cache.ent) a
// conditional request when the entry has a validator: its ETag in
// If-None-Match, its Last-Modified in If-Modified-Since (RFC 9111
// §4.3.1), sent instead of the client's own. A 304 then refreshes the
// entry (revalidated).
func (ex *Exchange) conditional() {
	e := &ex.cache.ent
	n := 0
	if etag, ok := e.Get("Etag"); ok && etag != "" {
		ex.cache.validators[n] = Field{"If-None-Match", unsafe.Slice(unsafe.StringData(etag), len(etag))}
		n++
	}
	if lm, ok := e.Get("Last-Modified"); ok && lm != "" {
		ex.cache.validators[n] = Field{"If-Modified-Since", unsafe.Slice(unsafe.StringData(lm), len(lm))}
		n++
	}
	if n > 0 {
		ex.cache.nval = n
		ex.cache.flags |= cRevalidate
	}
}

// cacheForward adds to f what the cache stage asks of the forwarded
// request and of its response: the block's own targeted field is not
// sent on; a fill leaves out the client's conditional and range fields,
// since what it stores must be whole, and a revalidation sends the
// entry's validators instead.
// It takes and returns f by value: a pointer handed to a stage's hook
// would move every request's Forward to the heap.
func (ex *Exchange) cacheForward(f Forward) Forward {
	f.Hide = ex.cache.blk.hide
	if ex.cache.flags&cFill == 0 {
		return f
	}
	f.Drop = unconditionalFields
	if ex.cache.flags&cRevalidate != 0 {
		// After the request id, if any (fwdAdd is a prefix of fwdAddBuf).
		f.Add = append(ex.fwdAddBuf[:len(f.Add)], ex.cache.validators[:ex.cache.nval]...)
	}
	return f
}

// unconditionalFields are what a cache fill leaves out of the request.
var unconditionalFields = []string{"If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since", "If-Range", "Range"}

// cacheHead is the cache's part of the application's response head: a
// successful unsafe request invalidates its URL; what to send instead is
// the stale entry a 304 to a revalidation refreshed, or for a 500, 502,
// 503 or 504 a stored response stale-if-error lets the cache serve. A
// fill whose response will not be stored ends here.
func (ex *Exchange) cacheHead(status int, h Header) *Response {
	ex.invalidateOnSuccess(status, h)
	if r := ex.revalidated(status, h); r != nil {
		return r
	}
	if status >= 500 {
		if fb := ex.fallback(status); fb != nil {
			ex.rec.Failed = true
			return fb
		}
	}
	if ex.cache.flags&cFill != 0 {
		ex.endFillAtHead(status, h)
	}
	return nil
}

// revalidated is what a 304 to a revalidation makes of the stale entry
// (RFC 9111 §4.3.4): the entry with the 304's fields in place of its
// own, fresh again, sent to the client (X-Cache: REVALIDATED, or a 304 to
// a client whose own condition it meets) and stored when the exchange
// completes; a 304 whose ETag is not the entry's serves the entry as it
// is, not refreshed. nil for any other response.
func (ex *Exchange) revalidated(status int, h Header) *Response {
	if status != http.StatusNotModified || ex.cache.flags&(cFill|cRevalidate) != cFill|cRevalidate {
		return nil
	}
	var got []httpcache.Field
	if h != nil {
		h.Each(func(name, value []byte) {
			if ex.c.isResetField(name) {
				return // the core's alone: never stored, never sent
			}
			got = append(got, httpcache.Field{Name: string(name), Value: bytes.Clone(value)})
		})
	}
	e := &ex.cache.ent
	// A 304 naming another ETag than the entry's must not update it
	// (RFC 9111 §4.3.4), but it still says the entry's own validator
	// matched (RFC 9110 §13.1.2): the entry is served as stored, and
	// left stale, so the next request validates again. Passing the 304
	// on would answer a client that asked no condition with no body.
	foreign := false
	if etag, ok := e.Get("Etag"); ok {
		sent, n := httpcache.Only(got, "Etag")
		foreign = n > 0 && !httpcache.SameTag(sent, etag)
	}
	now := ex.c.now()
	if !foreign {
		merged := ex.mergeFields(got)
		p, drop := ex.plan(e.Status, merged, e.Body, now)
		if p.data != nil {
			ex.cache.refreshed = p
			ex.cache.flags |= cRefreshed
			// The entry served is the new one; the old one's buffer
			// stays the exchange's.
			httpcache.Decode(p.data, &ex.cache.ent)
		} else {
			ex.cache.dropAfter = drop
		}
	}
	if ex.refreshing {
		// A background refresh: the stale response was sent, nothing
		// more is, and the request view is not the core's to read any
		// more (Finish): the engine may have reused its memory.
		ex.resp = Response{Status: ex.cache.ent.Status}
		return &ex.resp
	}
	age := max(ex.cache.ent.Age+now-ex.cache.ent.Stored, 0)
	ex.fields = ex.fields[:ex.cache.fieldsAt] // no X-Cache: MISS
	ex.serve(age, xRevalidated)
	// The 304's Set-Cookie is this client's (a session renewed): never
	// stored, always passed on.
	for _, f := range got {
		if strings.EqualFold(f.Name, "Set-Cookie") {
			ex.fields = append(ex.fields, Field{"Set-Cookie", f.Value})
		}
	}
	ex.resp.Fields = ex.fields
	return &ex.resp
}

// mergeFields is the stale entry's fields updated with those of a 304
// (RFC 9111 §3.2): every field the 304 has that a cache stores replaces
// the entry's of that name; the others stay. A 304 without a Date gets
// the time it arrived (plan adds it). Its Set-Cookie stays in, so that
// plan refuses to store the updated response, as it refuses a 200 with
// one (the entry is outdated by it); and its Age, which plan ages the
// refreshed entry by, as it ages a 200 (and never stores).
func (ex *Exchange) mergeFields(got []httpcache.Field) []httpcache.Field {
	var cb [8]string
	conn := httpcache.Lines(got, "Connection", cb[:0])
	fresh := got[:0:0]
	for _, f := range got {
		name := textproto.CanonicalMIMEHeaderKey(f.Name)
		if unstored(name) && name != "Set-Cookie" && name != "Age" || ex.coreField(name) || httpfield.HasToken(conn, name) {
			continue
		}
		fresh = append(fresh, httpcache.Field{Name: name, Value: f.Value})
	}
	dated := httpcache.Has(fresh, "Date")
	var merged []httpcache.Field
	for f := ex.cache.ent.Fields; len(f) > 0; {
		var name string
		var value []byte
		name, value, _, f = httpcache.NextField(f)
		if httpcache.Has(fresh, name) || name == "Date" && !dated {
			continue
		}
		merged = append(merged, httpcache.Field{Name: name, Value: value})
	}
	return append(merged, fresh...)
}

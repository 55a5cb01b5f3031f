package core

import (
	"strings"

	"github.com/preforkd/preforkd/core/httpcache"
)

// Byte ranges (RFC 9110 §14) of a stored whole response.

// What a Range field asks of a stored response.
const (
	rangeWhole = iota // no (usable) Range: the whole response
	rangePart         // one satisfiable byte range
	rangeNone         // a byte range the response does not have: 416
)

// byteRange reads the request's Range against the stored 200 e (RFC 9110
// §14.2): one byte range (first-last, first-, or -suffix) is served as a
// 206 of body[from:to]; one past the end is a 416. Anything else — no
// Range, another unit, several ranges, a syntax error, an If-Range the
// entry does not match (a strong ETag, or its Last-Modified date) — is
// answered with the whole response, as a server may.
func (ex *Exchange) byteRange(e *httpcache.Entry) (from, to, kind int) {
	spec, n := ex.req.Header("Range")
	if n != 1 {
		return 0, 0, rangeWhole
	}
	if ir, n := ex.req.Header("If-Range"); n > 0 {
		if n != 1 || !ifRangeMatches(e, ir) {
			return 0, 0, rangeWhole
		}
	}
	first, last, suffix, ok := httpcache.ParseByteRange(spec)
	size := int64(e.BodySize)
	switch {
	case !ok:
		return 0, 0, rangeWhole
	case suffix:
		if last == 0 || size == 0 {
			return 0, 0, rangeNone
		}
		return int(size - min(last, size)), int(size), rangePart
	case first >= size:
		return 0, 0, rangeNone
	}
	return int(first), int(min(last, size-1) + 1), rangePart
}

// ifRangeMatches reports whether If-Range lets a range of e be served: a
// strong entity-tag equal to e's (strong) ETag, or an HTTP-date equal to
// its Last-Modified (RFC 9110 §13.1.5).
func ifRangeMatches(e *httpcache.Entry, ir string) bool {
	if strings.HasPrefix(ir, "W/") {
		return false
	}
	if strings.HasPrefix(ir, `"`) {
		etag, ok := e.Get("Etag")
		return ok && !strings.HasPrefix(etag, "W/") && etag == ir
	}
	lm, ok := e.Get("Last-Modified")
	return ok && lm == ir
}

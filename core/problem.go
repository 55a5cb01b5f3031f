package core

import (
	"net/http"
	"strconv"

	"github.com/preforkd/preforkd/internal/jsonstring"
)

// Problem is an RFC 9457 problem+json answer: every answer of preforkd's
// own (a refusal, an idempotency problem, a bad request, a failed upstream)
// is one, written by this one function, so that they all look alike.
// Detail says what the client can act on, never anything about internals.
type Problem struct {
	Status int
	// Type is a URI; "" means "about:blank" (the status says it all).
	Type string
	// Title is a short summary; "" means the status text.
	Title  string
	Detail string
	// DetailText, when not nil, is the detail instead of Detail.
	DetailText []byte
	// RetryAfter, in whole seconds, is sent as Retry-After when positive.
	RetryAfter int64
	// Extra is appended to the JSON object as it is: more members, each
	// starting with a comma (`,"violated-policies":["login"]`).
	Extra []byte
	// RequestID, when not nil, is sent as the "request_id" member: the
	// request's id (Options.RequestID), so that a client reporting the
	// problem can name the request.
	RequestID []byte
}

// Problem header field names.
const (
	fieldContentType  = "Content-Type"
	fieldCacheControl = "Cache-Control"
	fieldNoSniff      = "X-Content-Type-Options"
	fieldRetryAfter   = "Retry-After"
	fieldLength       = "Content-Length"
)

// StatusText is the text of a status, as a problem's title and the
// reason phrase of a status line the engines write themselves:
// http.StatusText, but with RFC 9110's names where Go keeps RFC 2616's
// (413 is Content Too Large, §15.5.14; 422 Unprocessable Content,
// §15.5.21).
func StatusText(code int) string {
	switch code {
	case http.StatusRequestEntityTooLarge:
		return "Content Too Large"
	case http.StatusUnprocessableEntity:
		return "Unprocessable Content"
	}
	return http.StatusText(code)
}

// AppendJSON appends the problem's JSON body (with a final newline).
func (p *Problem) AppendJSON(dst []byte) []byte {
	typ, title := p.Type, p.Title
	if typ == "" {
		typ = "about:blank"
	}
	if title == "" {
		title = StatusText(p.Status)
	}
	dst = append(dst, `{"type":`...)
	dst = jsonstring.Append(dst, typ, jsonstring.Replace)
	dst = append(dst, `,"title":`...)
	dst = jsonstring.Append(dst, title, jsonstring.Replace)
	dst = append(dst, `,"status":`...)
	dst = strconv.AppendInt(dst, int64(p.Status), 10)
	dst = append(dst, `,"detail":`...)
	if p.DetailText != nil {
		dst = jsonstring.Append(dst, p.DetailText, jsonstring.Replace)
	} else {
		dst = jsonstring.Append(dst, p.Detail, jsonstring.Replace)
	}
	if p.RequestID != nil {
		dst = append(dst, `,"request_id":`...)
		dst = jsonstring.Append(dst, p.RequestID, jsonstring.Replace)
	}
	dst = append(dst, p.Extra...)
	return append(dst, "}\n"...)
}

// ProblemFields appends the header fields of a problem answer whose body
// has n bytes: Content-Type application/problem+json, Cache-Control
// no-store (no cache may answer a retry with it), nosniff, Retry-After
// when positive, Content-Length. The values of the fields that vary are
// appended to buf, which the returned fields alias.
func ProblemFields(fields []Field, buf []byte, retryAfter int64, n int) ([]Field, []byte) {
	fields = append(fields,
		Field{fieldContentType, valProblemJSON},
		Field{fieldCacheControl, valNoStore},
		Field{fieldNoSniff, valNoSniff})
	if retryAfter > 0 {
		from := len(buf)
		buf = strconv.AppendInt(buf, retryAfter, 10)
		fields = append(fields, Field{fieldRetryAfter, buf[from:len(buf):len(buf)]})
	}
	from := len(buf)
	buf = strconv.AppendInt(buf, int64(n), 10)
	fields = append(fields, Field{fieldLength, buf[from:len(buf):len(buf)]})
	return fields, buf
}

var (
	valProblemJSON = []byte("application/problem+json")
	valNoStore     = []byte("no-store")
	valNoSniff     = []byte("nosniff")
)

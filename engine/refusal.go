package engine

import "bytes"

// BadRequest is why a request cannot be served, before anything is
// forwarded: the status and the problem detail of the answer, and
// CloseConn when the connection must close after the answer: the
// request's framing cannot be trusted (RFC 9112 §6.3), or it may not have
// been read when the fault was found, so that what follows the head may
// be its body and must never be taken for a request. The engines refuse
// with the values below, so that a client gets the same answer from each.
type BadRequest struct {
	Status    int
	Detail    string
	CloseConn bool
}

func (b *BadRequest) Error() string { return "engine: " + b.Detail }

// Timeout reports whether the refusal is a client's time running out
// (408): the core tells a body that timed out from one it cannot read.
func (b *BadRequest) Timeout() bool { return b.Status == 408 }

// The refusals of a request. An engine that lets its HTTP library read
// heads meets only some: the library refuses the others its own way.
var (
	ErrObsFold     = &BadRequest{400, "obsolete line folding in the header section", true}
	ErrCLTE        = &BadRequest{400, "both Content-Length and Transfer-Encoding", true}
	ErrNoColon     = &BadRequest{400, "a header line without a colon", true}
	ErrName        = &BadRequest{400, "a header field name that is not a token", true}
	ErrValue       = &BadRequest{400, "a control character in a header field value", true}
	ErrBareLF      = &BadRequest{400, "a header line ended by a bare LF", true}
	ErrLine        = &BadRequest{400, "a malformed request line", true}
	ErrTarget      = &BadRequest{400, "the request target is not an absolute path", true}
	ErrNoHost      = &BadRequest{400, "an HTTP/1.1 request without Host", true}
	ErrPRI         = &BadRequest{400, "PRI is the HTTP/2 connection preface, not a request", true}
	ErrConnect     = &BadRequest{405, "CONNECT is not supported", true}
	ErrVersion     = &BadRequest{505, "only HTTP/1.0 and HTTP/1.1 are supported", true}
	ErrLength      = &BadRequest{400, "a malformed Content-Length", true}
	ErrTwoLengths  = &BadRequest{400, "more than one Content-Length", true}
	ErrEncoding    = &BadRequest{400, "a Transfer-Encoding whose last coding is not chunked", true}
	ErrCoding      = &BadRequest{501, "a transfer coding other than chunked", true}
	ErrEncoding10  = &BadRequest{400, "Transfer-Encoding in an HTTP/1.0 request", true}
	ErrTwoHosts    = &BadRequest{400, "more than one Host", true}
	ErrTooLarge    = &BadRequest{431, "the request header section is too large", true}
	ErrHeadTimeout = &BadRequest{408, "the request header did not arrive in time", true}
	ErrBodyTimeout = &BadRequest{408, "the request body did not arrive in time", true}
	ErrBodyEnded   = &BadRequest{400, "the request body ended early", true}
	ErrBadChunk    = &BadRequest{400, "malformed chunked request body", true}
	ErrBodyTooLong = &BadRequest{413, "the request body is too large", true}
	ErrUpgradeBody = &BadRequest{400, "an upgrade request with a long body", true}
)

// BadRequest is the refusal of a header line at fault f; nil for FieldOK.
func (f FieldFault) BadRequest() *BadRequest {
	switch f {
	case FaultObsFold:
		return ErrObsFold
	case FaultNoColon:
		return ErrNoColon
	case FaultName:
		return ErrName
	case FaultValueCtrl:
		return ErrValue
	}
	return nil
}

// Framing decides a request's body framing from its Content-Length and
// Transfer-Encoding field lines, as every engine that reads heads must
// (RFC 9112 §6): a request it cannot frame is refused, never guessed at,
// since a guess that differs from the upstream's is request smuggling.
// Each engine feeds it the lines as it meets them, then asks Problem.
type Framing struct {
	length   bool // a Content-Length line
	encoding bool // a Transfer-Encoding line
	chunked  bool // the Transfer-Encoding lines so far end in chunked, once
}

// Encoding reads one Transfer-Encoding field line: chunked is the one
// coding known here (RFC 9112 §6.1), and it must be the last, once. A
// line after the one that said chunked ("chunked" then "identity") makes
// the length unknowable, and so does an empty element ("chunked,"),
// which fasthttp, net/http and nginx refuse.
func (f *Framing) Encoding(v []byte) *BadRequest {
	f.encoding = true
	n, lastChunked := 0, false
	EachToken(v, func(t []byte) {
		n++
		lastChunked = EqualFold(t, "chunked")
	})
	switch {
	case n == 0, f.chunked, !lastChunked, hasEmptyElement(v):
		return ErrEncoding // the body's length cannot be known
	case n > 1:
		return ErrCoding // another coding under chunked
	}
	f.chunked = true
	return nil
}

// Length notes a Content-Length field line.
func (f *Framing) Length() { f.length = true }

// Chunked reports whether the body is chunked (once Problem is nil).
func (f *Framing) Chunked() bool { return f.chunked }

// Problem is the refusal of the request's framing once its header section
// is read, http10 telling an HTTP/1.0 request; nil when it can be framed.
func (f *Framing) Problem(http10 bool) *BadRequest {
	switch {
	case f.length && f.encoding:
		return ErrCLTE
	case f.encoding && http10:
		return ErrEncoding10
	case f.encoding && !f.chunked:
		return ErrEncoding
	}
	return nil
}

// hasEmptyElement reports whether the comma-separated list v has an
// element that is empty or blank.
func hasEmptyElement(v []byte) bool {
	for {
		var t []byte
		i := bytes.IndexByte(v, ',')
		if i < 0 {
			t = v
		} else {
			t, v = v[:i], v[i+1:]
		}
		if len(bytes.Trim(t, " \t")) == 0 {
			return true
		}
		if i < 0 {
			return false
		}
	}
}

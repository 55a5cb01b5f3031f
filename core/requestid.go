package core

import (
	"fmt"
	"math/rand/v2"
	"net/textproto"
)

// The request id: one value per request, kept from the client when it is
// well formed, else made here, that the application gets, the client gets
// back, and every line written about the request carries (the access log,
// a refusal's log line, a problem+json body), so that one request can be
// followed from the client through preforkd to the application.

// MaxRequestIDLen is the longest request id kept from a client; a longer
// one is replaced.
const MaxRequestIDLen = 128

// CheckRequestID reports whether name may be Options.RequestID: a header
// field name, or "" (off).
func CheckRequestID(name string) error {
	_, err := checkRequestIDName(name)
	return err
}

// checkRequestIDName refuses a header name that is no token, and returns
// it in canonical form ("x-request-id": "X-Request-Id").
func checkRequestIDName(name string) (string, error) {
	if name == "" {
		return "", nil
	}
	for i := 0; i < len(name); i++ {
		if !isTokenByte(name[i]) {
			return "", fmt.Errorf("core: RequestID %q is not a header field name (a token: letters, digits, -)", name)
		}
	}
	return textproto.CanonicalMIMEHeaderKey(name), nil
}

func isTokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// wellFormedID reports whether a client's request id is kept: 1 to
// MaxRequestIDLen visible ASCII characters (RFC 9110 VCHAR), nothing a log
// line or a header could be split on.
func wellFormedID(v string) bool {
	if len(v) == 0 || len(v) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// appendNewID appends a new request id: 32 lowercase hex digits (128
// random bits, as nginx's $request_id), from the process's ChaCha8
// generator, which is seeded at random and needs no system call.
func appendNewID(dst []byte) []byte {
	const hex = "0123456789abcdef"
	for _, w := range [2]uint64{rand.Uint64(), rand.Uint64()} {
		for i := 60; i >= 0; i -= 4 {
			dst = append(dst, hex[(w>>uint(i))&0xf])
		}
	}
	return dst
}

// takeRequestID settles the request's id, once, before any stage can
// answer: the client's, when it sent exactly one well-formed value (it
// is then forwarded as sent), else a new one, which replaces whatever the
// client sent on the way to the application. Either way the response
// carries it (Fields, and every Response the core makes).
func (ex *Exchange) takeRequestID() {
	name := ex.c.ridName
	if name == "" || ex.rid != nil {
		return
	}
	if v, n := ex.req.Header(name); n == 1 && wellFormedID(v) {
		ex.rid = append(ex.ridBuf[:0], v...)
	} else {
		ex.rid = appendNewID(ex.ridBuf[:0])
		ex.fwdAddBuf[0] = Field{name, ex.rid}
		ex.fwdAdd = ex.fwdAddBuf[:1]
	}
	ex.fields = append(ex.fields, Field{name, ex.rid})
}

// RequestID is the request's id (Options.RequestID), or nil when ids are
// off or Decide has not run yet. It aliases the exchange's memory: valid
// until Finish ends the exchange.
func (ex *Exchange) RequestID() []byte { return ex.rid }

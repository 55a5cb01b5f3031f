package clientip

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
	"unsafe"

	"github.com/preforkd/preforkd/internal/textvalue"
)

// ErrBy is wrapped by every error ParseBy returns.
var ErrBy = errors.New("clientip: invalid by")

// MaxKeyValue is the longest value a key holds as it is; a longer value (a
// JWT in Authorization) is replaced by its SHA-256, so that a key stays
// short and two long values never share one.
const MaxKeyValue = 256

// By is a parsed `by` expression: what a rule counts a request under. The
// zero By is "ip".
type By struct {
	global bool
	elems  []elem // tried in order before ip
}

// elem is one element of a chain before its final ip.
type elem struct {
	kind elemSource
	name string // header: canonical; cookie and query: as written
}

type elemSource uint8

const (
	fromHeader elemSource = iota
	fromCookie
	fromQuery
	fromPath
	fromFunc // an application's key function (AppendFuncKey): no name
)

// keyPrefix and hashedPrefix start the key of each kind of element, for a
// value kept as it is and a hashed one.
var (
	keyPrefix    = [...]string{fromHeader: "h:", fromCookie: "c:", fromQuery: "q:", fromPath: "p:", fromFunc: "f:"}
	hashedPrefix = [...]string{fromHeader: "H:", fromCookie: "C:", fromQuery: "Q:", fromPath: "P:", fromFunc: "F:"}
	elemWord     = [...]string{fromHeader: "header", fromCookie: "cookie", fromQuery: "query", fromPath: "path", fromFunc: "function"}
)

// ParseBy parses a `by` expression: "ip", "global", or a chain of elements
// that ends in ip, written or not: "header:NAME", "cookie:NAME",
// "query:NAME" and "path" ("header:X-Api-Key|cookie:session|ip"). The
// first element present in a request is its key. "global" is only valid
// alone; ip only last; "path" (always present) only last before ip; an
// element only once. A header NAME is an RFC 9110 token, matched
// case-insensitively; cookie and query names are tokens too, matched
// exactly. No spaces are allowed anywhere.
func ParseBy(s string) (By, error) {
	switch s {
	case "global":
		return By{global: true}, nil
	case "":
		return By{}, byError(s, "empty")
	}
	var b By
	rest := s
	for {
		text, tail, more := strings.Cut(rest, "|")
		rest = tail
		if n := len(b.elems); n > 0 && b.elems[n-1].kind == fromPath && text != "ip" {
			return By{}, byError(s, `nothing after "path" is ever used: path is in every request`)
		}
		var e elem
		switch {
		case text == "ip":
			if more {
				return By{}, byError(s, "ip must be the last element")
			}
			return b, nil
		case text == "global":
			return By{}, byError(s, `"global" must stand alone`)
		case text == "path":
			e.kind = fromPath
		case text == "":
			return By{}, byError(s, "empty element")
		default:
			word, name, ok := strings.Cut(text, ":")
			switch {
			case ok && word == "header":
				e.kind = fromHeader
			case ok && word == "cookie":
				e.kind = fromCookie
			case ok && word == "query":
				e.kind = fromQuery
			default:
				return By{}, byError(s, fmt.Sprintf("unknown element %q (want ip, global, path, header:NAME, cookie:NAME or query:NAME)", text))
			}
			if name == "" {
				return By{}, byError(s, "empty "+word+" name")
			}
			for i := 0; i < len(name); i++ {
				if !isTchar(name[i]) {
					return By{}, byError(s, fmt.Sprintf("%s name %q is not a token", word, name))
				}
			}
			if e.kind == fromHeader {
				name = textproto.CanonicalMIMEHeaderKey(name)
			}
			e.name = name
		}
		for _, seen := range b.elems {
			if seen == e {
				return By{}, byError(s, fmt.Sprintf("%s repeated", e))
			}
		}
		b.elems = append(b.elems, e)
		if !more {
			return b, nil
		}
	}
}

// MustParseBy is ParseBy for a key known when the program is written: it
// panics if s does not parse.
func MustParseBy(s string) By {
	b, err := ParseBy(s)
	if err != nil {
		panic(err)
	}
	return b
}

func byError(s, why string) error {
	return fmt.Errorf("%w %q: %s", ErrBy, s, why)
}

func (e elem) String() string {
	if e.kind == fromPath {
		return "path"
	}
	return elemWord[e.kind] + ":" + e.name
}

// String returns the canonical form: "global", "ip", or the chain with
// canonical header names and an explicit trailing ip
// ("header:X-Api-Key|ip"). ParseBy(b.String()) returns an equal By.
func (b By) String() string {
	if b.global {
		return "global"
	}
	var sb strings.Builder
	for _, e := range b.elems {
		sb.WriteString(e.String())
		sb.WriteByte('|')
	}
	sb.WriteString("ip")
	return sb.String()
}

// UnmarshalText parses a `by` expression (ParseBy), so that a By is a
// configuration value.
func (b *By) UnmarshalText(text []byte) error { return textvalue.Unmarshal(text, b, ParseBy) }

// MarshalText returns the canonical form (String).
func (b By) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// Source is what a request offers a By to make its key of. Any HTTP
// engine can provide one.
type Source interface {
	// Header returns the value of the first field line called name
	// (canonical form) and how many field lines have that name.
	Header(name string) (first string, lines int)
	// Cookie returns the value of the first cookie called name in the
	// request's Cookie header lines (quotes removed), and whether there
	// is one.
	Cookie(name string) (value string, ok bool)
	// Query returns the value of the query parameter called name,
	// percent-decoded, and how many times the query has it.
	Query(name string) (value string, n int)
	// Path is the request path as rules match it (normalized).
	Path() string
	// ClientKey is the client address as a rule counts it
	// (Resolver.Mask of Resolver.ClientOf); the zero Addr for none.
	ClientKey() netip.Addr
}

// RepeatedError means what a key is made of was sent more than once (a
// header, a query parameter): the request could be charged under one value
// and served as the other, so it is refused (400) rather than guessed at.
type RepeatedError struct {
	// What names it: "the X-Api-Key header", "the api_key query parameter".
	What string
}

func (e *RepeatedError) Error() string {
	return "clientip: " + e.What + " was sent more than once"
}

// AppendKeyOf appends the key a request is counted under to dst and
// returns the extended slice; it does not allocate when dst has room.
func (b By) AppendKeyOf(dst []byte, src Source) ([]byte, error) {
	dst, _, err := appendKeyOf(b, dst, src)
	return dst, err
}

// AppendKeyValue is AppendKeyOf that also returns the value the key was
// made of (before any hashing): a header, cookie or query value, or the
// path; "" for ip and global. Overrides match on it.
//
// The key is "g" for global. For the first element of the chain present
// in the request with a usable value (non-empty, no control bytes), it is
// the element's prefix ("h:" header, "c:" cookie, "q:" query, "p:" path),
// its name and ':' (not for path), and the value, or, for a value longer
// than MaxKeyValue, the upper-case prefix and the value's SHA-256 in
// base64url: a long value is never dropped for the next element, and two
// long values never share a key. Otherwise it is "ip:" and the client key
// address ("ip:" alone when there is none). Names are tokens without ':',
// and each element has its own prefix, so keys from different elements,
// or a short value and a long one, never collide.
//
// A header or query parameter of the chain that is reached and sent more
// than once is a *RepeatedError. Of two cookies with one name (a browser
// sends the one of the most specific path first) the first counts, as
// most applications read it.
func (b By) AppendKeyValue(dst []byte, src Source) ([]byte, string, error) {
	return appendKeyOf(b, dst, src)
}

// appendKeyOf is AppendKeyValue for any Source type, so that a caller with
// a concrete type does not make it escape through the interface.
func appendKeyOf[S Source](b By, dst []byte, src S) ([]byte, string, error) {
	if b.global {
		return append(dst, 'g'), "", nil
	}
	for _, e := range b.elems {
		var v string
		switch e.kind {
		case fromHeader:
			var n int
			if v, n = src.Header(e.name); n > 1 {
				return dst, "", &RepeatedError{What: "the " + e.name + " header"}
			}
		case fromCookie:
			v, _ = src.Cookie(e.name)
		case fromQuery:
			var n int
			if v, n = src.Query(e.name); n > 1 {
				return dst, "", &RepeatedError{What: "the " + e.name + " query parameter"}
			}
		case fromPath:
			v = src.Path()
		}
		if usable(v) {
			return appendElemKey(dst, e, v), v, nil
		}
	}
	dst = append(dst, "ip:"...)
	return src.ClientKey().AppendTo(dst), "", nil
}

// AppendKey is AppendKeyOf for a net/http request: remoteAddr and h are its
// RemoteAddr and Header. A repeated header or query parameter counts as
// its first here, and "path" is the URL's path as it is; request paths
// that must refuse repeats and normalize use AppendKeyOf.
func (b By) AppendKey(dst []byte, r *Resolver, remoteAddr string, h http.Header) []byte {
	out, _, err := appendKeyOf(b, dst, httpSource{r, remoteAddr, h, "", true})
	if err != nil {
		panic("clientip: AppendKey saw a repeat") // httpSource reports one
	}
	return out
}

// httpSource is a Source over a net/http request's parts.
type httpSource struct {
	r          *Resolver
	remoteAddr string
	h          http.Header
	target     string // the request URI ("/path?query"); "" for none
	firstOnly  bool   // report at most one of a header or parameter
}

func (s httpSource) Header(name string) (string, int) {
	vs := s.h[name]
	if len(vs) == 0 {
		return "", 0
	}
	if s.firstOnly {
		return vs[0], 1
	}
	return vs[0], len(vs)
}

func (s httpSource) Cookie(name string) (string, bool) {
	return CookieValue(s.h["Cookie"], name)
}

func (s httpSource) Query(name string) (string, int) {
	_, q, _ := strings.Cut(s.target, "?")
	v, n := QueryValue(q, name, nil)
	if s.firstOnly {
		n = min(n, 1)
	}
	return string(v), n
}

func (s httpSource) Path() string {
	p, _, _ := strings.Cut(s.target, "?")
	return p
}

func (s httpSource) ClientKey() netip.Addr { return s.r.Key(s.remoteAddr, s.h) }

// NewHTTPSource returns the Source of a net/http request, for AppendKeyOf;
// target is its RequestURI (for query: and path elements).
func NewHTTPSource(r *Resolver, remoteAddr string, h http.Header, target string) Source {
	return httpSource{r: r, remoteAddr: remoteAddr, h: h, target: target}
}

// appendElemKey appends the key of element e with the usable value v.
func appendElemKey(dst []byte, e elem, v string) []byte {
	long := len(v) > MaxKeyValue
	if long {
		dst = append(dst, hashedPrefix[e.kind]...)
	} else {
		dst = append(dst, keyPrefix[e.kind]...)
	}
	if e.kind != fromPath && e.kind != fromFunc {
		dst = append(dst, e.name...)
		dst = append(dst, ':')
	}
	if !long {
		return append(dst, v...)
	}
	// Sum256 neither keeps nor modifies its input: viewing v's bytes in
	// place saves copying a long value.
	sum := sha256.Sum256(unsafe.Slice(unsafe.StringData(v), len(v)))
	return base64.RawURLEncoding.AppendEncode(dst, sum[:])
}

// AppendFuncKey appends the key of v, a value an application's key
// function gave (an authenticated user, say): "f:" and v, or, for a v
// longer than MaxKeyValue, "F:" and its SHA-256, as for the values of a
// By's elements; ok is false for a value no key can be made of (empty,
// or with control bytes), which the caller replaces by its By's key.
func AppendFuncKey(dst []byte, v string) (_ []byte, ok bool) {
	if !usable(v) {
		return dst, false
	}
	return appendElemKey(dst, elem{kind: fromFunc}, v), true
}

// usable reports whether a key can be made of a header value:
// non-empty, without control bytes.
func usable(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] == 0x7f {
			return false
		}
	}
	return true
}

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
)

// ErrBy is wrapped by every error ParseBy returns.
var ErrBy = errors.New("clientip: invalid by")

// MaxKeyValue is the longest header value a header: key holds as it is; a
// longer value (a JWT in Authorization) is replaced by its SHA-256, so that
// a key stays short and two long values never share one.
const MaxKeyValue = 256

// By is a parsed `by` expression: what a rule counts a request under. The
// zero By is "ip".
type By struct {
	global  bool
	headers []string // canonical header names tried in order before ip
}

// ParseBy parses a `by` expression: "ip", "global", "header:NAME", or a chain
// of header:NAME elements optionally ending in "ip" ("header:X-Api-Key|ip").
// A chain always ends in ip, written or not. "global" is only valid alone; ip
// only last; a header only once. NAME is an RFC 9110 token, matched
// case-insensitively. No spaces are allowed anywhere.
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
		elem, tail, more := strings.Cut(rest, "|")
		rest = tail
		switch {
		case elem == "ip":
			if more {
				return By{}, byError(s, "ip must be the last element")
			}
			return b, nil
		case elem == "global":
			return By{}, byError(s, `"global" must stand alone`)
		case strings.HasPrefix(elem, "header:"):
			name := elem[len("header:"):]
			if name == "" {
				return By{}, byError(s, "empty header name")
			}
			for i := 0; i < len(name); i++ {
				if !isTchar(name[i]) {
					return By{}, byError(s, fmt.Sprintf("header name %q is not a token", name))
				}
			}
			name = textproto.CanonicalMIMEHeaderKey(name)
			for _, seen := range b.headers {
				if seen == name {
					return By{}, byError(s, fmt.Sprintf("header %s repeated", name))
				}
			}
			b.headers = append(b.headers, name)
		case elem == "":
			return By{}, byError(s, "empty element")
		default:
			return By{}, byError(s, fmt.Sprintf("unknown element %q (want ip, global or header:NAME)", elem))
		}
		if !more {
			return b, nil
		}
	}
}

func byError(s, why string) error {
	return fmt.Errorf("%w %q: %s", ErrBy, s, why)
}

// String returns the canonical form: "global", "ip", or the header chain with
// canonical names and an explicit trailing ip ("header:X-Api-Key|ip").
// ParseBy(b.String()) returns an equal By.
func (b By) String() string {
	if b.global {
		return "global"
	}
	var sb strings.Builder
	for _, name := range b.headers {
		sb.WriteString("header:")
		sb.WriteString(name)
		sb.WriteByte('|')
	}
	sb.WriteString("ip")
	return sb.String()
}

// Source is what a request offers a By to make its key of: its header
// fields and its client. Any HTTP engine can provide one.
type Source interface {
	// Header returns the value of the first field line called name
	// (canonical form) and how many field lines have that name.
	Header(name string) (first string, lines int)
	// ClientKey is the client address as a rule counts it
	// (Resolver.Mask of Resolver.ClientOf); the zero Addr for none.
	ClientKey() netip.Addr
}

// RepeatedError means a header a key is made of was sent more than once:
// the request could be charged under one value and served as the other,
// so it is refused (400) rather than guessed at.
type RepeatedError struct{ Header string }

func (e *RepeatedError) Error() string {
	return "clientip: the " + e.Header + " header was sent more than once"
}

// AppendKeyOf appends the key a request is counted under to dst and
// returns the extended slice; it does not allocate when dst has room. The
// key is "g" for global; for the first header of the chain that is present
// with a usable value (non-empty, no control bytes), "h:NAME:value", or
// "H:NAME:digest" when the value is longer than MaxKeyValue (digest: its
// SHA-256 in base64url, so a long value is never dropped for the next
// element, and two long values never share a key); NAME canonical.
// Otherwise "ip:" and the client key address ("ip:" alone when there is
// none). Header names are tokens without ':', and each element has its own
// prefix, so keys from different elements, or a short value and a long
// one, never collide.
//
// A header of the chain that is reached and sent more than once is a
// *RepeatedError.
func (b By) AppendKeyOf(dst []byte, src Source) ([]byte, error) {
	return appendKeyOf(b, dst, src)
}

// appendKeyOf is AppendKeyOf for any Source type, so that a caller with a
// concrete type does not make it escape through the interface.
func appendKeyOf[S Source](b By, dst []byte, src S) ([]byte, error) {
	if b.global {
		return append(dst, 'g'), nil
	}
	for _, name := range b.headers {
		v, lines := src.Header(name)
		if lines > 1 {
			return dst, &RepeatedError{Header: name}
		}
		if lines == 1 && usable(v) {
			return appendHeaderKey(dst, name, v), nil
		}
	}
	dst = append(dst, "ip:"...)
	return src.ClientKey().AppendTo(dst), nil
}

// AppendKey is AppendKeyOf for a net/http request: remoteAddr and h are its
// RemoteAddr and Header. A repeated header counts as its first line here;
// request paths that must refuse it use AppendKeyOf.
func (b By) AppendKey(dst []byte, r *Resolver, remoteAddr string, h http.Header) []byte {
	out, err := appendKeyOf(b, dst, httpSource{r, remoteAddr, h, true})
	if err != nil {
		panic("clientip: AppendKey saw a repeated header") // httpSource reports one line
	}
	return out
}

// httpSource is a Source over a net/http request.
type httpSource struct {
	r          *Resolver
	remoteAddr string
	h          http.Header
	firstOnly  bool // report at most one line of a header
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

func (s httpSource) ClientKey() netip.Addr { return s.r.Key(s.remoteAddr, s.h) }

// NewHTTPSource returns the Source of a net/http request, for AppendKeyOf.
func NewHTTPSource(r *Resolver, remoteAddr string, h http.Header) Source {
	return httpSource{r: r, remoteAddr: remoteAddr, h: h}
}

// appendHeaderKey appends the key of header name with the usable value v.
func appendHeaderKey(dst []byte, name, v string) []byte {
	if len(v) <= MaxKeyValue {
		dst = append(dst, "h:"...)
		dst = append(dst, name...)
		dst = append(dst, ':')
		return append(dst, v...)
	}
	dst = append(dst, "H:"...)
	dst = append(dst, name...)
	dst = append(dst, ':')
	// Sum256 neither keeps nor modifies its input: viewing v's bytes in
	// place saves copying a long value.
	sum := sha256.Sum256(unsafe.Slice(unsafe.StringData(v), len(v)))
	return base64.RawURLEncoding.AppendEncode(dst, sum[:])
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

package clientip

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/preforkd/preforkd/internal/httpfield"
)

// Resolver decides who the client of a request is. Its zero value believes no
// forwarding headers and keys IPv6 clients by their /64; a nil *Resolver
// behaves as the zero value. A Resolver must not be modified while in use.
type Resolver struct {
	// Trusted lists the proxies whose X-Forwarded-For / Forwarded headers are
	// believed. Nil or empty: none; the TCP peer is always the client.
	// IPv4-mapped IPv6 prefixes (::ffff:10.0.0.0/104) are treated as the IPv4
	// prefix they map.
	Trusted []netip.Prefix
	// IPv6Prefix is the prefix length IPv6 clients are truncated to in Key.
	// 0 means 64. Values outside 0..128 are rejected by Validate and treated
	// as 64.
	IPv6Prefix int
}

// Validate reports a configuration that Key and Client would otherwise
// silently work around: an IPv6Prefix outside 0..128 or an invalid (zero)
// prefix in Trusted.
func (r *Resolver) Validate() error {
	if r == nil {
		return nil
	}
	if r.IPv6Prefix < 0 || r.IPv6Prefix > 128 {
		return fmt.Errorf("clientip: IPv6Prefix %d out of range 0..128", r.IPv6Prefix)
	}
	for i, p := range r.Trusted {
		if !p.IsValid() {
			return fmt.Errorf("clientip: Trusted[%d] is not a valid prefix", i)
		}
	}
	return nil
}

// Client returns the client address of a request. remoteAddr is
// http.Request.RemoteAddr ("192.0.2.1:1234", "[2001:db8::1]:1234"). The
// headers are believed only when that TCP peer is inside Trusted; see the
// package documentation for the walk over them. The result has no zone and
// is never an IPv4-mapped IPv6 address. When remoteAddr does not parse (a
// Unix socket listener) the result is the zero Addr.
func (r *Resolver) Client(remoteAddr string, h http.Header) netip.Addr {
	peer, _ := parseNode(remoteAddr, false)
	return r.ClientOf(peer, h["X-Forwarded-For"], h["Forwarded"])
}

// Trusts reports whether the TCP peer is a trusted proxy, whose forwarding
// headers ClientOf reads: a caller can skip collecting them otherwise.
func (r *Resolver) Trusts(peer netip.Addr) bool {
	return r != nil && peer.IsValid() && r.trusts(peer)
}

// ClientOf is Client for any HTTP engine: peer is the TCP peer (unmapped,
// no zone; the zero Addr for none), xff and forwarded the field lines of
// X-Forwarded-For and Forwarded, in order. They are read only when peer
// is trusted.
//
// The walk: several lines of one header are one list, blank lines
// contributing nothing. Hops may carry a port ("192.0.2.1:80",
// "[2001:db8::1]:80", in Forwarded also an obfuscated "_port"); Forwarded
// values may be quoted with escapes, parameter names are case-insensitive.
// IPv4-mapped addresses become IPv4 and zones are dropped, in the peer,
// the hops and Trusted. From the right, trusted hops are skipped; the
// first untrusted one is the client; if every hop is trusted, the
// left-most is. A hop that names no usable address (garbage, "unknown",
// "_hidden", an empty element, a Forwarded element without for= or with
// two, a syntax error) stops the walk: the client is then the trusted hop
// just right of it, or the peer.
//
// Neither header is preferred: a trusted proxy that writes only one passes
// the other through from the client. When both list hops, they are
// aligned on the right and walked together, and a position where they
// name different addresses, or only the longer has a hop, is malformed; a
// client that forges the header its proxy does not write is counted under
// that proxy, shared with every other forger, never under a key of its
// choosing. A well-formed Forwarded header none of whose elements has
// for= says nothing about the client and is ignored; a malformed one is
// not (a client's unterminated quote may have swallowed what its proxy
// appended).
func (r *Resolver) ClientOf(peer netip.Addr, xff, forwarded []string) netip.Addr {
	if !r.Trusts(peer) {
		return peer
	}
	return r.walk(peer, hops{lines: xff}, hops{lines: forwarded, forwarded: true})
}

// walk finds the client among the hops of a trusted peer's headers.
func (r *Resolver) walk(peer netip.Addr, xff, fwd hops) netip.Addr {
	nf, speaks := fwd.count()
	if !speaks {
		// A well-formed Forwarded header that names nobody (only proto=,
		// host=, …) says nothing about the client; it neither counts nor
		// conflicts. A malformed one does count: a client's unterminated
		// quote may have swallowed what a trusted proxy appended.
		nf = 0
	}
	nx := 0
	if nf > 0 {
		nx, _ = xff.count()
	}

	var w walk
	switch {
	case nf == 0:
		for hp, more := xff.next(); more; hp, more = xff.next() {
			w.step(r, hp)
		}
	case nx == 0:
		for hp, more := fwd.next(); more; hp, more = fwd.next() {
			w.step(r, hp)
		}
	default:
		// Both headers name hops: align them on the right and walk them
		// together. A position where they disagree, or where only the
		// longer one has a hop, is malformed. The walk starts out without a
		// client, which is exactly the state a malformed hop leaves, so the
		// surplus on the left of the longer list can simply be skipped.
		for ; nx > nf; nx-- {
			xff.nextElement()
		}
		for ; nf > nx; nf-- {
			fwd.nextElement()
		}
		for {
			a, more := xff.next()
			b, _ := fwd.next()
			if !more {
				break
			}
			if a.ok && b.ok && a.addr == b.addr {
				w.step(r, a)
			} else {
				w.step(r, hop{})
			}
		}
	}
	if !w.client.IsValid() {
		return peer
	}
	return w.client
}

// Key returns the client address as a rule counts it: an IPv4 address as
// is, an IPv6 address masked to IPv6Prefix bits.
func (r *Resolver) Key(remoteAddr string, h http.Header) netip.Addr {
	return r.Mask(r.Client(remoteAddr, h))
}

// Mask returns a client address as a rule counts it (see Key).
func (r *Resolver) Mask(a netip.Addr) netip.Addr {
	if !a.Is6() {
		return a
	}
	p, err := a.Prefix(r.ipv6Bits())
	if err != nil {
		panic("clientip: masking a valid IPv6 address failed: " + err.Error()) // bits is in 1..128
	}
	return p.Addr()
}

func (r *Resolver) ipv6Bits() int {
	if r == nil || r.IPv6Prefix <= 0 || r.IPv6Prefix > 128 {
		return 64
	}
	return r.IPv6Prefix
}

// trusts reports whether a (unmapped, no zone) is inside Trusted.
func (r *Resolver) trusts(a netip.Addr) bool {
	for _, p := range r.Trusted {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// walk computes, in one pass from left to right, the answer of the walk
// from the right: client is what the walk would return if the list ended
// here, or the zero Addr for "none yet" (no hop, or a malformed hop last),
// in which case the trusted hop to its right, else the peer, is the client.
type walk struct {
	client netip.Addr
}

func (w *walk) step(r *Resolver, hp hop) {
	switch {
	case !hp.ok:
		w.client = netip.Addr{} // the walk from the right stops here
	case !r.trusts(hp.addr):
		w.client = hp.addr // the walk from the right stops here, at a client
	case !w.client.IsValid():
		w.client = hp.addr // left-most hop, or the trusted hop right of a malformed one
	}
}

// hop is one element of a forwarding header; ok is false when it does not
// name a usable address (garbage, "unknown", "_hidden", empty, no for=).
type hop struct {
	addr netip.Addr
	ok   bool
}

type elemKind uint8

const (
	elemMalformed elemKind = iota // syntax error, empty element, repeated for=
	elemNoFor                     // a well-formed Forwarded element without for=
	elemNode                      // node text to parse
)

// hops iterates over the elements of one forwarding header, its lines taken
// in order as one list. Blank lines contribute no elements; an empty element
// between commas is malformed. It never allocates.
type hops struct {
	lines     []string
	rest      string // unparsed remainder of the current line
	more      bool   // rest holds another element, perhaps an empty one
	forwarded bool   // RFC 7239 Forwarded rather than X-Forwarded-For
}

// count returns the number of elements, and whether any of them is other
// than a well-formed Forwarded element without for= (for X-Forwarded-For:
// whether there are any). It works on a copy.
func (it hops) count() (n int, speaks bool) {
	for {
		_, _, kind, more := it.nextElement()
		if !more {
			return n, speaks
		}
		n++
		speaks = speaks || kind != elemNoFor
	}
}

// next returns the next hop; more is false when the list is exhausted.
func (it *hops) next() (hp hop, more bool) {
	node, escaped, kind, more := it.nextElement()
	if !more || kind != elemNode {
		return hop{}, more
	}
	if escaped {
		var buf [64]byte
		n, ok := unescape(buf[:], node)
		if !ok {
			return hop{}, true
		}
		node = string(buf[:n])
	}
	hp.addr, hp.ok = parseNode(node, it.forwarded)
	return hp, true
}

// nextElement returns the next element: its node text (X-Forwarded-For: the
// element; Forwarded: the for= value, escaped reporting a quoted-string with
// backslash escapes still in it) and its kind.
func (it *hops) nextElement() (node string, escaped bool, kind elemKind, more bool) {
	for !it.more {
		if len(it.lines) == 0 {
			return "", false, elemMalformed, false
		}
		line := it.lines[0]
		it.lines = it.lines[1:]
		if skipOWS(line, 0) < len(line) {
			it.rest, it.more = line, true
		}
	}
	if it.forwarded {
		node, escaped, kind, it.rest, it.more = forwardedElement(it.rest)
		return node, escaped, kind, true
	}
	elem, rest, found := strings.Cut(it.rest, ",")
	it.rest, it.more = rest, found
	elem = httpfield.TrimOWS(elem)
	if elem == "" {
		return "", false, elemMalformed, true
	}
	return elem, false, elemNode, true
}

// forwardedElement parses the first forwarded-element of s (RFC 7239 §4):
// pairs separated by ';', token=token or token="quoted-string", parameter
// names case-insensitive. Unquoted values are accepted leniently: they may
// also contain ':', '[' and ']' ("for=192.0.2.43:47011"). After a syntax
// error it resynchronises on the next ',' outside a quoted-string; an
// unterminated quoted-string swallows the rest of the line.
func forwardedElement(s string) (node string, escaped bool, kind elemKind, rest string, more bool) {
	i := skipOWS(s, 0)
	if i == len(s) || s[i] == ',' {
		rest, more = skipElement(s, i)
		return "", false, elemMalformed, rest, more
	}
	kind = elemNoFor
	for {
		if i < len(s) && s[i] != ';' && s[i] != ',' {
			j := i
			for j < len(s) && isTchar(s[j]) {
				j++
			}
			name := s[i:j]
			if name == "" || j == len(s) || s[j] != '=' {
				rest, more = skipElement(s, j)
				return "", false, elemMalformed, rest, more
			}
			i = j + 1
			var val string
			var esc bool
			if i < len(s) && s[i] == '"' {
				j = i + 1
				for ; j < len(s) && s[j] != '"'; j++ {
					if s[j] == '\\' {
						esc = true
						j++
					}
				}
				if j >= len(s) {
					return "", false, elemMalformed, "", false
				}
				val, i = s[i+1:j], j+1
			} else {
				j = i
				for j < len(s) && (isTchar(s[j]) || s[j] == ':' || s[j] == '[' || s[j] == ']') {
					j++
				}
				if j == i {
					rest, more = skipElement(s, j)
					return "", false, elemMalformed, rest, more
				}
				val, i = s[i:j], j
			}
			if strings.EqualFold(name, "for") {
				if kind == elemNode { // "MUST NOT occur more than once per forwarded-element"
					rest, more = skipElement(s, i)
					return "", false, elemMalformed, rest, more
				}
				node, escaped, kind = val, esc, elemNode
			}
			i = skipOWS(s, i)
		}
		if i == len(s) {
			return node, escaped, kind, "", false
		}
		switch s[i] {
		case ';':
			i = skipOWS(s, i+1)
		case ',':
			return node, escaped, kind, s[i+1:], true
		default:
			rest, more = skipElement(s, i)
			return "", false, elemMalformed, rest, more
		}
	}
}

// skipElement returns what follows the next ',' at or after s[i] that is not
// inside a quoted-string.
func skipElement(s string, i int) (rest string, more bool) {
	quoted := false
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == ',':
			return s[i+1:], true
		}
	}
	return "", false
}

// unescape copies the content of a quoted-string into buf, resolving
// quoted-pairs; ok is false if it does not fit.
func unescape(buf []byte, s string) (n int, ok bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			i++ // forwardedElement guarantees a byte follows
		}
		if n == len(buf) {
			return 0, false
		}
		buf[n] = s[i]
		n++
	}
	return n, true
}

// parseNode parses "192.0.2.1", "192.0.2.1:80", "2001:db8::1",
// "[2001:db8::1]" or "[2001:db8::1]:80" and returns the address unmapped and
// without zone. obfuscatedPort also admits RFC 7239 ports such as ":_a1".
// Common garbage is rejected before netip.ParseAddr, whose errors allocate.
func parseNode(s string, obfuscatedPort bool) (netip.Addr, bool) {
	host, port, hasPort := s, "", false
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		host = s[1:end]
		if rest := s[end+1:]; rest != "" {
			if rest[0] != ':' {
				return netip.Addr{}, false
			}
			port, hasPort = rest[1:], true
		}
		if strings.IndexByte(host, ':') < 0 { // brackets hold IPv6 only
			return netip.Addr{}, false
		}
	case strings.Count(s, ":") == 1: // IPv4 with port; IPv6 has at least two
		host, port, hasPort = strings.Cut(s, ":")
	}
	if hasPort && !validPort(port, obfuscatedPort) {
		return netip.Addr{}, false
	}
	if !plausibleAddr(host) {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.WithZone("").Unmap(), true
}

// plausibleAddr rejects most strings netip.ParseAddr would reject, cheaply.
func plausibleAddr(s string) bool {
	if s == "" {
		return false
	}
	v6 := strings.IndexByte(s, ':') >= 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9', c == '.':
		case v6 && (c == ':' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'):
		case v6 && c == '%':
			return i+1 < len(s) // a zone: anything may follow
		default:
			return false
		}
	}
	return true
}

func validPort(p string, obfuscated bool) bool {
	if obfuscated && len(p) > 1 && p[0] == '_' { // obfport = "_" 1*(ALPHA / DIGIT / "." / "_" / "-")
		for i := 1; i < len(p); i++ {
			if c := p[i]; !isAlnum(c) && c != '.' && c != '_' && c != '-' {
				return false
			}
		}
		return true
	}
	if p == "" || len(p) > 5 {
		return false
	}
	n := 0
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
		n = n*10 + int(p[i]-'0')
	}
	return n <= 65535
}

func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// isTchar reports whether c may appear in an RFC 9110 token.
func isTchar(c byte) bool {
	return isAlnum(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

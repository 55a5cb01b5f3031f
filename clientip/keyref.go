package clientip

import (
	"errors"
	"fmt"
	"net/netip"
	"net/textproto"
	"strings"
)

// KeyRef names one key of a rule the way an operator knows it: by the
// element of the rule's `by` chain it comes from and that element's value
// ("header:X-Api-Key" and the API key a customer reads out), not by the
// bytes the table hashes.
type KeyRef struct {
	// Element is the element in canonical form, as By.Elements lists it:
	// "ip", "global", "path", "header:NAME", "cookie:NAME", "query:NAME";
	// or "func", the key an application's key function gave
	// (AppendFuncKey), which no By has.
	Element string
	// Value is the header, cookie or query value, the path, or the key
	// function's value, as a request would make it; "" for ip and global.
	Value string
	// Addr is the client address of an ip element.
	Addr netip.Addr
}

// ErrKeyRef is wrapped by every error ParseKeyRef returns.
var ErrKeyRef = errors.New("clientip: invalid key")

// ParseKeyRef parses an operator's key: "ip:ADDR" or a bare address,
// "header:NAME:VALUE", "cookie:NAME:VALUE", "query:NAME:VALUE",
// "path:PATH", "func:VALUE" (the value of a rule's key function: an
// authenticated user, say), or "global". The name ends at the first ':' after the
// element (names are tokens, without ':'); the value is the rest, as it
// is, colons and all.
func ParseKeyRef(s string) (KeyRef, error) {
	// The error leaves the key out: it may be a secret (an API key).
	bad := func(why string) (KeyRef, error) { return KeyRef{}, fmt.Errorf("%w: %s", ErrKeyRef, why) }
	if s == "global" {
		return KeyRef{Element: "global"}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return KeyRef{Element: "ip", Addr: a.Unmap().WithZone("")}, nil
	}
	word, rest, ok := strings.Cut(s, ":")
	if !ok {
		return bad(`want ip:ADDR (or an address), header:NAME:VALUE, cookie:NAME:VALUE, query:NAME:VALUE, path:PATH, func:VALUE or global`)
	}
	switch word {
	case "ip":
		a, err := netip.ParseAddr(rest)
		if err != nil {
			return bad("not an IP address")
		}
		return KeyRef{Element: "ip", Addr: a.Unmap().WithZone("")}, nil
	case "func":
		if !usable(rest) {
			return bad("the value is empty or has control characters: no request is counted under it")
		}
		return KeyRef{Element: "func", Value: rest}, nil
	case "path":
		if !strings.HasPrefix(rest, "/") {
			return bad("a path starts with /")
		}
		if !usable(rest) {
			return bad("the path has control characters: no request is counted under it")
		}
		return KeyRef{Element: "path", Value: rest}, nil
	case "header", "cookie", "query":
		name, value, ok := strings.Cut(rest, ":")
		if !ok || name == "" {
			return bad("want " + word + ":NAME:VALUE")
		}
		for i := 0; i < len(name); i++ {
			if !isTchar(name[i]) {
				return bad(fmt.Sprintf("%s name %q is not a token", word, name))
			}
		}
		if !usable(value) {
			return bad("the value is empty or has control characters: no request is counted under it")
		}
		if word == "header" {
			name = textproto.CanonicalMIMEHeaderKey(name)
		}
		return KeyRef{Element: word + ":" + name, Value: value}, nil
	}
	return bad(fmt.Sprintf("unknown element %q", word))
}

// Elements lists what b counts requests by, in the order it tries them,
// in canonical form: ["global"], or the chain ending in "ip"
// (["header:X-Api-Key", "ip"]).
func (b By) Elements() []string {
	if b.global {
		return []string{"global"}
	}
	out := make([]string, 0, len(b.elems)+1)
	for _, e := range b.elems {
		out = append(out, e.String())
	}
	return append(out, "ip")
}

// ByAddress reports whether some request is counted under its client
// address: b is "ip", or a chain whose every element may be missing from
// a request (a "path" element never is: nothing after it is reached).
// Such a rule's budget is every client's that arrives from one address:
// behind a proxy that is not trusted, every client's.
func (b By) ByAddress() bool {
	if b.global {
		return false
	}
	for _, e := range b.elems {
		if e.kind == fromPath {
			return false
		}
	}
	return true
}

// ClientChosen lists the elements of b whose value the client sends
// ("header:X-Api-Key", "cookie:session", "query:token"), in order: each
// new value it makes up starts a key of its own, with a fresh allowance,
// unless something in front of the application sets or checks it.
func (b By) ClientChosen() []string {
	var out []string
	for _, e := range b.elems {
		switch e.kind {
		case fromHeader, fromCookie, fromQuery:
			out = append(out, e.String())
		}
	}
	return out
}

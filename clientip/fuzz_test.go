package clientip

import (
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// clientByTheBook is Client written the obvious way, to check the one-pass
// walk against: collect the hops, align the two headers on the right, and
// walk from the right.
func clientByTheBook(r *Resolver, remoteAddr string, h http.Header) netip.Addr {
	peer, ok := parseNode(remoteAddr, false)
	if !ok || !r.trusts(peer) {
		return peer
	}
	collect := func(it hops) (list []hop) {
		for hp, more := it.next(); more; hp, more = it.next() {
			list = append(list, hp)
		}
		return list
	}
	xs := collect(hops{lines: h["X-Forwarded-For"]})
	fs := collect(hops{lines: h["Forwarded"], forwarded: true})
	if _, speaks := (hops{lines: h["Forwarded"], forwarded: true}).count(); !speaks {
		fs = nil // well-formed and names nobody: ignored
	}
	list := xs
	if len(fs) > 0 && len(xs) > 0 {
		list = make([]hop, max(len(xs), len(fs)))
		for i := 1; i <= len(list); i++ {
			if i <= len(xs) && i <= len(fs) && xs[len(xs)-i].ok && fs[len(fs)-i].ok && xs[len(xs)-i].addr == fs[len(fs)-i].addr {
				list[len(list)-i] = xs[len(xs)-i]
			}
		}
	} else if len(fs) > 0 {
		list = fs
	}
	client := peer
	for i := len(list) - 1; i >= 0; i-- {
		if !list[i].ok {
			return client
		}
		client = list[i].addr
		if !r.trusts(client) {
			return client
		}
	}
	return client
}

// lines splits a fuzzed header into lines at '\n'; "" is no header at all.
func lines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func FuzzClient(f *testing.F) {
	for _, seed := range []struct{ remote, xff, fwd string }{
		{"203.0.113.7:1234", "198.51.100.1", ""},
		{proxy, "198.51.100.1, 198.51.100.2, 10.0.0.5", ""},
		{proxy, "10.0.0.1, 10.0.0.2", ""},
		{proxy, "198.51.100.1, garbage, 10.0.0.2", "for=unknown"},
		{proxy, "", `for="[2001:db8:cafe::17]:4711";proto=https, For=192.0.2.43:47011`},
		{proxy, "198.51.100.1\n10.0.0.2", "for=198.51.100.1, for=10.0.0.2"},
		{proxy, "2001:db8::1", `for="\[2001:db8::1\]:_x"`},
		{"[::ffff:10.0.0.9]:80", "::ffff:198.51.100.1", `for="198.51.100.66, for=1.2.3.4`},
		{"[fe80::1%eth0]:80", "fe80::2%eth0", "for=_hidden;by=x;;"},
		{"[2001:db8:ffff::1]:443", "[2001:db8::5]:80, 2001:db8:ffff::2", ""},
		{"@", "1.2.3.4", "for=1.2.3.4"},
	} {
		f.Add(seed.remote, seed.xff, seed.fwd)
	}
	untrusting := &Resolver{IPv6Prefix: 48}
	f.Fuzz(func(t *testing.T, remote, xffValue, fwdValue string) {
		h := http.Header{}
		if l := lines(xffValue); l != nil {
			h["X-Forwarded-For"] = l
		}
		if l := lines(fwdValue); l != nil {
			h["Forwarded"] = l
		}
		peer := untrusting.Client(remote, nil)

		// Without trusted proxies the headers change nothing.
		if got := untrusting.Client(remote, h); got != peer {
			t.Fatalf("untrusting Client(%q, %q) = %v, want the peer %v", remote, h, got, peer)
		}
		if got, want := untrusting.Key(remote, h), untrusting.Key(remote, nil); got != want {
			t.Fatalf("untrusting Key(%q, %q) = %v, want %v", remote, h, got, want)
		}

		// With them, from the fuzzed peer and from a trusted one.
		for _, remote := range []string{remote, proxy} {
			peer := untrusting.Client(remote, nil)
			got := testResolver.Client(remote, h)
			if got != peer && !got.IsValid() {
				t.Fatalf("Client(%q, %q) = %v: neither valid nor the peer", remote, h, got)
			}
			if got.Zone() != "" || got.Is4In6() {
				t.Fatalf("Client(%q, %q) = %v: not normalised", remote, h, got)
			}
			if want := clientByTheBook(&testResolver, remote, h); got != want {
				t.Fatalf("Client(%q, %q) = %v, by the book %v", remote, h, got, want)
			}
			key := testResolver.Key(remote, h)
			if got.Is4() && key != got || got.Is6() && key != netip.PrefixFrom(got, 64).Masked().Addr() {
				t.Fatalf("Key(%q, %q) = %v for client %v", remote, h, key, got)
			}
			if k := string(By{}.AppendKey(nil, &testResolver, remote, h)); k != "ip:"+strings.TrimPrefix(key.String(), "invalid IP") {
				t.Fatalf("AppendKey(%q, %q) = %q for key %v", remote, h, k, key)
			}
		}

		// Behind a trusted proxy that appends the real client C to one or
		// both headers, whatever the client sent, the result is C or a
		// trusted proxy: never an address of the client's choosing.
		attackerX, attackerF := lines(xffValue), lines(fwdValue)
		for _, c := range []struct{ addr, xff, fwd string }{
			{"203.0.113.7", "203.0.113.7", "for=203.0.113.7"},
			{"2001:db8:aaaa::7", "2001:db8:aaaa::7", `for="[2001:db8:aaaa::7]:4711"`},
		} {
			for _, writes := range []struct{ xff, fwd bool }{{true, false}, {false, true}, {true, true}} {
				for _, sameLine := range []bool{false, true} {
					h := http.Header{}
					if l := appendHop(attackerX, c.xff, writes.xff, sameLine); l != nil {
						h["X-Forwarded-For"] = l
					}
					if l := appendHop(attackerF, c.fwd, writes.fwd, sameLine); l != nil {
						h["Forwarded"] = l
					}
					got := testResolver.Client(proxy, h)
					if got.String() != c.addr && !testResolver.trusts(got) {
						t.Fatalf("proxy writing %+v, client %s: Client(%q) = %v, chosen by the client", writes, c.addr, h, got)
					}
				}
			}
		}
	})
}

// appendHop returns lines with hop added as a proxy would: as a new line,
// or at the end of the last line.
func appendHop(lines []string, hop string, write, sameLine bool) []string {
	lines = slices.Clone(lines)
	switch {
	case !write:
		return lines
	case sameLine && len(lines) > 0:
		lines[len(lines)-1] += ", " + hop
		return lines
	default:
		return append(lines, hop)
	}
}

func FuzzParseBy(f *testing.F) {
	for _, seed := range []string{
		"ip", "global", "header:X-Api-Key", "header:x-api-key|ip", "header:A|header:B|ip",
		"", "header:", "header:Bad Name", "global|ip", "cookie:x", "header:X|", "ip|header:X",
		"query:k|path|ip", "path|cookie:a", "cookie:a|header:a",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseBy(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "clientip: ") {
				t.Fatalf("ParseBy(%q) error %q lacks the package prefix", s, err)
			}
			return
		}
		canon := b.String()
		b2, err := ParseBy(canon)
		if err != nil {
			t.Fatalf("ParseBy(%q).String() = %q does not parse: %v", s, canon, err)
		}
		if !reflect.DeepEqual(b, b2) || b2.String() != canon {
			t.Fatalf("ParseBy(%q) = %#v, but its String %q parses to %#v", s, b, canon, b2)
		}
		key := b.AppendKey(nil, &testResolver, proxy, http.Header{"X-Forwarded-For": {"198.51.100.1"}})
		if len(key) == 0 {
			t.Fatalf("%q: empty key", s)
		}
	})
}

package clientip

import (
	"fmt"
	"net/http"
	"net/netip"
	"testing"
)

// hdr builds a header from name, value pairs; a name given twice makes two
// lines of that header, in order.
func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

const (
	xff = "X-Forwarded-For"
	fwd = "Forwarded"
)

// Trusted proxies in these tests: 10/8, 2001:db8:ffff::/48 and, written as an
// IPv4-mapped prefix, 192.168.0.0/16.
var testResolver = Resolver{Trusted: []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("2001:db8:ffff::/48"),
	netip.MustParsePrefix("::ffff:192.168.0.0/112"),
}}

const proxy = "10.0.0.9:4000" // a trusted peer

func TestClient(t *testing.T) {
	tests := []struct {
		name   string
		remote string
		h      http.Header
		want   string
	}{
		// Who may speak.
		{"direct, no headers", "203.0.113.7:1234", nil, "203.0.113.7"},
		{"direct, spoofed XFF", "203.0.113.7:1234", hdr(xff, "198.51.100.1"), "203.0.113.7"},
		{"direct, spoofed Forwarded", "203.0.113.7:1234", hdr(fwd, "for=198.51.100.1"), "203.0.113.7"},
		{"direct, spoofed trusted XFF", "203.0.113.7:1234", hdr(xff, "10.0.0.1"), "203.0.113.7"},
		{"trusted peer, no headers", proxy, nil, "10.0.0.9"},
		{"trusted peer, blank XFF", proxy, hdr(xff, " "), "10.0.0.9"},

		// The walk from the right.
		{"XFF a, b", proxy, hdr(xff, "198.51.100.1, 198.51.100.2"), "198.51.100.2"},
		{"XFF trusted hops on the right", proxy, hdr(xff, "198.51.100.1,198.51.100.2, 10.0.0.5,\t10.0.0.6"), "198.51.100.2"},
		{"XFF all trusted", proxy, hdr(xff, "10.0.0.1, 10.0.0.2, 10.0.0.3"), "10.0.0.1"},
		{"XFF trusted IPv6 hop", "[2001:db8:ffff::1]:443", hdr(xff, "198.51.100.1, 2001:db8:ffff::2"), "198.51.100.1"},

		// Malformed hops stop the walk.
		{"garbage between", proxy, hdr(xff, "198.51.100.1, garbage, 10.0.0.2"), "10.0.0.2"},
		{"garbage right-most", proxy, hdr(xff, "198.51.100.1, 10.0.0.2, garbage"), "10.0.0.9"},
		{"garbage left of client", proxy, hdr(xff, "garbage, 198.51.100.2"), "198.51.100.2"},
		{"XFF unknown", proxy, hdr(xff, "198.51.100.1, unknown, 10.0.0.3"), "10.0.0.3"},
		{"XFF empty element", proxy, hdr(xff, "198.51.100.1,,10.0.0.2"), "10.0.0.2"},
		{"XFF trailing comma", proxy, hdr(xff, "198.51.100.1,"), "10.0.0.9"},
		{"XFF bad port", proxy, hdr(xff, "198.51.100.1, 10.0.0.2:99999"), "10.0.0.9"},
		{"XFF bracketed IPv4", proxy, hdr(xff, "198.51.100.1, [10.0.0.2]"), "10.0.0.9"},
		{"Forwarded unknown", proxy, hdr(fwd, "for=198.51.100.1, for=unknown, for=10.0.0.3"), "10.0.0.3"},
		{"Forwarded _hidden", proxy, hdr(fwd, "for=198.51.100.1, for=_hidden, for=10.0.0.3"), "10.0.0.3"},
		{"Forwarded element without for", proxy, hdr(fwd, "for=198.51.100.1, proto=https;for=10.0.0.3, by=10.0.0.4"), "10.0.0.9"},
		{"Forwarded repeated for", proxy, hdr(fwd, "for=198.51.100.1, for=198.51.100.5;for=10.0.0.3, for=10.0.0.4"), "10.0.0.4"},
		{"Forwarded syntax error", proxy, hdr(fwd, "for=198.51.100.1, for=198.51.100.5 junk, for=10.0.0.4"), "10.0.0.4"},
		{"Forwarded unterminated quote swallows the line", proxy, hdr(fwd, `for="198.51.100.66, for=198.51.100.2`), "10.0.0.9"},
		{"Forwarded unterminated quote in an earlier line", proxy, hdr(fwd, `for="198.51.100.66`, fwd, "for=198.51.100.2"), "198.51.100.2"},
		{"Forwarded resync skips quoted commas", proxy, hdr(fwd, `for=198.51.100.5 x="a,by=", for=10.0.0.4`), "10.0.0.4"},
		{"Forwarded junk after a pair", proxy, hdr(fwd, `for=10.0.0.4, for=198.51.100.5 /`), "10.0.0.9"},
		{"Forwarded quoted comma", proxy, hdr(fwd, `for="198.51.100.66,x", for=198.51.100.2`), "198.51.100.2"},

		// Syntax that must be understood.
		{"XFF ports", proxy, hdr(xff, "198.51.100.1:5678, [2001:db8::5]:80"), "2001:db8::5"},
		{"XFF IPv4 with port", proxy, hdr(xff, "198.51.100.1:5678"), "198.51.100.1"},
		{"XFF bracketed IPv6 without port", proxy, hdr(xff, "[2001:db8::6]"), "2001:db8::6"},
		{"Forwarded quoted IPv6 with port", proxy, hdr(fwd, `for="[2001:db8:cafe::17]:4711"`), "2001:db8:cafe::17"},
		{"Forwarded IPv4 with port, FOR", proxy, hdr(fwd, "FOR=192.0.2.43:47011"), "192.0.2.43"},
		{"Forwarded pairs", proxy, hdr(fwd, "for=192.0.2.60;proto=http;by=203.0.113.43"), "192.0.2.60"},
		{"Forwarded empty pairs and spaces", proxy, hdr(fwd, " ;for=192.0.2.60; ;proto=http ,  for=192.0.2.61 "), "192.0.2.61"},
		{"Forwarded escapes", proxy, hdr(fwd, `for="\[2001:db8::2\]:\4711"`), "2001:db8::2"},
		{"Forwarded obfuscated port", proxy, hdr(fwd, `for="[2001:db8::3]:_abc"`), "2001:db8::3"},
		{"XFF obfuscated port is garbage", proxy, hdr(xff, "198.51.100.1, [2001:db8::3]:_abc"), "10.0.0.9"},
		{"Forwarded quoted value with other pairs", proxy, hdr(fwd, `for=198.51.100.1, proto=https;for="10.0.0.3";host="a;b,c"`), "198.51.100.1"},

		// Several lines are one list.
		{"XFF lines", proxy, hdr(xff, "198.51.100.1", xff, "198.51.100.2, 10.0.0.5", xff, "10.0.0.6"), "198.51.100.2"},
		{"XFF lines, blank line", proxy, hdr(xff, "198.51.100.1", xff, "", xff, "10.0.0.6"), "198.51.100.1"},
		{"Forwarded lines", proxy, hdr(fwd, "for=198.51.100.1", fwd, "for=10.0.0.5, for=10.0.0.6"), "198.51.100.1"},

		// Normalisation.
		{"mapped peer is IPv4", "[::ffff:203.0.113.7]:80", nil, "203.0.113.7"},
		{"mapped peer trusted", "[::ffff:10.0.0.9]:80", hdr(xff, "198.51.100.1"), "198.51.100.1"},
		{"mapped hop", proxy, hdr(xff, "::ffff:198.51.100.1, ::ffff:10.0.0.1"), "198.51.100.1"},
		{"mapped prefix trusts IPv4", "192.168.3.4:80", hdr(xff, "198.51.100.1, 192.168.9.9"), "198.51.100.1"},
		{"peer zone dropped", "[fe80::1%eth0]:80", nil, "fe80::1"},
		{"hop zone dropped", proxy, hdr(xff, "fe80::2%eth0"), "fe80::2"},
		{"bare peer", "203.0.113.7", nil, "203.0.113.7"},
		{"bare bracketed peer", "[2001:db8::7]", nil, "2001:db8::7"},
		{"unparseable peer", "@", hdr(xff, "198.51.100.1"), "invalid IP"},

		// Both headers.
		{"both agree", proxy, hdr(xff, "198.51.100.1, 10.0.0.2", fwd, "for=198.51.100.1, for=10.0.0.2"), "198.51.100.1"},
		{"both agree, spelled differently", proxy, hdr(xff, "2001:db8::1", fwd, `for="[2001:db8::1]:4711"`), "2001:db8::1"},
		{"both, forged Forwarded (XFF-only proxy)", proxy, hdr(xff, "198.51.100.1", fwd, "for=203.0.113.66"), "10.0.0.9"},
		{"both, forged XFF (Forwarded-only proxy)", proxy, hdr(xff, "203.0.113.66", fwd, "for=198.51.100.1"), "10.0.0.9"},
		{"both, forged on the left of XFF", proxy, hdr(xff, "203.0.113.66, 198.51.100.1, 10.0.0.2", fwd, "for=198.51.100.1, for=10.0.0.2"), "198.51.100.1"},
		{"both, forged on the left of Forwarded", proxy, hdr(xff, "198.51.100.1, 10.0.0.2", fwd, "for=203.0.113.66, for=198.51.100.1, for=10.0.0.2"), "198.51.100.1"},
		{"both, empty Forwarded element on the left", proxy, hdr(xff, "10.0.0.2", fwd, ",for=10.0.0.2"), "10.0.0.2"},
		{"both, forged on the left of each", proxy, hdr(xff, "203.0.113.66, 198.51.100.1", fwd, "for=203.0.113.77, for=198.51.100.1"), "198.51.100.1"},
		{"both, forged behind two proxies", proxy, hdr(xff, "198.51.100.1, 10.0.0.2", fwd, "for=203.0.113.66"), "10.0.0.9"},
		{"both, disagree left of a trusted hop", proxy, hdr(xff, "198.51.100.1, 10.0.0.2", fwd, "for=203.0.113.66, for=10.0.0.2"), "10.0.0.2"},
		{"both, all trusted, lengths differ", proxy, hdr(xff, "10.0.0.1, 10.0.0.2", fwd, "for=10.0.0.2"), "10.0.0.2"},
		{"both, Forwarded names nobody", proxy, hdr(xff, "198.51.100.1", fwd, "proto=https;host=example.com"), "198.51.100.1"},
		{"both, Forwarded names nobody over two lines", proxy, hdr(xff, "198.51.100.1", fwd, "proto=https", fwd, "host=example.com;proto=http, by=10.0.0.2"), "198.51.100.1"},
		{"both, unterminated quote swallowed the proxy's Forwarded", proxy, hdr(xff, "203.0.113.66", fwd, `for="x, for=198.51.100.1`), "10.0.0.9"},
		{"both, quote closed by the proxy's quoted IPv6", proxy, hdr(xff, "203.0.113.66", fwd, `host=", for="[2001:db8::c]:1234"`), "10.0.0.9"},
		{"both, malformed Forwarded without for", proxy, hdr(xff, "198.51.100.1", fwd, "proto=https junk"), "10.0.0.9"},
		{"both, Forwarded unknown names a hop", proxy, hdr(xff, "198.51.100.1", fwd, "for=unknown"), "10.0.0.9"},
		{"both, blank XFF", proxy, hdr(xff, "", fwd, "for=198.51.100.1"), "198.51.100.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := testResolver.Client(tt.remote, tt.h)
			if got.String() != tt.want {
				t.Errorf("Client(%q, %v) = %v, want %s", tt.remote, tt.h, got, tt.want)
			}
		})
	}
}

func TestClientWithoutTrust(t *testing.T) {
	h := hdr(xff, "198.51.100.1", fwd, "for=198.51.100.2")
	for _, r := range []*Resolver{nil, {}} {
		if got := r.Client("10.0.0.9:1", h); got != netip.MustParseAddr("10.0.0.9") {
			t.Errorf("%v.Client = %v, want the peer", r, got)
		}
	}
}

func TestKey(t *testing.T) {
	tests := []struct {
		name   string
		prefix int
		remote string
		h      http.Header
		want   string
	}{
		{"IPv4 as is", 0, "203.0.113.7:1", nil, "203.0.113.7"},
		{"IPv4 as is with a prefix", 48, "203.0.113.7:1", nil, "203.0.113.7"},
		{"IPv6 default /64", 0, "[2001:db8:1:2:3:4:5:6]:1", nil, "2001:db8:1:2::"},
		{"IPv6 /64", 64, "[2001:db8:1:2:3:4:5:6]:1", nil, "2001:db8:1:2::"},
		{"IPv6 /48", 48, "[2001:db8:1:2:3:4:5:6]:1", nil, "2001:db8:1::"},
		{"IPv6 /128", 128, "[2001:db8:1:2:3:4:5:6]:1", nil, "2001:db8:1:2:3:4:5:6"},
		{"IPv6 out of range is /64", 129, "[2001:db8:1:2:3:4:5:6]:1", nil, "2001:db8:1:2::"},
		{"IPv6 from XFF", 48, proxy, hdr(xff, "2001:db8:1:2:3:4:5:6"), "2001:db8:1::"},
		{"mapped IPv4 is not masked", 48, "[::ffff:203.0.113.7]:1", nil, "203.0.113.7"},
		{"zone dropped before masking", 128, "[fe80::1%eth0]:1", nil, "fe80::1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := testResolver
			r.IPv6Prefix = tt.prefix
			if got := r.Key(tt.remote, tt.h); got.String() != tt.want {
				t.Errorf("Key(%q) with /%d = %v, want %s", tt.remote, tt.prefix, got, tt.want)
			}
		})
	}
}

// A client rotating forwarding headers never changes its key: directly,
// because the headers are not believed, and behind a trusted proxy, because
// everything it sends lies left of what the proxy wrote.
func TestRotatingHeadersKeepTheKey(t *testing.T) {
	for i := range 200 {
		forged := fmt.Sprintf("198.51.%d.%d", i/250, i%250)
		for _, tc := range []struct {
			remote string
			h      http.Header
			want   string
		}{
			{"203.0.113.7:1234", hdr(xff, forged), "203.0.113.7"},
			{"203.0.113.7:1234", hdr(fwd, "for="+forged), "203.0.113.7"},
			{"203.0.113.7:1234", hdr(xff, "10.0.0.1, "+forged), "203.0.113.7"},
			{proxy, hdr(xff, forged+", 203.0.113.7"), "203.0.113.7"},
			{proxy, hdr(xff, forged, xff, "203.0.113.7"), "203.0.113.7"},
			{proxy, hdr(xff, "203.0.113.7", fwd, "for="+forged), "10.0.0.9"},
		} {
			if got := testResolver.Key(tc.remote, tc.h); got.String() != tc.want {
				t.Fatalf("Key(%q, %v) = %v, want %s", tc.remote, tc.h, got, tc.want)
			}
		}
	}
}

func TestClientDoesNotAllocate(t *testing.T) {
	h := hdr(
		xff, "198.51.100.1, [2001:db8::5]:80, 10.0.0.5",
		xff, "10.0.0.6:443",
		fwd, `for=198.51.100.1;proto=https, for="[2001:db8::5]:80", for=10.0.0.5`,
		fwd, "for=10.0.0.6",
	)
	var got netip.Addr
	allocs := testing.AllocsPerRun(100, func() { got = testResolver.Client(proxy, h) })
	if got != netip.MustParseAddr("2001:db8::5") {
		t.Fatalf("Client = %v", got)
	}
	if allocs != 0 {
		t.Errorf("Client allocates %v times per call, want 0", allocs)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		r       *Resolver
		wantErr bool
	}{
		{nil, false},
		{&Resolver{}, false},
		{&testResolver, false},
		{&Resolver{IPv6Prefix: 128}, false},
		{&Resolver{IPv6Prefix: -1}, true},
		{&Resolver{IPv6Prefix: 129}, true},
		{&Resolver{Trusted: []netip.Prefix{{}}}, true},
	}
	for _, tt := range tests {
		if err := tt.r.Validate(); (err != nil) != tt.wantErr {
			t.Errorf("%+v.Validate() = %v, want error %v", tt.r, err, tt.wantErr)
		}
	}
}

func TestParseNode(t *testing.T) {
	tests := []struct {
		in        string
		forwarded bool
		want      string // "" for rejected
	}{
		{"192.0.2.1", false, "192.0.2.1"},
		{"192.0.2.1:0", false, "192.0.2.1"},
		{"192.0.2.1:65535", false, "192.0.2.1"},
		{"192.0.2.1:65536", false, ""},
		{"192.0.2.1:", false, ""},
		{"192.0.2.1:+80", false, ""},
		{"2001:db8::1", false, "2001:db8::1"},
		{"[2001:db8::1]", false, "2001:db8::1"},
		{"[2001:db8::1]:80", false, "2001:db8::1"},
		{"[2001:db8::1]80", false, ""},
		{"[2001:db8::1", false, ""},
		{"[192.0.2.1]:80", false, ""},
		{"[2001:db8::1]:_x", false, ""},
		{"[2001:db8::1]:_x", true, "2001:db8::1"},
		{"[2001:db8::1]:_", true, ""},
		{"[2001:db8::1]:_a b", true, ""},
		{"192.0.2.1:_x.y-z", true, "192.0.2.1"},
		{"fe80::1%eth0", false, "fe80::1"},
		{"fe80::1%", false, ""},
		{"::ffff:192.0.2.1", false, "192.0.2.1"},
		{"unknown", true, ""},
		{"_hidden", true, ""},
		{"", false, ""},
		{"1.2.3", false, ""},
		{"deadbeef", false, ""},
		{":::", false, ""},
	}
	for _, tt := range tests {
		a, ok := parseNode(tt.in, tt.forwarded)
		got := ""
		if ok {
			got = a.String()
		}
		if got != tt.want {
			t.Errorf("parseNode(%q, %v) = %q, want %q", tt.in, tt.forwarded, got, tt.want)
		}
	}
}

package clientip

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// The set answers as a linear scan of its prefixes would, for random
// prefixes and addresses near their edges.
func TestPrefixSetAgreesWithScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		var ps []netip.Prefix
		for i := rng.IntN(20); i >= 0; i-- {
			if rng.IntN(2) == 0 {
				var b [4]byte
				for j := range b {
					b[j] = byte(rng.IntN(4)) // dense: prefixes overlap and touch
				}
				ps = append(ps, netip.PrefixFrom(netip.AddrFrom4(b), rng.IntN(33)))
			} else {
				var b [16]byte
				for j := range b {
					b[j] = byte(rng.IntN(3))
				}
				ps = append(ps, netip.PrefixFrom(netip.AddrFrom16(b), rng.IntN(129)))
			}
		}
		s := NewPrefixSet(ps)
		for k := 0; k < 300; k++ {
			var a netip.Addr
			if rng.IntN(2) == 0 {
				var b [4]byte
				for j := range b {
					b[j] = byte(rng.IntN(4))
				}
				a = netip.AddrFrom4(b)
			} else {
				var b [16]byte
				for j := range b {
					b[j] = byte(rng.IntN(3))
				}
				a = netip.AddrFrom16(b)
			}
			want := false
			for _, p := range ps {
				want = want || p.Masked().Contains(a)
			}
			if got := s.Contains(a); got != want {
				t.Fatalf("%v contains %v: %v, want %v", ps, a, got, want)
			}
		}
	}
}

func TestPrefixSetEdges(t *testing.T) {
	s := NewPrefixSet([]netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("::ffff:192.168.0.0/112"), // mapped: 192.168.0.0/16
		netip.MustParsePrefix("2001:db8::/32"),
		netip.MustParsePrefix("0.0.0.0/0"),
	})
	for _, tt := range []struct {
		a    string
		want bool
	}{
		{"10.1.2.3", true}, {"192.168.9.9", true}, {"255.255.255.255", true},
		{"2001:db8::1", true}, {"2001:db9::1", false}, {"::1", false},
	} {
		if got := s.Contains(netip.MustParseAddr(tt.a)); got != tt.want {
			t.Errorf("Contains(%s) = %v", tt.a, got)
		}
	}
	all6 := NewPrefixSet([]netip.Prefix{netip.MustParsePrefix("::/0")})
	if !all6.Contains(netip.MustParseAddr("ffff::1")) || all6.Contains(netip.MustParseAddr("1.2.3.4")) {
		t.Error("::/0")
	}
	var empty PrefixSet
	if empty.Contains(netip.MustParseAddr("1.2.3.4")) {
		t.Error("empty set contains an address")
	}
}

// The target: an exemption check with 100 CIDRs costs at most 50 ns.
func BenchmarkPrefixSetContains(b *testing.B) {
	var ps []netip.Prefix
	for i := 0; i < 50; i++ {
		ps = append(ps, netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/16", i*5)))
		ps = append(ps, netip.MustParsePrefix(fmt.Sprintf("2001:db8:%x::/48", i*7)))
	}
	s := NewPrefixSet(ps)
	addrs := []netip.Addr{netip.MustParseAddr("10.45.3.3"), netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8:e::1")}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.Contains(addrs[i%len(addrs)])
	}
}

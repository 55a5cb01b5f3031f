package clientip

import (
	"encoding/binary"
	"net/netip"
	"sort"
)

// PrefixSet is a set of address prefixes (exempt clients, say) with a
// membership test that costs a binary search, however many prefixes it
// holds: the prefixes are turned into sorted, merged address ranges. The
// zero PrefixSet is empty. It is read-only once built and safe for
// concurrent use.
type PrefixSet struct {
	v4 []range4
	v6 []range6
}

type range4 struct{ lo, hi uint32 }

// range6 bounds compare as 128-bit numbers: [0] the high half.
type range6 struct{ lo, hi [2]uint64 }

// NewPrefixSet builds the set of ps. IPv4-mapped IPv6 prefixes
// (::ffff:10.0.0.0/104) are the IPv4 prefix they map; invalid prefixes are
// ignored (callers validate).
func NewPrefixSet(ps []netip.Prefix) PrefixSet {
	var s PrefixSet
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		p = p.Masked()
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		if p.Addr().Is4() {
			lo := binary.BigEndian.Uint32(p.Addr().AsSlice())
			s.v4 = append(s.v4, range4{lo, lo | uint32(uint64(1)<<(32-p.Bits())-1)})
			continue
		}
		lo := split(p.Addr())
		hi := lo
		host := 128 - p.Bits()
		switch {
		case host >= 64:
			hi[1] = ^uint64(0)
			hi[0] |= uint64(1)<<(host-64) - 1
			if host == 128 {
				hi[0] = ^uint64(0)
			}
		default:
			hi[1] |= uint64(1)<<host - 1
		}
		s.v6 = append(s.v6, range6{lo, hi})
	}
	// sort.Sort, not slices.SortFunc: a generic sort is compiled anew for
	// each element type (some 15 KB of an embedding binary for these two),
	// and sort.Sort is linked already.
	sort.Sort(byLo4(s.v4))
	sort.Sort(byLo6(s.v6))
	s.v4 = merge(s.v4, func(a, b range4) bool { return b.lo <= a.hi || a.hi != ^uint32(0) && b.lo == a.hi+1 },
		func(a, b range4) range4 { return range4{a.lo, max(a.hi, b.hi)} })
	s.v6 = merge(s.v6, func(a, b range6) bool { return cmp6(b.lo, a.hi) <= 0 },
		func(a, b range6) range6 {
			if cmp6(b.hi, a.hi) > 0 {
				a.hi = b.hi
			}
			return a
		})
	return s
}

// byLo4 and byLo6 sort ranges by their first address.
type (
	byLo4 []range4
	byLo6 []range6
)

func (r byLo4) Len() int           { return len(r) }
func (r byLo4) Less(i, j int) bool { return r[i].lo < r[j].lo }
func (r byLo4) Swap(i, j int)      { r[i], r[j] = r[j], r[i] }
func (r byLo6) Len() int           { return len(r) }
func (r byLo6) Less(i, j int) bool { return cmp6(r[i].lo, r[j].lo) < 0 }
func (r byLo6) Swap(i, j int)      { r[i], r[j] = r[j], r[i] }

// merge joins neighbours of a sorted slice that overlap.
func merge[T any](rs []T, overlaps func(a, b T) bool, join func(a, b T) T) []T {
	if len(rs) < 2 {
		return rs
	}
	out := rs[:1]
	for _, r := range rs[1:] {
		if last := &out[len(out)-1]; overlaps(*last, r) {
			*last = join(*last, r)
		} else {
			out = append(out, r)
		}
	}
	return out
}

func split(a netip.Addr) [2]uint64 {
	b := a.As16()
	return [2]uint64{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

func cmp6(a, b [2]uint64) int {
	switch {
	case a[0] != b[0]:
		if a[0] < b[0] {
			return -1
		}
		return 1
	case a[1] < b[1]:
		return -1
	case a[1] > b[1]:
		return 1
	}
	return 0
}

// Len is the number of merged ranges (0: the set is empty).
func (s *PrefixSet) Len() int { return len(s.v4) + len(s.v6) }

// Contains reports whether a (unmapped, as Resolver returns it) is in the
// set. It does not allocate.
func (s *PrefixSet) Contains(a netip.Addr) bool {
	switch {
	case a.Is4():
		if len(s.v4) == 0 {
			return false
		}
		b := a.As4()
		x := binary.BigEndian.Uint32(b[:])
		i := sort.Search(len(s.v4), func(i int) bool { return s.v4[i].hi >= x })
		return i < len(s.v4) && s.v4[i].lo <= x
	case a.Is6():
		if len(s.v6) == 0 {
			return false
		}
		x := split(a)
		i := sort.Search(len(s.v6), func(i int) bool { return cmp6(s.v6[i].hi, x) >= 0 })
		return i < len(s.v6) && cmp6(s.v6[i].lo, x) <= 0
	}
	return false
}

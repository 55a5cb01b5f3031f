package shm

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// Key is a key's 128-bit identity in one region (two independently seeded
// 64-bit hashes).
type Key struct{ A, B uint64 }

// KeyOf hashes id within namespace ns (e.g. a rule's identity) with the
// region's seeds. Equal (ns, id) give equal keys in every process of the
// region. The two halves are xxhash64 of (seed ^ ns) ‖ id for each seed:
// one pass each over a stack copy for ids up to inlineKey bytes (the
// streaming digest costs three times as much), the streaming digest,
// which gives the same hash, beyond.
func (c *Counters) KeyOf(ns uint64, id []byte) Key {
	if len(id) <= inlineKey {
		var buf [8 + inlineKey]byte
		n := copy(buf[8:], id)
		return c.keyOfPrefixed(ns, buf[:8+n])
	}
	return c.keyOfLong(ns, id, "")
}

// KeyOfString is KeyOf for a string, without allocating.
func (c *Counters) KeyOfString(ns uint64, id string) Key {
	if len(id) <= inlineKey {
		var buf [8 + inlineKey]byte
		n := copy(buf[8:], id)
		return c.keyOfPrefixed(ns, buf[:8+n])
	}
	return c.keyOfLong(ns, nil, id)
}

const inlineKey = 120

// keyOfPrefixed hashes b, whose first 8 bytes are free for the seed.
func (c *Counters) keyOfPrefixed(ns uint64, b []byte) Key {
	binary.LittleEndian.PutUint64(b, c.r.seed1^ns)
	a := xxhash.Sum64(b)
	binary.LittleEndian.PutUint64(b, c.r.seed2^ns)
	return Key{A: a, B: xxhash.Sum64(b)}
}

func (c *Counters) keyOfLong(ns uint64, id []byte, ids string) Key {
	var seed [8]byte
	var d xxhash.Digest
	half := func(s uint64) uint64 {
		binary.LittleEndian.PutUint64(seed[:], s^ns)
		d.Reset()
		d.Write(seed[:])
		d.Write(id)
		d.WriteString(ids)
		return d.Sum64()
	}
	return Key{A: half(c.r.seed1), B: half(c.r.seed2)}
}

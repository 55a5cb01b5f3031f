package shm

import (
	"errors"
	"iter"
	"sync/atomic"
	"unsafe"
)

// Tags is the region's table of tag generations, with which the response
// cache purges: a fixed array of generation counters indexed by a tag's
// hash. An entry records the generation of each of its tags (and of its
// URL) when it is stored; a purge advances the tag's generation, one
// atomic add that every process sees at once, and an entry whose recorded
// generation differs is purged: a lookup treats it as absent.
//
// Two tags whose hashes share a slot share a generation, so a purge of
// one also purges the other's entries: an extra miss, never a stale hit.
// The table never fills and a purge costs the same however many entries
// carry the tag.
type Tags struct {
	r    *Region
	gens []uint64
	mask uint64
}

func newTags(r *Region, lay sections) *Tags {
	n := r.geo.Tags
	if n == 0 {
		return &Tags{r: r}
	}
	return &Tags{
		r:    r,
		gens: unsafe.Slice((*uint64)(r.at(lay.off[secTags])), n),
		mask: uint64(n - 1),
	}
}

// Len is the number of generation slots (0: the region has no response
// table, and no cache).
func (g *Tags) Len() int { return len(g.gens) }

// Gen is the generation of the slot of hash h (0 in a table without
// slots).
func (g *Tags) Gen(h uint64) uint64 {
	if len(g.gens) == 0 {
		return 0
	}
	return atomic.LoadUint64(&g.gens[h&g.mask])
}

// Bump advances the generation of h's slot: an invalidation of one URL,
// whose entries recorded its generation before they were fetched. It
// reports false in a table without slots.
func (g *Tags) Bump(h uint64) bool {
	if len(g.gens) == 0 {
		return false
	}
	atomic.AddUint64(&g.gens[h&g.mask], 1)
	g.r.add(hURLPurges, 1)
	return true
}

// Purge advances the generation of the tag whose hash is h. It advances
// the epoch first: a fill that read the epoch before it fetched, and
// reads it again after it read its tags' generations, sees a change if
// this purge can have missed what it fetched (see Epoch). It reports
// false in a table without slots.
func (g *Tags) Purge(h uint64) bool {
	if len(g.gens) == 0 {
		return false
	}
	g.r.add(hTagEpoch, 1)
	atomic.AddUint64(&g.gens[h&g.mask], 1)
	g.r.add(hTagPurges, 1)
	return true
}

// Epoch counts the tag purges begun. A response's tags are known only once
// it has arrived, so their generations cannot be read before the fetch:
// a fill reads the epoch before, and after it read its tags' generations;
// if it moved, a purge ran meanwhile and the response must not be stored
// (it may predate the purge but carry the generation after it).
func (g *Tags) Epoch() uint64 { return g.r.word(hTagEpoch) }

// TagStats counts the table's use since the region was created.
type TagStats struct {
	Slots     int    // generation slots
	Used      int    // slots whose generation is not 0 (purged at least once)
	TagPurges uint64 // Purge calls
	URLPurges uint64 // Bump calls (URL purges and invalidations)
}

// Stats scans the table.
func (g *Tags) Stats() TagStats {
	st := TagStats{Slots: len(g.gens), TagPurges: g.r.word(hTagPurges), URLPurges: g.r.word(hURLPurges)}
	for i := range g.gens {
		if atomic.LoadUint64(&g.gens[i]) != 0 {
			st.Used++
		}
	}
	return st
}

// TagGen is one slot's generation, as persistence dumps and restores it.
type TagGen struct {
	Slot int
	Gen  uint64
}

// Snapshot returns an iterator over the slots whose generation is not 0.
func (g *Tags) Snapshot() iter.Seq[TagGen] {
	return func(yield func(TagGen) bool) {
		for i := range g.gens {
			if v := atomic.LoadUint64(&g.gens[i]); v != 0 {
				if !yield(TagGen{i, v}) {
					return
				}
			}
		}
	}
}

// ErrTagSlot is Place's error for a slot outside the table.
var ErrTagSlot = errors.New("shm: tag slot outside the table")

// Place sets a slot's generation, for a region that no other process uses
// yet (persistence restoring a dump).
func (g *Tags) Place(e TagGen) error {
	if e.Slot < 0 || e.Slot >= len(g.gens) {
		return ErrTagSlot
	}
	atomic.StoreUint64(&g.gens[e.Slot], e.Gen)
	return nil
}

// add adds d to a header word.
func (r *Region) add(off int, d uint64) {
	atomic.AddUint64((*uint64)(r.at(uint64(off))), d)
}

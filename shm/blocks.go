package shm

import (
	"encoding/binary"
	"math"
	"math/bits"
	"sync/atomic"
	"time"
	"unsafe"
)

// A stored response occupies a chain of blocks: each block starts with a
// header word, the index of the next block (noBlock ends the chain) and
// the block's stamp, and the rest holds data, written and read as whole
// 8-byte words with sync/atomic (a reader may race with a writer that
// reclaimed the blocks; the record's state and checksum tell).
//
// The stamp says who holds the block, so that Reap can give back the
// blocks of a process killed while it held some, and nothing else: 0 for
// a free block, else the stamp of a process (stampOf). A block is taken
// by a CAS of its header from stamp 0 to the taker's, and only then is
// its bit set in the bitmap; it is given back by clearing its bit, then
// its stamp. So a block whose bit is set has a stamp, a block with the
// stamp of a live process is that process's, and a block whose bit is
// clear with the stamp of a dead process is free (it died taking or
// giving it back): allocBlock takes it as it takes one of stamp 0, so
// that Reap reads only the headers of blocks in use (reading the others
// would make the whole pool's pages resident). A chain keeps its
// builder's stamp while a completed record holds it (the record's kind
// word names it too); whoever frees a record's chain first takes each
// block by a CAS from that stamp to its own, so that a block is freed
// once even when Reap frees the same dead builder's blocks meanwhile. A
// record whose chain is being freed is BUSY and its chain word names
// what is left of the chain (releaseRec finishes it for a dead owner).
const (
	blockHeader = 8         // next block index (low 32) · stamp (high 32)
	noBlock     = 1<<32 - 1 // end of a block chain
	lowHalf     = 1<<32 - 1
	// stampSuper is the supervisor's stamp (Place, Forget, a dead
	// worker's free finished) and stampReap reclaimStale's: never stale
	// (a worker's stamp has a nonzero low half), and two, so that a
	// block reclaimStale takes is never one that a Forget running
	// meanwhile takes for its own.
	stampSuper = 0xFFFF << 16
	stampReap  = 0xFFFE << 16
)

// stampOf is the stamp of owner o: worker index (16 bits) · incarnation
// reduced to 1..65535; the supervisor's for anything else.
func stampOf(o uint64) uint32 {
	if o == 0 || o == sweeperID || o == sweeperRec {
		return stampSuper
	}
	return uint32(o>>32)<<16 | (uint32(o)-1)%0xFFFF + 1
}

// staleStamp reports whether st is the stamp of a process reaped since.
func (r *Region) staleStamp(st uint32) bool {
	w := int(st >> 16)
	if st&0xFFFF == 0 {
		return false // the supervisor's
	}
	return w >= len(r.workers) || stampOf(ownerID(w, uint32(atomic.LoadUint64(&r.workers[w].incarnation)))) != st
}

func (t *Responses) dataPerBlock() int { return t.blockSize - blockHeader }

func (t *Responses) blockWords(b uint32) []uint64 {
	off := uintptr(b) * uintptr(t.blockSize)
	return unsafe.Slice((*uint64)(unsafe.Pointer(&t.blocks[off])), t.blockSize/8)
}

func (t *Responses) header(b uint32) *uint64 {
	return (*uint64)(unsafe.Pointer(&t.blocks[uintptr(b)*uintptr(t.blockSize)]))
}

// allocBlock takes one free block from the bitmap for stamp me.
func (t *Responses) allocBlock(me uint32) (uint32, bool) {
	nw := len(t.bitmap)
	if nw == 0 {
		return 0, false
	}
	start := int(t.hint.Load()) % nw
	for k := 0; k < nw; k++ {
		wi := (start + k) % nw
		var tried uint64 // bits whose block another process is taking or giving back
		for {
			w := atomic.LoadUint64(&t.bitmap[wi]) | tried
			if w == math.MaxUint64 {
				break
			}
			bit := bits.TrailingZeros64(^w)
			idx := uint32(wi*64 + bit)
			if idx >= t.nblocks {
				break // the tail bits past the last block
			}
			// Free: stamp 0, or the stamp of a process reaped while it took
			// or gave back the block (its bit clear: in no chain).
			h := atomic.LoadUint64(t.header(idx))
			if (h>>32 == 0 || t.r.staleStamp(uint32(h>>32))) && atomic.CompareAndSwapUint64(t.header(idx), h, uint64(me)<<32|noBlock) {
				atomic.OrUint64(&t.bitmap[wi], 1<<bit)
				t.hint.Store(uint32(wi))
				t.r.count(evBlocksTaken, 1)
				return idx, true
			}
			tried |= 1 << bit
		}
	}
	return 0, false
}

// freeBlock gives block b, which the caller holds, back to the pool.
func (t *Responses) freeBlock(b uint32) {
	atomic.AndUint64(&t.bitmap[b/64], ^(uint64(1) << (b % 64)))
	atomic.StoreUint64(t.header(b), noBlock)
	t.r.count(evBlocksFreed, 1)
}

// store writes data into a new chain of stamp me; ok is false when the
// pool is short.
func (t *Responses) store(data []byte, me uint32) (first, count uint32, ok bool) {
	per := t.dataPerBlock()
	n := max((len(data)+per-1)/per, 1)
	if n > int(t.nblocks) {
		return 0, 0, false
	}
	first, prev := uint32(noBlock), uint32(noBlock)
	for i := 0; i < n; i++ {
		b, got := t.allocBlock(me)
		if !got {
			t.freeChain(uint64(i)<<32|uint64(first), me, me, me, nil)
			return 0, 0, false
		}
		words := t.blockWords(b)
		if prev == noBlock {
			first = b
		} else {
			atomic.StoreUint64(t.header(prev), uint64(me)<<32|uint64(b))
		}
		chunk := data[min(i*per, len(data)):min((i+1)*per, len(data))]
		storeWords(words[1:], chunk)
		prev = b
	}
	return first, uint32(n), true
}

// load copies a chain of count blocks from first into dst.
func (t *Responses) load(first, count uint32, dst []byte) bool {
	per := t.dataPerBlock()
	if uint64(count) > uint64(t.nblocks) || uint64(len(dst)) > uint64(count)*uint64(per) {
		return false
	}
	b := first
	for i := 0; i < int(count); i++ {
		if b >= t.nblocks {
			return false
		}
		words := t.blockWords(b)
		loadWords(dst[min(i*per, len(dst)):min((i+1)*per, len(dst))], words[1:])
		b = uint32(atomic.LoadUint64(&words[0]))
	}
	return true
}

// freeChain gives a chain (first block in the low 32 bits, count in the
// high 32) back to the pool for stamp me: each block of stamp want or alt
// is taken for me by a CAS (one of me is me's already), then freed. It
// stops at a block of another stamp: Reap took it, and takes the rest of
// the chain, of the same dead builder's stamp. When progress is not nil
// (the chain word of the record, BUSY for me), it names the rest of the
// chain before each block is freed, and noBlock at the end, so that Reap
// can finish the free if me's process dies. It returns the blocks freed.
func (t *Responses) freeChain(chain uint64, want, alt, me uint32, progress *uint64) (n int) {
	b, count := uint32(chain), uint32(chain>>32)
	for ; count > 0 && b < t.nblocks; count-- {
		hp := t.header(b)
		h := atomic.LoadUint64(hp)
		for st := uint32(h >> 32); st != me && (st == want || st == alt); st = uint32(h >> 32) {
			if atomic.CompareAndSwapUint64(hp, h, uint64(me)<<32|h&lowHalf) {
				h = uint64(me)<<32 | h&lowHalf
				break
			}
			h = atomic.LoadUint64(hp)
		}
		if uint32(h>>32) != me {
			break
		}
		if progress != nil {
			atomic.StoreUint64(progress, uint64(count-1)<<32|h&lowHalf)
		}
		t.freeBlock(b)
		n++
		b = uint32(h)
	}
	if progress != nil {
		atomic.StoreUint64(progress, noBlock)
	}
	return n
}

// freeRec frees the chain of record rec, which stamp me's process holds
// BUSY, taken from a COMPLETE state (see freeChain).
func (t *Responses) freeRec(rec *record, me uint32) int {
	return t.freeChain(atomic.LoadUint64(&rec.chain), uint32(atomic.LoadUint64(&rec.kind)>>32), me, me, &rec.chain)
}

func storeWords(words []uint64, src []byte) {
	var tail [8]byte
	for i := 0; len(src) > 0; i++ {
		if len(src) < 8 {
			tail = [8]byte{}
			copy(tail[:], src)
			src = tail[:]
		}
		atomic.StoreUint64(&words[i], binary.LittleEndian.Uint64(src))
		src = src[8:]
	}
}

// littleEndianHost: a word loaded natively is its bytes in little-endian
// order, as storeWords put them.
var littleEndianHost = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func loadWords(dst []byte, words []uint64) {
	// Whole words straight into an aligned destination (the common case: a
	// buffer from make), a third of the cost of converting each word.
	if n := len(dst) / 8; n > 0 && littleEndianHost && uintptr(unsafe.Pointer(&dst[0]))%8 == 0 {
		d := unsafe.Slice((*uint64)(unsafe.Pointer(&dst[0])), n)
		w := words[:n]
		for i := range d {
			d[i] = atomic.LoadUint64(&w[i])
		}
		dst, words = dst[n*8:], words[n:]
	}
	var tail [8]byte
	for i := 0; len(dst) > 0; i++ {
		w := atomic.LoadUint64(&words[i])
		if len(dst) < 8 {
			binary.LittleEndian.PutUint64(tail[:], w)
			copy(dst, tail[:])
			return
		}
		binary.LittleEndian.PutUint64(dst, w)
		dst = dst[8:]
	}
}

// storeEvicting is store that, when the pool is short, evicts (see
// evictBlocks) and tries once more.
func (t *Responses) storeEvicting(data []byte, now time.Duration) (first, count uint32, ok bool) {
	me := stampOf(t.r.owner.Load())
	if first, count, ok = t.store(data, me); ok {
		return first, count, true
	}
	per := t.dataPerBlock()
	need := max((len(data)+per-1)/per, 1)
	if need > int(t.nblocks) || t.evictBlocks(need, now) == 0 {
		return 0, 0, false
	}
	return t.store(data, me)
}

// evictBlocks frees blocks for a store of need blocks: it drops completed
// records that expired (of any kind) and cache entries, walking the
// records from where this process's last walk stopped (a clock hand, so
// that successive evictions spread over the table), until need blocks are
// free or every record was visited. A completed idempotency record that
// has not expired is never dropped. It returns the blocks it freed.
func (t *Responses) evictBlocks(need int, now time.Duration) (freed int) {
	n := len(t.recs)
	start := int(t.hand.Load())
	j := 0
	for ; j < n && freed < need; j++ {
		i := (start + j) & int(t.mask)
		rec := &t.recs[i]
		s := atomic.LoadUint64(&rec.state)
		if recPhase(s) != recComplete {
			continue
		}
		expired := time.Duration(atomic.LoadUint64(&rec.expiry)) <= now
		if !expired && Kind(atomic.LoadUint64(&rec.kind)) != KindCache {
			continue
		}
		if t.charged(i) {
			// An idempotency record: its charges go with it, as a
			// sweep's do, so that its client and its address count no
			// record that is gone.
			if b, ok, _ := t.retire(i, s, t.r.owner.Load()); ok {
				freed += b
			}
			continue
		}
		b, ok := t.drop(i, s)
		if !ok {
			continue
		}
		freed += b
		if !expired {
			t.r.count(evCacheEvicted, 1)
		}
	}
	t.hand.Store(uint32((start + j) & int(t.mask)))
	return freed
}

// drop frees the COMPLETE record i, found in state s: BUSY for this
// process while its chain is freed (so that Reap can finish the free if
// the process dies), then a tombstone; waiters wake. ok is false when the
// record changed meanwhile; blocks is how many blocks it freed.
func (t *Responses) drop(i int, s uint64) (blocks int, ok bool) {
	rec := &t.recs[i]
	owner := t.r.owner.Load()
	if owner == 0 {
		owner = sweeperRec // the supervisor
	}
	gen := recGen(s) + 1
	busy := mkRec(recBusy, gen, owner)
	if !atomic.CompareAndSwapUint64(&rec.state, s, busy) {
		return 0, false
	}
	blocks = t.freeRec(rec, stampOf(owner))
	if atomic.CompareAndSwapUint64(&rec.state, busy, mkRec(recTomb, gen, 0)) {
		t.r.count(evRecFreed, 1)
	}
	t.wake(rec)
	return blocks, true
}

// held marks the blocks of the chains of completed records, and the next
// block of each chain being freed (its freer's to take, or releaseRec's
// for a dead freer, which would stop at it if it were taken away); a
// chain whose record changed while it was walked is not marked (whoever
// changed it frees it).
func (t *Responses) held() []uint64 {
	held := make([]uint64, len(t.bitmap))
	var walk []uint32
	for i := range t.recs {
		rec := &t.recs[i]
		s := atomic.LoadUint64(&rec.state)
		chain := atomic.LoadUint64(&rec.chain)
		if b := uint32(chain); recPhase(s) == recBusy && chain>>32 != 0 && b < t.nblocks {
			held[b/64] |= 1 << (b % 64)
		}
		if recPhase(s) != recComplete {
			continue
		}
		walk = walk[:0]
		b, count := uint32(chain), uint32(chain>>32)
		for j := uint32(0); j < count && b < t.nblocks; j++ {
			walk = append(walk, b)
			b = uint32(atomic.LoadUint64(t.header(b)))
		}
		if atomic.LoadUint64(&rec.state) == s {
			for _, b := range walk {
				held[b/64] |= 1 << (b % 64)
			}
		}
	}
	return held
}

// reclaimStale gives back to the pool the blocks that reaped processes
// held and no completed record holds: a chain a process was building or
// had not yet attached, the rest of a chain it was freeing, a block it
// was taking or giving back. Reap calls it after the records of the dead
// are released (releaseRec finishes their frees), while live processes
// go on: a block is freed only from the stamp of a dead process, by a
// CAS to the supervisor's, so that a live process freeing the same
// record's chain (whose builder died) frees each block once. A dead
// process's stamp is never written again, and a chain of that stamp is
// held by a completed record only if that record was completed before
// the process died, and so is seen by held. It returns the blocks it
// gave back.
func (t *Responses) reclaimStale() (n int) {
	type cand struct {
		b uint32
		h uint64
	}
	var cands []cand
	for wi := range t.bitmap {
		for w := atomic.LoadUint64(&t.bitmap[wi]); w != 0; w &= w - 1 {
			b := uint32(wi*64 + bits.TrailingZeros64(w))
			if h := atomic.LoadUint64(t.header(b)); t.r.staleStamp(uint32(h >> 32)) {
				cands = append(cands, cand{b, h})
			}
		}
	}
	if len(cands) == 0 {
		return 0
	}
	held := t.held()
	for _, c := range cands {
		if held[c.b/64]&(1<<(c.b%64)) == 0 &&
			atomic.CompareAndSwapUint64(t.header(c.b), c.h, stampReap<<32|c.h&lowHalf) {
			t.freeBlock(c.b)
			n++
		}
	}
	return n
}

// reclaimLeaked gives back to the pool every block in use that no
// completed record's chain holds: any a supervisor killed inside a
// Forget left. Only ReapAll calls it, after the records of the dead are
// released, when no process is left that could hold a chain of its own.
// It returns how many blocks it freed.
func (t *Responses) reclaimLeaked() (n int) {
	if t.nblocks == 0 {
		return 0
	}
	held := t.held()
	for wi := range t.bitmap {
		if leaked := atomic.LoadUint64(&t.bitmap[wi]) &^ held[wi]; leaked != 0 {
			for ; leaked != 0; leaked &= leaked - 1 {
				t.freeBlock(uint32(wi*64 + bits.TrailingZeros64(leaked)))
				n++
			}
		}
	}
	return n
}

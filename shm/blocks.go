package shm

import (
	"encoding/binary"
	"math"
	"math/bits"
	"sync/atomic"
	"time"
	"unsafe"
)

// A stored response occupies a chain of blocks: each block starts with the
// index of the next (noBlock ends it), and the rest holds data, written and
// read as whole 8-byte words with sync/atomic (a reader may race with a
// writer that reclaimed the blocks; the record's state and checksum tell).
const (
	blockHeader = 8         // next block index (u32) · spare
	noBlock     = 1<<32 - 1 // end of a block chain
)

func (t *Responses) dataPerBlock() int { return t.blockSize - blockHeader }

func (t *Responses) blockWords(b uint32) []uint64 {
	off := uintptr(b) * uintptr(t.blockSize)
	return unsafe.Slice((*uint64)(unsafe.Pointer(&t.blocks[off])), t.blockSize/8)
}

// allocBlock takes one free block from the bitmap.
func (t *Responses) allocBlock() (uint32, bool) {
	nw := len(t.bitmap)
	if nw == 0 {
		return 0, false
	}
	start := int(t.hint.Load()) % nw
	for k := 0; k < nw; k++ {
		wi := (start + k) % nw
		for {
			w := atomic.LoadUint64(&t.bitmap[wi])
			if w == math.MaxUint64 {
				break
			}
			bit := bits.TrailingZeros64(^w)
			idx := uint32(wi*64 + bit)
			if idx >= t.nblocks {
				break // the tail bits past the last block
			}
			if atomic.CompareAndSwapUint64(&t.bitmap[wi], w, w|1<<bit) {
				t.hint.Store(uint32(wi))
				t.r.count(evBlocksTaken, 1)
				return idx, true
			}
		}
	}
	return 0, false
}

func (t *Responses) freeBlock(b uint32) {
	atomic.AndUint64(&t.bitmap[b/64], ^(uint64(1) << (b % 64)))
	t.r.count(evBlocksFreed, 1)
}

// store writes data into a new chain; ok is false when the pool is short.
func (t *Responses) store(data []byte) (first, count uint32, ok bool) {
	per := t.dataPerBlock()
	n := max((len(data)+per-1)/per, 1)
	if n > int(t.nblocks) {
		return 0, 0, false
	}
	first, prev := uint32(noBlock), uint32(noBlock)
	for i := 0; i < n; i++ {
		b, got := t.allocBlock()
		if !got {
			t.freeChain(uint64(i)<<32 | uint64(first))
			return 0, 0, false
		}
		words := t.blockWords(b)
		atomic.StoreUint64(&words[0], noBlock)
		if prev == noBlock {
			first = b
		} else {
			atomic.StoreUint64(&t.blockWords(prev)[0], uint64(b))
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
// high 32) back to the pool.
func (t *Responses) freeChain(chain uint64) {
	b, count := uint32(chain), uint32(chain>>32)
	for i := uint32(0); i < count && b < t.nblocks; i++ {
		next := uint32(atomic.LoadUint64(&t.blockWords(b)[0]))
		t.freeBlock(b)
		b = next
	}
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
	if first, count, ok = t.store(data); ok {
		return first, count, true
	}
	per := t.dataPerBlock()
	need := max((len(data)+per-1)/per, 1)
	if need > int(t.nblocks) || t.evictBlocks(need, now) == 0 {
		return 0, 0, false
	}
	return t.store(data)
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
		// The chain is stable while the record is COMPLETE in state s: read
		// it before the record is given up, after which a claim may reset it.
		chain := atomic.LoadUint64(&rec.chain)
		if !t.drop(rec, s) {
			continue
		}
		t.freeChain(chain)
		freed += int(min(chain>>32, uint64(t.nblocks)))
		if !expired {
			t.r.count(evCacheEvicted, 1)
		}
	}
	t.hand.Store(uint32((start + j) & int(t.mask)))
	return freed
}

// drop turns the COMPLETE record rec, in state s, into a tombstone, and
// wakes whoever waits on it; false when it changed meanwhile. The caller
// frees the chain it read in state s.
func (t *Responses) drop(rec *record, s uint64) bool {
	if !atomic.CompareAndSwapUint64(&rec.state, s, mkRec(recTomb, recGen(s), 0)) {
		return false
	}
	t.r.count(evRecFreed, 1)
	t.wake(rec)
	return true
}

// reclaimLeaked gives back to the pool every block in use that no
// completed record's chain holds: those a process killed while it built
// a chain, completed a record or freed a record's chain left taken
// (which Reap cannot tell from the chain in progress of a live process).
// Only ReapAll calls it, after the records of the dead are released,
// when no process is left that could hold a chain of its own. It returns
// how many blocks it freed.
func (t *Responses) reclaimLeaked() (n int) {
	if t.nblocks == 0 {
		return 0
	}
	held := make([]uint64, len(t.bitmap))
	for i := range t.recs {
		rec := &t.recs[i]
		if recPhase(atomic.LoadUint64(&rec.state)) != recComplete {
			continue
		}
		chain := atomic.LoadUint64(&rec.chain)
		b, count := uint32(chain), uint32(chain>>32)
		for j := uint32(0); j < count && b < t.nblocks; j++ {
			held[b/64] |= 1 << (b % 64)
			b = uint32(atomic.LoadUint64(&t.blockWords(b)[0]))
		}
	}
	for wi := range t.bitmap {
		if leaked := atomic.LoadUint64(&t.bitmap[wi]) &^ held[wi]; leaked != 0 {
			atomic.AndUint64(&t.bitmap[wi], ^leaked)
			n += bits.OnesCount64(leaked)
		}
	}
	if n > 0 {
		t.r.count(evBlocksFreed, uint64(n))
	}
	return n
}

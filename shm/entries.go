package shm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Entry is one LIVE counter slot's content.
type Entry struct {
	Key     Key
	Meta    uint64
	Payload uint64
}

// Range calls fn for every LIVE slot until fn returns false. While workers
// run it is a moving picture; persistence calls it after the last worker
// has exited.
func (c *Counters) Range(fn func(Entry) bool) {
	for i := range c.slots {
		sl := &c.slots[i]
		s := atomic.LoadUint64(&sl.state)
		if phaseOf(s) != phaseLive {
			continue
		}
		e := Entry{
			Key:     Key{A: atomic.LoadUint64(&sl.keyA), B: atomic.LoadUint64(&sl.keyB)},
			Meta:    atomic.LoadUint64(&sl.meta),
			Payload: payloadOf(s),
		}
		if atomic.LoadUint64(&sl.state) != s {
			continue // taken over while read: not a consistent entry
		}
		if !fn(e) {
			return
		}
	}
}

// Insert installs e (or overwrites the payload of its key) at region time
// now. Loading a dump uses it before any worker starts; it returns
// ErrFull when the probe window has no room.
func (c *Counters) Insert(e Entry, now time.Duration) error {
	if e.Payload > PayloadMask {
		return fmt.Errorf("shm: payload %#x exceeds 48 bits", e.Payload)
	}
	_, err := c.Update(e.Key, e.Meta, now, func(uint64, time.Duration) (uint64, bool) { return e.Payload, true })
	return err
}

// ErrNotEmpty is returned by SetSeeds on a table that already holds keys.
var ErrNotEmpty = errors.New("shm: table not empty")

// SetSeeds replaces the region's hash seeds, so that keys hashed in an
// earlier region (a dump) keep their identity. Only an empty table may be
// reseeded, and only before other processes attach.
func (r *Region) SetSeeds(s1, s2 uint64) error {
	for i := range r.counts.slots {
		if phaseOf(atomic.LoadUint64(&r.counts.slots[i].state)) != phaseEmpty {
			return ErrNotEmpty
		}
	}
	r.store(hSeed1, s1)
	r.store(hSeed2, s2)
	r.seed1, r.seed2 = s1, s2
	return nil
}

// Created reports the wall-clock time at which the region was created.
func (r *Region) Created() time.Time { return time.Unix(0, int64(r.word(hCreated))) }

package bucket

import (
	"time"

	"github.com/cespare/xxhash/v2"
)

// The meta word a limiter stores beside each key (shm's Entry.Meta) tells
// a process that knows nothing of the rule what the payload means: the
// rule's tag (16 bits) · algorithm (4 bits) · window in µs (44 bits).
// Fresh reads it to judge reclaims in every process; persistence reads
// the tag to find the rule an entry belongs to.
const (
	tagShift   = 48
	algoMask   = 0xf
	windowBits = 44
	windowMask = 1<<windowBits - 1
)

// Tag is a 16-bit hash of the rule's name, stored in each of its slots.
// Two rules may share one: persistence then trusts neither's state.
func (r Rule) Tag() uint16 { return uint16(xxhash.Sum64String(r.Name)) }

// Meta is the meta word a limiter of r writes beside each of its keys.
// It depends on the name, algorithm and window only.
func (r Rule) Meta() uint64 {
	return uint64(r.Tag())<<tagShift | uint64(r.Algorithm&algoMask)<<windowBits |
		uint64(r.Window/time.Microsecond)&windowMask
}

// Account is the 16-bit account that the rule's keys are charged to in the
// counter table, which MaxKeys bounds: the tag of its Group, or of its
// Name when Group is "". Two rules on one account share its count.
func (r Rule) Account() uint16 {
	if r.Group != "" {
		return uint16(xxhash.Sum64String(r.Group))
	}
	return r.Tag()
}

// MetaTag is the tag of the rule that wrote a meta word.
func MetaTag(meta uint64) uint16 { return uint16(meta >> tagShift) }

// Fresh is the table-wide freshness judgement for slots written by
// limiters of this package (see shm.Counters.SetFresh).
func Fresh(meta, payload uint64, now time.Duration) bool {
	algo := Algorithm(meta >> windowBits & algoMask)
	window := int64(meta & windowMask)
	if window <= 0 {
		return payload == 0
	}
	return fresh(algo, window, payload, max(int64(now/time.Microsecond), 0))
}

// MetaOf is the meta word of a slot that holds a payload of algorithm a
// over window, under a 16-bit tag, so that the table's freshness
// judgement ([Fresh]) reads it as this package's limiters would: a GCRA
// payload (a time) is fresh once it has passed, a fixed-window one once its
// window is over. Other packages keep entries of their own in the table
// with it (a deny cache, a shared count); a window no rule can have (under
// [MinWindow]) keeps such an entry apart from every rule's state.
func MetaOf(tag uint16, a Algorithm, window time.Duration) uint64 {
	return uint64(tag)<<tagShift | uint64(a&algoMask)<<windowBits | uint64(window/time.Microsecond)&windowMask
}

package prefork

import "time"

// Respawn delays of a crashed worker.
const (
	backoffBase   = 100 * time.Millisecond // first delay after a crash
	backoffMax    = 10 * time.Second       // the delay doubles up to this
	backoffStable = 10 * time.Second       // a worker that ran this long resets the delay
)

// backoff is the respawn delay of one worker slot: it doubles with every
// crash of a worker that ran less than stable, and starts over from base
// once a worker has run stably. It is pure (time is a parameter): the
// supervisor owns one per slot and is its only user.
type backoff struct {
	base, max, stable time.Duration
	next              time.Duration // delay of the next crash; 0 = base
}

func newBackoff() backoff {
	return backoff{base: backoffBase, max: backoffMax, stable: backoffStable}
}

// failure records a crash of a worker that ran for ran and returns how long
// to wait before starting its replacement.
func (b *backoff) failure(ran time.Duration) time.Duration {
	if b.next == 0 || ran >= b.stable {
		b.next = b.base
	}
	d := b.next
	b.next = min(2*b.next, b.max)
	return d
}

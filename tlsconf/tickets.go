package tlsconf

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"sync"
	"time"
)

// Tickets is the secret of a chain of session ticket keys: Key is the
// key of period Epoch (Unix time divided by Rotation), and the key of the
// next period is the SHA-256 of a label and the previous key.
type Tickets struct {
	Key      [32]byte      `json:"key"`
	Epoch    int64         `json:"epoch"`
	Rotation time.Duration `json:"rotation"`
}

// Rotation's bounds.
const (
	MinRotation     = time.Minute
	MaxRotation     = 7 * 24 * time.Hour
	DefaultRotation = 12 * time.Hour
)

var timeNow = time.Now

// NewTickets draws a new chain whose keys change every rotation, starting
// one period before now (the previous key is needed for the tickets of
// the period now began in).
func NewTickets(rotation time.Duration, now time.Time) (Tickets, error) {
	if rotation < MinRotation || rotation > MaxRotation {
		return Tickets{}, errors.New("tlsconf: ticket rotation must be between 1m and 168h")
	}
	t := Tickets{Rotation: rotation}
	t.Epoch = t.epoch(now) - 1
	if _, err := rand.Read(t.Key[:]); err != nil {
		return Tickets{}, err
	}
	return t, nil
}

// IsZero reports whether t is no chain.
func (t Tickets) IsZero() bool { return t.Rotation == 0 }

func (t Tickets) epoch(now time.Time) int64 {
	return now.UnixNano() / int64(t.Rotation)
}

// next is the key of the period after k's.
func next(k [32]byte) [32]byte {
	h := sha256.New()
	h.Write([]byte("preforkd session ticket key\x00"))
	h.Write(k[:])
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// Advance returns the chain from one period before now on: what to hand
// a process started now (it holds no key older than that).
func (t Tickets) Advance(now time.Time) Tickets {
	for e := t.epoch(now) - 1; t.Epoch < e; t.Epoch++ {
		t.Key = next(t.Key)
	}
	return t
}

// Keys are the session ticket keys at now: the current period's, which
// encrypts new tickets, then the previous period's, which still opens the
// tickets issued in it (when t reaches that far back).
func (t Tickets) Keys(now time.Time) [][32]byte {
	e := t.epoch(now)
	if e < t.Epoch {
		return [][32]byte{t.Key} // a clock gone back: the oldest known
	}
	a := t.Advance(now)
	if a.Epoch == e {
		return [][32]byte{a.Key}
	}
	return [][32]byte{next(a.Key), a.Key}
}

// NextChange is when the keys change after now.
func (t Tickets) NextChange(now time.Time) time.Time {
	return time.Unix(0, (t.epoch(now)+1)*int64(t.Rotation))
}

// Rotate sets cfg's session ticket keys at every change of t's period
// (crypto/tls takes new keys while it serves), from a goroutine that the
// returned function stops and waits for. It looks at the clock at least
// once a second, so that a wall clock that jumps (a host resumed from
// sleep) changes the keys within a second. With a zero t it does nothing.
func Rotate(cfg *tls.Config, t Tickets, now func() time.Time) (stop func()) {
	return rotate(cfg, t, now, nil, nil)
}

// rotate is Rotate; a test wakes it with wake and learns of each change
// of keys through set.
func rotate(cfg *tls.Config, t Tickets, now func() time.Time, wake <-chan struct{}, set func(epoch int64)) (stop func()) {
	if t.IsZero() {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		epoch := int64(-1 << 62)
		for {
			at := now()
			if e := t.epoch(at); e != epoch {
				cfg.SetSessionTicketKeys(t.Keys(at))
				epoch = e
				if set != nil {
					set(e)
				}
			}
			timer := time.NewTimer(min(t.NextChange(at).Sub(at), time.Second))
			select {
			case <-done:
				timer.Stop()
				return
			case <-timer.C:
			case <-wake:
				timer.Stop()
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			<-exited
		})
	}
}

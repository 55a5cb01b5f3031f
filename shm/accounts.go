package shm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Accounts bound the room that one group of keys takes in a table: the
// counter slots of one rate-limit rule, the response records of one
// client. Each set of accounts has numAccounts accounts; each account
// holds the number of the table's elements charged to it, a lock, and the
// state of its sweep. An element's charge in a set is a word of its own
// (0: none, a+1: account a), written only while the element is BUSY (or
// RESERVED) and owned by the writer. The counter table has one set; the
// response table two, each with its charge word in every record: the
// client as its `by` key names it, and the client's address, so that an
// idempotency record counts against both. The sets are independent: each
// holds the invariant below on its own words, and no process ever holds
// locks of two accounts at once.
//
// The invariant, for every account a of a set whose lock is free:
//
//	held[a] == the number of elements whose charge word (of that set) is a+1
//
// Only a holder of a's lock changes held[a], or a charge word to or from
// a+1 (Place aside: it runs alone with the region). A holder changes both,
// one after the other; a process that dies in between leaves its lock
// behind, and whoever takes a lock from a dead holder first counts the
// account's elements again, so that a crash never makes a count drift.
// The count is one load, for a claim's cap and for statistics: only that
// recovery walks the table.
//
// An element's charge survives its key: it is moved or cleared by whoever
// takes the element over (a claim of a fresh slot or an expired record, a
// release of a dead owner's element, a sweep), always while it owns the
// element, and checked again under the lock, so that two processes never
// both clear one charge.

// numAccounts is the number of accounts per table: an Account is 16 bits.
const numAccounts = 1 << 16

// accountSize is the bytes of one account in the region.
const accountSize = 32

// A sweep of one account visits sweepBudget elements from the account's
// cursor, at most once per sweepEvery (on the system-wide monotonic clock):
// a bounded cost however often a capped account is asked for room.
const (
	sweepBudget = 4096
	sweepEvery  = time.Millisecond
)

// account is one account's line in the region.
type account struct {
	lock    uint64 // owner id of the process changing held or a charge; 0 = free
	held    uint64 // elements charged to the account
	sweepAt uint64 // nanotime before which the account's next sweep does not start
	cursor  uint64 // element at which the account's next sweep starts
}

// Quota names the account a table charges a new key's element to, and how
// many elements that account may hold.
type Quota struct {
	// Account is the count the element is charged to: a rule's tag, a
	// hashed client.
	Account uint16
	// Max is the most elements the account's keys may hold; past it a new
	// key is refused with ErrQuota (ErrAddrQuota for a client address's
	// account). 0 means no bound but the table's.
	Max int
}

// charge is the charge word of an element charged to q's account.
func (q Quota) charge() uint64 { return uint64(q.Account) + 1 }

// ErrQuota means that the key is new and its account already holds its
// quota's maximum of elements (the rate-limit rule's max_keys, the
// client's max_records). Callers treat it like ErrFull, for that account
// only.
var ErrQuota = errors.New("shm: the account holds its maximum of elements")

// ErrAddrQuota is ErrQuota for the account of a client's address (see
// Responses.Begin): that address holds its maximum of records, whatever
// the `by` keys its requests came with.
var ErrAddrQuota = errors.New("shm: the client address's account holds its maximum of records")

// errLost means an element changed hands while its charge was changed:
// this process was reaped meanwhile.
var errLost = errors.New("shm: element lost while its charge changed")

// The supervisor has no worker identity; these stand for it, and are
// never stale (Region.stale). sweeperID holds an account's lock, outside
// the 48 bits of workers' owner ids. sweeperRec owns a record the
// supervisor holds BUSY (Forget): a record's owner field has 48 bits, so
// it is ownerID(maxWorkers-1, 0), which no worker has (an incarnation is
// never 0). A supervisor killed inside a Forget leaves that one record
// BUSY, and the account locks it held locked, until ReapAll (the whole
// tree died) or a load from a dump (which skips the record).
const (
	sweeperID  = 1 << 62
	sweeperRec = (maxWorkers - 1) << 32
)

// accounts are the accounts of one table.
type accounts struct {
	r     *Region
	a     []account
	n     int                 // elements of the table
	word  func(i int) *uint64 // the charge word of element i
	state func(i int) *uint64 // the state word of element i
	// capped is charge's error for an account at its maximum: ErrQuota,
	// or ErrAddrQuota for the client-address accounts.
	capped error
}

// Held reports how many elements account a holds.
func (as *accounts) held(a uint16) int { return int(atomic.LoadUint64(&as.a[a].held)) }

// lock takes account a's lock for owner. A dead holder's lock is taken
// over, and the account recounted; a live holder is waited for up to
// wait, or not at all when wait is 0 (then ErrLockTimeout at once).
func (as *accounts) lock(a uint16, owner uint64, wait time.Duration) error {
	// The dead holder may have changed the count and not the charge, or
	// the other way round.
	return lockWord(as.r, &as.a[a].lock, owner, wait, func() { as.recount(a) })
}

func (as *accounts) unlock(a uint16, owner uint64) {
	atomic.CompareAndSwapUint64(&as.a[a].lock, owner, 0)
}

// recount sets account a's count from its elements' charges. It requires
// a's lock: nobody else changes a charge to or from a meanwhile.
func (as *accounts) recount(a uint16) {
	c := uint64(a) + 1
	var n uint64
	for i := 0; i < as.n; i++ {
		if atomic.LoadUint64(as.word(i)) == c {
			n++
		}
	}
	atomic.StoreUint64(&as.a[a].held, n)
}

// charge charges element i, which owner holds in state s and which has no
// charge, to q's account, unless the account holds q.Max elements already
// (as.capped). Errors: as.capped, ErrLockTimeout, errLost.
func (as *accounts) charge(i int, s uint64, q Quota, owner uint64, wait time.Duration) error {
	if err := as.lock(q.Account, owner, wait); err != nil {
		return err
	}
	defer as.unlock(q.Account, owner)
	if atomic.LoadUint64(as.state(i)) != s {
		return errLost // reaped meanwhile: the sweep owns the element now
	}
	acc := &as.a[q.Account]
	if q.Max > 0 && atomic.LoadUint64(&acc.held) >= uint64(q.Max) {
		return as.capped
	}
	atomic.AddUint64(&acc.held, 1)
	if testHook != nil {
		testHook("charged")
	}
	atomic.StoreUint64(as.word(i), q.charge())
	return nil
}

// uncharge clears element i's charge, if it has one, while the element is
// in state s (held by owner, or by a dead owner that owner releases).
// With wait 0 it does not wait for a live holder of the account's lock
// (ErrLockTimeout). Errors: ErrLockTimeout, errLost.
func (as *accounts) uncharge(i int, s uint64, owner uint64, wait time.Duration) error {
	v := atomic.LoadUint64(as.word(i))
	if v == 0 {
		return nil
	}
	a := uint16(v - 1)
	if err := as.lock(a, owner, wait); err != nil {
		return err
	}
	defer as.unlock(a, owner)
	// Another releaser of a dead owner's element may have been first, and
	// a claimer may have charged it again since: only the one who finds
	// the element as it was, charged to a, clears the charge.
	if atomic.LoadUint64(as.state(i)) != s {
		return errLost
	}
	if atomic.LoadUint64(as.word(i)) != v {
		return nil
	}
	atomic.StoreUint64(as.word(i), 0)
	if testHook != nil {
		testHook("uncharged")
	}
	atomic.AddUint64(&as.a[a].held, ^uint64(0))
	return nil
}

// move moves the charge of element i, which owner holds in state busy,
// to q's account (q nil: to none): nothing to do when it is charged to it
// already. Errors: as charge and uncharge.
func (as *accounts) move(i int, busy uint64, q *Quota, owner uint64, wait time.Duration) error {
	old, want := atomic.LoadUint64(as.word(i)), uint64(0)
	if q != nil {
		want = q.charge()
	}
	if old == want {
		return nil
	}
	if old != 0 {
		if err := as.uncharge(i, busy, owner, wait); err != nil {
			return err
		}
	}
	if q == nil {
		return nil
	}
	return as.charge(i, busy, *q, owner, wait)
}

// drop clears element i's charge outright, for a table that no other
// process uses (Place).
func (as *accounts) drop(i int) {
	if old := atomic.LoadUint64(as.word(i)); old != 0 {
		atomic.StoreUint64(as.word(i), 0)
		atomic.AddUint64(&as.a[uint16(old-1)].held, ^uint64(0))
	}
}

// place charges element i to account a for a table that no other process
// uses (persistence placing entries before any worker starts).
func (as *accounts) place(i int, a uint16) {
	atomic.StoreUint64(as.word(i), uint64(a)+1)
	atomic.AddUint64(&as.a[a].held, 1)
}

// rebuild counts every account again and frees every account lock: for a
// region that no process uses (a live region re-attached after its whole
// process tree died).
func (as *accounts) rebuild() {
	for a := range as.a {
		atomic.StoreUint64(&as.a[a].lock, 0)
		atomic.StoreUint64(&as.a[a].held, 0)
	}
	for i := 0; i < as.n; i++ {
		if v := atomic.LoadUint64(as.word(i)); v != 0 {
			atomic.AddUint64(&as.a[uint16(v-1)].held, 1)
		}
	}
}

// releaseStale takes every account lock left by a dead owner, recounts
// the account and frees the lock. It returns how many it released.
func (as *accounts) releaseStale() (n int) {
	for a := range as.a {
		if l := atomic.LoadUint64(&as.a[a].lock); l != 0 && as.r.stale(l) {
			if as.lock(uint16(a), sweeperID, 0) == nil {
				as.unlock(uint16(a), sweeperID)
				n++
			}
		}
	}
	return n
}

// sweepRange returns the elements a sweep of account a visits now, or
// ok false when the account was swept less than sweepEvery ago.
func (as *accounts) sweepRange(a uint16) (from, n int, ok bool) {
	acc := &as.a[a]
	now := nanotime()
	at := atomic.LoadUint64(&acc.sweepAt)
	if now < int64(at) || !atomic.CompareAndSwapUint64(&acc.sweepAt, at, uint64(now+int64(sweepEvery))) {
		return 0, 0, false
	}
	n = min(sweepBudget, as.n)
	from = int(atomic.AddUint64(&acc.cursor, uint64(n)) - uint64(n))
	return from % as.n, n, true
}

// verify walks the table: every account's count must equal the number of
// elements charged to it, every charged element must be one that holds a
// key (held), and no account may be locked.
func (as *accounts) verify(held func(i int) bool) error {
	walk := make([]uint64, numAccounts)
	for i := 0; i < as.n; i++ {
		v := atomic.LoadUint64(as.word(i))
		if v == 0 {
			continue
		}
		if !held(i) {
			return fmt.Errorf("shm: element %d (state %#x) is charged to account %d but holds no key", i, atomic.LoadUint64(as.state(i)), v-1)
		}
		walk[v-1]++
	}
	for a := range as.a {
		if got := atomic.LoadUint64(&as.a[a].held); got != walk[a] {
			return fmt.Errorf("shm: account %d counts %d, the table holds %d", a, got, walk[a])
		}
		if l := atomic.LoadUint64(&as.a[a].lock); l != 0 {
			return fmt.Errorf("shm: account %d is locked by %#x", a, l)
		}
	}
	return nil
}

// VerifyAccounts walks the table and reports the first account whose count
// differs from the LIVE slots charged to it, a charge on a slot that holds
// no key, or an account left locked: none when nothing is in flight (a
// region no process uses, a test at rest). For inspection and tests; it
// costs a walk of the table.
func (c *Counters) VerifyAccounts() error {
	return c.acc.verify(func(i int) bool { return phaseOf(atomic.LoadUint64(&c.slots[i].state)) == phaseLive })
}

// VerifyAccounts is Counters.VerifyAccounts for the records reserved or
// completed (expired or not), in both sets of accounts: the clients' and
// their addresses'.
func (t *Responses) VerifyAccounts() error {
	if len(t.recs) == 0 {
		return nil
	}
	held := func(i int) bool {
		p := recPhase(atomic.LoadUint64(&t.recs[i].state))
		return p == recReserved || p == recComplete
	}
	if err := t.acc.verify(held); err != nil {
		return err
	}
	if err := t.addr.verify(held); err != nil {
		return fmt.Errorf("%w (address accounts)", err)
	}
	return nil
}

package persist

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
)

// Accounts are not in a dump: a load charges each restored counter to the
// account of its rule now (a tier's to its rule's), and each stored
// response to the accounts it was dumped with (its client's, and its
// client address's when it had one), so that every count equals a walk of
// the restored table, and a live region migrated to another size keeps
// them too.
func TestLoadCountsAccounts(t *testing.T) {
	tier := bucket.Rule{Name: "api\x00key\x00gold", Group: "api", Limit: 50, Window: time.Minute, Algorithm: bucket.FixedWindow}
	rules := []bucket.Rule{login, api, tier}
	src, err := shm.CreatePrivate(shm.Options{Counters: 1024, MaxWorkers: 8, Responses: 256, ResponseBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	src.SetNow(t1)
	ll, la, lt := limiter(t, src, login), limiter(t, src, api), limiter(t, src, tier)
	for i := range 30 {
		ll.Allow(fmt.Sprint("c", i), t1)
		la.Allow(fmt.Sprint("c", i), t1)
		if i < 10 {
			lt.Allow(fmt.Sprint("gold", i), t1)
		}
	}
	var scratch shm.Response
	for i := range 20 {
		q := shm.Quota{Account: uint16(100 + i%3)}
		addr := shm.Quota{Account: uint16(300 + i%2), Max: 100}
		if i%5 == 0 {
			addr = shm.Quota{} // no address known
		}
		_, tk, err := src.Responses().Begin(src.Counters().KeyOf(1, []byte(fmt.Sprint("k", i))), q, addr, fp1, t1, &scratch)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := src.Responses().Complete(tk, &created, t1, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "dump")
	dumpTo(t, src, Options{Path: path, Rules: rules, Now: wallAt(wall0)})

	dst, err := shm.CreatePrivate(shm.Options{Counters: 2048, MaxWorkers: 8, Responses: 512, ResponseBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Load(dst, Options{Path: path, Rules: rules, Now: wallAt(wall0.Add(time.Second))}, quiet)
	if err != nil || rep.Counters != 70 || rep.Responses != 20 {
		t.Fatalf("%+v %v", rep, err)
	}
	check := func(what string, r *shm.Region) {
		t.Helper()
		if err := r.Counters().VerifyAccounts(); err != nil {
			t.Fatal(what, err)
		}
		if err := r.Responses().VerifyAccounts(); err != nil {
			t.Fatal(what, err)
		}
		c := r.Counters()
		if c.Held(login.Account()) != 30 || c.Held(api.Account()) != 40 {
			t.Fatalf("%s: login holds %d, api (with its tier) %d; want 30, 40", what, c.Held(login.Account()), c.Held(api.Account()))
		}
		if n := r.Responses().Held(100) + r.Responses().Held(101) + r.Responses().Held(102); n != 20 || r.Responses().Held(101) != 7 {
			t.Fatalf("%s: records held %d (account 101: %d)", what, n, r.Responses().Held(101))
		}
		if a, b := r.Responses().AddrHeld(300), r.Responses().AddrHeld(301); a != 8 || b != 8 {
			t.Fatalf("%s: the addresses hold %d and %d records, want 8 and 8", what, a, b)
		}
	}
	check("loaded", dst)
}

// A stored response's client-address account travels in the high bits of
// its flags, which builds before address accounts wrote as 0 and read
// past: their records load with no address account.
func TestRecordAddrAccount(t *testing.T) {
	for _, e := range []shm.StoredEntry{
		{Account: 7, AddrAccount: 0xfffe, HasAddrAccount: true, Response: created},
		{Account: 7, AddrAccount: 0, HasAddrAccount: true, Unreplayable: true},
		{Account: 9},
	} {
		b := appendRecord(nil, &e)
		got, rest, ok := nextRecord(b)
		if !ok || len(rest) != 0 || got.Account != e.Account || got.AddrAccount != e.AddrAccount ||
			got.HasAddrAccount != e.HasAddrAccount || got.Unreplayable != e.Unreplayable {
			t.Errorf("%+v came back as %+v", e, got)
		}
		if !e.HasAddrAccount && binary.LittleEndian.Uint32(b[56:]) != 0 {
			t.Errorf("a record without an address account has flags %#x, as older builds never wrote", binary.LittleEndian.Uint32(b[56:]))
		}
	}
}

package persist

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
)

// Accounts are not in a dump: a load charges each restored counter to the
// account of its rule now (a tier's to its rule's), and each stored
// response to the account it was dumped with, so that every count equals
// a walk of the restored table, and a live region migrated to another
// size keeps them too.
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
		_, tk, err := src.Responses().Begin(src.Counters().KeyOf(1, []byte(fmt.Sprint("k", i))), q, fp1, t1, &scratch)
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
	}
	check("loaded", dst)
}

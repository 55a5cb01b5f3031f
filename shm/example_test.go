package shm_test

import (
	"fmt"
	"log"
	"os"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// One region, mapped twice as two worker processes would map it (the
// second from the region's file, which a worker inherits): a count that
// one updates with a CAS, the other sees and goes on with.
func ExampleRegion() {
	region, err := shm.Create(shm.Options{Counters: 1024, MaxWorkers: 2})
	if err != nil {
		log.Fatal(err)
	}
	defer region.Close()
	dup, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", region.File().Fd()), os.O_RDWR, 0)
	if err != nil {
		log.Fatal(err)
	}
	other, err := shm.Attach(dup) // another process would attach its inherited descriptor
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close()
	if err := region.Join(0); err != nil {
		log.Fatal(err)
	}
	if err := other.Join(1); err != nil {
		log.Fatal(err)
	}

	const ns = 0x5e // the namespace of this kind of key
	incr := func(r *shm.Region) uint64 {
		k := r.Counters().KeyOfString(ns, "visits")
		old, err := r.Counters().Update(k, shm.Quota{}, 0, time.Second, func(p uint64, _ time.Duration) (uint64, bool) {
			return p + 1, true
		})
		if err != nil {
			log.Fatal(err)
		}
		return old + 1
	}
	fmt.Println(incr(region), incr(other), incr(region))
	// Output: 1 2 3
}

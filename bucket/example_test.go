package bucket_test

import (
	"fmt"
	"log"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
)

// A rule of 3 requests a minute, decided on a shared counter table at
// instants given by hand: the fourth request is refused, and told when
// it may come back; a minute's allowance refills at one request every
// 20 seconds.
func ExampleLimiter() {
	region, err := shm.Create(shm.Options{Counters: 1024, MaxWorkers: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer region.Close()
	if err := region.Join(0); err != nil { // as a worker process would
		log.Fatal(err)
	}
	lim, err := bucket.NewLimiter(bucket.Rule{Name: "login", Limit: 3, Window: time.Minute}, region.Counters())
	if err != nil {
		log.Fatal(err)
	}
	now := time.Hour // region time: shm.Region.Now in a real program
	for i := range 4 {
		d := lim.Allow("ip:192.0.2.1", now)
		fmt.Printf("request %d: allowed %v, remaining %d, retry after %v\n", i+1, d.Allowed, d.Remaining, d.RetryAfter)
	}
	d := lim.Allow("ip:192.0.2.1", now+20*time.Second)
	fmt.Printf("20s later: allowed %v\n", d.Allowed)
	// Output:
	// request 1: allowed true, remaining 2, retry after 0s
	// request 2: allowed true, remaining 1, retry after 0s
	// request 3: allowed true, remaining 0, retry after 0s
	// request 4: allowed false, remaining 0, retry after 20s
	// 20s later: allowed true
}

package prefork

import (
	"reflect"
	"time"
)

// Status is a snapshot of the supervisor, for an admin endpoint or a test.
type Status struct {
	// Generation counts the accepted reloads: 0 at start.
	Generation int
	// Ready: every worker slot runs a ready worker of the running
	// configuration (false while starting, reloading or draining).
	Ready    bool
	Draining bool
	// Workers are the worker processes not yet reaped, by pid; during a
	// reload, or a drain, there may be more than Server.Workers.
	Workers []WorkerStatus
	// Canary is the canary being judged (Verdict ""), else the last
	// canary's verdict; nil before the first canary reload.
	Canary *CanaryStatus
	// Quarantined are the slots an aborted reload's canary left empty, in
	// order: the fleet runs that many workers short until a reload
	// succeeds.
	Quarantined []int
	// Recycled counts the workers replaced for server.max_requests or
	// server.max_rss.
	Recycled int
}

// WorkerStatus is one worker process.
type WorkerStatus struct {
	PID        int
	Index      int // region worker index
	Slot       int // the place it fills (0..Server.Workers-1)
	Generation int // the configuration it runs
	Started    time.Time
	Ready      bool // reported ready
	Retiring   bool // told to drain (reload or shutdown)
}

// status takes the snapshot.
func (s *supervisor) status() Status {
	st := Status{Generation: s.gen, Draining: s.draining, Ready: !s.draining && s.announced && !s.reloading, Recycled: s.recycled}
	for _, p := range s.sortedProcs() {
		st.Workers = append(st.Workers, WorkerStatus{
			PID: p.pid, Index: p.index, Slot: p.slot, Generation: p.gen, Started: p.start, Ready: p.ready, Retiring: p.retiring,
		})
	}
	if s.canary != nil {
		c := s.canaryStatus()
		st.Canary = &c
	} else if s.verdict != nil {
		v := *s.verdict
		st.Canary = &v
	}
	for i, sl := range s.slots {
		if sl.quarantined {
			st.Quarantined = append(st.Quarantined, i)
		}
	}
	return st
}

// publish hands the snapshot to the OnStatus hook when it changed.
func (s *supervisor) publish() {
	if s.onStatus == nil {
		return
	}
	st := s.status()
	if s.published != nil && reflect.DeepEqual(st, *s.published) {
		return
	}
	s.published = &st
	s.onStatus(st)
}

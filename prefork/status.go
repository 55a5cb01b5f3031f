package prefork

import (
	"slices"
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
}

// WorkerStatus is one worker process.
type WorkerStatus struct {
	PID        int
	Index      int // region worker index
	Generation int // the configuration it runs
	Started    time.Time
	Ready      bool // reported ready
	Retiring   bool // told to drain (reload or shutdown)
}

// status takes the snapshot.
func (s *supervisor) status() Status {
	st := Status{Generation: s.gen, Draining: s.draining, Ready: !s.draining && s.announced && !s.reloading}
	for _, p := range s.sortedProcs() {
		st.Workers = append(st.Workers, WorkerStatus{
			PID: p.pid, Index: p.index, Generation: p.gen, Started: p.start, Ready: p.ready, Retiring: p.retiring,
		})
	}
	return st
}

// publish hands the snapshot to the OnStatus hook when it changed.
func (s *supervisor) publish() {
	if s.onStatus == nil {
		return
	}
	st := s.status()
	if s.published != nil && st.Generation == s.published.Generation && st.Ready == s.published.Ready &&
		st.Draining == s.published.Draining && slices.Equal(st.Workers, s.published.Workers) {
		return
	}
	s.published = &st
	s.onStatus(st)
}

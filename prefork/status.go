package prefork

import (
	"reflect"
	"time"
)

// Status is a snapshot of the supervisor, for an admin endpoint or a test.
type Status struct {
	// Generation numbers the running configuration: 0 at start, the next
	// one at each accepted reload, the last good one again after a reload
	// is aborted (Reloads counts the reloads). While a canary is judged
	// it is the configuration the other workers serve, until the canary
	// passes: Canary.Generation is the canary's.
	Generation int
	// Settings are the running settings (with defaults), the ones
	// workers of Generation run; Settings.Config is the program's
	// configuration they come from.
	Settings Settings
	// Ready: every worker slot runs a ready worker of the running
	// configuration (false while starting, reloading or draining, and
	// while a crashed worker's slot waits for its replacement; started
	// by a binary upgrade, until the old supervisor made this one the
	// main process, once its workers stopped accepting).
	Ready bool
	// Serving is what a load balancer's readiness check wants: every slot
	// had a ready worker once (READY=1 was sent), no drain has begun, and
	// a ready worker serves now. It stays true during a reload, whose old
	// workers serve until their successors are ready, and while a crashed
	// worker is replaced beside others that serve.
	Serving  bool
	Draining bool
	// Workers are the worker processes not yet reaped, by pid; during a
	// reload, or a drain, there may be more than Options.Workers.
	Workers []WorkerStatus
	// Canary is the canary being judged (Verdict ""), else the last
	// canary's verdict; nil before the first canary reload.
	Canary *CanaryStatus
	// Quarantined are the slots an aborted reload's canary left empty, in
	// order: the fleet runs that many workers short until a reload
	// succeeds, or no other worker serves.
	Quarantined []int
	// Recycled counts the workers replaced for server.max_requests or
	// server.max_rss.
	Recycled int
	// Crashes counts the workers that exited without being asked to (and
	// the ones killed for not becoming ready in time): each is replaced.
	Crashes int
	// Reloads says how the reloads went.
	Reloads ReloadStatus
}

// ReloadStatus counts the reloads (HUP) and says how the last one went.
type ReloadStatus struct {
	Accepted int // configurations taken (each bumped the generation)
	// Refused counts the reloads refused: a configuration that did not
	// load or validate, or a HUP during an upgrade or a drain.
	Refused int
	// Aborted counts the accepted reloads that were aborted, the running
	// configuration kept: by their canary's verdict, or because a worker
	// of the new configuration could not start or become ready.
	Aborted int
	// Last is when the last reload was asked for (zero: never); LastError
	// is why it was refused or aborted (the log line), "" when it was
	// accepted and not aborted (yet: it may still be under way).
	Last      time.Time
	LastError string
}

// WorkerStatus is one worker process.
type WorkerStatus struct {
	PID        int
	Index      int // region worker index
	Slot       int // the place it fills (0..Options.Workers-1)
	Generation int // the configuration it runs
	Started    time.Time
	Ready      bool // reported ready
	Retiring   bool // told to drain (reload or shutdown)
}

// State names the worker's phase for people: "starting" (not yet ready),
// "ready" or "retiring".
func (w WorkerStatus) State() string {
	switch {
	case w.Retiring:
		return "retiring"
	case w.Ready:
		return "ready"
	}
	return "starting"
}

// status takes the snapshot.
func (s *supervisor) status() Status {
	running := &generation{s.gen, s.cfg}
	if s.canary != nil {
		running = &s.good // the reload is on trial: the fleet's stands
	}
	st := Status{
		Generation: running.gen, Settings: running.cfg, Draining: s.draining,
		Ready:   !s.draining && s.announced && !s.reloading && !s.notifyHeld && s.filled(),
		Crashes: s.crashes, Reloads: s.reloads, Recycled: s.recycled,
	}
	for _, p := range s.sortedProcs() {
		st.Workers = append(st.Workers, WorkerStatus{
			PID: p.pid, Index: p.index, Slot: p.slot, Generation: p.gen, Started: p.start, Ready: p.ready, Retiring: p.retiring,
		})
		if p.ready && !p.retiring {
			st.Serving = true
		}
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
	st.Serving = st.Serving && s.announced && !s.draining
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

package prefork

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// A canary reload (README, "Safe deploys"). On HUP, the first worker replaced is the
// canary: it runs the new configuration (and binary) while every other
// worker runs the last good one. Once it is ready, it takes its slot's
// place (its predecessor retires) and is watched for canary_window: the
// requests and 5xx it sent over the window are compared with those of
// every other worker over the same window (judge). Then:
//
//   - healthy, or inconclusive with canary_inconclusive = "continue": the
//     new configuration becomes the good one and the roll goes on, one
//     slot at a time;
//   - unhealthy, or inconclusive with "abort": the reload is aborted. The
//     canary drains; its slot stays empty (quarantined), since a new
//     worker there would run what was just judged bad; the supervisor
//     returns to the good configuration, which every other worker still
//     runs. The next reload's canary takes a quarantined slot first, and
//     the next reload that succeeds fills every quarantined slot;
//   - a canary that cannot start, exits, or is killed for not becoming
//     ready fails: the reload is aborted at once, and it is never
//     respawned.
//
// The fleet never goes below one worker: when no other slot has a ready
// worker, the canary's predecessor keeps serving beside it until the
// verdict (and stays if the reload is aborted), and an aborted canary's
// slot is filled again with the good configuration instead of being
// quarantined, as is a quarantined slot once no other worker serves.

// canaryRun is the canary of the reload in progress.
type canaryRun struct {
	gen      int
	settings Canary // of the configuration being judged
	proc     *proc  // nil until it is started
	slot     int
	open     bool      // ready: the window runs
	started  time.Time // start of the window
	end      time.Time // end of the window
	// The canary's and every index's counts at the start of the window.
	startCanary, startFleet RequestCounts
}

// CanaryStatus is a reload's canary, as Status reports it: the one being
// judged (Verdict ""), or the last verdict.
type CanaryStatus struct {
	Generation int // the configuration it ran
	Slot       int
	PID        int // 0 when it could not be started
	// Verdict is "" while the window runs.
	Verdict Verdict
	// Aborted: the reload was aborted (unhealthy, failed, or inconclusive
	// with canary_inconclusive = "abort").
	Aborted bool
	// Canary and Fleet are what the canary and every other worker sent
	// over the window: requests and 5xx.
	Canary, Fleet RequestCounts
	// PValue is the one-sided p-value of the canary's 5xx rate being above
	// the fleet's, by Test ("fisher" or "z"); 1 and "" when no test was
	// made (inconclusive, failed).
	PValue float64
	Test   string
	// Summary is the log line that gave the verdict.
	Summary string
	// Started is when its window began (zero if it never became ready);
	// Ends when it ends, or ended.
	Started, Ends time.Time
}

// isCanary reports whether p is the canary being judged.
func (s *supervisor) isCanary(p *proc) bool {
	return p != nil && s.canary != nil && s.canary.proc == p
}

// startCanary starts the canary of the reload in progress: in the first
// quarantined slot, else in the first slot that runs another generation.
func (s *supervisor) startCanary() {
	c := s.canary
	i := slices.IndexFunc(s.slots, func(sl slot) bool { return sl.quarantined && sl.cur == nil && sl.succ == nil })
	if i < 0 {
		i = slices.IndexFunc(s.slots, func(sl slot) bool { return sl.cur != nil && sl.cur.gen != s.gen })
	}
	if i < 0 {
		return // every slot is empty, waiting for a respawn
	}
	c.slot = i
	p, err := s.spawn(i, generation{s.gen, s.cfg})
	switch {
	case err != nil:
		s.failCanary("could not be started: " + err.Error())
	case p != nil:
		c.proc = p
		s.slots[i].succ = p
		s.log.Info("canary started", "pid", p.pid, "slot", i, "generation", s.gen, "window", c.settings.Window)
	}
}

// canaryReady opens the canary's window. The canary takes its slot's place
// unless no other slot has a ready worker: then its predecessor keeps
// serving beside it until the verdict.
func (s *supervisor) canaryReady() {
	c := s.canary
	now := s.env.now()
	c.open, c.started, c.end = true, now, now.Add(c.settings.Window)
	c.startCanary = s.env.requests(c.proc.index)
	c.startFleet = s.env.fleetRequests(c.proc.index)
	beside := !s.othersReady(c.slot)
	if !beside {
		s.promote(&s.slots[c.slot])
		// The slot serves again: an earlier abort's quarantine is over
		// (an abort that empties it sets it again).
		s.slots[c.slot].quarantined = false
	}
	s.log.Info("canary ready: judging it", "pid", c.proc.pid, "slot", c.slot, "generation", c.gen,
		"window", c.settings.Window, "beside_predecessor", beside)
}

// othersReady reports whether a slot other than i has a ready worker that
// does not retire.
func (s *supervisor) othersReady(i int) bool {
	for j, sl := range s.slots {
		if j != i && sl.cur != nil && sl.cur.ready && !sl.cur.retiring {
			return true
		}
	}
	return false
}

// judgeCanary gives the verdict at the end of the window.
func (s *supervisor) judgeCanary() {
	c := s.canary
	canary := s.env.requests(c.proc.index).Sub(c.startCanary)
	fleet := s.env.fleetRequests(c.proc.index).Sub(c.startFleet)
	j := judge(canary, fleet, c.settings.MinRequests, c.settings.MaxErrorDelta)
	st := s.canaryStatus()
	st.Verdict, st.Canary, st.Fleet, st.PValue, st.Test = j.verdict, canary, fleet, j.pValue, j.test
	st.Ends = s.env.now()

	rates := fmt.Sprintf("5xx %s vs fleet %s, allowed +%.1f points",
		ratio(canary, j.canaryRate), ratio(fleet, j.fleetRate), c.settings.MaxErrorDelta)
	var what string
	switch j.verdict {
	case VerdictInconclusive:
		if canary.Requests < uint64(c.settings.MinRequests) {
			what = fmt.Sprintf("canary inconclusive: %d requests, fewer than canary_min_requests %d; %s",
				canary.Requests, c.settings.MinRequests, rates)
		} else if fleet.Requests == 0 {
			what = fmt.Sprintf("canary inconclusive: the fleet served no request to compare with; %s", rates)
		} else {
			what = fmt.Sprintf("canary inconclusive: the fleet served %d requests, too few for any canary to be judged worse; %s", fleet.Requests, rates)
		}
	case VerdictHealthy:
		what = "canary healthy: " + rates
		if j.overDelta(c.settings.MaxErrorDelta) {
			what += fmt.Sprintf(", above it but not significantly (p=%.2g)", j.pValue)
		}
	default:
		what = "canary unhealthy: " + rates
	}
	attrs := []any{"verdict", j.verdict, "generation", c.gen, "slot", c.slot, "pid", c.proc.pid,
		"canary_requests", canary.Requests, "canary_5xx", canary.Errors,
		"fleet_requests", fleet.Requests, "fleet_5xx", fleet.Errors, "p_value", j.pValue, "test", j.test}
	if j.verdict == VerdictUnhealthy ||
		j.verdict == VerdictInconclusive && c.settings.Inconclusive == InconclusiveAbort {
		s.abortCanary(st, what, attrs)
		return
	}
	s.passCanary(st, what, attrs)
}

// ratio formats a rate with its counts: "63.4% (71/112)".
func ratio(c RequestCounts, r float64) string {
	return fmt.Sprintf("%.1f%% (%d/%d)", r*100, c.Errors, c.Requests)
}

// passCanary makes the canary's configuration the good one; the roll goes on.
func (s *supervisor) passCanary(st CanaryStatus, what string, attrs []any) {
	c := s.canary
	if sl := &s.slots[c.slot]; sl.succ == c.proc { // it served beside its predecessor
		s.promote(sl)
	}
	s.good = generation{s.gen, s.cfg}
	s.canary = nil
	s.clearQuarantine()
	st.Summary = what + "; reload continues"
	s.verdict = &st
	level := slog.LevelInfo
	if st.Verdict != VerdictHealthy {
		level = slog.LevelWarn // inconclusive: said loudly
	}
	s.publish() // before the line, as at "ready": /status then shows the verdict
	s.log.Log(context.Background(), level, st.Summary, attrs...)
}

// failCanary aborts the reload for a canary that could not start, exited
// or never became ready.
func (s *supervisor) failCanary(why string) {
	st := s.canaryStatus()
	st.Verdict, st.Ends = VerdictFailed, s.env.now()
	s.abortCanary(st, "canary failed: "+why, []any{"verdict", VerdictFailed, "generation", s.canary.gen, "slot", s.canary.slot})
}

// abortCanary drains the canary, takes its slot out of service (or
// leaves it to the predecessor that still serves there) and returns to
// the good configuration, which the other workers run (abortReload).
func (s *supervisor) abortCanary(st CanaryStatus, what string, attrs []any) {
	c := s.canary
	s.abortReload(c.slot, c.proc, what, attrs, &st)
}

// supersedeCanary drops the canary of a reload that a newer one replaces
// before its verdict. A canary that already took its slot stays, as a
// worker of an older generation that the new roll replaces; one that
// serves beside its predecessor, or is not ready yet, retires.
func (s *supervisor) supersedeCanary() {
	c := s.canary
	s.canary = nil
	if c.proc == nil {
		return
	}
	if sl := &s.slots[c.slot]; sl.succ == c.proc {
		sl.succ = nil
		s.retire(c.proc, c.proc.drainBy(s.env.now()))
	}
	s.log.Warn("canary superseded by a newer reload", "pid", c.proc.pid, "generation", c.gen)
}

// clearQuarantine returns every quarantined slot to service: the step
// that follows fills them.
func (s *supervisor) clearQuarantine() {
	for i := range s.slots {
		s.slots[i].quarantined = false
	}
}

// canaryStatus describes the canary being judged.
func (s *supervisor) canaryStatus() CanaryStatus {
	c := s.canary
	st := CanaryStatus{Generation: c.gen, Slot: c.slot, PValue: 1, Started: c.started, Ends: c.end}
	if c.proc != nil {
		st.PID = c.proc.pid
	}
	return st
}

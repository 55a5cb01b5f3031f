package prefork

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// An aborted reload (README, "Safe deploys"). A reload's configuration
// fails in one slot: its canary was judged bad or failed (canary.go), or,
// with the canary off, a worker of it could not start, exited before it
// was ready, or was killed for not becoming ready in time. The reload is
// then aborted the same way: that worker is never respawned (it would run
// the same build and configuration), the supervisor returns to the good
// configuration, the last one every worker ran, and the reload ends.
//
// Without a canary, every worker of the new configuration is on trial
// until every slot runs it: then, and not at the first ready one, it is
// the good one. Slots the roll had already replaced go back to the good
// configuration, one at a time, new ready before old leaves, as the
// leftovers of a superseded reload do after a canary's abort: one
// configuration runs after a reload, the one the log and Status name.
// Nothing is quarantined without a canary: the failed worker's
// predecessor still serves its slot (it leaves only for a ready
// successor), and a slot left empty (its predecessor crashed meanwhile)
// is filled again with the good configuration.

// onTrial reports whether a worker of generation gen that fails to become
// ready fails the reload: with the canary off, one of the reload's
// configuration until every slot runs it (checkReady makes it the good
// one then). A canary's failure is the canary's (failCanary).
func (s *supervisor) onTrial(gen int) bool {
	return s.canary == nil && s.announced && !s.draining && gen == s.gen && gen != s.good.gen
}

// failReload aborts a reload without a canary whose worker p in slot i
// (nil when it could not be started) failed for the reason why.
func (s *supervisor) failReload(i int, p *proc, why string) {
	attrs := []any{"generation", s.gen, "slot", i, "running_generation", s.good.gen}
	if p != nil {
		attrs = append(attrs, "pid", p.pid)
	}
	s.abortReload(i, p, fmt.Sprintf("reload failed: a worker of generation %d in slot %d %s", s.gen, i, why), attrs, nil)
}

// abortReload aborts the reload whose configuration failed in slot i with
// its worker p (nil when none was started), for what (the log line's
// start); canary is the canary's verdict, nil without one. p drains, but
// for a canary that is the one worker left serving; the slot stays with
// the predecessor that still serves there, else it is quarantined (a
// canary's, beside other ready workers) or filled again.
func (s *supervisor) abortReload(i int, p *proc, what string, attrs []any, canary *CanaryStatus) {
	sl := &s.slots[i]
	// A canary that took its slot and is the one worker left serving
	// (the others crashed and are not ready again) keeps serving until a
	// worker of the good generation replaces it, as the roll replaces any
	// worker of another generation.
	keep := p != nil && p == sl.cur && s.procs[p.pid] == p && p.ready && !p.retiring && !s.othersReady(i)
	if p != nil && !keep {
		switch p {
		case sl.succ:
			sl.succ = nil
		case sl.cur:
			sl.cur = nil
		}
		if s.procs[p.pid] == p { // not exited yet
			s.retire(p, p.drainBy(s.env.now()))
		}
	}
	var fate string
	switch {
	case keep:
		fate = fmt.Sprintf("slot %d keeps the canary until a worker of generation %d replaces it: the fleet never goes below one worker", i, s.good.gen)
	case sl.cur != nil:
		fate = fmt.Sprintf("slot %d keeps generation %d", i, sl.cur.gen)
	case canary != nil && s.othersReady(i):
		sl.quarantined = true
		fate = fmt.Sprintf("slot %d quarantined", i)
	default:
		sl.quarantined = false
		fate = fmt.Sprintf("slot %d refilled with generation %d", i, s.good.gen)
		if canary != nil {
			sl.respawnAt = time.Time{}
			fate += ": the fleet never goes below one worker"
		}
		// Without one, after the backoff of a start that failed, if
		// that was the failure: step, run at its end, fills the slot.
	}
	// The slots a roll already replaced (or a superseded reload left)
	// are replaced again by step, with the good configuration.
	var back []string
	for j, o := range s.slots {
		if j != i && o.cur != nil && o.cur.gen != s.good.gen {
			back = append(back, strconv.Itoa(j))
		}
	}
	switch len(back) {
	case 0:
	case 1:
		fate += fmt.Sprintf("; slot %s goes back to generation %d", back[0], s.good.gen)
	default:
		fate += fmt.Sprintf("; slots %s go back to generation %d, one at a time", strings.Join(back, ", "), s.good.gen)
	}
	s.gen, s.cfg = s.good.gen, s.good.cfg
	if s.onConfig != nil {
		s.onConfig(s.cfg) // the aborted configuration's settings (its log) no longer apply
	}
	s.canary = nil
	summary := what + "; reload aborted, " + fate
	s.reloads.Aborted++
	s.reloads.LastError = summary
	if canary != nil {
		canary.Aborted, canary.Summary = true, summary
		s.verdict = canary
	}
	s.publish() // before the line, as at "ready": /status then shows the outcome
	s.log.Error(summary, attrs...)
	// systemd waits for READY=1 after RELOADING=1, whatever the outcome.
	// The reload ends as one that finished does (checkReady): once every
	// slot runs the good configuration again (a roll, or a reload this one
	// superseded, may have replaced some) and every worker told to drain,
	// the failed one first, stopped accepting; until then a client that
	// connects may still get the configuration that failed. This line is
	// the reload's one record: its end is logged at debug level only.
	s.reloading, s.aborted = true, true
}

package prefork

import (
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"
)

// The supervisor's side of the binary upgrade (upgrade.go has the
// protocol): the old supervisor starts the new one on USR2 and hands over
// once it is ready; the new one waits to be the main process and for the
// old one's workers to be gone.

// startUpgrade starts a new supervisor from the program's file on disk
// (USR2), unless something else is under way.
func (s *supervisor) startUpgrade() {
	why := ""
	switch {
	case s.draining:
		why = "draining"
	case s.up != nil:
		why = "an upgrade is under way"
	case s.reloading || s.canary != nil:
		why = "a reload is under way"
	case s.notifyHeld || len(s.oldIndexes) > 0:
		why = "the previous upgrade has not finished (its old supervisor still runs)"
	case s.orphans > 0:
		// Its indexes are held until reaped: a new supervisor now would
		// find too few and ask for a restart.
		why = "the indexes of the failed upgrade's workers are not all reaped yet"
	case s.freeIndexes() < len(s.slots):
		// Workers a reload or a recycling replaced still drain: the new
		// supervisor would find too few indexes for its workers and
		// exit asking for a restart, when waiting is enough.
		why = "replaced workers still drain and hold the indexes the new supervisor's workers need (send USR2 again once they exited)"
	case !s.announced:
		why = "not ready yet"
	case s.env.upgrade == nil:
		why = "upgrades are not supported here"
	}
	if why != "" {
		s.log.Warn("upgrade refused", "why", why)
		return
	}
	var held []int
	for i, used := range s.inUse {
		if used {
			held = append(held, i)
		}
	}
	p, err := s.env.upgrade(held, s.gen) // no reload is under way: the workers run s.gen
	if err != nil {
		s.log.Error("upgrade failed: serving on", "err", err)
		return
	}
	s.up = &upgradeRun{proc: p, deadline: s.env.now().Add(s.cfg.UpgradeTimeout)}
	s.log.Info("upgrade begun: new supervisor started", "pid", p.pid, "upgrade_timeout", s.cfg.UpgradeTimeout)
}

// freeIndexes counts the region worker indexes no worker holds.
func (s *supervisor) freeIndexes() int {
	n := 0
	for _, used := range s.inUse {
		if !used {
			n++
		}
	}
	return n
}

// onUpgradeReady hands over to the new supervisor: this one drains its
// workers and exits, and the new one becomes the service's main process
// once they stopped accepting (handOver).
func (s *supervisor) onUpgradeReady(ev upgradeReadyEvent) {
	u := s.up
	if u == nil || u.proc.pid != ev.pid || u.killed || s.draining {
		return
	}
	u.ready = true
	s.handedOver = true // from here on, no word to systemd but the watchdog's until MAINPID=
	s.log.Info("upgrade: the new supervisor serves; draining the old workers", "new_pid", u.proc.pid)
	if s.onHandedOver != nil {
		s.onHandedOver()
	}
	s.beginDrain("upgraded", 0)
	s.handOver()
}

// handOver makes the new supervisor the service's main process (MAINPID=
// to systemd, msgMain to it, whose Status is ready only then) once every
// worker of this one said it accepts no more (stoppedEvent) or exited:
// until then a client that connects may be served by the old binary, and
// whoever waits for either would test it. The wait is bounded by the
// workers' kill at their drain deadline. Not if the new one exited.
func (s *supervisor) handOver() {
	u := s.up
	if u == nil || !u.ready || u.main || u.exited || u.killed {
		return
	}
	for _, p := range s.procs {
		if !p.stopped {
			return
		}
	}
	u.main = true
	if err := s.env.notify(fmt.Sprintf("MAINPID=%d", u.proc.pid)); err != nil {
		s.log.Warn("systemd notification failed", "err", err)
	}
	if err := u.proc.tell(msgMain); err != nil {
		s.log.Warn("telling the new supervisor it is the main process failed", "pid", u.proc.pid, "err", err)
	}
}

// onUpgradeExit handles the exit of the new supervisor: before it was
// made the main process, the upgrade failed, and the indexes its workers
// held are reaped once they are gone.
func (s *supervisor) onUpgradeExit(ev upgradeExitEvent) {
	u := s.up
	if u == nil || u.proc.pid != ev.pid {
		return
	}
	switch {
	case u.main:
		u.exited = true
		s.log.Warn("the new supervisor exited while this one drains", "pid", ev.pid, "status", ev.status)
		return
	case u.ready:
		// Gone before it was made the main process: nobody took the
		// region over, and this one, whose workers drain, cannot serve
		// on. It is still the main process: it finishes the region
		// (the dump); with an error, for a restart, unless it stopped
		// the new one itself (a stop during the handover).
		u.exited = true
		if !u.killed {
			s.handedOver = false
			s.fatal = errors.New("prefork: the new supervisor of the upgrade exited before the handover")
			s.log.Error("upgrade failed: the new supervisor exited after it was ready, before the handover; "+
				"this one drains, finishes and exits with an error", "pid", ev.pid, "status", ev.status)
			s.sendNotify(notifyStopping)
		}
	default:
		s.up = nil
		if !u.killed {
			s.log.Error("upgrade failed: the new supervisor exited before it was ready; serving on", "pid", ev.pid, "status", ev.status)
		}
	}
	var theirs []int
	for i, used := range s.inUse {
		if !used {
			theirs = append(theirs, i)
			s.inUse[i] = true // until reaped
		}
	}
	s.orphans += len(theirs)
	s.env.waitGone(theirs)
}

// abandonUpgrade stops the new supervisor for this one's drain.
func (s *supervisor) abandonUpgrade() {
	s.log.Info("upgrade abandoned: draining", "pid", s.up.proc.pid)
	s.killUpgrade()
}

// killUpgrade stops the new supervisor; its exit follows. With TERM
// first: its workers that are ready already serve on the shared socket,
// and finish what they serve (it neither dumps nor hands anything over,
// stopped before the handover). KILL follows when it has not exited
// within a drain (step), or at a second stop signal (killAll).
func (s *supervisor) killUpgrade() {
	u := s.up
	u.killed = true
	u.killAt = s.env.now().Add(s.cfg.DrainDelay).Add(s.cfg.ShutdownTimeout).Add(drainGrace) // a sum could wrap
	// Told first, that it wait for no handover once it said it is ready
	// (it may have, unread here): else it would, and this one for it.
	_ = u.proc.tell(msgAbandon) // it may be gone
	s.signalUpgrade(syscall.SIGTERM)
}

func (s *supervisor) signalUpgrade(sig syscall.Signal) {
	if err := s.up.proc.signal(sig); err != nil {
		s.log.Warn("signalling the new supervisor failed", "pid", s.up.proc.pid, "signal", sig.String(), "err", err)
	}
}

// onOrphan reaps an index that the other supervisor's worker held.
func (s *supervisor) onOrphan(ev orphanEvent) {
	if _, err := s.env.reap(ev.index); err != nil {
		s.log.Error("releasing a worker's slots failed", "index", ev.index, "err", err)
	}
	if i := slices.Index(s.oldIndexes, ev.index); i >= 0 {
		s.oldIndexes = slices.Delete(s.oldIndexes, i, i+1)
		if len(s.oldIndexes) == 0 {
			s.log.Info("upgrade finished: the old supervisor's workers are gone")
		}
	} else {
		s.orphans--
		if s.orphans == 0 {
			s.log.Info("upgrade abandoned: the new supervisor's workers are gone, their indexes reaped")
		}
	}
	s.inUse[ev.index] = false
}

// onMain: the old supervisor made this one the main process, or is gone.
func (s *supervisor) onMain(ev mainEvent) {
	if ev.abandoned {
		// A TERM follows: stopped, this one waits neither for a
		// handover nor for the old workers (finished).
		s.oldGivenUp = true
		return
	}
	if s.notifyHeld {
		s.notifyHeld = false
		s.publish() // ready now (status): before the line, as at "ready"
		s.log.Info("upgrade: this supervisor is the main process now")
		s.watchdogAt = time.Time{} // the pings held back: one now
		s.keepAlive()
	}
	if ev.gone && len(s.oldIndexes) > 0 {
		s.log.Info("upgrade: the old supervisor exited")
		s.env.waitGone(slices.Clone(s.oldIndexes))
	}
}

// inherit makes a supervisor started by an upgrade leave the old one's
// indexes alone until they are free, and hold its notifications until it
// is the main process.
func (s *supervisor) inherit(oldIndexes []int, gen int) {
	s.notifyHeld = true
	if gen >= 0 {
		// The new supervisor loaded the configuration again: one
		// generation more than the old one's, so that the numbers in
		// logs, process titles and Status go on across the upgrade.
		// A reload numbers on from it (lastGen), not from 0.
		s.gen = gen + 1
		s.good.gen, s.lastGen = s.gen, s.gen
	}
	for _, i := range oldIndexes {
		if i >= 0 && i < len(s.inUse) {
			s.inUse[i] = true
			s.oldIndexes = append(s.oldIndexes, i)
		}
	}
}

// regionLeft says why Options.Finish does not run once this supervisor
// has stopped, or is "" when it does. After a handover the new
// supervisor holds the region. Started by an upgrade and stopped before
// the old supervisor made this one the main process, the old one serves
// on and finishes the region in its time: a dump here would be older than
// the state it serves (and be loaded after a later crash), and an admin
// socket closed here would be the one it serves on.
func (s *supervisor) regionLeft() string {
	switch {
	case s.handedOver:
		return "upgrade: the old supervisor exits; the new one serves"
	case s.notifyHeld:
		return "upgrade: stopped before the old supervisor handed over; it serves on"
	}
	return ""
}

package prefork

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"syscall"
	"time"
)

// drainGrace is how long past Server.ShutdownTimeout the supervisor waits
// for a draining worker before it kills it. The worker bounds its drain
// by ShutdownTimeout; past it, an engine waits up to 2 s for what it cut
// to let go (a handler that ignores its request's end), Serve up to 1 s
// to return, and then what the worker deferred runs (a core's last counts
// to a shared store): killed, the worker would lose that.
const drainGrace = 5 * time.Second

// readyTimeout bounds the start of a worker: one that has not reported
// ready by then (a handler that hangs while it is built) is killed and
// replaced like a crashed one, so that it cannot stall a reload forever.
const readyTimeout = time.Minute

// sysEnv is the supervisor's seam to the operating system:
// everything that starts, signals or reaps a process, reads the clock or
// talks to the service manager. The real one is built in runSupervisor,
// over an osEnv; the unit tests drive the state machine with a fake.
type sysEnv struct {
	now func() time.Time
	// start starts a worker process. Its readiness and its exit are
	// delivered later to the supervisor's onReady and onExit, in that order,
	// readiness only if the worker reported it.
	start func(spawnSpec) (started, error)
	// reap releases what region worker index held (shm.Region.Reap).
	reap func(index int) (released int, err error)
	// notify sends a systemd notification (a no-op without NOTIFY_SOCKET).
	notify func(state string) error
	// watchdog is how often the loop sends WATCHDOG=1 (half of systemd's
	// WatchdogSec); 0 = never.
	watchdog time.Duration
	// load takes the settings again on HUP (Options.Reload); nil reuses
	// the running ones.
	load func(running Settings) (Settings, error)
	// stopListening closes the supervisor's own copy of the listener.
	stopListening func()
	// requests samples what a region worker index counted since the
	// process joined as it; fleetRequests what every other worker
	// counted, reaped ones included (see RequestCounts).
	requests      func(index int) RequestCounts
	fleetRequests func(except int) RequestCounts
	// upgrade starts a new supervisor from the program's file on disk
	// (USR2), handing it what it needs; indexes are the worker indexes
	// this supervisor's workers hold. Its readiness and its exit come
	// as upgradeReadyEvent and upgradeExitEvent.
	upgrade func(indexes []int, gen int) (upgradeProc, error)
	// waitGone posts an orphanEvent for each of indexes once no live
	// process is joined as it (the workers of the other supervisor).
	waitGone func(indexes []int)
	// tellReady, in a supervisor started by an upgrade, reports it
	// ready to the old one; nil in one that was not.
	tellReady func() error
	// pid is this supervisor's process id: its MAINPID= when it makes
	// itself the main process (tellReady failed: the old one is gone).
	pid int
}

// spawnSpec is what a worker process is started with.
type spawnSpec struct {
	Index    int // region worker index: unique among unreaped workers
	Gen      int // configuration generation
	Settings Settings
	// Keep are the generations that may be started again later: what the
	// env holds for any other (a binary, a configuration file) may go.
	Keep []int
	// RSSDelay is how long after its start the worker begins judging its
	// memory against max_rss (memory recycling's backoff; 0: at once).
	RSSDelay time.Duration
}

// started is a worker process as the seam returns it.
type started struct {
	pid    int
	signal func(syscall.Signal) error // safe after the process was reaped
}

// proc is one worker process, from its start until its exit is handled.
type proc struct {
	started
	index    int // region worker index
	slot     int
	gen      int
	start    time.Time
	drain    time.Duration // its configuration's shutdown timeout
	ready    bool
	retiring bool      // told to drain (shutdown or reload): its exit is no crash
	killAt   time.Time // when a retiring worker is killed; zero = never
	killed   bool
	stopped  bool          // it said it accepts no more (stoppedEvent)
	recycle  string        // why it asked to be replaced (max_requests, max_rss); "" = it did not
	rssDelay time.Duration // it judges its memory from start + rssDelay
	// held are the notes (sigReopen, sigDrain) sent while it was not yet ready,
	// for it once it is: a process just started may not handle them yet,
	// and their default action ends it.
	held []syscall.Signal
}

// note sends a worker a note (sigReopen, sigDrain), or holds it until
// the worker is ready (see proc.held).
func (p *proc) note(sig syscall.Signal) error {
	if !p.ready {
		if !slices.Contains(p.held, sig) {
			p.held = append(p.held, sig)
		}
		return nil
	}
	return p.signal(sig)
}

// slot is one of the N places a worker fills. During a reload a slot has
// its running worker (cur) and, at most one slot at a time, a successor
// that takes over once it is ready.
type slot struct {
	cur, succ *proc
	backoff   backoff
	respawnAt time.Time // no new worker for this slot before this instant
	// quarantined: left empty by the canary of an aborted reload, which
	// took this slot; only the next reload that succeeds fills it again.
	quarantined bool
	// Memory recycling's backoff (recycle.go): the slot's next workers
	// judge their memory from rssDelay after their start.
	rssBackoff backoff
	rssDelay   time.Duration
}

// generation is a configuration's settings and the number the supervisor
// gave them.
type generation struct {
	gen int
	cfg Settings
}

// supervisor is the state machine of the supervisor: it decides which
// workers to start, retire and kill. All of its methods run on the one
// goroutine of its loop (run); it never blocks except in the seam.
type supervisor struct {
	env sysEnv
	log *slog.Logger

	cfg     Settings // the running settings, or the ones a reload rolls in
	gen     int      // its generation
	lastGen int      // the last generation given out: one per accepted reload
	// good is the configuration last known good: the first one, or the
	// last whose canary passed. While a canary is judged, every worker
	// but the canary starts with it; an aborted reload returns to it.
	good   generation
	canary *canaryRun // the canary of the reload in progress; nil when none
	// verdict is the last canary's outcome; nil before the first.
	verdict  *CanaryStatus
	recycled int // workers replaced for max_requests or max_rss
	// rssWarned: an early memory recycle was reported (once, until a
	// reload changes max_rss).
	rssWarned bool

	slots []slot
	procs map[int]*proc // unreaped workers by pid
	inUse []bool        // region worker indexes held by unreaped workers
	// indexWait: a start waits for an index (logged once, until a start
	// takes one).
	indexWait bool

	draining    bool
	stopAt      time.Time // the drain delay's end, when the workers are told to drain; zero: none pending
	watchdogAt  time.Time // when the loop sends the next WATCHDOG=1
	reloading   bool      // a reload was accepted and not all slots run it yet
	aborted     bool      // that reload was aborted: its end is not logged (abortReload)
	announced   bool      // READY=1 was sent once
	everStarted bool      // a worker was started: start errors are no longer fatal
	fatal       error     // a startup failure, returned by Run after the drain
	crashes     int       // workers replaced after an exit nobody asked for
	reloads     ReloadStatus
	// stopSignalled: a TERM, INT or QUIT came. Only the next one shortens
	// the drain: one begun otherwise (Run's context, a handover, a
	// start-up failure) takes the first as the graceful stop it is.
	stopSignalled bool

	onStatus  func(Status)   // Options.OnStatus
	published *Status        // what onStatus saw last
	onConfig  func(Settings) // Options.Configured

	// The binary upgrade (upgrade.go). Old side: the new supervisor
	// being started (nil when none), whether it took over (this one
	// then drains without a word to systemd and without Finish), what
	// runs then (Options.HandedOver), and the indexes of a failed new
	// one's workers still to be reaped.
	up           *upgradeRun
	handedOver   bool
	onHandedOver func()
	orphans      int
	// New side: notifications wait until the old supervisor made this
	// one the main process (notifyHeld); the indexes its workers hold
	// until it is gone (oldIndexes).
	notifyHeld bool
	oldIndexes []int
	// toldReady: this one reported ready to the old supervisor, which
	// then hands over (and dumps no more) unless it is gone first. Until
	// its word comes (onMain), a drain cannot tell whose dump it is.
	toldReady bool
	// Draining, it waits for the old workers (finished) until oldBy, or
	// a second TERM: then they are given up (oldGivenUp), and the dump is
	// made without what they still serve, rather than never.
	oldBy      time.Time
	oldGivenUp bool
}

// newSupervisor prepares a supervisor of n workers with settings cfg
// (already with defaults) and maxWorkers region worker indexes.
func newSupervisor(env sysEnv, log *slog.Logger, cfg Settings, n, maxWorkers int) *supervisor {
	s := &supervisor{
		env:   env,
		log:   log,
		cfg:   cfg,
		good:  generation{0, cfg},
		slots: make([]slot, n),
		procs: make(map[int]*proc),
		inUse: make([]bool, maxWorkers),
	}
	for i := range s.slots {
		s.slots[i].backoff = newBackoff()
		s.slots[i].rssBackoff = newRSSBackoff()
	}
	return s
}

// keepAlive sends WATCHDOG=1 when one is due. It is sent by the loop
// itself, between two events: a loop stuck in a handler sends none, and
// systemd restarts the service after WatchdogSec, while a healthy loop
// wakes for it (nextDeadline) at half that interval, also during a drain.
func (s *supervisor) keepAlive() {
	if s.env.watchdog <= 0 {
		return
	}
	now := s.env.now()
	if now.Before(s.watchdogAt) {
		return
	}
	s.sendNotify(notifyWatchdog)
	s.watchdogAt = now.Add(s.env.watchdog)
}

// finished reports whether the supervisor drained and reaped every worker:
// its own; a new supervisor's that it killed (it waits for that one's
// exit, then for its workers' indexes); and, once an upgrade made it the
// main process, the old supervisor's too. Those may still be storing
// responses in the region this one is about to dump (Finish); the old
// supervisor no longer dumps. Before it is the main process, the old one
// still serves and dumps.
func (s *supervisor) finished() bool {
	if s.notifyHeld && s.toldReady && len(s.oldIndexes) > 0 && !s.oldGivenUp {
		// The old one's word is on its way; the wait has the bound of
		// the one for its workers (oldBy, a second TERM).
		return false
	}
	return s.draining && len(s.procs) == 0 && s.orphans == 0 &&
		(s.up == nil || s.up.ready && (s.up.exited || !s.up.killed)) && (len(s.oldIndexes) == 0 || s.notifyHeld || s.oldGivenUp)
}

// giveUpOld stops waiting for the old supervisor's workers.
func (s *supervisor) giveUpOld(why string) {
	if len(s.oldIndexes) == 0 || s.oldGivenUp {
		return
	}
	s.oldGivenUp = true
	s.log.Warn("upgrade: the old supervisor's workers are not gone: finishing without them", "why", why, "indexes", s.oldIndexes)
}

// reopen tells every worker to reopen the files it writes (an access log
// that logrotate just renamed): USR1, as nginx's master passes it on.
func (s *supervisor) reopen() {
	n := 0
	for _, p := range s.sortedProcs() {
		if p.killed {
			continue
		}
		if err := p.note(sigReopen); err != nil {
			s.log.Warn("signalling a worker failed", "pid", p.pid, "signal", "USR1", "err", err)
			continue
		}
		n++
	}
	s.log.Info("reopening logs", "workers", n)
}

// step kills retiring workers that are past their deadline and starts the
// workers that are due: it is run after every event.
func (s *supervisor) step() {
	now := s.env.now()
	if !s.oldBy.IsZero() && !now.Before(s.oldBy) { // set at beginDrain
		s.giveUpOld("not gone within twice shutdown_timeout")
	}
	if !s.stopAt.IsZero() && !now.Before(s.stopAt) {
		s.log.Info("drain delay over", "workers", len(s.procs))
		s.retireAll()
	}
	for _, p := range s.sortedProcs() {
		switch {
		case p.killed:
		case p.retiring && !p.killAt.IsZero() && !now.Before(p.killAt):
			s.log.Warn("worker did not drain in time: killing it", "pid", p.pid, "index", p.index)
			s.kill(p)
		case !p.retiring && !p.ready && !now.Before(p.start.Add(readyTimeout)):
			// Its exit is handled as a crash: replaced after a backoff.
			s.log.Error("worker not ready in time: killing it", "pid", p.pid, "index", p.index, "timeout", readyTimeout)
			p.killed = true
			if err := p.signal(syscall.SIGKILL); err != nil {
				s.log.Warn("signalling a worker failed", "pid", p.pid, "signal", "KILL", "err", err)
			}
		}
	}
	if u := s.up; u != nil && !u.ready && !u.killed && !now.Before(u.deadline) {
		s.log.Error("upgrade failed: the new supervisor was not ready within upgrade_timeout: killing it; serving on",
			"pid", u.proc.pid, "upgrade_timeout", s.cfg.UpgradeTimeout)
		s.killUpgrade()
	}
	if u := s.up; u != nil && u.killed && !u.killAt.IsZero() && !now.Before(u.killAt) {
		u.killAt = time.Time{}
		s.signalUpgrade(syscall.SIGKILL)
	}
	s.handOver()
	if s.draining || s.up != nil {
		// While a new supervisor starts, this one starts no worker: the
		// indexes it holds are the ones the new one was told of.
		return
	}
	for i := range s.slots {
		// Asked for each slot: a worker that fails to start may abort
		// the reload (abort.go), and the next slot gets the good one.
		fleetGen := s.fleet()
		sl := &s.slots[i]
		if sl.quarantined && sl.cur == nil && sl.succ == nil && !s.othersReady(i) {
			// The fleet never goes below one worker: with no other
			// worker serving (the others crashed since the abort), the
			// slot serves again, with the good configuration.
			sl.quarantined, sl.respawnAt = false, time.Time{}
			s.log.Warn("quarantine lifted: no other worker serves", "slot", i, "generation", fleetGen.gen)
		}
		if sl.cur == nil && sl.succ == nil && !sl.quarantined && !now.Before(sl.respawnAt) {
			sl.cur, _ = s.spawn(i, fleetGen)
			if s.draining { // a fatal start error
				return
			}
		}
	}
	if c := s.canary; c != nil && c.open && !now.Before(c.end) {
		s.judgeCanary()
	}
	// A worker past max_requests or max_rss gets a successor of its own,
	// and leaves once that one is ready.
	for i := range s.slots {
		sl := &s.slots[i]
		if p := sl.cur; p != nil && p.recycle != "" && !p.retiring && sl.succ == nil &&
			!s.isCanary(p) && !now.Before(sl.respawnAt) {
			sl.succ, _ = s.spawn(i, s.fleet())
		}
	}
	// A reload replaces one slot at a time: a successor starts, and the old
	// worker retires once the successor is ready. With a canary, the first
	// successor is the canary, and the others wait for its verdict.
	if !slices.ContainsFunc(s.slots, func(sl slot) bool { return sl.succ != nil }) {
		switch c := s.canary; {
		case c == nil:
			for i := range s.slots {
				sl := &s.slots[i]
				if sl.cur != nil && sl.cur.gen != s.gen {
					// In slot order; a successor that crashed is retried
					// after its backoff, before any other slot is touched.
					if !now.Before(sl.respawnAt) {
						sl.succ, _ = s.spawn(i, generation{s.gen, s.cfg})
					}
					break
				}
			}
		case c.proc == nil:
			s.startCanary()
		}
	}
	s.checkReady()
}

// fleet is the generation that workers other than a canary start with:
// the running one, or while a canary is judged, the last good one.
func (s *supervisor) fleet() generation {
	if s.canary != nil {
		return s.good
	}
	return generation{s.gen, s.cfg}
}

// spawn starts a worker of generation g for slot i; nil when none could
// be started now, with the start's error if that was the reason.
func (s *supervisor) spawn(i int, g generation) (*proc, error) {
	index := slices.Index(s.inUse, false)
	if index < 0 {
		// Every index is held by a worker that still drains; its exit
		// brings the supervisor back here. Said once: a reload (HUPs in
		// a row while retired workers drain slow requests) may wait up
		// to their shutdown_timeout, and would otherwise seem stuck.
		if !s.indexWait {
			s.indexWait = true
			draining := 0
			for _, p := range s.procs {
				if p.retiring {
					draining++
				}
			}
			s.log.Warn("worker start waits for a free index: every one is held by a worker that still drains",
				"slot", i, "generation", g.gen, "max_workers", len(s.inUse), "draining", draining)
		}
		return nil, nil
	}
	s.indexWait = false
	keep := []int{s.good.gen}
	if s.gen != s.good.gen {
		keep = append(keep, s.gen)
	}
	rssDelay := s.slots[i].rssDelay
	st, err := s.env.start(spawnSpec{Index: index, Gen: g.gen, Settings: g.cfg, Keep: keep, RSSDelay: rssDelay})
	if err != nil {
		if !s.everStarted {
			s.fatal = err
			s.beginDrain("start-up failure", 0)
			return nil, err
		}
		sl := &s.slots[i]
		d := sl.backoff.failure(0)
		sl.respawnAt = s.env.now().Add(d)
		if s.onTrial(g.gen) {
			// Not retried: the same build and configuration would fail
			// the same way. The slot, if empty, is filled again after
			// the backoff, with the good configuration.
			s.failReload(i, nil, "could not be started: "+err.Error())
			return nil, err
		}
		s.log.Error("worker start failed", "slot", i, "err", err, "retry_in", d)
		return nil, err
	}
	s.everStarted = true
	p := &proc{started: st, index: index, slot: i, gen: g.gen, start: s.env.now(), drain: g.cfg.ShutdownTimeout, rssDelay: rssDelay}
	s.procs[p.pid] = p
	s.inUse[index] = true
	attrs := []any{"pid", p.pid, "index", index, "slot", i, "generation", g.gen}
	if rssDelay > 0 {
		attrs = append(attrs, "memory_checked_after", rssDelay)
	}
	s.log.Info("worker started", attrs...)
	return p, nil
}

// readyEvent and exitEvent are what the process watchers send to the
// supervisor's loop; a worker's readyEvent always comes before its
// recycleEvents, and those before its exitEvent. An error is a worker
// that broke the protocol, for the log.
type readyEvent struct{ pid int }

// stoppedEvent: a worker accepts no more connections; until a retiring
// one says so, a client that connects may still get its configuration.
type stoppedEvent struct{ pid int }

type exitEvent struct {
	pid    int
	status string // "exit status 0", "signal: killed", ...
	clean  bool   // exited with status 0
	code   int    // the exit status; -1 for a signal
}

// exitNoEngine is a worker's exit status when Options.Engine returned an
// error (sysexits' EX_CONFIG): the same build and settings would fail the
// same way.
const exitNoEngine = 78

// exitPanic is the exit status of a Go program that panicked (or died
// of a fatal error), its stack on stderr.
const exitPanic = 2

// onReady handles a worker's readiness report.
func (s *supervisor) onReady(pid int) {
	p := s.procs[pid]
	if p == nil || p.retiring {
		return
	}
	p.ready = true
	s.log.Debug("worker ready", "pid", pid, "index", p.index)
	for _, sig := range p.held {
		if err := p.signal(sig); err != nil {
			s.log.Warn("signalling a worker failed", "pid", p.pid, "signal", sig.String(), "err", err)
		}
	}
	p.held = nil
	sl := &s.slots[p.slot]
	if sl.succ != p {
		return
	}
	if s.isCanary(p) {
		s.canaryReady()
		return
	}
	s.promote(sl)
}

// promote makes a slot's ready successor its worker: now, and only now,
// the old worker may go, so that no fewer than N workers are ready
// during a reload.
func (s *supervisor) promote(sl *slot) {
	old := sl.cur
	sl.cur, sl.succ = sl.succ, nil
	if old != nil {
		s.retire(old, old.drainBy(s.env.now()))
	}
}

// checkReady announces readiness once every slot runs a ready worker of the
// running configuration: the first time, and at the end of a reload.
func (s *supervisor) checkReady() {
	if s.draining || (s.announced && !s.reloading) {
		return
	}
	if !s.filled() || slices.ContainsFunc(s.slots, func(sl slot) bool { return sl.succ != nil }) {
		return
	}
	// Nor while a worker told to drain may still accept a connection (it
	// has neither said it stopped, stoppedEvent, nor exited): a client
	// that connects once the reload is announced gets its configuration.
	// The wait is bounded by the worker's kill at its drain deadline.
	for _, p := range s.procs {
		if p.retiring && !p.stopped {
			return
		}
	}
	first, aborted := !s.announced, s.aborted
	s.announced, s.reloading, s.aborted = true, false, false
	if s.canary == nil {
		// Every slot runs it: a reload without a canary is over, its
		// configuration the good one (while a canary is judged, only
		// its verdict makes it so).
		s.good = generation{s.gen, s.cfg}
	}
	// Whoever reads the line below or READY=1 and then asks /status or
	// /metrics finds them saying the same.
	s.publish()
	switch {
	case first:
		s.log.Info("ready", "workers", len(s.slots), "generation", s.gen)
	case aborted:
		// Its ERROR line said the outcome: "reload finished" would read
		// as a success, and end the wait of whoever waits for one. At
		// debug level, for whoever times READY=1.
		s.log.Debug("aborted reload over: no retired worker accepts any more", "generation", s.gen)
	default:
		s.log.Info("reload finished", "workers", len(s.slots), "generation", s.gen)
	}
	if s.env.tellReady != nil && first {
		// Started by an upgrade: the old supervisor makes this one the
		// main process, and READY=1 is its to send.
		err := s.env.tellReady()
		if err == nil {
			s.toldReady = true
			return
		}
		// The old supervisor is gone (killed before it handed over):
		// nobody makes this one the main process, so it says so itself,
		// or systemd would never hear it is ready.
		s.log.Error("telling the old supervisor this one is ready failed: it is the main process now", "err", err)
		s.notifyHeld = false
		s.sendNotify(fmt.Sprintf("MAINPID=%d\n%s", s.env.pid, notifyReady))
		return
	}
	s.sendNotify(notifyReady)
}

// filled reports whether every slot runs a ready worker of the running
// configuration, but a quarantined one left empty.
func (s *supervisor) filled() bool {
	for _, sl := range s.slots {
		if sl.quarantined && sl.cur == nil && sl.succ == nil {
			continue
		}
		if sl.cur == nil || !sl.cur.ready || sl.cur.gen != s.gen {
			return false
		}
	}
	return true
}

// exitReason is a worker's exit status for the line that says it failed
// a reload, with what the status means when it says more than a crash.
func exitReason(ev exitEvent) string {
	if ev.code == exitNoEngine {
		return ev.status + ": it could not build its engine, its log says why"
	}
	return ev.status
}

// onExit handles the exit of a worker the seam has waited for.
func (s *supervisor) onExit(ev exitEvent) {
	p := s.procs[ev.pid]
	if p == nil {
		return
	}
	delete(s.procs, ev.pid)
	now := s.env.now()
	ran := now.Sub(p.start)
	released, err := s.env.reap(p.index)
	s.inUse[p.index] = false
	attrs := []any{"pid", p.pid, "index", p.index, "status", ev.status, "ran", ran.Round(time.Millisecond)}
	if released > 0 {
		attrs = append(attrs, "released", released)
	}
	if err != nil {
		s.log.Error("releasing a worker's slots failed", "index", p.index, "err", err)
	}
	if p.retiring {
		if ev.clean {
			s.log.Info("worker exited", attrs...)
		} else {
			s.log.Warn("worker exited", attrs...)
		}
		return
	}
	if s.isCanary(p) {
		// Never respawned: it would run the same build and configuration.
		s.log.Error("worker crashed", append(attrs, "canary", true)...)
		when := "before it was ready"
		if p.ready {
			when = "during its window"
		}
		s.failCanary(fmt.Sprintf("exited %s (%s)", when, exitReason(ev)))
		return
	}
	if !p.ready && s.onTrial(p.gen) {
		// A reload's worker without a canary: never respawned either.
		s.log.Error("worker crashed", append(attrs, "respawn", "no: reload aborted")...)
		s.failReload(p.slot, p, "exited before it was ready ("+exitReason(ev)+")")
		return
	}
	// A crash (or an exit nobody asked for): replace the worker after a
	// delay that grows while the crashes go on.
	sl := &s.slots[p.slot]
	switch p {
	case sl.cur:
		sl.cur = nil
	case sl.succ:
		sl.succ = nil
	}
	if (ev.code == exitNoEngine || ev.code == exitPanic && !p.ready) && !s.announced && !s.draining {
		// At start-up, a worker that could not build its engine would
		// not build it on the next try either: the supervisor would
		// respawn it for ever and never be ready. Stop instead, as for a
		// worker that cannot be started at all. So for a panic before
		// it was ready: what it ran until then (a Must function of the
		// engine's factory given a bad value) runs again the same way.
		// (A crash is respawned, a panic once it served too.)
		s.log.Error("worker could not build its engine: stopping", attrs...)
		s.fatal = fmt.Errorf("prefork: worker %d could not build its engine (Options.Engine failed; its log says why)", p.index)
		s.beginDrain("start-up failure", 0)
		return
	}
	d := sl.backoff.failure(ran)
	sl.respawnAt = now.Add(d)
	s.crashes++
	if s.draining {
		// Nothing is started while draining (step): say so, not a
		// respawn that will not come.
		s.log.Error("worker crashed", append(attrs, "respawn", "no: draining")...)
		return
	}
	s.log.Error("worker crashed", append(attrs, "respawn_in", d)...)
}

// drainBy is when p, told to drain at now, is killed: its drain and the
// grace added to now one at a time, as their sum could wrap around
// (shutdown_timeout may be as long as a Duration holds).
func (p *proc) drainBy(now time.Time) time.Time { return now.Add(p.drain).Add(drainGrace) }

// retire tells p to drain and kills it if it has not exited by killAt.
func (s *supervisor) retire(p *proc, killAt time.Time) {
	if p.killAt.IsZero() || killAt.Before(p.killAt) {
		p.killAt = killAt
	}
	if p.retiring {
		return
	}
	p.retiring = true
	if !s.draining {
		s.log.Info("worker retiring", "pid", p.pid, "index", p.index, "generation", p.gen)
	}
	if err := p.signal(syscall.SIGTERM); err != nil {
		s.log.Warn("signalling a worker failed", "pid", p.pid, "signal", "TERM", "err", err)
	}
}

func (s *supervisor) kill(p *proc) {
	p.retiring, p.killed = true, true
	if err := p.signal(syscall.SIGKILL); err != nil {
		s.log.Warn("signalling a worker failed", "pid", p.pid, "signal", "KILL", "err", err)
	}
}

// beginDrain starts the graceful shutdown: none is started any more, and
// every worker is told to drain, after delay (Settings.DrainDelay): until
// then the workers serve on, told only that the instance is stopping
// (sigDrain: their health check answers 503), and readiness says draining, so
// that a load balancer takes the instance out before its listener closes.
func (s *supervisor) beginDrain(reason string, delay time.Duration) {
	if s.draining {
		return
	}
	s.draining = true
	s.sendNotify(notifyStopping)
	attrs := []any{"reason", reason, "workers", len(s.procs), "timeout", s.cfg.ShutdownTimeout}
	if delay > 0 {
		attrs = append(attrs, "drain_delay", delay)
	}
	s.log.Info("drain begun", attrs...)
	if len(s.oldIndexes) > 0 {
		// The old supervisor drains them within its shutdown_timeout,
		// then they are reaped: twice that is time enough.
		s.oldBy = s.env.now().Add(delay).Add(s.cfg.ShutdownTimeout).Add(s.cfg.ShutdownTimeout) // a sum could wrap
	}
	if u := s.up; u != nil && !u.ready && !u.killed {
		s.abandonUpgrade()
	}
	if c := s.canary; c != nil {
		s.log.Info("canary abandoned: draining", "generation", c.gen)
		s.canary = nil
	}
	for i := range s.slots {
		s.slots[i].cur, s.slots[i].succ = nil, nil
	}
	if delay > 0 {
		s.stopAt = s.env.now().Add(delay)
		for _, p := range s.sortedProcs() {
			if err := p.note(sigDrain); err != nil {
				s.log.Warn("signalling a worker failed", "pid", p.pid, "signal", "RTMIN+2", "err", err)
			}
		}
		return
	}
	s.retireAll()
}

// retireAll tells every worker to drain now: the end of the drain delay,
// or the start of a drain without one.
func (s *supervisor) retireAll() {
	s.stopAt = time.Time{}
	if s.env.stopListening != nil {
		s.env.stopListening()
	}
	now := s.env.now()
	for _, p := range s.sortedProcs() {
		s.retire(p, p.drainBy(now))
	}
}

// killAll ends the drain now.
func (s *supervisor) killAll(reason string) {
	var n int
	for _, p := range s.sortedProcs() {
		if !p.killed {
			s.kill(p)
			n++
		}
	}
	if u := s.up; u != nil && u.killed && !u.killAt.IsZero() {
		u.killAt = s.env.now() // and the new supervisor an upgrade abandoned (step)
	}
	s.log.Warn("drain shortened: killing workers", "reason", reason, "workers", n)
	s.giveUpOld("drain shortened")
}

// refuseReload ends a reload that keeps the running configuration, for
// the reason lastError (/status), with a log line at level.
func (s *supervisor) refuseReload(level slog.Level, lastError, msg string, attrs ...any) {
	s.reloads.Refused++
	s.reloads.LastError = lastError
	s.publish() // before the line, as at "ready": /metrics then counts it
	s.log.Log(context.Background(), level, msg, attrs...)
	// systemd ends a reload at READY=1. While an earlier reload still
	// replaces workers, its own READY=1 comes when it is done: sending one
	// now would end the reload early.
	if s.announced && !s.reloading {
		s.sendNotify(notifyReady)
	}
}

// reload takes the configuration again (HUP) and, when it is valid, starts
// replacing the workers with ones that run it.
func (s *supervisor) reload() {
	if s.draining {
		// Refused and counted as any refused reload, so that /metrics
		// and /status say the HUP did not happen; no READY=1: the
		// instance is stopping.
		s.reloads.Last = s.env.now()
		s.reloads.Refused++
		s.reloads.LastError = "draining"
		s.publish()
		s.log.Warn("reload refused: draining; the running configuration is kept until the workers exit")
		return
	}
	if s.announced {
		s.sendNotify(reloadingState())
	}
	cfg := s.cfg
	s.reloads.Last = s.env.now()
	if s.up != nil {
		// A new supervisor is starting: it reads the configuration
		// itself, and this one starts no worker until it hands over, when
		// a reload begun here would be dropped. Refused, as USR2 is during
		// a reload.
		s.refuseReload(slog.LevelWarn, "an upgrade is under way",
			"reload refused: an upgrade is under way (send HUP again once it is done)", "new_pid", s.up.proc.pid)
		return
	}
	if s.env.load != nil {
		var err error
		if cfg, err = s.env.load(s.cfg); err == nil {
			cfg, err = cfg.withDefaults()
		}
		if err != nil {
			s.refuseReload(slog.LevelError, err.Error(), "reload refused: keeping the running configuration", "err", err)
			return
		}
	}
	if s.canary != nil {
		s.supersedeCanary()
	}
	if cfg.MaxRSS != s.cfg.MaxRSS {
		s.resetMemoryBackoff()
	}
	s.reloads.Accepted++
	s.reloads.LastError = ""
	s.lastGen++
	s.cfg, s.gen = cfg, s.lastGen
	s.reloading, s.aborted = true, false
	if s.onConfig != nil {
		s.onConfig(cfg)
	}
	attrs := []any{"generation", s.gen, "workers", len(s.slots)}
	// Before the workers were first ready there is no fleet to judge a
	// canary against (a HUP of the start-up is handled before any worker
	// starts): the file is taken as the start takes it.
	if !cfg.Canary.Off && s.announced {
		s.canary = &canaryRun{gen: s.gen, settings: cfg.Canary}
		attrs = append(attrs, "canary_window", cfg.Canary.Window)
	} else {
		// No canary: the slots a canary left empty are filled with the
		// configuration. Before the first ready it is good as it is
		// taken, as the start's is; after, once every slot runs it
		// (checkReady), and a worker of it that fails to become ready
		// until then aborts the reload (abort.go).
		if !s.announced {
			s.good = generation{s.gen, cfg}
		}
		s.clearQuarantine()
	}
	for _, a := range cfg.LogAttrs {
		attrs = append(attrs, a)
	}
	s.cfg.LogAttrs = nil // they say what this reload changed: not the next
	if s.good.gen == s.gen {
		s.good.cfg.LogAttrs = nil
	}
	s.log.Info("reload begun", attrs...)
}

// nextDeadline is the earliest instant at which step has something to do.
func (s *supervisor) nextDeadline() (time.Time, bool) {
	var next time.Time
	if s.env.watchdog > 0 {
		next = earliest(next, s.watchdogAt)
	}
	next = earliest(next, s.stopAt)
	if u := s.up; u != nil && !u.ready && !u.killed {
		next = earliest(next, u.deadline)
	} else if u != nil {
		next = earliest(next, u.killAt) // zero but while a stopped one is waited for
	}
	if len(s.oldIndexes) > 0 && !s.oldGivenUp {
		next = earliest(next, s.oldBy) // zero until the drain
	}
	for _, p := range s.procs {
		switch {
		case p.killed:
		case p.retiring:
			next = earliest(next, p.killAt)
		case !p.ready:
			next = earliest(next, p.start.Add(readyTimeout))
		}
	}
	if !s.draining {
		now := s.env.now()
		for _, sl := range s.slots {
			if sl.respawnAt.After(now) {
				next = earliest(next, sl.respawnAt)
			}
		}
		if c := s.canary; c != nil && c.open {
			next = earliest(next, c.end)
		}
	}
	return next, !next.IsZero()
}

// earliest is the earlier of next and t, a zero time being none. Not
// inlined, where nextDeadline calls it: ten copies of it would be 2 KB of
// code, which every program embedding the supervisor carries.
//
//go:noinline
func earliest(next, t time.Time) time.Time {
	if !t.IsZero() && (next.IsZero() || t.Before(next)) {
		return t
	}
	return next
}

// sortedProcs lists the unreaped workers by pid, so that the order of
// signals and log lines does not depend on map iteration.
func (s *supervisor) sortedProcs() []*proc {
	ps := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b *proc) int { return a.pid - b.pid })
	return ps
}

func (s *supervisor) sendNotify(state string) {
	if s.notifyHeld || s.handedOver && (state != notifyWatchdog || s.up.main) {
		// Not the service's main process (yet, or any more): systemd
		// would refuse it, or, with NotifyAccess=all, believe it. Handing
		// over, it pings on until MAINPID= (handOver).
		return
	}
	if err := s.env.notify(state); err != nil {
		s.log.Warn("systemd notification failed", "err", err)
	}
}

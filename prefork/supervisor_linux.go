package prefork

import (
	"context"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// sigReopen and sigDrain are what the supervisor sends a worker to have
// it reopen the files it writes (USR1), and to tell it that the instance
// stops (SIGRTMIN+2, as kill -l names 36): not USR2, which an operator
// sends the binary upgrade with, and systemctl kill sends every process
// of the unit, workers included, unless told --kill-whom=main. A
// worker that took it for the notice would answer 503 to health checks
// and stop recycling for good when the upgrade is refused or fails.
const (
	sigReopen = syscall.SIGUSR1
	sigDrain  = syscall.Signal(36)
)

// run is the supervisor's one select loop. It returns once the supervisor
// drained and every worker was reaped.
func (s *supervisor) run(ctx context.Context, sigs <-chan os.Signal, events <-chan any) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	done := ctx.Done()
	// A signal that arrived during start-up is handled before any worker starts.
	for pending := true; pending; {
		select {
		case sig := <-sigs:
			s.onSignal(sig)
		default:
			pending = false
		}
	}
	s.step()
	s.keepAlive()
	s.publish()
	for !s.finished() {
		var wake <-chan time.Time
		if t, ok := s.nextDeadline(); ok {
			timer.Reset(t.Sub(s.env.now()))
			wake = timer.C
		}
		select {
		case sig := <-sigs:
			s.onSignal(sig)
		case <-done:
			done = nil
			s.beginDrain(context.Cause(ctx).Error(), s.cfg.DrainDelay)
		case ev := <-events:
			switch ev := ev.(type) {
			case readyEvent:
				s.onReady(ev.pid)
			case stoppedEvent:
				if p := s.procs[ev.pid]; p != nil {
					p.stopped = true
				}
			case exitEvent:
				s.onExit(ev)
			case recycleEvent:
				s.onRecycle(ev)
			case upgradeReadyEvent:
				s.onUpgradeReady(ev)
			case upgradeExitEvent:
				s.onUpgradeExit(ev)
			case mainEvent:
				s.onMain(ev)
			case orphanEvent:
				s.onOrphan(ev)
			case error:
				s.log.Error("worker broke the protocol of its readiness pipe", "err", ev)
			}
		case <-wake:
		}
		s.step()
		s.keepAlive()
		s.publish()
	}
}

// onSignal handles the signals the supervisor listens to (handledSignals):
// TERM, INT and QUIT drain, HUP reloads, USR1 has the workers reopen
// their files; any other is logged and ignored.
func (s *supervisor) onSignal(sig os.Signal) {
	name := sig.String()
	if ss, ok := sig.(syscall.Signal); ok {
		name = unix.SignalName(ss)
	}
	switch sig {
	case syscall.SIGHUP:
		s.reload()
	case syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT:
		if s.stopSignalled {
			s.killAll("second " + name)
			return
		}
		s.stopSignalled = true
		if u := s.up; u != nil && u.ready && !u.main && !u.exited && !u.killed {
			// Handing over, this one is still the service's main
			// process (systemctl stop signals it): the stop is the
			// service's. The new one stops too, and this one finishes.
			s.handedOver = false
			s.sendNotify(notifyStopping)
			s.abandonUpgrade()
			return
		}
		if s.draining {
			// Begun otherwise: the same TERM that ended Run's context
			// (signal.NotifyContext), or a QUIT to the old supervisor
			// of a binary upgrade. Its workers finish their requests.
			s.log.Info("already draining: a second signal kills the workers", "signal", name)
			return
		}
		s.beginDrain(name, s.cfg.DrainDelay)
	case syscall.SIGUSR1:
		s.reopen()
	case syscall.SIGUSR2:
		s.startUpgrade()
	default:
		s.log.Warn("signal ignored", "signal", name)
	}
}

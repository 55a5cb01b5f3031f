package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/preforkd/preforkd/prefork"
)

// heldAtStart are the signals an operator sends the supervisor to act on
// (HUP, USR1, USR2) that end a Go program which does not listen for them.
// The supervisor listens once package prefork runs it, after the
// configuration is read: a HUP sent as the daemon starts (a deploy that
// reloads right after it restarts it) would kill it, with no line said.
// From the program's start they are held instead (earlySignals), and sent
// again once the supervisor listens, which acts on them as on any sent
// before its workers are first ready.
var heldAtStart = []os.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2}

// earlySignals holds heldAtStart in the supervisor of preforkd run, from
// the program's initialization (the earliest a Go program can); nil in
// any other process.
var earlySignals = holdSignals(os.Args)

func holdSignals(args []string) chan os.Signal {
	if len(args) < 2 || args[1] != "run" || prefork.IsWorker() {
		return nil // a worker ignores HUP and USR2 itself (package prefork)
	}
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, heldAtStart...)
	return ch
}

// releaseSignals stops holding them and sends each kind held to this
// process once more, in the order they came: the supervisor, which
// listens for them now, acts on it. Called once it listens (Prepare).
func releaseSignals() {
	ch := earlySignals
	if ch == nil {
		return
	}
	earlySignals = nil
	signal.Stop(ch)
	sent := map[os.Signal]bool{}
	for {
		select {
		case sig := <-ch:
			if !sent[sig] {
				sent[sig] = true
				syscall.Kill(os.Getpid(), sig.(syscall.Signal))
			}
		default:
			return
		}
	}
}

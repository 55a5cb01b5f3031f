// Package prefork is a supervisor of worker processes that share one
// listening socket and one shared-memory region (package shm), so that
// state meant to be global — rate limits, stored responses — holds across
// all of them. It runs the preforkd daemon's workers, and an embedding
// program's.
//
// The call most users want is [Run], first thing in main. prefork knows a
// worker's HTTP server only as an [Engine]; the program builds it, in each
// worker, over the worker's region (see the example: a decision core of
// package core, and net/http in front of an http.Handler with package
// engine/nethttp):
//
//	func main() {
//		err := prefork.Run(context.Background(), prefork.Options{
//			Listen:  "127.0.0.1:8080",
//			Workers: 4,
//			Engine:  newEngine, // func(w *prefork.Worker) (prefork.Engine, error)
//		})
//		...
//	}
//
// # Roles
//
// The same program runs as the supervisor and as every worker. The
// supervisor starts each worker by executing the program again, with the
// same arguments (argv[0] is the worker's title) and the environment
// variable PREFORKD_WORKER set; [Run] (and [IsWorker]) detect that role.
// The first workers run the supervisor's own binary; each reload opens
// the program's file on disk (os.Executable) again, so that a build
// deployed there by rename is what the reload starts, and keeps it open,
// so that a worker of that generation respawned later runs the same
// file, whatever was deployed since. In a worker,
// Run serves and exits the process itself: it never returns. Hence main
// calls Run before anything with side effects (opening files, starting
// goroutines that matter), and the code before Run runs in every process.
//
// A worker inherits, as file descriptors 3 to 7: the region, the listening
// socket, the read end of a lifeline pipe, the write end of its readiness
// pipe, and the [Settings] of its generation (in a sealed memory file: a
// line for each field, then the program's Payload as it is; not Config
// nor LogAttrs, which stay with the supervisor), then from 8 on the
// sockets of [Options.ExtraListen], named in the environment variable
// PREFORKD_LISTENERS ([Worker.Listener]). It maps the region, joins it under its
// worker index, builds its engine with [Options.Engine], reports readiness
// and serves; when it is told to drain, the engine's Shutdown drains by
// package engine's rule, and what [Worker.Defer] was given runs.
//
// # Supervisor
//
// The supervisor opens the listener and creates the region before any
// worker exists, runs Options.Prepare, starts the workers and watches them
// with one select loop; it never serves a request. TERM, INT or QUIT (or
// ctx done) drains: after Settings.DrainDelay (during which the workers
// serve on, told by SIGRTMIN+2 that the instance stops: Worker.OnDrain), the
// workers stop accepting and finish what is in flight within
// Settings.ShutdownTimeout, by package engine's drain rule, then
// Options.Finish runs and Run returns; a second signal kills at once (a
// drain begun otherwise, by ctx or a handover, takes a first one as
// itself: ctx ended by signal.NotifyContext on that same TERM). USR1
// is passed on to the workers (Worker.OnReopen: logrotate). USR2
// upgrades the binary (upgrade.go): a new supervisor from the program's
// file inherits the listeners (the extra ones by name), the region and Options.Handover's files,
// and once it serves, this one drains its workers and returns without
// Finish. Any other signal is logged and ignored. A socket passed by the
// service manager (LISTEN_FDS) is served instead of Options.Listen; with
// Options.ExtraListen, sockets named as one of them (LISTEN_FDNAMES,
// systemd's FileDescriptorName=) serve it and the first other one
// Options.Listen, or, when no name matches, they go in order: Listen's
// first, then ExtraListen's. HUP
// takes Options.Reload's settings and replaces the workers one at a time,
// each new one ready before an old one leaves, the first of them a canary
// judged against the others (canary.go); the region and its counts carry
// over. A HUP during an upgrade or a drain is refused, and counted as a
// refused reload (Status.Reloads). A reload whose canary fails or is judged bad, or, without a
// canary, any of whose workers cannot start or become ready, is aborted:
// the workers return to the running settings (abort.go). A worker past Settings.MaxRequests or MaxRSS is replaced the same
// way (recycle.go); a crashed one after a backoff (100ms doubling to 10s);
// one not ready within a minute is killed and replaced. With
// NOTIFY_SOCKET it speaks systemd's notify protocol (READY, RELOADING,
// STOPPING, WATCHDOG). README.md says all of it from the operator's side.
//
// # Guarantees
//
// Exact across workers: every worker updates the same counters in the
// region with atomic operations, so a limit of L lets L requests through in
// total, whatever the number of workers.
//
// Crash release: the supervisor reaps every worker and calls
// shm.Region.Reap for its index before the index is used again, which
// releases the slots and locks the dead process held; a worker killed in
// the middle of an update never blocks a key.
//
// Death of the supervisor: workers are started with Pdeathsig (SIGKILL) from
// one OS thread that lives as long as the supervisor, and hold the read end
// of a pipe that only the supervisor can write; its EOF makes a worker drain
// and exit. Either way no worker outlives its supervisor, also after a
// kill -9. Workers live in their own process group: a terminal's Ctrl-C
// reaches the supervisor only, which then drains them.
//
// # Limits
//
// Linux only (memfd, Pdeathsig). Elsewhere the package builds for
// development, and [Run] (and [ListenerFile]) return an error that wraps
// shm.ErrNeedsLinux. A TCP listener (a net.Listener whose
// socket can be duplicated). A reload starts the program's file on disk, but the
// supervisor keeps running the binary it was started as: a build whose
// supervisor differs (its region layout, its options) needs a restart.
// Worker indexes are allocated from the
// region's MaxWorkers (2×workers+2 with shm.Create): while draining
// workers hold indexes, a reload waits for them. Logs are one line per
// operator event (start, worker started, ready, worker exit with its status,
// reload, drain), never one per request.
package prefork

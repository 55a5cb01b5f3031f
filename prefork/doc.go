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
// pipe, and the [Settings] of its generation (JSON in a sealed memory file,
// with the program's Payload). It maps the region, joins it under its
// worker index, builds its engine with [Options.Engine], reports readiness
// and serves; when it is told to drain, the engine's Shutdown drains by
// package engine's rule, and what [Worker.Defer] was given runs.
//
// # Supervisor
//
// The supervisor opens the listener and creates the region (with
// Options.NewRegion or shm.Create) before any worker exists, runs
// Options.Prepare, starts Options.Workers workers and watches them with
// one select loop. It never serves a request.
//
//   - TERM or INT (or ctx done): graceful drain. Every worker stops
//     accepting and finishes its requests in flight for up to
//     Settings.ShutdownTimeout; the supervisor kills what is left a little
//     later. A draining worker answers with Connection: close and closes a
//     keep-alive connection only after that, or after it was idle for a
//     grace (package engine states the rule), so that no request is lost
//     to a connection closed under it. A second TERM or INT kills at once.
//     No worker is started while draining. After the last worker was
//     reaped, Options.Finish runs and Run returns.
//   - HUP: the settings are taken again (Options.Reload; without it, the
//     running ones are reused). An error is logged and the running
//     settings kept. Otherwise the workers are replaced one at a time: a
//     new one starts, and an old one is told to drain only once the new
//     one is ready, so that no fewer than N workers serve and no
//     connection is refused. The region, and every count in it, carries
//     over. The listener, the region and the number of workers are the
//     supervisor's for its life: a restart changes them.
//   - Canary (Settings.Canary, on unless Off; canary.go states the rules):
//     the first worker a reload replaces is judged for
//     Canary.Window against every other worker, by the requests and
//     5xx each counted in the region over the same window, before the
//     others are replaced. An unhealthy (or failed) canary aborts the
//     reload: it drains, its slot stays empty (quarantined) until a reload
//     succeeds, and the other workers keep the running configuration and
//     binary. [Status] shows the verdict.
//   - Recycling (Settings.MaxRequests, Settings.MaxRSS): a worker checks both
//     after every response; past one, it stops accepting and asks to be
//     replaced, and leaves once its successor is ready (recycle.go).
//   - A worker that exits without being asked to (a crash) is replaced
//     after a delay that starts at 100ms and doubles up to 10s while the
//     crashes go on; a worker that ran for 10s resets it. A crash loop
//     costs a few process starts per minute, not a spinning CPU. A worker
//     that has not reported ready a minute after its start is killed and
//     replaced the same way.
//   - systemd: with NOTIFY_SOCKET set, READY=1 once every worker reported
//     ready, RELOADING=1 on HUP and READY=1 when the reload finished (or
//     was refused, or aborted by its canary), STOPPING=1 at shutdown.
//     Workers do not inherit NOTIFY_SOCKET.
//   - Each worker's GOMAXPROCS is its share of the CPUs unless GOMAXPROCS
//     is set in the environment.
//   - The supervisor and every worker raise their soft limit on open files
//     to the hard limit at start; the supervisor logs it ("supervisor
//     started", open_files).
//   - Workers take the supervisor's process name (its /proc/self/comm:
//     "preforkd" for the daemon, the program's name when embedded) instead
//     of "exe", and their command line reads "NAME: worker INDEX
//     (generation G)", so that ps -C NAME and pgrep -x NAME see the whole
//     tree. The arguments a worker sees in os.Args are the supervisor's.
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
// Linux only (memfd, Pdeathsig). A TCP listener (a net.Listener whose
// socket can be duplicated). A reload starts the program's file on disk, but the
// supervisor keeps running the binary it was started as: a build whose
// supervisor differs (its region layout, its options) needs a restart.
// Worker indexes are allocated from the
// region's MaxWorkers (2×workers+2 with shm.Create): while draining
// workers hold indexes, a reload waits for them. Logs are one line per
// operator event (start, worker started, ready, worker exit with its status,
// reload, drain), never one per request.
package prefork

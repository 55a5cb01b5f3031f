// Package accesslog writes preforkd's access log: one line per request,
// in nginx's combined format (with preforkd's fields after it) or as one
// JSON object, from the entries package core hands it (core.AccessLog).
//
// A request never waits on the file: Log formats the line into a buffer
// of the process, and a goroutine of the Log's own writes the buffer out
// at least once a second ([Options.FlushEvery]), sooner when 64 KiB are
// pending, and at Close. Past [Options.MaxPending] bytes not yet written
// (a disk that stalls), lines are dropped and counted ([Log.Dropped]),
// never held without bound. [Log.Reopen] (the daemon calls it on
// SIGUSR1) opens the file again at its path, so that after logrotate
// renamed it the next lines go to a new file.
//
// The call most users want, once per worker process:
//
//	l, err := accesslog.New(accesslog.Options{Path: "/var/log/preforkd/access.log"})
//	...
//	c, err := core.New(region, core.Options{AccessLog: l, ...})
//	...
//	defer l.Close() // after the engine drained: the last lines are written
//
// A Log is safe for concurrent use. Several processes may append to one
// file: each write is whole lines, appended (O_APPEND); to standard
// error or a FIFO, in pieces of at most 4 KiB cut at line ends, which a
// pipe writes whole (PIPE_BUF), so that the lines of the workers never
// mix.
package accesslog

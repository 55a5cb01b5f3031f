package persist

import (
	"log/slog"
	"sync"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// A dump while workers serve (persist.interval): the supervisor writes
// one every interval, so that a crash of the whole process tree, or of the
// machine, costs at most the interval's counts (see Dump for what such a
// dump holds). It reads the region without a lock: the workers never
// wait for it, and it takes only the CPU time they leave (lowPriority).

// LogRoomMade logs, at warn, that the dump at path found its file system
// full and removed the consumed dumps beside it to make room (see Dump),
// if it did.
func (st DumpStats) LogRoomMade(log *slog.Logger, path string) {
	if st.Removed > 0 {
		log.Warn("persist: the dump's file system was full: consumed dumps (PATH.loaded, PATH.superseded) removed to make room",
			"path", path, "removed", st.Removed)
	}
}

// Dumper writes a dump of a region every interval until Stop.
type Dumper struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// StartDumper dumps r every interval, with the Options options returns
// for that dump (the configuration in force: its rules guard the dump,
// its key stamps it), until Stop. Each dump replaces the last one
// atomically and durably, as Dump does: one that fails (a full disk) is
// logged at warn and leaves the previous dump in place; one that made room
// by removing consumed dumps says so at warn (LogRoomMade). A dump that takes
// longer than interval is followed by the next at once. Each dump is
// logged at debug. An interval of 0 or less (persist.interval's "0s",
// off) dumps nothing: the Dumper only waits for Stop. A nil log means
// slog.Default().
func StartDumper(r *shm.Region, interval time.Duration, options func() Options, log *slog.Logger) *Dumper {
	if log == nil {
		log = slog.Default()
	}
	d := &Dumper{stop: make(chan struct{}), done: make(chan struct{})}
	if interval <= 0 {
		close(d.done) // time.NewTicker would panic, in a goroutine
		return d
	}
	go func() {
		defer close(d.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-d.stop:
				return
			case <-tick.C:
			}
			o := options()
			start := time.Now()
			st, err := lowPriority(func() dumped {
				st, err := Dump(r, o)
				return dumped{st, err}
			}).values()
			if err != nil {
				log.Warn("persist: periodic dump failed: the previous dump is kept", "path", o.Path, "err", err)
				continue
			}
			st.LogRoomMade(log, o.Path)
			log.Debug("persist: periodic dump written", "path", o.Path, "counters", st.Entries, "responses", st.Responses,
				"cached", st.Cached, "bytes", st.Bytes, "took", time.Since(start).Round(time.Millisecond))
		}
	}()
	return d
}

// Stop ends the dumps and waits for one in progress: the caller may then
// dump for the last time. It is idempotent.
func (d *Dumper) Stop() {
	d.once.Do(func() { close(d.stop) })
	<-d.done
}

type dumped struct {
	st  DumpStats
	err error
}

func (d dumped) values() (DumpStats, error) { return d.st, d.err }

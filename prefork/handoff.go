package prefork

import (
	"fmt"
	"io"
	"os"
	"strconv"
)

// What a worker process inherits from its supervisor: an environment
// variable that marks the process as a worker and names its region worker
// index, one with the supervisor's process name (procname.go), its title as
// argv[0], and five file descriptors (from 3 on, as os.StartProcess passes them),
// then one per extra listener (Options.ExtraListen).
const (
	envWorker = "PREFORKD_WORKER"
	envName   = "PREFORKD_NAME"
	// envRSSDelay, when set, is how long after its start the worker
	// begins judging its memory against server.max_rss (a Go duration):
	// the supervisor backs off memory recycling (see recycle.go).
	envRSSDelay = "PREFORKD_RSS_DELAY"
	// envListeners names Options.ExtraListen's sockets, comma-separated,
	// in the order of their descriptors from fdExtra on.
	envListeners = "PREFORKD_LISTENERS"

	fdRegion   = 3 // the shared-memory region (memfd or tmpfs file)
	fdListener = 4 // the listening socket, shared by every worker
	fdLifeline = 5 // read end of a pipe the supervisor never writes: EOF = supervisor gone
	fdReady    = 6 // write end of this worker's readiness pipe
	fdConfig   = 7 // the settings (handoff_codec.go), read with pread (the offset is shared)
	fdExtra    = 8 // Options.ExtraListen's sockets, from here on (envListeners)
)

// IsWorker reports whether this process was started by a supervisor as one
// of its workers. Run answers the same question itself; IsWorker lets a
// program (or a TestMain) pick its role before doing anything else.
// A worker's Run removes the marker from its environment, so that programs
// the application starts are not mistaken for workers.
func IsWorker() bool {
	_, ok := os.LookupEnv(envWorker)
	return ok
}

// workerIndex parses the worker marker.
func workerIndex() (int, error) {
	v := os.Getenv(envWorker)
	w, err := strconv.Atoi(v)
	if err != nil || w < 0 {
		return 0, fmt.Errorf("prefork: %s=%q is not a worker index", envWorker, v)
	}
	return w, nil
}

// readSettings reads the settings a worker inherited.
func readSettings(f *os.File) (Settings, error) {
	st, err := f.Stat()
	if err != nil {
		return Settings{}, fmt.Errorf("prefork: inherited settings: %w", err)
	}
	b, err := io.ReadAll(io.NewSectionReader(f, 0, st.Size()))
	if err != nil {
		return Settings{}, fmt.Errorf("prefork: reading the inherited settings: %w", err)
	}
	s, err := parseHandoff(b)
	if err != nil {
		return Settings{}, fmt.Errorf("prefork: decoding the inherited settings: %w", err)
	}
	return s, nil
}

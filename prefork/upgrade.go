package prefork

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// The binary upgrade (USR2), as nginx does it: the supervisor starts the
// program's file on disk as a new supervisor that inherits the listening
// socket and the region (its memfd, or persist.live's file: the same
// descriptor either way, so the counts continue whether the region lives
// on tmpfs or not), and the program's own files (Options.Handover). The
// new supervisor starts its workers on worker indexes the old one's do
// not hold, and reports ready over a socket pair; only then does the old
// one drain its own workers and, once none accepts any more, make it the
// service's main process (MAINPID= to systemd) and tell it so; it exits
// without Finish: nothing is dumped, the region lives on. A new
// supervisor that exits, or is not ready within Settings.UpgradeTimeout,
// is killed and the old one serves on; the indexes its workers held are
// reaped once they are gone.

// What a supervisor started by USR2 inherits: the variable, and from fd 3
// the region, the listener, its end of the socket pair, then the
// extra listeners (Options.ExtraListen) and the program's files, each
// named in the variable with its descriptor.
const (
	envUpgrade  = "PREFORKD_UPGRADE"
	fdUpRegion  = 3
	fdUpListen  = 4
	fdUpChannel = 5
	fdUpFiles   = 6
)

// The messages on the socket pair: the new supervisor is ready; the old
// one made it the main process, or stops it and will not (a TERM follows).
const (
	msgReady   byte = 'R'
	msgMain    byte = 'M'
	msgAbandon byte = 'A'
)

// Events of an upgrade, for the supervisor's loop.
type (
	// upgradeReadyEvent: the new supervisor (old side) reported ready.
	upgradeReadyEvent struct{ pid int }
	// upgradeExitEvent: the new supervisor (old side) exited.
	upgradeExitEvent struct {
		pid    int
		status string
	}
	// mainEvent: the old supervisor (new side) made this one the main
	// process, is gone (gone), or abandoned the upgrade (abandoned).
	mainEvent struct{ gone, abandoned bool }
	// orphanEvent: no live process is joined as the index any more.
	orphanEvent struct{ index int }
)

// upgradeProc is the new supervisor as the old one's seam returns it.
type upgradeProc struct {
	started
	// tell sends it a message (msgMain, msgAbandon).
	tell func(msg byte) error
}

// upgradeRun is the old supervisor's upgrade in progress.
type upgradeRun struct {
	proc     upgradeProc
	deadline time.Time
	ready    bool
	main     bool      // told it is the main process (handOver)
	exited   bool      // after it was ready
	killed   bool      // told to stop (killUpgrade)
	killAt   time.Time // then killed at; zero once it was
}

// inheritance is what a supervisor started by USR2 was handed.
type inheritance struct {
	region, listener *os.File
	channel          *net.UnixConn
	oldIndexes       []int
	gen              int // the generation the old workers run; -1 from a build that does not say
	files            map[string]*os.File
	listeners        map[string]*os.File // the extra listeners' sockets, by name
}

// listen returns the inherited listener.
func (in *inheritance) listen() (net.Listener, error) {
	ln, err := net.FileListener(in.listener)
	in.listener.Close()
	if err != nil {
		return nil, fmt.Errorf("prefork: the inherited listener: %w", err)
	}
	return ln, nil
}

// extra returns the inherited extra listener called name, or nil; it
// is no longer the inheritance's.
func (in *inheritance) extra(name string) (net.Listener, error) {
	f := in.listeners[name]
	if f == nil {
		return nil, nil
	}
	delete(in.listeners, name)
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("prefork: the inherited listener %q: %w", name, err)
	}
	return ln, nil
}

// attach maps the inherited region and checks that it has room for n
// workers beside the old supervisor's, and that this build reads its
// statistics rows as the old one writes them: the canary is judged by
// them, and the metrics read from them.
// statLayout is what this build's own region would be tagged with
// (regionOptions).
func (in *inheritance) attach(n int, statLayout uint64) (*shm.Region, error) {
	r, err := shm.Attach(in.region)
	if err != nil {
		return nil, fmt.Errorf("prefork: the inherited region: %w", err)
	}
	if r.Geometry().StatLayout != statLayout {
		r.Close()
		return nil, errors.New("prefork: the inherited region's statistics rows are laid out by a build with other metrics: " +
			"this upgrade needs a restart (the old supervisor serves on; a restart keeps the state through its dump)")
	}
	if free := r.Geometry().MaxWorkers - len(in.oldIndexes); free < n {
		r.Close()
		return nil, fmt.Errorf("prefork: the region has room for %d more workers beside the old supervisor's %d; %d workers need a restart",
			free, len(in.oldIndexes), n)
	}
	return r, nil
}

// watch reads the old supervisor's messages and posts them: it made this
// one the main process, then (EOF) it is gone.
func (in *inheritance) watch(post func(any)) {
	go func() {
		var b [1]byte
		for {
			if _, err := in.channel.Read(b[:]); err != nil {
				// The old supervisor is gone: its end of the channel
				// with it. A later tellReady fails, as it must.
				in.channel.Close()
				post(mainEvent{gone: true})
				return
			}
			if b[0] == msgMain || b[0] == msgAbandon {
				post(mainEvent{abandoned: b[0] == msgAbandon})
			}
		}
	}()
}

// tellReady reports this supervisor ready to the old one.
func (in *inheritance) tellReady() error {
	_, err := in.channel.Write([]byte{msgReady})
	return err
}

// upgradeEnviron is the new supervisor's environment: this one's, without
// what marks a worker, the watchdog's pid (the new supervisor is to ping
// it once it is the main process) and an earlier upgrade's variable.
func upgradeEnviron(environ []string, indexes []int, gen int, files, listeners []string) []string {
	out := make([]string, 0, len(environ)+1)
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case envWorker, envName, envRSSDelay, envWatchdogPID, envUpgrade, envListeners:
			continue
		}
		out = append(out, kv)
	}
	is := make([]string, len(indexes))
	for i, x := range indexes {
		is[i] = strconv.Itoa(x)
	}
	v := envUpgrade + "=indexes=" + strings.Join(is, ",") + ";generation=" + strconv.Itoa(gen) + ";files=" + strings.Join(files, ",")
	if len(listeners) > 0 {
		v += ";listeners=" + strings.Join(listeners, ",")
	}
	return append(out, v)
}

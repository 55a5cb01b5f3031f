package prefork

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Socket activation (sd_listen_fds(3)): a service manager that opened the
// listening sockets itself (systemd's preforkd.socket) passes them from
// descriptor 3 on, with LISTEN_FDS their number, LISTEN_PID naming this
// process and LISTEN_FDNAMES their names (FileDescriptorName=, ':'
// separated). The supervisor then serves them instead of opening
// Options.Listen and Options.ExtraListen's addresses: the sockets exist
// before preforkd starts and outlive its restarts, and connections that
// arrive meanwhile wait in their backlogs.
const (
	envListenPID     = "LISTEN_PID"
	envListenFDs     = "LISTEN_FDS"
	envListenFDNames = "LISTEN_FDNAMES"
	listenFDsStart   = 3
)

// activatedListeners returns the listeners a service manager passed to
// this process: main for Options.Listen (nil when none was passed), and
// extra those of wanted (Options.ExtraListen's names) it passed. The
// variables are removed from the environment either way: no process
// started from here (a worker, an upgrade) takes them for its own.
// Sockets that serve nothing are closed, logged.
func activatedListeners(wanted []string, log *slog.Logger) (main net.Listener, extra map[string]net.Listener, err error) {
	pid, fds, names := os.Getenv(envListenPID), os.Getenv(envListenFDs), os.Getenv(envListenFDNames)
	for _, k := range []string{envListenPID, envListenFDs, envListenFDNames} {
		os.Unsetenv(k)
	}
	if fds == "" || pid != strconv.Itoa(os.Getpid()) {
		return nil, nil, nil // none, or meant for another process
	}
	n, err := strconv.Atoi(fds)
	if err != nil || n < 1 {
		return nil, nil, fmt.Errorf("prefork: %s=%q: want the number of sockets passed", envListenFDs, fds)
	}
	var fdNames []string
	if names != "" {
		fdNames = strings.Split(names, ":")
	}
	m, byName, unused := pickActivated(n, fdNames, wanted)
	listen := func(i int) (net.Listener, error) {
		f := os.NewFile(uintptr(listenFDsStart+i), "LISTEN_FDS")
		ln, err := net.FileListener(f)
		f.Close() // FileListener holds its own descriptor
		if err != nil {
			return nil, fmt.Errorf("prefork: the socket passed by the service manager (%s, #%d): %w", envListenFDs, i+1, err)
		}
		return ln, nil
	}
	for _, i := range unused {
		syscall.Close(listenFDsStart + i)
	}
	closeAll := func() {
		if main != nil {
			main.Close()
		}
		for _, ln := range extra {
			ln.Close()
		}
	}
	if m >= 0 {
		if main, err = listen(m); err != nil {
			return nil, nil, err
		}
	}
	for name, i := range byName {
		ln, err := listen(i)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		if extra == nil {
			extra = map[string]net.Listener{}
		}
		extra[name] = ln
	}
	if len(unused) > 0 {
		log.Warn("sockets passed by the service manager serve nothing: closed", "sockets", n, "closed", len(unused))
	}
	return main, extra, nil
}

// pickActivated decides which of n passed sockets serves what: main is
// the index of Options.Listen's (-1: none), byName those of wanted, and
// unused the others. When a passed name (fdNames, if it names each
// socket) is one of wanted, sockets go by name, and main is the first
// socket named otherwise; else by order: main first, then wanted in
// turn.
func pickActivated(n int, fdNames, wanted []string) (main int, byName map[string]int, unused []int) {
	main = -1
	byName = map[string]int{}
	taken := make([]bool, n)
	if len(fdNames) == n && slices.ContainsFunc(fdNames, func(s string) bool { return slices.Contains(wanted, s) }) {
		for i, s := range fdNames {
			if _, dup := byName[s]; !dup && slices.Contains(wanted, s) {
				byName[s], taken[i] = i, true
			}
		}
		for i := range n {
			if !taken[i] && !slices.Contains(wanted, fdNames[i]) {
				main, taken[i] = i, true
				break
			}
		}
	} else {
		main, taken[0] = 0, true
		for i, s := range wanted {
			if i+1 < n {
				byName[s], taken[i+1] = i+1, true
			}
		}
	}
	for i := range n {
		if !taken[i] {
			unused = append(unused, i)
		}
	}
	return main, byName, unused
}

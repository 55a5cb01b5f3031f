package prefork

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"syscall"
)

// Socket activation (sd_listen_fds(3)): a service manager that opened the
// listening socket itself (systemd's preforkd.socket) passes it as
// descriptor 3, with LISTEN_FDS=1 and LISTEN_PID naming this process. The
// supervisor then serves it instead of opening Options.Listen: the
// socket exists before preforkd starts and outlives its restarts, and
// connections that arrive meanwhile wait in its backlog.
const (
	envListenPID     = "LISTEN_PID"
	envListenFDs     = "LISTEN_FDS"
	envListenFDNames = "LISTEN_FDNAMES"
	listenFDsStart   = 3
)

// activatedListener returns the listener a service manager passed to this
// process, or nil when none was. The variables are removed from the
// environment either way: no process started from here (a worker, an
// upgrade) takes them for its own. With several sockets passed, the first
// is served and the others are closed, logged.
func activatedListener(log *slog.Logger) (net.Listener, error) {
	pid, fds := os.Getenv(envListenPID), os.Getenv(envListenFDs)
	for _, k := range []string{envListenPID, envListenFDs, envListenFDNames} {
		os.Unsetenv(k)
	}
	if fds == "" || pid != strconv.Itoa(os.Getpid()) {
		return nil, nil // none, or meant for another process
	}
	n, err := strconv.Atoi(fds)
	if err != nil || n < 1 {
		return nil, fmt.Errorf("prefork: %s=%q: want the number of sockets passed", envListenFDs, fds)
	}
	f := os.NewFile(listenFDsStart, "LISTEN_FDS")
	ln, err := net.FileListener(f)
	f.Close() // FileListener holds its own descriptor
	if err != nil {
		return nil, fmt.Errorf("prefork: the socket passed by the service manager (%s): %w", envListenFDs, err)
	}
	for fd := listenFDsStart + 1; fd < listenFDsStart+n; fd++ {
		syscall.Close(fd)
	}
	if n > 1 {
		log.Warn("several sockets passed: serving the first, closing the others", "sockets", n)
	}
	return ln, nil
}

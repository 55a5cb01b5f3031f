package prefork

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"
)

// envNotifySocket is systemd's notification socket: a path, or an abstract
// socket name starting with '@'.
const envNotifySocket = "NOTIFY_SOCKET"

// systemd's watchdog (WatchdogSec=): the interval in µs, and the pid it
// is meant for (sd_watchdog_enabled(3)).
const (
	envWatchdogUsec = "WATCHDOG_USEC"
	envWatchdogPID  = "WATCHDOG_PID"
)

// Notification states (sd_notify(3)).
const (
	notifyReady    = "READY=1"
	notifyStopping = "STOPPING=1"
	notifyWatchdog = "WATCHDOG=1"
)

// watchdogPings is how often the supervisor sends WATCHDOG=1 for the
// values of WATCHDOG_USEC and WATCHDOG_PID: half the watchdog's interval,
// as sd_watchdog_enabled(3) advises; 0 when there is no watchdog, or one
// meant for another process (WATCHDOG_PID names another pid: the
// variables were inherited).
func watchdogPings(usec, pid string, self int) (time.Duration, error) {
	if usec == "" {
		return 0, nil
	}
	if pid != "" && pid != strconv.Itoa(self) {
		return 0, nil
	}
	n, err := strconv.ParseUint(usec, 10, 63)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("prefork: %s=%q: want a positive number of microseconds", envWatchdogUsec, usec)
	}
	return time.Duration(min(n, uint64(math.MaxInt64/int64(time.Microsecond)))) * time.Microsecond / 2, nil
}

// notifier sends sd_notify(3) messages to the service manager. A nil
// notifier (NOTIFY_SOCKET unset) sends nothing. It dials for every message,
// as libsystemd does: messages are rare, and a socket that the manager
// re-created is found again.
type notifier struct {
	addr *net.UnixAddr
}

// newNotifier returns the notifier for socket, the value of NOTIFY_SOCKET;
// nil when it is empty.
func newNotifier(socket string) (*notifier, error) {
	if socket == "" {
		return nil, nil
	}
	if !strings.HasPrefix(socket, "/") && !strings.HasPrefix(socket, "@") {
		return nil, fmt.Errorf("prefork: %s=%q: only a path or an abstract '@' name is supported", envNotifySocket, socket)
	}
	// Go maps a leading '@' to the abstract namespace (a leading NUL byte).
	return &notifier{addr: &net.UnixAddr{Name: socket, Net: "unixgram"}}, nil
}

// send writes one notification.
func (n *notifier) send(state string) error {
	if n == nil {
		return nil
	}
	c, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return fmt.Errorf("prefork: notify %s: %w", n.addr.Name, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("prefork: notify %s: %w", n.addr.Name, err)
	}
	return nil
}

package prefork

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// reloadingState is the message that starts a reload. systemd's
// Type=notify-reload sends HUP, then takes RELOADING=1 as the answer to
// that HUP only with MONOTONIC_USEC (CLOCK_MONOTONIC in µs, decimal) in
// the same message and no earlier than the instant it sent the signal;
// then it waits for READY=1. So the time is read here, when the HUP is
// handled, never cached.
func reloadingState() string {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return "RELOADING=1"
	}
	return fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d", ts.Nano()/1000)
}

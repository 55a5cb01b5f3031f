package tlsconf

import (
	"crypto/tls"
	"time"
)

// RotateWith is rotate, for the tests.
func RotateWith(cfg *tls.Config, t Tickets, now func() time.Time, wake <-chan struct{}, set func(epoch int64)) func() {
	return rotate(cfg, t, now, wake, set)
}

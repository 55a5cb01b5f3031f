//go:build linux

package loop

import "time"

// SetDrainGraces shortens the drain rule's graces for a test.
func SetDrainGraces(s *Server, idle, fresh time.Duration) {
	s.drainIdleGrace, s.drainNewGrace = idle, fresh
}

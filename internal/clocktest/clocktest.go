// Package clocktest fakes what time.Now reads after the wall clock was
// stepped (an NTP step, a resumed VM), for tests of code that must measure
// durations by the monotonic clock.
package clocktest

import (
	"time"
	"unsafe"
)

// Stepped is time.Now after the wall clock was stepped by d (whole
// seconds): the wall reading moves, the monotonic one does not. A
// time.Time with a monotonic reading keeps the wall clock's seconds
// (since 1885) in bits 30-62 of its first word.
func Stepped(d time.Duration) time.Time {
	t := time.Now()
	w := (*uint64)(unsafe.Pointer(&t))
	*w += uint64(int64(d/time.Second)) << 30
	return t
}

// Works reports whether Stepped moves the wall reading only, as a test
// must check before it relies on it.
func Works() bool {
	s := Stepped(time.Hour)
	return s.Unix()-time.Now().Unix() >= 3599 && time.Until(s) < time.Second
}

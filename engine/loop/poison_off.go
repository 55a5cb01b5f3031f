//go:build linux && !loop_poison

package loop

// poison does nothing outside tests built with loop_poison (poison_on.go).
func poison([]byte) {}

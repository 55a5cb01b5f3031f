//go:build linux && loop_poison

package loop

// With the loop_poison build tag, a buffer that goes back to its pool is
// filled with 0xAA, so that a reader that kept a slice of it sees garbage.
func poison(b []byte) {
	b = b[:cap(b)]
	for i := range b {
		b[i] = 0xAA
	}
}

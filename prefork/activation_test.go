//go:build linux

package prefork

import (
	"maps"
	"slices"
	"testing"
)

func TestPickActivated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		n       int
		fdNames []string
		wanted  []string
		main    int
		byName  map[string]int
		unused  []int
	}{
		{"one socket", 1, []string{"preforkd.socket"}, nil, 0, map[string]int{}, nil},
		{"several, no extra: the first", 3, nil, nil, 0, map[string]int{}, []int{1, 2}},
		{"by order", 2, []string{"preforkd.socket", "preforkd.socket"}, []string{"cleartext"}, 0, map[string]int{"cleartext": 1}, nil},
		{"by order, fewer sockets", 1, nil, []string{"cleartext"}, 0, map[string]int{}, nil},
		{"by name, extra first", 2, []string{"cleartext", "preforkd.socket"}, []string{"cleartext"}, 1, map[string]int{"cleartext": 0}, nil},
		{"by name, extra alone", 1, []string{"cleartext"}, []string{"cleartext"}, -1, map[string]int{"cleartext": 0}, nil},
		{"by name, a spare", 3, []string{"a", "cleartext", "b"}, []string{"cleartext"}, 0, map[string]int{"cleartext": 1}, []int{2}},
		{"names that do not count the sockets: by order", 2, []string{"cleartext"}, []string{"cleartext"}, 0, map[string]int{"cleartext": 1}, nil},
	} {
		main, byName, unused := pickActivated(tc.n, tc.fdNames, tc.wanted)
		if main != tc.main || !maps.Equal(byName, tc.byName) || !slices.Equal(unused, tc.unused) {
			t.Errorf("%s: got main %d, %v, unused %v; want %d, %v, %v", tc.name, main, byName, unused, tc.main, tc.byName, tc.unused)
		}
	}
}

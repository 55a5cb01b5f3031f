package engine

import (
	"fmt"
	"testing"
)

// A NameSet answers alike for a few names (kept in place) and for many (a
// map), without case, and only for the names added.
func TestNameSet(t *testing.T) {
	for _, n := range []int{1, 8, 9, 3500} {
		var s NameSet
		if !s.Empty() {
			t.Fatal("the zero NameSet is not empty")
		}
		for i := range n {
			s.Add(fmt.Appendf(nil, "X-Hop-%d", i))
		}
		for i := range n {
			if !s.Has(fmt.Appendf(nil, "x-HOP-%d", i)) {
				t.Fatalf("%d names: x-HOP-%d not found", n, i)
			}
		}
		for _, name := range []string{fmt.Sprintf("X-Hop-%d", n), "X-Hop-", "X-Hop-1x", ""} {
			if s.Has([]byte(name)) {
				t.Errorf("%d names: %q found", n, name)
			}
		}
		long := make([]byte, 300)
		for i := range long {
			long[i] = 'A'
		}
		if s.Has(long) {
			t.Errorf("%d names: a long name found", n)
		}
		s.Add(long)
		if !s.Has(append([]byte("a"), long[1:]...)) {
			t.Errorf("%d names: a long name added is not found in another case", n)
		}
	}
}

// A Connection field's own options name no field to drop.
func TestNameSetAddOptions(t *testing.T) {
	var s NameSet
	s.AddOptions([]byte("close, Keep-Alive ,UPGRADE, X-A,,x-b"))
	for _, name := range []string{"close", "keep-alive", "upgrade"} {
		if s.Has([]byte(name)) {
			t.Errorf("%s taken for a field to drop", name)
		}
	}
	if !s.Has([]byte("x-a")) || !s.Has([]byte("X-B")) {
		t.Error("X-A or X-B missing")
	}
}

// Marking the fields a Connection field names is one pass over each:
// thousands of names and fields within max_header_bytes cost microseconds,
// not the tens of milliseconds of a scan of every field for every name.
func BenchmarkDropConnectionNamed(b *testing.B) {
	const n = 3500
	head := []byte("HTTP/1.1 200 OK\r\nConnection: ")
	for i := range n {
		if i > 0 {
			head = append(head, ',')
		}
		head = fmt.Appendf(head, "h%d", i)
	}
	head = append(head, "\r\n"...)
	for i := range n {
		head = fmt.Appendf(head, "h%d: v\r\n", i)
	}
	head = append(head, "Content-Length: 0\r\n\r\n"...)
	fields := make([]Field, 0, n+2)
	b.ReportAllocs()
	for b.Loop() {
		h, err := ParseResponseHead(head, fields[:0])
		if err != nil {
			b.Fatal(err)
		}
		if len(h.Fields) != n+2 || h.Fields[n].Kind != FieldDropped {
			b.Fatalf("%d fields, the last named one %v", len(h.Fields), h.Fields[n].Kind)
		}
	}
}

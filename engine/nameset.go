package engine

import "unsafe"

// NameSet is a set of field names, compared without case: the fields a
// Connection field names (RFC 9110 §7.6.1). Marking them is one pass over
// the names and one over the fields, however many there are: a head
// within max_header_bytes can carry thousands of each, and a scan of every
// field for every name made it cost a worker core tens of milliseconds.
// A few names are kept in place; past them, in a map of their lower case.
// The zero value is empty.
type NameSet struct {
	few  [8][]byte
	n    int
	many map[string]struct{}
	low  []byte // scratch for a name in lower case
}

// Add adds name (aliased while it is one of the few).
func (s *NameSet) Add(name []byte) {
	switch {
	case s.many != nil:
		s.addLower(name)
	case s.n < len(s.few):
		s.few[s.n] = name
		s.n++
	default:
		s.many = make(map[string]struct{}, 2*len(s.few))
		for _, t := range s.few[:s.n] {
			s.addLower(t)
		}
		s.addLower(name)
	}
}

func (s *NameSet) addLower(name []byte) {
	s.low = appendLower(s.low[:0], name)
	s.many[string(s.low)] = struct{}{}
}

// Empty reports whether s has no name.
func (s *NameSet) Empty() bool { return s.n == 0 }

// Has reports whether s has name, in any case.
func (s *NameSet) Has(name []byte) bool {
	if s.many == nil {
		for _, t := range s.few[:s.n] {
			if EqualFold(name, unsafe.String(unsafe.SliceData(t), len(t))) {
				return true
			}
		}
		return false
	}
	var buf [128]byte
	_, ok := s.many[string(appendLower(buf[:0], name))] // no copy made for the lookup
	return ok
}

// appendLower appends b to dst in ASCII lower case (field names are
// tokens: ASCII).
func appendLower(dst, b []byte) []byte {
	for _, c := range b {
		dst = append(dst, lower(c))
	}
	return dst
}

// AddOptions adds the elements of a Connection field's value, but its own
// options (close, keep-alive, upgrade), which name no field to drop.
func (s *NameSet) AddOptions(list []byte) {
	EachToken(list, func(t []byte) {
		if !EqualFold(t, "close") && !EqualFold(t, "keep-alive") && !EqualFold(t, "upgrade") {
			s.Add(t)
		}
	})
}

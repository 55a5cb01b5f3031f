package textvalue

import (
	"fmt"
	"strconv"
	"strings"
)

// Enum holds the names of a small integer type's values, indexed by value:
// the first is the zero value's. A value at or past len(e) has no name.
//
// Parse and Unmarshal word their errors as `pkg: "x" is not one of "a",
// "b"`, Check and Marshal as `pkg: 7 is not one of "a", "b"`; a type whose
// errors read otherwise builds them around Name and Value.
type Enum[T ~uint8] []string

// Name returns v's name; ok is false when v has none.
func (e Enum[T]) Name(v T) (name string, ok bool) {
	if int(v) < len(e) {
		return e[v], true
	}
	return "", false
}

// Value returns the value named s; ok is false when no value is.
func (e Enum[T]) Value(s string) (v T, ok bool) {
	for i, name := range e {
		if name == s {
			return T(i), true
		}
	}
	return 0, false
}

// String returns v's name or, for a value without one, typ and the number
// in parentheses ("Phase(7)"), or the number alone when typ is "". Only a
// value without a name allocates.
func (e Enum[T]) String(v T, typ string) string {
	if name, ok := e.Name(v); ok {
		return name
	}
	if typ == "" {
		return strconv.Itoa(int(v))
	}
	return typ + "(" + strconv.Itoa(int(v)) + ")"
}

// Check refuses a value that has no name (one set in Go); the error starts
// with pkg.
func (e Enum[T]) Check(pkg string, v T) error {
	if int(v) < len(e) {
		return nil
	}
	return fmt.Errorf("%s: %d is not one of %s", pkg, v, e.list())
}

// Marshal returns v's name, or Check's error.
func (e Enum[T]) Marshal(pkg string, v T) ([]byte, error) {
	if err := e.Check(pkg, v); err != nil {
		return nil, err
	}
	return []byte(e[v]), nil
}

// Parse returns the value named s, or an error that starts with pkg.
func (e Enum[T]) Parse(pkg, s string) (T, error) {
	v, ok := e.Value(s)
	if !ok {
		return 0, fmt.Errorf("%s: %q is not one of %s", pkg, s, e.list())
	}
	return v, nil
}

// Unmarshal sets *v to the value named text, or returns Parse's error and
// leaves *v as it is.
func (e Enum[T]) Unmarshal(pkg string, text []byte, v *T) error {
	return Unmarshal(text, v, func(s string) (T, error) { return e.Parse(pkg, s) })
}

// list is the names, quoted, separated by commas.
func (e Enum[T]) list() string {
	q := make([]string, len(e))
	for i, n := range e {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

// Unmarshal sets *v to parse(text), or returns parse's error and leaves *v
// as it is: the UnmarshalText of a type that has a Parse function.
func Unmarshal[T any](text []byte, v *T, parse func(string) (T, error)) error {
	p, err := parse(string(text))
	if err != nil {
		return err
	}
	*v = p
	return nil
}

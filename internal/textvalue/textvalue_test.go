package textvalue_test

import (
	"errors"
	"strconv"
	"testing"

	"github.com/preforkd/preforkd/internal/textvalue"
)

type color uint8

var colors = textvalue.Enum[color]{"red", "green"}

// Every named value goes to its name and back; a value past the names has
// none and is written as a number.
func TestEnumNames(t *testing.T) {
	for i, want := range colors {
		v := color(i)
		if name, ok := colors.Name(v); !ok || name != want {
			t.Errorf("Name(%d) = %q, %v; want %q", i, name, ok, want)
		}
		if got := colors.String(v, "color"); got != want {
			t.Errorf("String(%d) = %q, want %q", i, got, want)
		}
		if b, err := colors.Marshal("pkg", v); err != nil || string(b) != want {
			t.Errorf("Marshal(%d) = %q, %v; want %q", i, b, err, want)
		}
		if got, ok := colors.Value(want); !ok || got != v {
			t.Errorf("Value(%q) = %d, %v; want %d", want, got, ok, i)
		}
		if got, err := colors.Parse("pkg", want); err != nil || got != v {
			t.Errorf("Parse(%q) = %d, %v; want %d", want, got, err, i)
		}
		var got color = 9
		if err := colors.Unmarshal("pkg", []byte(want), &got); err != nil || got != v {
			t.Errorf("Unmarshal(%q) = %d, %v; want %d", want, got, err, i)
		}
	}
	if name, ok := colors.Name(2); ok {
		t.Errorf("Name(2) = %q, want none", name)
	}
	if got := colors.String(2, "color"); got != "color(2)" {
		t.Errorf(`String(2, "color") = %q`, got)
	}
	if got := colors.String(255, ""); got != "255" {
		t.Errorf(`String(255, "") = %q`, got)
	}
}

// The errors start with the package given and list the names.
func TestEnumErrors(t *testing.T) {
	const list = `"red", "green"`
	if err := colors.Check("pkg", 1); err != nil {
		t.Errorf("Check(1) = %v", err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"Check", colors.Check("pkg", 2), `pkg: 2 is not one of ` + list},
		{"Marshal", func() error { _, err := colors.Marshal("pkg", 7); return err }(), `pkg: 7 is not one of ` + list},
		{"Parse empty", func() error { _, err := colors.Parse("pkg", ""); return err }(), `pkg: "" is not one of ` + list},
		{"Parse case", func() error { _, err := colors.Parse("pkg", "Red"); return err }(), `pkg: "Red" is not one of ` + list},
		{"Unmarshal", func() error { var c color; return colors.Unmarshal("pkg", []byte("blue"), &c) }(), `pkg: "blue" is not one of ` + list},
	} {
		if tc.err == nil || tc.err.Error() != tc.want {
			t.Errorf("%s: error %v, want %q", tc.name, tc.err, tc.want)
		}
	}
	c := color(1)
	if err := colors.Unmarshal("pkg", []byte("blue"), &c); err == nil || c != 1 {
		t.Errorf("a refused text changed the value to %d", c)
	}
}

// Writing a named value allocates nothing: String may be on a request path.
func TestEnumStringAllocs(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = colors.String(1, "color") }); n != 0 {
		t.Errorf("String allocates %v times", n)
	}
}

// Unmarshal stores what parse returns, and on an error stores nothing.
func TestUnmarshal(t *testing.T) {
	errOdd := errors.New("odd")
	parse := func(s string) (int, error) {
		n, err := strconv.Atoi(s)
		if err != nil {
			return 0, err
		}
		if n%2 != 0 {
			return n, errOdd
		}
		return n, nil
	}
	v := 1
	if err := textvalue.Unmarshal([]byte("42"), &v, parse); err != nil || v != 42 {
		t.Errorf("Unmarshal(42) = %d, %v", v, err)
	}
	if err := textvalue.Unmarshal([]byte("7"), &v, parse); !errors.Is(err, errOdd) || v != 42 {
		t.Errorf("Unmarshal(7) = %d, %v; want 42, %v", v, err, errOdd)
	}
}

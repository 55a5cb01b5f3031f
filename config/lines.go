package config

import (
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// The TOML decoder knows where each key is but does not say: its positions
// are not exported, and the elements of an array of tables share one. So
// when there is a problem to report, indexLines reads the text once more for
// the line of every key, table header and inline table in an array. It
// only runs on text the decoder accepted, so it knows just enough TOML to
// find them; on anything else it stops (lines are then 0).

// lineIndex maps a path (segments joined by NUL; the elements of an array
// are "#N") to the 1-based line where it is defined. The first definition
// wins.
type lineIndex map[string]int

func elem(i int) string { return "#" + strconv.Itoa(i) }

func joinPath(p []string) string { return strings.Join(p, "\x00") }

// line returns the line of the most specific defined prefix of path, or 0:
// an element of an array of values is at its key's line.
func (ix lineIndex) line(path ...string) int {
	for n := len(path); n > 0; n-- {
		if l, ok := ix[joinPath(path[:n])]; ok {
			return l
		}
	}
	return 0
}

// token is one TOML token: blanks, a comment, a string of any of the four
// kinds (a multi-line one may end in up to five quotes), a newline, a
// punctuation mark, or a run of anything else (a bare key, a number, a
// date: a value may be several runs).
var token = regexp.MustCompile(`^(?s:[ \t]+|#[^\n]*|"""(?:\\.|[^\\])*?"""{1,3}|'''.*?'''{1,3}|"(?:\\.|[^"\\\n])*"|'[^'\n]*'|\r?\n|[][{}=,.]|[^][{}=,.# \t\r\n"']+)`)

type lineScanner struct {
	toks   []string // newlines are "\n"; blanks and comments are dropped
	lines  []int    // the line of each token
	i      int
	ix     lineIndex
	arrays map[string]int // array of tables → number of elements so far
}

func indexLines(src string) lineIndex {
	s := &lineScanner{ix: lineIndex{}, arrays: map[string]int{}}
	src = strings.TrimPrefix(src, "\ufeff") // as the decoder does
	for line := 1; src != ""; {
		t := token.FindString(src)
		if t == "" {
			break
		}
		if t[0] != ' ' && t[0] != '\t' && t[0] != '#' {
			s.toks = append(s.toks, strings.TrimPrefix(t, "\r"))
			s.lines = append(s.lines, line)
		}
		line += strings.Count(t, "\n")
		src = src[len(t):]
	}
	var table []string
	for s.i < len(s.toks) {
		switch s.peek() {
		case "\n":
			s.i++
		case "[":
			table = s.header()
		default:
			s.keyValue(table)
		}
	}
	return s.ix
}

func (s *lineScanner) peek() string {
	if s.i < len(s.toks) {
		return s.toks[s.i]
	}
	return ""
}

func (s *lineScanner) eat(t string) bool {
	if s.peek() == t {
		s.i++
		return true
	}
	return false
}

func (s *lineScanner) newlines() {
	for s.eat("\n") {
	}
}

func (s *lineScanner) record(path []string, line int) {
	if k := joinPath(path); s.ix[k] == 0 {
		s.ix[k] = line
	}
}

// header reads "[a.b]" or "[[a.b]]" and returns the path of the table.
func (s *lineScanner) header() []string {
	line := s.lines[s.i]
	s.i++
	array := s.eat("[")
	key := s.key()
	if key == nil {
		s.i = len(s.toks)
		return nil
	}
	// Step into the current element of each array of tables on the way;
	// a table the header creates is defined here.
	var path []string
	for _, k := range key[:len(key)-1] {
		path = append(path, k)
		if n := s.arrays[joinPath(path)]; n > 0 {
			path = append(path, elem(n-1))
		}
		s.record(path, line)
	}
	path = append(path, key[len(key)-1])
	if array {
		n := s.arrays[joinPath(path)]
		s.arrays[joinPath(path)] = n + 1
		s.record(path, line)
		path = append(path, elem(n))
	}
	s.record(path, line)
	s.eat("]")
	s.eat("]")
	return path
}

// keyValue records a dotted key in table and reads its value.
func (s *lineScanner) keyValue(table []string) {
	line := s.lines[s.i]
	key := s.key()
	if key == nil || !s.eat("=") {
		s.i = len(s.toks)
		return
	}
	path := slices.Clone(table)
	for _, k := range key {
		path = append(path, k)
		s.record(path, line)
	}
	s.value(path)
}

// key reads a dotted key; nil if there is none.
func (s *lineScanner) key() []string {
	var parts []string
	for {
		switch t := s.peek(); {
		case strings.HasPrefix(t, `"`) || strings.HasPrefix(t, "'"):
			var v struct{ K string } // the decoder reads its own escapes
			if _, err := toml.Decode("K = "+t, &v); err != nil {
				return nil
			}
			parts = append(parts, v.K)
		case t != "" && strings.IndexFunc(t, func(r rune) bool { return r > 0x7f || !isBare(byte(r)) }) < 0:
			parts = append(parts, t)
		default:
			return nil
		}
		s.i++
		if !s.eat(".") {
			return parts
		}
	}
}

func isBare(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// value reads one value, recording the inline tables under path.
func (s *lineScanner) value(path []string) {
	switch s.peek() {
	case "[":
		s.i++
		for n := 0; ; n++ {
			if s.newlines(); s.peek() == "]" || s.peek() == "" {
				break
			}
			start := s.i
			p := append(slices.Clone(path), elem(n))
			if s.peek() == "{" {
				s.record(p, s.lines[s.i])
			}
			s.value(p)
			s.newlines()
			if !s.eat(",") && s.i == start {
				s.i = len(s.toks)
			}
		}
		s.i++
	case "{":
		s.i++
		for s.newlines(); s.peek() != "}" && s.peek() != ""; s.newlines() {
			s.keyValue(path)
			s.newlines()
			s.eat(",")
		}
		s.i++
	default: // a string, or the runs of a number, a boolean or a date-time
		for t := s.peek(); t != "" && t != "\n" && t != "," && t != "]" && t != "}"; t = s.peek() {
			s.i++
		}
	}
}

package config

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// The TOML decoder does not tell where a key is: its positions are not
// exported, and the elements of an array of tables share one entry. So
// lineIndex scans the source once more and records the line of every key,
// table header and array element, by path. It only runs on text the decoder
// has accepted, so it needs to know just enough TOML to find where keys
// are; on anything it does not expect it gives up quietly (errors then carry
// line 0), and it never panics.

// lineIndex maps a path (segments joined by pathSep; array elements are
// "#N") to the 1-based line where it is defined. The first definition wins.
type lineIndex map[string]int

const pathSep = "\x00"

func elem(i int) string { return "#" + strconv.Itoa(i) }

func joinPath(p []string) string { return strings.Join(p, pathSep) }

// line returns the line of the most specific defined prefix of path, or 0.
func (ix lineIndex) line(path ...string) int {
	for n := len(path); n > 0; n-- {
		if l, ok := ix[joinPath(path[:n])]; ok {
			return l
		}
	}
	return 0
}

type lineScanner struct {
	src  string
	pos  int
	line int
	ix   lineIndex
	aot  map[string]int // array-of-tables path → number of elements so far
	bad  bool           // something unexpected: stop
}

func indexLines(src string) lineIndex {
	// The decoder skips a byte-order mark; so do we. The lengths differ,
	// but what counts here is lines, not offsets.
	src = strings.TrimPrefix(src, "\xef\xbb\xbf")
	s := &lineScanner{src: src, line: 1, ix: lineIndex{}, aot: map[string]int{}}
	s.document()
	return s.ix
}

func (s *lineScanner) peek(off int) byte {
	if s.pos+off < len(s.src) {
		return s.src[s.pos+off]
	}
	return 0
}

func (s *lineScanner) eof() bool { return s.bad || s.pos >= len(s.src) }

func (s *lineScanner) advance() {
	if s.pos < len(s.src) {
		if s.src[s.pos] == '\n' {
			s.line++
		}
		s.pos++
	}
}

func (s *lineScanner) record(path []string, line int) {
	k := joinPath(path)
	if _, ok := s.ix[k]; !ok {
		s.ix[k] = line
	}
}

// skip skips blanks, and also newlines and comments when nl is set.
func (s *lineScanner) skip(nl bool) {
	for !s.eof() {
		switch c := s.peek(0); {
		case c == ' ' || c == '\t':
			s.advance()
		case nl && (c == '\n' || c == '\r'):
			s.advance()
		case nl && c == '#':
			s.skipComment()
		default:
			return
		}
	}
}

func (s *lineScanner) skipComment() {
	for !s.eof() && s.peek(0) != '\n' {
		s.advance()
	}
}

func (s *lineScanner) document() {
	var ctx []string
	for s.skip(true); !s.eof(); s.skip(true) {
		start := s.pos
		line := s.line
		if s.peek(0) == '[' {
			ctx = s.header(line)
		} else {
			key := s.key()
			if s.bad || s.peek(0) != '=' {
				return
			}
			s.advance()
			s.keyValue(ctx, key, line)
		}
		// Rest of the line: blanks and a comment.
		s.skip(false)
		if s.peek(0) == '#' {
			s.skipComment()
		}
		if s.pos == start {
			return // no progress: not TOML we understand
		}
	}
}

// header reads "[a.b]" or "[[a.b]]" and returns the new context path.
func (s *lineScanner) header(line int) []string {
	s.advance()
	array := s.peek(0) == '['
	if array {
		s.advance()
	}
	s.skip(false)
	key := s.key()
	if s.bad {
		return nil
	}
	path := s.resolve(key[:len(key)-1])
	path = append(path, key[len(key)-1])
	if array {
		name := joinPath(path)
		n := s.aot[name]
		s.aot[name] = n + 1
		s.record(path, line)
		path = append(path, elem(n))
	}
	s.record(path, line)
	for i := 0; i < 2 && s.peek(0) == ']'; i++ {
		s.advance()
	}
	return path
}

// resolve turns the segments of a table name into a path, stepping into the
// current element of each array of tables on the way.
func (s *lineScanner) resolve(key []string) []string {
	var path []string
	for _, k := range key {
		path = append(path, k)
		if n, ok := s.aot[joinPath(path)]; ok && n > 0 {
			path = append(path, elem(n-1))
		}
	}
	return path
}

// keyValue records a dotted key and scans its value.
func (s *lineScanner) keyValue(ctx, key []string, line int) {
	path := append([]string(nil), ctx...)
	for _, k := range key {
		path = append(path, k)
		s.record(path, line)
	}
	s.skip(false)
	s.value(path)
}

// key reads a dotted key (bare or quoted parts) and leaves s after it and the
// blanks that follow.
func (s *lineScanner) key() []string {
	var parts []string
	for {
		s.skip(false)
		var part string
		switch c := s.peek(0); {
		case c == '"':
			part = s.basicString()
		case c == '\'':
			part = s.literalString()
		case isBare(c):
			start := s.pos
			for isBare(s.peek(0)) {
				s.advance()
			}
			part = s.src[start:s.pos]
		default:
			s.bad = true
			return nil
		}
		parts = append(parts, part)
		s.skip(false)
		if s.peek(0) != '.' {
			return parts
		}
		s.advance()
	}
}

func isBare(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// value scans one value, recording the keys of inline tables under path.
func (s *lineScanner) value(path []string) {
	switch c := s.peek(0); c {
	case '"':
		if s.peek(1) == '"' && s.peek(2) == '"' {
			s.multiline('"')
		} else {
			s.basicString()
		}
	case '\'':
		if s.peek(1) == '\'' && s.peek(2) == '\'' {
			s.multiline('\'')
		} else {
			s.literalString()
		}
	case '[':
		s.advance()
		for i := 0; ; i++ {
			s.skip(true)
			if s.eof() || s.peek(0) == ']' {
				break
			}
			p := append(append([]string(nil), path...), elem(i))
			s.record(p, s.line)
			start := s.pos
			s.value(p)
			s.skip(true)
			if s.peek(0) == ',' {
				s.advance()
			} else if s.pos == start {
				s.bad = true
			}
		}
		s.advance()
	case '{':
		s.advance()
		for {
			s.skip(true)
			if s.eof() || s.peek(0) == '}' {
				break
			}
			line := s.line
			key := s.key()
			if s.bad || s.peek(0) != '=' {
				s.bad = true
				return
			}
			s.advance()
			s.keyValue(path, key, line)
			s.skip(true)
			if s.peek(0) == ',' {
				s.advance()
			}
		}
		s.advance()
	default:
		s.scalar()
	}
}

// scalar skips a number, boolean or date-time. A date and a time may be
// separated by one space.
func (s *lineScanner) scalar() {
	start := s.pos
	for !s.eof() {
		c := s.peek(0)
		if c == ' ' && s.pos-start == 10 && s.src[start+4] == '-' && isDigit(s.peek(1)) {
			s.advance()
			continue
		}
		if c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ',' || c == ']' || c == '}' || c == '#' {
			break
		}
		s.advance()
	}
	if s.pos == start {
		s.bad = true
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// basicString reads "..." and returns its unescaped content.
func (s *lineScanner) basicString() string {
	s.advance()
	start := s.pos
	for !s.eof() && s.peek(0) != '"' && s.peek(0) != '\n' {
		if s.peek(0) == '\\' {
			s.advance()
		}
		s.advance()
	}
	raw := s.src[start:s.pos]
	s.advance()
	return unescape(raw)
}

// literalString reads '...' and returns its content.
func (s *lineScanner) literalString() string {
	s.advance()
	start := s.pos
	for !s.eof() && s.peek(0) != '\'' && s.peek(0) != '\n' {
		s.advance()
	}
	raw := s.src[start:s.pos]
	s.advance()
	return raw
}

// multiline skips a """...""" or ”'...”' string; up to two quotes may
// directly precede the closing three.
func (s *lineScanner) multiline(q byte) {
	s.pos += 3
	for !s.eof() {
		c := s.peek(0)
		if q == '"' && c == '\\' {
			s.advance()
			s.advance()
			continue
		}
		if c == q && s.peek(1) == q && s.peek(2) == q {
			s.pos += 3
			for i := 0; i < 2 && s.peek(0) == q; i++ {
				s.pos++
			}
			return
		}
		s.advance()
	}
}

// unescape decodes the escapes of a TOML basic string. Invalid escapes
// (which the decoder has already refused) are kept as they are.
func unescape(raw string) string {
	if !strings.Contains(raw, `\`) {
		return raw
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' || i+1 >= len(raw) {
			b.WriteByte(c)
			continue
		}
		i++
		switch e := raw[i]; e {
		case 'b':
			b.WriteByte('\b')
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'f':
			b.WriteByte('\f')
		case 'r':
			b.WriteByte('\r')
		case 'e':
			b.WriteByte(0x1b)
		case '"', '\\':
			b.WriteByte(e)
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			var v uint64
			err := strconv.ErrSyntax
			if i+1+n <= len(raw) {
				v, err = strconv.ParseUint(raw[i+1:i+1+n], 16, 32)
			}
			if err != nil || !utf8.ValidRune(rune(v)) {
				b.WriteByte('\\')
				b.WriteByte(e)
				continue
			}
			b.WriteRune(rune(v))
			i += n
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return b.String()
}

package httpcache

import "strings"

// Targeted cache-control fields (RFC 9213): CDN-Cache-Control, and a
// cache's own (preforkd's is configurable). They say what Cache-Control
// says, to the caches they target only, and they are Dictionary
// Structured Fields (RFC 9651 §3.2): parsed as such, never as
// Cache-Control is, and ignored whole when they do not parse.

// ParseTargeted reads the lines of a targeted field. ok is false when
// the field is absent, empty or invalid: a Structured Field parsing error,
// or a directive this cache knows with a value of the wrong type
// (max-age="60", a negative max-age, no-store=1). The field then does not
// count, and Cache-Control and Expires apply (RFC 9213 §2.1). Known
// directives are those of Cache-Control; parameters are ignored, unknown
// directives too; a directive given twice counts with its last value, as
// in any Dictionary.
func ParseTargeted(lines []string) (d Directives, ok bool) {
	d = Directives{MaxAge: -1, SMaxAge: -1, SWR: -1, SIE: -1}
	var p sfParser
	members := 0
	for _, line := range lines {
		p = sfParser{s: line}
		p.skipSP()
		if p.done() && len(lines) > 1 {
			continue // an empty line of several adds nothing
		}
		for {
			key, ok := p.key()
			if !ok {
				return d, false
			}
			v := sfItem{kind: sfBoolean, boolean: true}
			if p.peek() == '=' {
				p.i++
				if v, ok = p.memberValue(); !ok {
					return d, false
				}
			}
			if !p.parameters() {
				return d, false
			}
			if !d.set(key, v) {
				return d, false
			}
			members++
			p.skipOWS()
			if p.done() {
				break
			}
			if p.peek() != ',' {
				return d, false
			}
			p.i++
			p.skipOWS()
			if p.done() {
				return d, false // a trailing comma
			}
		}
	}
	return d, members > 0
}

// set applies one directive of a targeted field; false for a known
// directive with a value of the wrong type.
func (d *Directives) set(key string, v sfItem) bool {
	flag, delta := d.directive(key)
	switch {
	case flag != nil && v.kind == sfBoolean:
		*flag = v.boolean
	case flag != nil && v.kind == sfString && (flag == &d.NoCache || flag == &d.Private):
		// no-cache and private may list field names (a String): taken
		// as the unqualified directive, as for Cache-Control.
		*flag = true
	case delta != nil && v.kind == sfInteger && v.integer >= 0:
		*delta = min(v.integer, MaxDelta)
	case flag != nil || delta != nil:
		return false
	}
	return true // an extension: ignored
}

// The types of a Structured Field item this parser tells apart.
const (
	sfInteger = iota
	sfDecimal
	sfString
	sfToken
	sfBytes
	sfBoolean
	sfDate
	sfDisplay
	sfInnerList
)

// sfItem is a member value: its type, and its value for the types a
// cache directive can have.
type sfItem struct {
	kind    int
	integer int64
	boolean bool
}

// sfParser walks one field line (RFC 9651 §4.2).
type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }

func (p *sfParser) peek() byte {
	if p.done() {
		return 0
	}
	return p.s[p.i]
}

func (p *sfParser) skipSP() {
	for !p.done() && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for !p.done() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func lcalpha(c byte) bool { return 'a' <= c && c <= 'z' }
func digit(c byte) bool   { return '0' <= c && c <= '9' }

// key reads a key: ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" /
// "." / "*" ).
func (p *sfParser) key() (string, bool) {
	start := p.i
	if c := p.peek(); !lcalpha(c) && c != '*' {
		return "", false
	}
	p.i++
	for !p.done() {
		c := p.s[p.i]
		if !lcalpha(c) && !digit(c) && c != '_' && c != '-' && c != '.' && c != '*' {
			break
		}
		p.i++
	}
	return p.s[start:p.i], true
}

// memberValue reads an item or an inner list, with their parameters left
// for the caller (an item's) or read (an inner list's members').
func (p *sfParser) memberValue() (sfItem, bool) {
	if p.peek() != '(' {
		return p.bareItem()
	}
	p.i++
	for {
		p.skipSP()
		if p.peek() == ')' {
			p.i++
			return sfItem{kind: sfInnerList}, true
		}
		if _, ok := p.bareItem(); !ok || !p.parameters() {
			return sfItem{}, false
		}
		if c := p.peek(); c != ' ' && c != ')' {
			return sfItem{}, false
		}
	}
}

// parameters reads *( ";" *SP key [ "=" bare-item ] ).
func (p *sfParser) parameters() bool {
	for p.peek() == ';' {
		p.i++
		p.skipSP()
		if _, ok := p.key(); !ok {
			return false
		}
		if p.peek() == '=' {
			p.i++
			if _, ok := p.bareItem(); !ok {
				return false
			}
		}
	}
	return true
}

// bareItem reads an Integer, Decimal, String, Token, Byte Sequence,
// Boolean, Date or Display String.
func (p *sfParser) bareItem() (sfItem, bool) {
	switch c := p.peek(); {
	case c == '-' || digit(c):
		return p.number()
	case c == '"':
		return sfItem{kind: sfString}, p.str()
	case c == '*' || 'A' <= c && c <= 'Z' || lcalpha(c):
		p.i++
		for !p.done() && (tchar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
			p.i++
		}
		return sfItem{kind: sfToken}, true
	case c == ':':
		p.i++
		end := strings.IndexByte(p.s[p.i:], ':')
		if end < 0 {
			return sfItem{}, false
		}
		for _, b := range []byte(p.s[p.i : p.i+end]) {
			if !lcalpha(b) && !('A' <= b && b <= 'Z') && !digit(b) && b != '+' && b != '/' && b != '=' {
				return sfItem{}, false
			}
		}
		p.i += end + 1
		return sfItem{kind: sfBytes}, true
	case c == '?':
		p.i++
		switch p.peek() {
		case '0':
			p.i++
			return sfItem{kind: sfBoolean}, true
		case '1':
			p.i++
			return sfItem{kind: sfBoolean, boolean: true}, true
		}
		return sfItem{}, false
	case c == '@':
		p.i++
		it, ok := p.number()
		return sfItem{kind: sfDate}, ok && it.kind == sfInteger
	case c == '%':
		p.i++
		return sfItem{kind: sfDisplay}, p.peek() == '"' && p.str()
	}
	return sfItem{}, false
}

// number reads an Integer (at most 15 digits) or a Decimal (at most 12
// digits, a dot, 1 to 3 digits).
func (p *sfParser) number() (sfItem, bool) {
	neg := p.peek() == '-'
	if neg {
		p.i++
	}
	var n int64
	intDigits, fracDigits, dot := 0, 0, false
	for !p.done() {
		c := p.s[p.i]
		switch {
		case digit(c) && !dot:
			n = n*10 + int64(c-'0')
			intDigits++
		case digit(c):
			fracDigits++
		case c == '.' && !dot:
			dot = true
		default:
			goto end
		}
		p.i++
	}
end:
	switch {
	case intDigits == 0:
		return sfItem{}, false
	case !dot && intDigits > 15:
		return sfItem{}, false
	case dot && (intDigits > 12 || fracDigits == 0 || fracDigits > 3):
		return sfItem{}, false
	case dot:
		return sfItem{kind: sfDecimal}, true
	}
	if neg {
		n = -n
	}
	return sfItem{kind: sfInteger, integer: n}, true
}

// str reads a String: printable ASCII in quotes, with \" and \\ only.
func (p *sfParser) str() bool {
	p.i++ // the opening quote
	for !p.done() {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '"':
			return true
		case c == '\\':
			if n := p.peek(); n != '"' && n != '\\' {
				return false
			}
			p.i++
		case c < 0x20 || c > 0x7e:
			return false
		}
	}
	return false
}

// tchar reports a token character (RFC 9110 §5.6.2).
func tchar(c byte) bool {
	switch {
	case lcalpha(c), 'A' <= c && c <= 'Z', digit(c):
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

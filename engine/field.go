package engine

import (
	"bytes"
	"unsafe"

	"github.com/preforkd/preforkd/internal/httpfield"
	"github.com/preforkd/preforkd/route"
)

// The HTTP/1.1 header field rules a proxy applies (RFC 9110 §5, §7.6.1;
// RFC 9112 §5): what a field is to a proxy, by its name, and what makes a
// header line one it must refuse. The engines that read heads themselves
// (engine/loop, package proxy) check every line here, so that they accept,
// refuse and forward the same fields. Nothing here allocates.

// FieldKind classifies a header field by its name: what a proxy does with
// it.
type FieldKind uint8

const (
	FieldOther          FieldKind = iota
	FieldHost                     // kept as sent, also sent as X-Forwarded-Host
	FieldHopByHop                 // never forwarded (RFC 9110 §7.6.1)
	FieldConnection               // hop-by-hop, and names more hop-by-hop fields
	FieldUpgrade                  // hop-by-hop unless the request is upgraded
	FieldLength                   // Content-Length: the framing is sent anew
	FieldEncoding                 // Transfer-Encoding: likewise
	FieldExpect                   // answered here, never forwarded
	FieldForwardedFor             // merged into the one X-Forwarded-For sent
	FieldForwardedOther           // X-Forwarded-Proto/-Host: replaced
	FieldDropped                  // named by Connection, or a request field's name with '_': never forwarded
)

// ClassifyField tells a header field's kind by its name.
func ClassifyField(name []byte) FieldKind {
	switch len(name) {
	case 2:
		if EqualFold(name, "te") {
			return FieldHopByHop
		}
	case 4:
		if EqualFold(name, "host") {
			return FieldHost
		}
	case 6:
		if EqualFold(name, "expect") {
			return FieldExpect
		}
	case 7:
		switch {
		case EqualFold(name, "upgrade"):
			return FieldUpgrade
		case EqualFold(name, "trailer"):
			return FieldHopByHop
		}
	case 10:
		switch {
		case EqualFold(name, "connection"):
			return FieldConnection
		case EqualFold(name, "keep-alive"):
			return FieldHopByHop
		}
	case 14:
		if EqualFold(name, "content-length") {
			return FieldLength
		}
	case 15:
		if EqualFold(name, "x-forwarded-for") {
			return FieldForwardedFor
		}
	case 16:
		if EqualFold(name, "x-forwarded-host") {
			return FieldForwardedOther
		}
	case 17:
		switch {
		case EqualFold(name, "transfer-encoding"):
			return FieldEncoding
		case EqualFold(name, "x-forwarded-proto"):
			return FieldForwardedOther
		}
	}
	if len(name) > 6 && EqualFold(name[:6], "proxy-") {
		return FieldHopByHop // Proxy-Connection, Proxy-Authorization, ...
	}
	return FieldOther
}

// ClassifyRequestField is ClassifyField for a request's field, which is
// dropped when its name has a '_' (nginx's underscores_in_headers off):
// X_Forwarded_For would be X-Forwarded-For to an application that maps
// '_' to '-' (CGI, WSGI, Rack), past every rule that reads the real one.
func ClassifyRequestField(name []byte) FieldKind {
	k := ClassifyField(name)
	if k == FieldOther && bytes.IndexByte(name, '_') >= 0 {
		return FieldDropped
	}
	return k
}

// RequestFieldSeen reports whether the upstream gets a request field of
// kind k as the client sent it (Content-Length and X-Forwarded-For
// reframed or extended, but with the client's value): ownHost when the
// server writes Host itself (an absolute-form target, or no Host value),
// upgrade when the request is upgraded. Every other field is the
// server's to write, or not sent.
func RequestFieldSeen(k FieldKind, ownHost, upgrade bool) bool {
	switch k {
	case FieldOther, FieldLength, FieldForwardedFor:
		return true
	case FieldHost:
		return !ownHost
	case FieldUpgrade:
		return upgrade
	}
	return false
}

// ResponseFieldPassed reports whether a response field of kind k goes on
// to the client: the hop-by-hop fields and the framing are the server's
// to send; on a 101 (switched) Upgrade goes with it, and the server
// sends its own Connection (SwitchedConnection), as nginx does.
func ResponseFieldPassed(k FieldKind, switched bool) bool {
	switch k {
	case FieldOther, FieldHost, FieldForwardedFor, FieldForwardedOther, FieldExpect:
		return true
	case FieldUpgrade:
		return switched
	}
	return false
}

// SwitchedConnection is the Connection field every engine sends with a
// 101 in place of the upstream's: the connection goes on as the tunnel
// whatever the upstream's head said of keeping it for another exchange
// (an HTTP/1.0 status line, close among its options, Keep-Alive:
// timeout=0), for there is none on it, and the client is told so (RFC
// 9110 §7.8: the sender of Upgrade sends the upgrade option).
const SwitchedConnection = "Upgrade"

// ForwardedField returns the value the server sends for a request field
// it writes itself, whatever the client sent: Host and X-Forwarded-Host
// (host, the request's Host or the authority of its absolute-form
// target; none when empty) and X-Forwarded-Proto.
func ForwardedField(name, host []byte) ([]byte, bool) {
	switch {
	case len(name) == 4 && EqualFold(name, "host"),
		len(name) == 16 && EqualFold(name, "x-forwarded-host"):
		return host, len(host) > 0
	case len(name) == 17 && EqualFold(name, "x-forwarded-proto"):
		return protoHTTP, true
	}
	return nil, false
}

var protoHTTP = []byte("http")

// FieldFault is the rule a header line breaks (RFC 9112 §5, RFC 9110
// §5.5), or FieldOK.
type FieldFault uint8

const (
	FieldOK        FieldFault = iota
	FaultObsFold              // the line starts with a space or a tab: obsolete line folding
	FaultNoColon              // no colon
	FaultName                 // the name is not a token
	FaultValueCtrl            // the value has a control character
)

// FieldLine is a header line as ParseFieldLine found it, as offsets into
// the line: the name is line[:NameEnd], the value line[ValueFrom:ValueTo]
// (without the spaces and tabs around it).
type FieldLine struct {
	NameEnd, ValueFrom, ValueTo int
}

// ParseFieldLine checks one header line, its CRLF excluded, and finds its
// name and value.
func ParseFieldLine(line []byte) (FieldLine, FieldFault) {
	if len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
		return FieldLine{}, FaultObsFold
	}
	colon := bytes.IndexByte(line, ':')
	if colon < 0 {
		return FieldLine{}, FaultNoColon
	}
	if !route.IsToken(b2s(line[:colon])) {
		return FieldLine{}, FaultName
	}
	from, to := colon+1, len(line)
	for from < to && (line[from] == ' ' || line[from] == '\t') {
		from++
	}
	for to > from && (line[to-1] == ' ' || line[to-1] == '\t') {
		to--
	}
	if !FieldValueOK(line[from:to]) {
		return FieldLine{}, FaultValueCtrl
	}
	return FieldLine{colon, from, to}, FieldOK
}

// FieldValueOK reports whether v has no control character but HTAB
// (RFC 9110 §5.5: CR, LF and NUL must be refused; the others are no
// better).
func FieldValueOK(v []byte) bool {
	for _, c := range v {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// EachToken calls f with each element of a comma-separated list, trimmed,
// skipping empty ones.
func EachToken(list []byte, f func([]byte)) {
	for len(list) > 0 {
		var t []byte
		if t, list = nextToken(list); len(t) > 0 {
			f(t)
		}
	}
}

// Hops gathers what a request's Connection and Upgrade field lines say
// about its connection, which every engine that reads heads must read
// alike: each feeds it the lines as it meets them, then asks.
type Hops struct {
	upgradeField bool // an Upgrade line
	h2c          bool // h2c among the Upgrade lines' protocols
	upgrade      bool // upgrade among the Connection lines' options
	close        bool // close among them
	keepAlive    bool // keep-alive among them
	named        bool // another option: a field name
}

// Upgrade reads one Upgrade field line.
func (h *Hops) Upgrade(v []byte) {
	h.upgradeField = true
	EachToken(v, func(t []byte) { h.h2c = h.h2c || EqualFold(t, "h2c") })
}

// Connection reads one Connection field line.
func (h *Hops) Connection(v []byte) {
	EachToken(v, func(t []byte) {
		switch {
		case EqualFold(t, "upgrade"):
			h.upgrade = true
		case EqualFold(t, "close"):
			h.close = true
		case EqualFold(t, "keep-alive"):
			h.keepAlive = true
		default:
			h.named = true
		}
	})
}

// Close reports whether the connection ends after this request: close
// wins over keep-alive, wherever each is (RFC 9112 §9.6); an HTTP/1.0
// connection is kept only when the client asks.
func (h *Hops) Close(http10 bool) bool { return h.close || http10 && !h.keepAlive }

// Upgrades reports whether the request asks to switch protocols: HTTP/1.1
// with an Upgrade field and upgrade among Connection's options. An
// upgrade to h2c is never tunnelled: HTTP/2 spoken straight to the
// upstream would pass every later request by the core. Such a request
// goes on without it, as HTTP/1.1.
func (h *Hops) Upgrades(http10 bool) bool {
	return h.upgrade && h.upgradeField && !h.h2c && !http10
}

// UpgradeClose reports whether an HTTP/1.1 request has an Upgrade field
// and close among Connection's options: a 101 to it is not tunnelled.
func (h *Hops) UpgradeClose(http10 bool) bool { return h.upgradeField && h.close && !http10 }

// Named reports whether Connection names other fields, which are then
// hop-by-hop too (RFC 9110 §7.6.1).
func (h *Hops) Named() bool { return h.named }

// SwitchAsked reports whether a 101 switches only to protocols the
// request asked for: each in switched, the 101's Upgrade list, is in
// asked, the request's (RFC 9110 §7.8: a server must not switch to one
// the client did not name), ignoring case. Several field lines of
// either are one list joined by commas.
func SwitchAsked(asked, switched []byte) bool {
	for list := switched; len(list) > 0; {
		var t []byte
		t, list = nextToken(list)
		found := len(t) == 0
		for a := asked; len(a) > 0 && !found; {
			var o []byte
			o, a = nextToken(a)
			found = len(o) == len(t) && bytes.EqualFold(o, t)
		}
		if !found {
			return false
		}
	}
	return true
}

// nextToken returns the first element of a comma-separated list, trimmed
// (it may be empty), and the rest of the list.
func nextToken(list []byte) (t, rest []byte) {
	if i := bytes.IndexByte(list, ','); i >= 0 {
		t, rest = list[:i], list[i+1:]
	} else {
		t = list
	}
	return httpfield.TrimOWS(t), rest
}

// EqualFold reports whether b equals s in ASCII, ignoring case (unlike
// bytes.EqualFold, no Unicode folding: the Kelvin sign is not a k).
func EqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		x, y := b[i], s[i]
		if x != y && lower(x) != lower(y) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// b2s returns b as a string without copying, for reading only.
func b2s(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

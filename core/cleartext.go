package core

import (
	"net/http"
	"strconv"
	"strings"
)

// CleartextOptions say how a cleartext listener beside a TLS one is
// answered (Core.Cleartext).
type CleartextOptions struct {
	// Redirect answers every request but the health check with 308
	// Permanent Redirect to the same host, path and query over https, at
	// TLSPort, before any rule (none counts it: nginx's return in the
	// port-80 server block runs before the TLS server's limits). A Host
	// that is not an authority gets 400. false: requests are served as on
	// the TLS listener, by every stage.
	Redirect bool
	// TLSPort is the TLS listener's port, in the Location when not 443.
	TLSPort int
}

// Cleartext returns a Core for a cleartext listener beside the TLS one c
// serves: it shares c's rules and their counts, its stages and stored
// responses, its statistics, access log, drain (Drain on either is
// both's) and Redis store, which only c's Close closes. It answers as o
// says; the cache keeps its responses apart from the TLS listener's (a
// response the application made for http, with http:// links, is never
// served over https, nor the other way), as nginx's default cache key
// ($scheme first) does.
func (c *Core) Cleartext(o CleartextOptions) *Core {
	v := &Core{
		region: c.region, rules: c.rules, byName: c.byName, blocks: c.blocks,
		resolver: c.resolver, exempt: c.exempt, caseSens: c.caseSens, headers: c.headers, maxReq: c.maxReq,
		now: c.now, wall: c.wall, respond: c.respond, log: c.log, redis: c.redis, ridName: c.ridName, access: c.access,
		healthPath: c.healthPath, drained: c.drained, cleartext: &o,
		caches: c.caches, steps: c.steps, preRedis: c.preRedis, idem: c.idem, cache: c.cache,
		row: c.row, upstreamLogs: c.upstreamLogs, forwarded: c.forwarded,
		reset: c.reset, resetHide: c.resetHide, resetDropFill: c.resetDropFill, resetLog: c.resetLog, cutLog: c.cutLog,
	}
	if o.Redirect {
		v.redirect = (*Exchange).redirectHTTPS
	}
	v.pool.New = func() any { return &Exchange{c: v} }
	return v
}

var (
	fieldLocation  = "Location"
	redirectPrefix = []byte("Redirecting to ")
)

// redirectHTTPS answers 308 to the request's URL over https at the TLS
// listener's port (the Host's name, without its port, in lower case and
// without a trailing dot, as nginx's $host), or 400 when the Host is not
// an authority: none, several, or one no URL can hold.
func (ex *Exchange) redirectHTTPS() (Verdict, bool) {
	port := ex.c.cleartext.TLSPort
	host, lines := ex.req.Header("Host")
	if lines != 1 || host == "" || hostProblem(host) != "" {
		return ex.respond(&Problem{Status: http.StatusBadRequest, Detail: "the request has no Host an https URL can be made of"}, true)
	}
	name := hostName(host)
	if len(name) > 1 && name[len(name)-1] == '.' {
		// A fully qualified name's root: nginx's $host drops it, and a
		// browser would take "a.example." for another origin than
		// "a.example" (its cookies, its HSTS).
		name = name[:len(name)-1]
	}
	if name == "" {
		return ex.respond(&Problem{Status: http.StatusBadRequest, Detail: "the request has no Host an https URL can be made of"}, true)
	}
	from := len(ex.buf)
	ex.buf = append(ex.buf, "https://"...)
	for i := 0; i < len(name); i++ {
		// In lower case, as nginx's $host: a host name is
		// case-insensitive, and the redirect names it once for good.
		c := name[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		ex.buf = append(ex.buf, c)
	}
	if port != 443 && port > 0 {
		ex.buf = append(ex.buf, ':')
		ex.buf = strconv.AppendInt(ex.buf, int64(port), 10)
	}
	path, query := ex.req.Path(), ex.req.Query()
	if !strings.HasPrefix(path, "/") {
		path = "/" // "*", or a target without a path
	}
	if !printable(path) || !printable(query) {
		return ex.respond(&Problem{Status: http.StatusBadRequest, Detail: "the request target has a byte a URL cannot hold"}, true)
	}
	ex.buf = appendEscaped(ex.buf, path)
	if query != "" {
		ex.buf = append(ex.buf, '?')
		ex.buf = appendEscaped(ex.buf, query)
	}
	loc := ex.buf[from:len(ex.buf):len(ex.buf)]
	from = len(ex.buf)
	ex.buf = append(ex.buf, redirectPrefix...)
	ex.buf = append(ex.buf, loc...)
	ex.buf = append(ex.buf, '\n')
	body := ex.buf[from:len(ex.buf):len(ex.buf)]
	ex.fields = append(ex.fields, Field{fieldLocation, loc}, Field{fieldContentType, valTextPlain})
	n := len(body)
	ex.addField(fieldLength, func(b []byte) []byte { return strconv.AppendInt(b, int64(n), 10) })
	if ex.req.Method() == http.MethodHead {
		body = nil
	}
	ex.resp = Response{Status: http.StatusPermanentRedirect, Fields: ex.fields, Body: body}
	return Respond, true
}

// printable reports whether s has no control byte, space nor DEL:
// nothing a URL can hold even percent-encoded, in the target a client
// meant.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// appendEscaped appends s with every byte past ASCII percent-encoded
// (UTF-8 sent raw, as some clients send a path), as a browser maps an
// IRI to a URI (RFC 3987 §3.1), so that the Location is visible ASCII, as
// a field value that goes out as sent must be; nothing else is changed,
// and nothing decoded.
func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0x80 {
			b = append(b, '%', hex[c>>4], hex[c&15])
		} else {
			b = append(b, c)
		}
	}
	return b
}

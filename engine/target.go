package engine

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Target is an upstream URL ("http://app:3000", "https://app.internal/base")
// as every engine forwards to it: checked once, here, so that the engines
// accept and refuse the same URLs.
type Target struct {
	Addr      string // host:port to connect to
	TLS       bool   // https: TLS, with Hostname verified
	Hostname  string // the host without its port (nor an IPv6 literal's brackets): the name TLS verifies, the name to resolve
	Port      uint16 //
	Authority string // host[:port] as in the URL: the Host of a request that has none
	Prefix    string // path prepended to every request's ("" or "/base")
}

// TargetError is ParseTarget's error: the URL, and what is wrong with it.
// A password in the URL is masked ("xxxxx", as url.URL.Redacted): the
// error is printed by check and logged at a start or a reload.
type TargetError struct{ URL, Why string }

func (e *TargetError) Error() string { return fmt.Sprintf("upstream %q: %s", e.URL, e.Why) }

// ParseTarget checks an upstream URL: absolute, http or https, with a
// host, no credentials, query nor fragment.
func ParseTarget(s string) (Target, error) {
	u, err := url.Parse(s)
	bad := func(why string) (Target, error) { return Target{}, &TargetError{redacted(s), why} }
	switch {
	case err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Opaque != "" || u.Hostname() == "":
		return bad("want an absolute http:// or https:// URL with a host")
	case u.User != nil:
		return bad("credentials in the URL are not sent upstream; remove them")
	case u.Fragment != "":
		return bad("an upstream URL has no fragment")
	case u.RawQuery != "" || u.ForceQuery:
		return bad("an upstream URL has no query (requests keep their own)")
	}
	t := Target{TLS: u.Scheme == "https", Hostname: u.Hostname(), Authority: u.Host,
		Prefix: strings.TrimSuffix(u.EscapedPath(), "/")}
	port := u.Port()
	if port == "" {
		port = "80"
		if t.TLS {
			port = "443"
		}
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return bad("the port must be a number from 1 to 65535")
	}
	t.Port = uint16(p)
	t.Addr = net.JoinHostPort(t.Hostname, port)
	if h, _, err := net.SplitHostPort(t.Addr); err != nil || h != t.Hostname {
		// url.Parse takes a ']' in a name ("http://a]"): no dial would.
		return bad("the host is neither a name nor an IP address")
	}
	return t, nil
}

// redacted is s with the password of its userinfo, if any, masked: also
// when s does not parse as a URL (a bad port after the credentials).
func redacted(s string) string {
	i := strings.Index(s, "://")
	if i < 0 {
		return s
	}
	rest := s[i+3:]
	auth := rest
	if j := strings.IndexAny(auth, "/?#"); j >= 0 {
		auth = auth[:j]
	}
	at := strings.LastIndexByte(auth, '@')
	if at < 0 {
		// A password with a '/', '?' or '#' ends the authority early
		// (no URL then): the userinfo runs to the last '@'. A path's
		// "a:b@c" is masked too, which tells nothing away.
		at = strings.LastIndexByte(rest, '@')
	}
	if at < 0 {
		return s
	}
	user, _, ok := strings.Cut(rest[:at], ":")
	if !ok {
		return s
	}
	return s[:i+3] + user + ":xxxxx" + s[i+3+at:]
}

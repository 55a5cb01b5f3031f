package config

import (
	"fmt"
	"math/bits"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Validate reports the first problem with c as an *Error. Zero values stand
// for their defaults, as in [Config.WithDefaults]. Errors about a rule carry
// the rule's Line (0 for rules built in Go) and no file name. Validate does
// no I/O: it does not check that files exist or addresses can be bound.
func (c Config) Validate() error {
	d := c.WithDefaults()
	return d.check("", func(section string, i int, _ string) int {
		switch {
		case section == "ratelimit" && i >= 0 && i < len(d.RateLimits):
			return d.RateLimits[i].Line
		case section == "idempotency" && i >= 0 && i < len(d.Idempotency):
			return d.Idempotency[i].Line
		}
		return 0
	})
}

// lineFunc gives the line of a key: in a table (i < 0) or in element i of an
// array of tables. 0 means unknown.
type lineFunc func(section string, i int, key string) int

// checker collects the problems of one configuration.
type checker struct {
	file string
	at   lineFunc
	errs []*Error
}

func (v *checker) fail(section string, i int, key, label, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if key != "" {
		msg = key + ": " + msg
	}
	v.errs = append(v.errs, &Error{File: v.file, Line: v.at(section, i, key), Msg: label + msg})
}

// check validates a configuration whose defaults are filled in: here, unlike
// in Validate, a zero value is the value zero.
func (c Config) check(file string, at lineFunc) error {
	v := &checker{file: file, at: at}
	c.checkSections(v)
	names := map[string]int{} // rule name → index of its first use
	for i, r := range c.RateLimits {
		r.check(v, i, names)
	}
	for i, d := range c.Idempotency {
		d.check(v, i, c)
	}
	return first(v.errs)
}

func (c Config) checkSections(v *checker) {
	s := c.Server
	sf := func(key, format string, args ...any) { v.fail("server", -1, key, "server.", format, args...) }
	if err := checkAddr(s.Listen); err != nil {
		sf("listen", "%v", err)
	}
	if s.Workers < 0 {
		sf("workers", "must not be negative (0 means one per CPU), got %d", s.Workers)
	} else if s.Workers > MaxWorkers {
		sf("workers", "must be at most %d, got %d", MaxWorkers, s.Workers)
	}
	if err := checkUpstream(s.Upstream); err != nil {
		sf("upstream", "%v", err)
	}
	for i, p := range s.TrustedProxies {
		if !p.IsValid() {
			sf("trusted_proxies", "element %d is not a valid prefix", i+1)
		}
	}
	if s.IPv6Prefix < 1 || s.IPv6Prefix > 128 {
		sf("ipv6_prefix", "must be between 1 and 128, got %d", s.IPv6Prefix)
	}
	if s.ShutdownTimeout <= 0 {
		sf("shutdown_timeout", "must be positive, got %v", s.ShutdownTimeout)
	}
	if err := oneOf(s.Headers, "ietf", "x", "both", "none"); err != nil {
		sf("headers", "%v", err)
	}
	if s.MaxRequestBody <= 0 {
		sf("max_request_body", "must be positive, got %d", s.MaxRequestBody)
	}

	if a := c.Admin.Listen; a != "" {
		if err := checkAddr(a); err != nil {
			v.fail("admin", -1, "listen", "admin.", "%v", err)
		} else if a == s.Listen {
			v.fail("admin", -1, "listen", "admin.", "%q is also server.listen", a)
		}
	}

	t := c.Table
	tf := func(key, format string, args ...any) { v.fail("table", -1, key, "table.", format, args...) }
	if t.Counters < minCounters || t.Counters > maxCounters {
		tf("counters", "must be between %d and %d, got %d", minCounters, maxCounters, t.Counters)
	}
	if t.Responses < 0 {
		tf("responses", "must not be negative, got %d", t.Responses)
	} else if t.Responses == 0 && len(c.Idempotency) > 0 {
		tf("responses", "is 0 but [[idempotency]] blocks need stored responses")
	}
	if t.ResponseBytes < 0 {
		tf("response_bytes", "must not be negative, got %d", t.ResponseBytes)
	} else if t.ResponseBytes == 0 && len(c.Idempotency) > 0 {
		tf("response_bytes", "is 0 but [[idempotency]] blocks need room for stored bodies")
	}

	if p := c.Persist; p.Path != "" && p.Path == p.Live {
		v.fail("persist", -1, "live", "persist.", "is the same file as persist.path (%q)", p.Path)
	}
}

func (r RateLimit) check(v *checker, i int, names map[string]int) {
	label := fmt.Sprintf("ratelimit[%d]: ", i+1)
	if checkName(r.Name) == nil {
		label = fmt.Sprintf("ratelimit %q: ", r.Name)
	}
	f := func(key, format string, args ...any) { v.fail("ratelimit", i, key, label, format, args...) }

	if err := checkName(r.Name); err != nil {
		f("name", "%v", err)
	} else if j, dup := names[r.Name]; dup {
		where := fmt.Sprintf("rule %d", j+1)
		if l := v.at("ratelimit", j, "name"); l > 0 {
			where = "line " + strconv.Itoa(l)
		}
		f("name", "duplicate rule name (first used at %s)", where)
	} else {
		names[r.Name] = i
	}
	if err := checkPath(r.Path); err != nil {
		f("path", "%v", err)
	}
	if err := checkMethods(r.Methods, true); err != nil {
		f("methods", "%v", err)
	}
	if r.Limit < 1 || r.Limit > maxLimit {
		f("limit", "must be between 1 and %d, got %d", maxLimit, r.Limit)
	}
	if err := checkWindow(r.Window); err != nil {
		f("window", "%v", err)
	}
	if err := oneOf(r.Algorithm, "gcra", "fixed-window"); err != nil {
		f("algorithm", "%v", err)
	}
	switch {
	case r.Burst < 0 || r.Burst > maxLimit:
		f("burst", "must be between 0 and %d (0 means limit), got %d", maxLimit, r.Burst)
	case r.Burst != 0 && r.Algorithm == "fixed-window":
		f("burst", "applies to algorithm \"gcra\" only, not \"fixed-window\"")
	case r.Algorithm == "gcra" && r.Limit >= 1 && r.Limit <= maxLimit && checkWindow(r.Window) == nil:
		// The bucket keeps time in whole microseconds: one request must
		// be worth at least one, and a full burst at most maxWindow.
		if r.Window < time.Duration(r.Limit)*time.Microsecond {
			f("window", "%v is too short for %d requests: gcra needs at least 1µs per request", r.Window, r.Limit)
		} else if hi, lo := bits.Mul64(uint64(r.EffectiveBurst()), uint64(r.Window/time.Microsecond)); hi != 0 ||
			lo/uint64(r.Limit) > uint64(maxWindow/time.Microsecond) {
			f("burst", "%d requests take longer than %s to refill at %d per %v", r.EffectiveBurst(), maxWindowText, r.Limit, r.Window)
		}
	}
	if err := checkBy(r.By); err != nil {
		f("by", "%v", err)
	}
	if err := oneOf(r.Mode, "enforce", "shadow"); err != nil {
		f("mode", "%v", err)
	}
	if err := oneOf(r.OnFull, "open", "closed"); err != nil {
		f("on_full", "%v", err)
	}
}

func (d Idempotency) check(v *checker, i int, c Config) {
	label := fmt.Sprintf("idempotency[%d]: ", i+1)
	f := func(key, format string, args ...any) { v.fail("idempotency", i, key, label, format, args...) }

	if err := checkPath(d.Path); err != nil {
		f("path", "%v", err)
	}
	// Two blocks for one request would make it ambiguous which key
	// namespace and TTL apply.
	for j, e := range c.Idempotency[:i] {
		if e.Path != d.Path {
			continue
		}
		for _, m := range d.Methods {
			if contains(e.Methods, m) {
				f("path", "%s %s is already covered by idempotency[%d]", m, d.Path, j+1)
				break
			}
		}
	}
	if err := checkMethods(d.Methods, false); err != nil {
		f("methods", "%v", err)
	}
	if !isToken(d.Header) {
		f("header", "%q is not a valid header name", d.Header)
	}
	if d.TTL <= 0 || d.TTL > maxWindow {
		f("ttl", "must be positive and at most %s, got %v", maxWindowText, d.TTL)
	}
	if d.Wait < 0 {
		f("wait", "must not be negative, got %v", d.Wait)
	}
	if err := checkBy(d.By); err != nil {
		f("by", "%v", err)
	}
	switch {
	case d.MaxBody <= 0:
		f("max_body", "must be positive, got %d", d.MaxBody)
	case c.Table.ResponseBytes > 0 && d.MaxBody > c.Table.ResponseBytes:
		f("max_body", "%d is larger than table.response_bytes (%d)", d.MaxBody, c.Table.ResponseBytes)
	}
}

func oneOf(s string, allowed ...string) error {
	if contains(allowed, s) {
		return nil
	}
	q := make([]string, len(allowed))
	for i, a := range allowed {
		q[i] = strconv.Quote(a)
	}
	return fmt.Errorf("%q is not one of %s", s, strings.Join(q, ", "))
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

func checkName(n string) error {
	if n == "" {
		return fmt.Errorf("is required")
	}
	if len(n) > maxNameLen {
		return fmt.Errorf("%q is longer than %d characters", n, maxNameLen)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !isBare(c) && c != '.' {
			return fmt.Errorf("%q: only letters, digits, '_', '.' and '-' are allowed", n)
		}
	}
	return nil
}

// checkPath accepts an exact path or a prefix ending in "/*".
func checkPath(p string) error {
	if p == "" {
		return fmt.Errorf("is required")
	}
	if p[0] != '/' {
		return fmt.Errorf("%q must start with \"/\"", p)
	}
	if strings.Contains(strings.TrimSuffix(p, "/*"), "*") {
		return fmt.Errorf("%q: \"*\" is allowed only as a trailing \"/*\"", p)
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c <= ' ' || c == 0x7f:
			return fmt.Errorf("%q contains a space or control character", p)
		case c == '?' || c == '#':
			return fmt.Errorf("%q: a path cannot contain a query or fragment", p)
		}
	}
	return nil
}

// checkMethods accepts valid HTTP method tokens, each at most once.
func checkMethods(ms []string, emptyOK bool) error {
	if len(ms) == 0 && !emptyOK {
		return fmt.Errorf("is empty; leave the key out for the default [\"POST\", \"PATCH\"]")
	}
	for i, m := range ms {
		if !isToken(m) {
			return fmt.Errorf("%q is not a valid HTTP method", m)
		}
		if contains(ms[:i], m) {
			return fmt.Errorf("%q is listed twice", m)
		}
	}
	return nil
}

func checkWindow(w time.Duration) error {
	switch {
	case w < minWindow || w > maxWindow:
		return fmt.Errorf("must be between %v and %s, got %v", minWindow, maxWindowText, w)
	case w%time.Microsecond != 0:
		return fmt.Errorf("%v is not a whole number of microseconds", w)
	}
	return nil
}

// checkBy accepts "ip", "global", "header:NAME" or a chain of ip and header
// elements separated by '|'. Elements after "ip" could never be used, and
// "global" has no fallback, so both are refused.
func checkBy(s string) error {
	if s == "" {
		return fmt.Errorf("is empty: want \"ip\", \"global\", \"header:NAME\" or a chain such as \"header:X-Api-Key|ip\"")
	}
	parts := strings.Split(s, "|")
	var headers []string
	for i, e := range parts {
		switch {
		case e == "ip":
			if i != len(parts)-1 {
				return fmt.Errorf("%q: nothing after \"ip\" is ever used", s)
			}
		case e == "global":
			if len(parts) != 1 {
				return fmt.Errorf("%q: \"global\" cannot be combined with other keys", s)
			}
		case strings.HasPrefix(e, "header:"):
			h := e[len("header:"):]
			if !isToken(h) {
				return fmt.Errorf("%q: %q is not a valid header name", s, h)
			}
			if contains(headers, strings.ToLower(h)) {
				return fmt.Errorf("%q: header %q is listed twice", s, h)
			}
			headers = append(headers, strings.ToLower(h))
		default:
			return fmt.Errorf("%q: unknown element %q: want \"ip\", \"global\" or \"header:NAME\"", s, e)
		}
	}
	return nil
}

// isToken reports whether s is an RFC 9110 token: a valid method or header
// field name.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(isBare(c) || strings.IndexByte("!#$%&'*+.^`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func checkAddr(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("invalid address %q: want host:port, such as \"127.0.0.1:8080\" or \":8080\"", a)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || strconv.FormatUint(n, 10) != port {
		return fmt.Errorf("invalid port in %q: want a number from 0 to 65535", a)
	}
	return nil
}

func checkUpstream(s string) error {
	if strings.HasPrefix(s, "builtin:") {
		if s != defaultUpstream {
			return fmt.Errorf("unknown built-in upstream %q: the only one is %q", s, defaultUpstream)
		}
		return nil
	}
	u, err := url.Parse(s)
	switch {
	case err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Opaque != "" || u.Hostname() == "":
		return fmt.Errorf("%q: want %q or an absolute http:// or https:// URL with a host", s, defaultUpstream)
	case u.User != nil:
		return fmt.Errorf("%q: credentials in the URL are not sent upstream; remove them", s)
	case u.Fragment != "":
		return fmt.Errorf("%q: an upstream URL has no fragment", s)
	}
	return nil
}

package config

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/preforkd/preforkd/accesslog"
	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/route"
)

// Validate reports the first problem with c as an *Error. Zero values stand
// for their defaults, as in [Config.WithDefaults]. The errors of a Config
// built in Go carry no file and no line. Validate does no I/O: it does not
// check that files exist or addresses can be bound.
func (c Config) Validate() error {
	r := &report{}
	c.WithDefaults().check(r)
	return r.first()
}

// check validates a configuration whose defaults are filled in: here, unlike
// in Validate, a zero value is the value zero. What a rule's path, methods,
// rate and key mean is checked by the package that applies it (route,
// bucket, clientip); check only adds where it is in the file.
func (c Config) check(r *report) {
	s := c.Server
	f := r.at([]string{"server"}, "server.")
	if err := checkAddr(s.Listen); err != nil {
		f("listen", "%v", err)
	}
	if s.Workers < 0 {
		f("workers", "must not be negative (0 means one per CPU), got %d", s.Workers)
	} else if s.Workers > MaxWorkers {
		f("workers", "must be at most %d, got %d", MaxWorkers, s.Workers)
	}
	if err := checkUpstream(s.Upstream); err != nil {
		f("upstream", "%v", err)
	}
	for i, p := range s.TrustedProxies {
		if !p.IsValid() {
			f("trusted_proxies", "element %d is not a valid prefix", i+1)
		}
	}
	if s.IPv6Prefix < 1 || s.IPv6Prefix > 128 {
		f("ipv6_prefix", "must be between 1 and 128, got %d", s.IPv6Prefix)
	}
	if _, err := s.Headers.MarshalText(); err != nil {
		f("headers", "%s", detail(err))
	}
	if err := core.CheckRequestID(s.RequestID); err != nil {
		f("request_id", "%s", detail(err))
	}
	if err := core.CheckHealthPath(s.HealthPath); err != nil {
		f("health_path", "%s", detail(err))
	}
	if err := engineNames.check(s.Engine); err != nil {
		f("engine", "%s", detail(err))
	}
	if s.MaxRequestBody <= 0 || s.MaxRequestBody > core.MaxMaxRequestBody {
		f("max_request_body", "must be positive and at most %v, got %d", Size(core.MaxMaxRequestBody), s.MaxRequestBody)
	}
	if err := core.CheckResetHeader(s.ResetHeader); err != nil {
		f("reset_header", "%s", detail(err))
	}
	// The engines' limits, and the supervisor's settings, are checked by
	// the packages that own them; the file adds the line.
	// The configuration's defaults are the owners' (WithDefaults): here a
	// zero is a zero the file wrote.
	if err := s.Limits().Check(); err != nil {
		ownerError(f, err)
	}
	if err := s.UpstreamClient().Check(); err != nil {
		ownerError(f, err)
	}
	if s.UpstreamMaxIdle == 0 {
		// The engines take a zero for their default.
		f("upstream_max_idle", "is 0; it must be at least 1 (leave the key out for the default %d)", engine.DefaultUpstreamMaxIdle)
	}
	if err := c.settings().Check(); err != nil {
		var fe *prefork.FieldError
		if errors.As(err, &fe) && fe.Table == "reload" {
			ownerError(r.at([]string{"reload"}, "reload."), err)
		} else {
			ownerError(f, err)
		}
	}
	c.Reload.check(r)

	if a := c.Admin.Listen; a != "" {
		f := r.at([]string{"admin"}, "admin.")
		if err := checkAdminAddr(a); err != nil {
			f("listen", "%v", err)
		} else if sameSocket(a, s.Listen) {
			f("listen", "%q takes server.listen's port (%q)", a, s.Listen)
		} else if cl := c.TLS.CleartextListen; cl != "" && c.TLS.Enabled() && !anyPort(cl) && sameSocket(a, cl) {
			f("listen", "%q takes tls.cleartext_listen's port (%q)", a, cl)
		}
	}

	t := c.Table
	f = r.at([]string{"table"}, "table.")
	tableErrs := len(r.errs)
	if t.Counters < minCounters || t.Counters > maxCounters {
		f("counters", "must be between %d and %d, got %d", minCounters, maxCounters, t.Counters)
	}
	storing := c.storing()
	if t.Responses < 0 {
		f("responses", "must not be negative, got %d", t.Responses)
	} else if t.Responses > maxResponses {
		f("responses", "must be between 0 and %d, got %d", maxResponses, t.Responses)
	} else if t.Responses == 0 && storing != "" {
		f("responses", "is 0 but %s blocks need stored responses", storing)
	}
	if t.ResponseBytes < 0 {
		f("response_bytes", "must not be negative, got %d", t.ResponseBytes)
	} else if t.ResponseBytes > maxResponseBytes {
		f("response_bytes", "must be between 0 and %d bytes (2^32 - 2 blocks of %v), got %d", Size(maxResponseBytes), Size(responseBlock), t.ResponseBytes)
	} else if t.ResponseBytes == 0 && storing != "" {
		f("response_bytes", "is 0 but %s blocks need room for stored bodies", storing)
	}
	if len(r.errs) == tableErrs {
		// The rest of the geometry's bounds are the region's own (a
		// record or block count past what its indexes hold): check says
		// no to what run would refuse.
		if _, err := c.RegionOptions().Size(); err != nil {
			r.fail([]string{"table"}, fmt.Sprintf("table: the region cannot be made: %v", err))
		}
	}

	f = r.at([]string{"log"}, "log.")
	if err := logFormatNames.check(c.Log.Format); err != nil {
		f("format", "%s", detail(err))
	}
	if err := logLevelNames.check(c.Log.Level); err != nil {
		f("level", "%s", detail(err))
	}
	if p, on := c.Log.AccessLog(); on && p != accesslog.Stderr && !filepath.IsAbs(p) {
		f("access", "want \"off\", \"stderr\" or an absolute file path, got %q", p)
	}
	if _, err := c.Log.AccessFormat.MarshalText(); err != nil {
		f("access_format", "%s", detail(err))
	}

	if p := c.Persist; p.Path != "" && p.Path == p.Live {
		r.at([]string{"persist"}, "persist.")("live", "is the same file as persist.path (%q)", p.Path)
	}
	if p := c.Persist; p.Interval != 0 {
		f := r.at([]string{"persist"}, "persist.")
		switch {
		case p.Interval < MinPersistInterval:
			f("interval", "must be 0 (off) or at least %v, got %v", MinPersistInterval, p.Interval)
		case p.Path == "":
			f("interval", "needs persist.path: the dump it writes every %v goes there", p.Interval)
		}
	}
	if p := c.Persist; p.Key != "" && p.KeyFile != "" {
		r.at([]string{"persist"}, "persist.")("key_file", "and persist.key are both set: set one (the file, for a version the deploy writes)")
	}

	c.Redis.check(r)
	c.TLS.check(r, s.Listen)

	names := map[string]int{} // rule name → index of its first use
	rules := make([]core.RateLimit, len(c.RateLimits))
	for i, rl := range c.RateLimits {
		rl.check(r, i, names, s.routes(), s.Exempt)
		rl.checkStore(r, i, c.Redis.Enabled())
		rules[i].Rule, rules[i].Overrides = rl.BucketRule(), rl.coreOverrides()
	}
	var ae *core.AccountError
	switch {
	case !errors.As(core.CheckAccounts(rules), &ae):
	case ae.Override > 0:
		r.at([]string{"ratelimit", elem(ae.Index)}, fmt.Sprintf("ratelimit %q: ", ae.Rule))("name",
			"the state of its override %d hashes to the 16-bit tag %#04x of %s, and a dump could not tell them apart (both would be dropped at every restart); rename the rule", ae.Override, ae.Account, ae.Other)
	default:
		r.at([]string{"ratelimit", elem(ae.Index)}, fmt.Sprintf("ratelimit %q: ", ae.Rule))("name",
			"its name hashes to the 16-bit account %#04x of rule %q, which counts their keys; rename one of them", ae.Account, ae.Other)
	}
	for i, d := range c.Idempotency {
		d.check(r, i, c)
	}
	for i, d := range c.Caches {
		d.check(r, i, c)
	}
}

func (d Cache) check(r *report, i int, c Config) {
	ro := c.Server.routes()
	dc, err := d.core(ro)
	f := block[Cache](r, "cache", i, err)
	// The first block whose path matches applies: a later one for a path
	// it covers ("/a" after "/A" or "/a/*") would never apply.
	for j, e := range c.Caches[:i] {
		if ec, eerr := e.core(ro); err == nil && eerr == nil && ec.Route.Covers(&dc.Route) {
			f("path", "%s is already covered by cache[%d]", d.Path, j+1)
			break
		}
	}
	if c.Table.ResponseBytes > 0 && d.MaxBody > c.Table.ResponseBytes {
		f("max_body", "%d is larger than table.response_bytes (%d)", d.MaxBody, c.Table.ResponseBytes)
	}
	if d.Targeted == "" {
		f("targeted", "is empty; leave the key out for the default %q", core.DefaultTargeted)
	}
}

// ownerError reports, at its key, what a package that owns settings
// (engine, prefork) refused.
func ownerError(f func(key, format string, args ...any), err error) {
	var ef *engine.FieldError
	var pf *prefork.FieldError
	switch {
	case errors.As(err, &ef):
		f(ef.Key, "%s", ef.Msg)
	case errors.As(err, &pf):
		f(pf.Key, "%s", pf.Msg)
	default:
		f("", "%v", err)
	}
}

func (rl Reload) check(r *report) {
	f := r.at([]string{"reload"}, "reload.")
	if err := rl.Canary.check(); err != nil {
		f("canary", "%s", detail(err))
	}
	if err := inconclusiveNames.check(rl.CanaryInconclusive); err != nil {
		f("canary_inconclusive", "%s", detail(err))
	}
}

func (rl RateLimit) check(r *report, i int, names map[string]int, ro route.Options, serverExempt Prefixes) {
	path := []string{"ratelimit", elem(i)}
	label := fmt.Sprintf("ratelimit[%d]: ", i+1)
	if checkName(rl.Name) == nil {
		label = fmt.Sprintf("ratelimit %q: ", rl.Name)
	}
	f := r.at(path, label)
	if err := checkName(rl.Name); err != nil {
		f("name", "%v", err)
	} else if j, dup := names[rl.Name]; dup {
		where := fmt.Sprintf("rule %d", j+1)
		if l := r.line("ratelimit", elem(j), "name"); l > 0 {
			where = "line " + strconv.Itoa(l)
		}
		f("name", "duplicate rule name (first used at %s)", where)
	} else {
		names[rl.Name] = i
	}
	// Checked with server.exempt among its exempt ranges: an override of
	// clients that one covers would never apply either.
	checked := rl
	checked.Exempt = slices.Concat(serverExempt, rl.Exempt)
	if _, err := checked.core(ro); err != nil {
		var oe *core.OverrideError
		if errors.As(err, &oe) {
			r.owned(append(path, "override", elem(oe.Index)), fmt.Sprintf("%soverride %d: ", label, oe.Index+1), reflect.TypeFor[Override](), oe.Err)
		} else {
			r.owned(path, label, reflect.TypeFor[RateLimit](), err)
		}
	}
	if err := modeNames.check(rl.Mode); err != nil {
		f("mode", "%s", detail(err))
	}
	// The packages take 0 for the default; a file that writes 0 asked
	// for something else (a rule that leaves the key out has the default
	// before it is checked).
	if rl.Cost == 0 {
		f("cost", "must be at least 1, got 0")
	}
	if rl.Status == 0 {
		f("status", "want 429 or 503, got 0")
	}
}

// checkStore checks the keys of a rule's store: those of a redis rule by
// package redisstore, which applies them.
func (rl RateLimit) checkStore(r *report, i int, redisOn bool) {
	path := []string{"ratelimit", elem(i)}
	label := fmt.Sprintf("ratelimit %q: ", rl.Name)
	f := r.at(path, label)
	if err := storeNames.check(rl.Store); err != nil {
		f("store", "%s", detail(err))
		return
	}
	if rl.Store == StoreLocal {
		switch {
		case rl.Sync != 0:
			f("sync", "applies to store = \"redis\" only")
		case rl.LocalShare != 1:
			f("local_share", "applies to store = \"redis\" only")
		case rl.OnUnavailable != redisstore.FailLocal:
			// "local" is the default, and what a local rule does anyway.
			f("on_unavailable", "applies to store = \"redis\" only")
		}
		return
	}
	if !redisOn {
		f("store", "is \"redis\" but [redis] sets no url, cluster or sentinel")
		return
	}
	if rl.LocalShare < 1 {
		f("local_share", "must be between 1 and %d, got %d", redisstore.MaxLocalShare, rl.LocalShare)
		return
	}
	if err := redisstore.ValidateRule(rl.RedisRule()); err != nil {
		r.owned(path, label, reflect.TypeFor[RateLimit](), err)
		return
	}
	// Each override is a limiter of its own in Redis, with a local share
	// of its own: one whose share cannot hold a request is refused by
	// the workers as the rule's would be. (An override whose own rate is
	// wrong is reported by check.)
	for j, o := range rl.Overrides {
		or := rl.RedisRule()
		or.Limit, or.Burst = o.Limit, o.Burst
		if o.Window != 0 {
			or.Window = o.Window
		}
		if _, err := or.Rule.Compile(); err != nil {
			continue
		}
		if err := redisstore.ValidateRule(or); err != nil {
			msg := detail(err)
			var fe *redisstore.FieldError
			if errors.As(err, &fe) {
				msg = fe.Msg
			}
			r.at(append(path, "override", elem(j)), fmt.Sprintf("%soverride %d: ", label, j+1))("limit", "%s", msg)
		}
	}
}

func (d Idempotency) check(r *report, i int, c Config) {
	dc, err := d.core(c.Server)
	f := block[Idempotency](r, "idempotency", i, err)
	// The first block whose route matches a request applies: a later
	// one for a path and method it covers would never apply.
	for j, e := range c.Idempotency[:i] {
		ec, eerr := e.core(c.Server)
		if err != nil || eerr != nil || !ec.Route.Covers(&dc.Route) {
			continue
		}
		earlier := upperAll(e.Methods)
		for _, m := range upperAll(d.Methods) {
			// A route with GET matches HEAD too (route.Route.Match).
			if slices.Contains(earlier, m) || m == "HEAD" && slices.Contains(earlier, "GET") {
				f("path", "%s %s is already covered by idempotency[%d]", m, d.Path, j+1)
				break
			}
		}
	}
	if len(d.Methods) == 0 {
		f("methods", `is empty; leave the key out for the default ["POST", "PATCH"]`)
	}
	if d.Header == "" {
		f("header", "is empty; leave the key out for the default %q", core.DefaultIdempotencyHeader)
	}
	if c.Table.ResponseBytes > 0 && d.MaxBody > c.Table.ResponseBytes {
		f("max_body", "%d is larger than table.response_bytes (%d)", d.MaxBody, c.Table.ResponseBytes)
	}
}

// block reports err, what the owning packages found wrong with block i of
// [[table]] (a T), and returns the function reporting a problem with a
// key of that block.
func block[T any](r *report, table string, i int, err error) func(key, format string, args ...any) {
	path := []string{table, elem(i)}
	label := fmt.Sprintf("%s[%d]: ", table, i+1)
	r.owned(path, label, reflect.TypeFor[T](), err)
	return r.at(path, label)
}

// at returns a function reporting a problem with a key of the table at
// path, as label, key, ": " and the message.
func (r *report) at(path []string, label string) func(key, format string, args ...any) {
	return func(key, format string, args ...any) {
		r.fail(append(path[:len(path):len(path)], key), label+key+": "+fmt.Sprintf(format, args...))
	}
}

// owned reports err, from the package that owns a value of the table at
// path (of type t), at the line of the key it is about: the field a
// *bucket.RuleError, a *route.Error, a *core.FieldError or a
// *redisstore.FieldError names. A redisstore message does not name its
// setting: the key comes before it ("timeout: ..."); a label that ends in
// '.' ("redis.") is then a table's, which a message about no key takes as
// "redis: ...".
func (r *report) owned(path []string, label string, t reflect.Type, err error) {
	if err == nil {
		return
	}
	field, msg := "", detail(err)
	var se *redisstore.FieldError
	var be *bucket.RuleError
	var re *route.Error
	var ce *core.FieldError
	switch {
	case errors.As(err, &se):
		// The fields its message names, as this file's keys.
		field, msg = se.Field, se.Message(func(f string) string {
			if keys := ownerKeys(t, f); keys != nil {
				return strings.Join(keys, ".")
			}
			return f
		})
	case errors.As(err, &be):
		field, msg = be.Field, be.Msg
	case errors.As(err, &re):
		field, msg = re.Field, re.Msg
	case errors.As(err, &ce):
		field, msg = ce.Field, ce.Msg
	case errors.Is(err, clientip.ErrBy):
		field = "By"
	}
	keys := ownerKeys(t, field)
	path = append(path[:len(path):len(path)], keys...)
	if se != nil {
		if keys != nil {
			msg = strings.Join(keys, ".") + ": " + msg
		} else if l, ok := strings.CutSuffix(label, "."); ok {
			label = l + ": "
		}
	}
	r.fail(path, label+msg)
}

// ownerKeys returns the keys, from the table of type t down, of the field
// that an owner's field name stands for: a field of t of that name, or of
// that name in the singular (Clients, client), or tagged owner:"name"
// (Breaker.Successes, success_threshold), or a dotted name's field of a
// table (Sentinel.Addrs, sentinel.addrs); nil when none is.
func ownerKeys(t reflect.Type, field string) []string {
	if field == "" {
		return nil
	}
	sf, ok := t.FieldByName(field)
	if !ok {
		sf, ok = t.FieldByName(strings.TrimSuffix(field, "s"))
	}
	for i := 0; !ok && i < t.NumField(); i++ {
		sf, ok = t.Field(i), t.Field(i).Tag.Get("owner") == field
	}
	if ok {
		return []string{keyName(sf)}
	}
	head, rest, dotted := strings.Cut(field, ".")
	if hf, ok := t.FieldByName(head); dotted && ok && hf.Type.Kind() == reflect.Struct {
		if keys := ownerKeys(hf.Type, rest); keys != nil {
			return append([]string{keyName(hf)}, keys...)
		}
	}
	return nil
}

func checkName(n string) error {
	if n == "" {
		return fmt.Errorf("is required")
	}
	if len(n) > maxNameLen {
		return fmt.Errorf("%q is longer than %d characters", n, maxNameLen)
	}
	for i := 0; i < len(n); i++ {
		if c := n[i]; !isBare(c) && c != '.' {
			return fmt.Errorf("%q: only letters, digits, '_', '.' and '-' are allowed", n)
		}
	}
	return nil
}

// AdminUnix is the prefix of an admin.listen that is a unix socket's
// path: "unix:/run/preforkd/admin.sock".
const AdminUnix = "unix:"

// maxSocketPath is the longest path a unix socket address holds
// (sun_path, 108 bytes with its NUL).
const maxSocketPath = 107

// CheckAdminAddr checks an address of the admin endpoint as admin.listen
// takes it, for the commands that ask one (preforkd health, tune).
func CheckAdminAddr(a string) error { return checkAdminAddr(a) }

// checkAdminAddr checks an admin.listen: host:port, or unix: and an
// absolute path.
func checkAdminAddr(a string) error {
	p, ok := strings.CutPrefix(a, AdminUnix)
	if !ok {
		return checkAddr(a)
	}
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("invalid unix socket %q: want an absolute path, such as \"unix:/run/preforkd/admin.sock\"", a)
	case len(p) > maxSocketPath:
		return fmt.Errorf("unix socket path %q is %d bytes: at most %d fit a socket address", p, len(p), maxSocketPath)
	case strings.HasSuffix(p, "/"):
		return fmt.Errorf("unix socket path %q names a directory", p)
	}
	return nil
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
		if s != demoUpstream {
			return fmt.Errorf("unknown built-in upstream %q: the only one is %q", s, demoUpstream)
		}
		return nil
	}
	if _, err := engine.ParseTarget(s); err != nil {
		var te *engine.TargetError
		if errors.As(err, &te) {
			return fmt.Errorf("%q: %s", te.URL, te.Why)
		}
		return err
	}
	return nil
}

// check asks package redisstore about the [redis] table and reports its
// answer at the line of the key it is about, when it names one.
func (rd Redis) check(r *report) {
	if !rd.Enabled() {
		return
	}
	// The store takes a zero for its default; the file's zero is the
	// file's own.
	f := r.at([]string{"redis"}, "redis.")
	if rd.Timeout == 0 {
		f("timeout", "is 0; leave the key out for the default %v", redisstore.DefaultTimeout)
	}
	if rd.Prefix == "" {
		f("prefix", "is empty; leave the key out for the default %q", redisstore.DefaultPrefix)
	}
	if rd.BreakerFailures == 0 {
		f("breaker_failures", "is 0; leave the key out for the default %d", redisstore.DefaultBreakerFailures)
	}
	if rd.BreakerBackoff == 0 {
		f("breaker_backoff", "is 0; leave the key out for the default %v", redisstore.DefaultBreakerBackoff)
	}
	if rd.SuccessThreshold == 0 {
		f("success_threshold", "is 0; leave the key out for the default %d", redisstore.DefaultBreakerSuccesses)
	}
	r.owned([]string{"redis"}, "redis.", reflect.TypeFor[Redis](), rd.StoreOptions().Validate())
}

// anyPort reports whether the address a asks for a port of the
// system's choosing: it never takes another listener's.
func anyPort(a string) bool {
	_, port, err := net.SplitHostPort(a)
	return err == nil && port == "0"
}

// sameSocket reports whether listening on a and on b would take one
// port: the same port, and hosts that are the same or of which one is a
// wildcard (all addresses). Unix socket paths are compared as written.
// localhost is the address Go listens on for it, 127.0.0.1.
func sameSocket(a, b string) bool {
	if a == b {
		return true
	}
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || pa != pb {
		return false
	}
	wild := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	host := func(h string) string {
		if strings.EqualFold(h, "localhost") {
			return "127.0.0.1"
		}
		return h
	}
	return host(ha) == host(hb) || wild(ha) || wild(hb)
}

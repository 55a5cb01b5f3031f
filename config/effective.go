package config

import (
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/preforkd/preforkd/core"
)

// WriteEffective writes the configuration as it takes effect, defaults
// filled in and Workers, Burst, MaxKeys, MaxRecords and the table the
// region is made with (RegionTable) resolved, for
// `preforkd check`: one line per table and one per rule, every key with
// its value, for example (cut short here)
//
//	server: listen=127.0.0.1:8080 workers=4 upstream=builtin:demo trusted_proxies=[] ipv6_prefix=64 … max_rss=""
//	rule "login": path=/login methods=* limit=5 window=5m0s algorithm=gcra burst=5 by=ip … max_keys=262144 store=local on_unavailable=local local_share=1 sync=exact
//
// Strings that are empty or contain blanks, quotes or control characters
// are quoted. The format is for people; it may change.
func (c Config) WriteEffective(w io.Writer) error {
	c = c.WithDefaults()
	c.Server.Workers = c.Server.WorkerCount()
	var b strings.Builder
	line(&b, "server:", c.Server, "")
	if e, why := c.ServingEngine(); why != "" {
		fmt.Fprintf(&b, "server: the workers serve with %s, not server.engine's %s: %s\n", e, c.Server.Engine, why)
	}
	if c.TLS.Enabled() && c.TLS.CleartextListen != "" {
		plain := c
		plain.TLS = TLS{}
		e, _ := plain.ServingEngine()
		fmt.Fprintf(&b, "server: the cleartext port %s (tls.cleartext_listen) is served with %s, over the same region: %s\n",
			c.TLS.CleartextListen, e, map[Cleartext]string{CleartextRedirect: "redirect to https", CleartextServe: "served as the TLS port"}[c.TLS.Cleartext])
	}
	line(&b, "admin:", c.Admin, "")
	table := c.RegionTable()
	line(&b, "table:", table, "")
	if table.Responses == 0 && c.Table.Responses != 0 {
		b.WriteString("table: no response table: no [[idempotency]] or [[cache]] block stores responses (adding the first one needs a restart)\n")
	}
	line(&b, "persist:", c.Persist, "")
	line(&b, "log:", c.Log, "")
	if c.Redis.Enabled() {
		line(&b, "redis:", c.Redis, "")
	}
	line(&b, "reload:", c.Reload, "")
	if c.TLS.Enabled() {
		line(&b, "tls:", c.TLS, "certificate")
		for i, cert := range c.TLS.Certificates {
			line(&b, fmt.Sprintf("tls certificate %d:", i+1), cert)
		}
	}
	if c.Server.Shadow {
		b.WriteString("shadow: every rule is in shadow mode (a dry run): nothing is refused\n")
	}
	for _, r := range c.RateLimits {
		r.Burst = r.EffectiveBurst()
		r.Cost = max(r.Cost, 1)
		if r.Status == 0 {
			r.Status = 429
		}
		if r.MaxKeys == 0 {
			r.MaxKeys = core.DefaultMaxKeys(c.Table.Counters, len(c.RateLimits))
		}
		r.Mode = c.RuleMode(r)
		line(&b, fmt.Sprintf("rule %q:", r.Name), r, "name", "override")
		for i, o := range r.Overrides {
			if o.Window == 0 {
				o.Window = r.Window
			}
			if o.Burst == 0 {
				o.Burst = o.Limit
			}
			line(&b, fmt.Sprintf("rule %q override %d:", r.Name, i+1), o)
		}
	}
	for _, d := range c.Idempotency {
		if d.MaxRecords == 0 {
			d.MaxRecords = core.DefaultMaxRecords(table.Responses) // the records the region has
		}
		line(&b, "idempotency "+quote(d.Path)+":", d, "path")
		if d.Wait == UntilDone {
			fmt.Fprintf(&b, "idempotency %s: wait=until-done: a duplicate waits for its original up to %v (server.upstream_connect_timeout + upstream_timeout), then 409\n",
				quote(d.Path), c.Server.UntilDone())
		}
	}
	for _, d := range c.Caches {
		// An empty tag_headers is none, not every one as for methods.
		line(&b, "cache "+quote(d.Path)+":", d, "path", "tag_headers")
		tags := `""`
		if len(d.TagHeaders) > 0 {
			tags = quote(strings.Join(d.TagHeaders, ","))
		}
		s := b.String()
		b.Reset()
		b.WriteString(strings.TrimSuffix(s, "\n") + " tag_headers=" + tags + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// line writes head and key=value for every key of the table v but skip.
func line(b *strings.Builder, head string, v any, skip ...string) {
	b.WriteString(head)
	rv := reflect.ValueOf(v)
	for i, k := range tomlKeys(rv.Type()) {
		if k == "" || slices.Contains(skip, k) {
			continue // no key (a secret read from a file), or skipped
		}
		var s string
		switch v := rv.Field(i).Interface().(type) {
		case string:
			s = quote(v)
		case []string:
			s = "*"
			if len(v) > 0 {
				s = quote(strings.Join(v, ","))
			}
		case SizeLimit:
			s = quote(v.String())
		case []RedisURL:
			s = `""`
			if len(v) > 0 {
				s = quote(strings.Join(RedactedURLs(v), ","))
			}
		case Prefixes:
			s = strings.ReplaceAll(fmt.Sprint(v), " ", ",") // [a,b]
		default:
			s = fmt.Sprint(v)
		}
		b.WriteString(" " + k + "=" + s)
	}
	b.WriteByte('\n')
}

// quote returns s bare when that is unambiguous, else Go-quoted.
func quote(s string) string {
	if s == "" {
		return `""`
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == '"' || c == '\\' || c >= 0x7f {
			return strconv.Quote(s)
		}
	}
	return s
}

// ServingEngine is the engine the workers serve with, and why it is not
// server.engine's when it is not: net/http on a [tls] listener
// (crypto/tls needs a blocking connection), fasthttp for an https://
// upstream (the event loop speaks no TLS to one).
func (c Config) ServingEngine() (engine, why string) {
	switch {
	case c.TLS.Enabled():
		return "net/http", "the listener speaks TLS ([tls])"
	case strings.HasPrefix(c.Server.Upstream, "https://") && c.Server.Engine != EngineFasthttp:
		return EngineFasthttp.String(), "the upstream is https://, which the event loop does not speak"
	}
	return c.Server.Engine.String(), ""
}

package config

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// WriteEffective writes the configuration as it takes effect, defaults
// filled in and Workers resolved, for `preforkd check`: one line per table
// and one per rule, for example
//
//	server: listen=127.0.0.1:8080 workers=4 upstream=builtin:demo trusted_proxies=[] ipv6_prefix=64 shutdown_timeout=30s headers=both max_request_body=1MiB
//	rule "login": path=/login methods=* limit=5 window=5m0s algorithm=gcra burst=5 by=ip mode=enforce on_full=open
//
// Strings that are empty or contain blanks, quotes or control characters
// are quoted. The format is for people; it may change.
func (c Config) WriteEffective(w io.Writer) error {
	c = c.WithDefaults()
	var b strings.Builder
	s := c.Server
	proxies := make([]string, len(s.TrustedProxies))
	for i, p := range s.TrustedProxies {
		proxies[i] = p.String()
	}
	fmt.Fprintf(&b, "server: listen=%s workers=%d upstream=%s trusted_proxies=[%s] ipv6_prefix=%d shutdown_timeout=%v headers=%s max_request_body=%s\n",
		quote(s.Listen), s.WorkerCount(), quote(s.Upstream), strings.Join(proxies, ","), s.IPv6Prefix, s.ShutdownTimeout, quote(s.Headers), formatSize(s.MaxRequestBody))
	fmt.Fprintf(&b, "admin: listen=%s token_file=%s\n", quote(c.Admin.Listen), quote(c.Admin.TokenFile))
	fmt.Fprintf(&b, "table: counters=%d responses=%d response_bytes=%s\n",
		c.Table.Counters, c.Table.Responses, formatSize(c.Table.ResponseBytes))
	fmt.Fprintf(&b, "persist: path=%s key=%s live=%s\n", quote(c.Persist.Path), quote(c.Persist.Key), quote(c.Persist.Live))
	for _, r := range c.RateLimits {
		fmt.Fprintf(&b, "rule %q: path=%s methods=%s limit=%d window=%v algorithm=%s burst=%d by=%s mode=%s on_full=%s\n",
			r.Name, quote(r.Path), methods(r.Methods), r.Limit, r.Window, quote(r.Algorithm), r.EffectiveBurst(), quote(r.By), quote(r.Mode), quote(r.OnFull))
	}
	for _, d := range c.Idempotency {
		fmt.Fprintf(&b, "idempotency %s: methods=%s header=%s required=%t ttl=%v wait=%v by=%s max_body=%s\n",
			quote(d.Path), methods(d.Methods), quote(d.Header), d.Required, d.TTL, d.Wait, quote(d.By), formatSize(d.MaxBody))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func methods(ms []string) string {
	if len(ms) == 0 {
		return "*"
	}
	return quote(strings.Join(ms, ","))
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

// formatSize writes n with the largest binary unit that divides it.
func formatSize(n int64) string {
	for _, u := range []struct {
		name string
		size int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n > 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

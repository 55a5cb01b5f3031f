package config

import (
	"fmt"
	"strings"

	"github.com/preforkd/preforkd/clientip"
)

// Warnings are what a valid configuration does that an operator most
// likely did not mean, one sentence each: `preforkd run` logs them at
// start and at every reload, `preforkd check` prints them. A warning is
// not an error: the configuration runs as written.
//
//   - Rules that count clients by their address (by "ip", or a chain that
//     falls back to it) while server.trusted_proxies is empty: behind a
//     load balancer or a CDN every client arrives from the proxy's
//     address, and all share one budget.
//   - [[cache]] or [[idempotency]] blocks, persist.path set and no
//     persist.key: a restart after a deploy serves the stored responses
//     of the previous build.
//   - An override by key on a rule whose key has no value it could match
//     (by "ip" or "global"; by "path" for a key that is not a path): the
//     override never applies, and its clients get the rule's limit.
//   - tls.cleartext or tls.redirect_port written without a
//     tls.cleartext_listen, or redirect_port beside cleartext = "serve":
//     there is no cleartext port, or it redirects nothing, and the key
//     does nothing.
func (c Config) Warnings() []string {
	c = c.WithDefaults()
	var out []string
	if t := c.TLS; t.CleartextListen == "" {
		for _, k := range []struct {
			set  bool
			name string
		}{{t.cleartextSet, "cleartext"}, {t.redirectPortSet, "redirect_port"}} {
			if k.set {
				out = append(out, "tls."+k.name+" has no effect without tls.cleartext_listen: no cleartext port is opened; "+
					`set cleartext_listen (e.g. ":80") beside a [[tls.certificate]], or remove the key`)
			}
		}
	} else if t.redirectPortSet && t.Cleartext == CleartextServe {
		out = append(out, `tls.redirect_port has no effect with cleartext = "serve": the cleartext_listen port serves requests and redirects none; remove the key, or set cleartext = "redirect"`)
	}
	if len(c.Server.TrustedProxies) == 0 {
		var names []string
		for _, rl := range c.RateLimits {
			if by, err := clientip.ParseBy(rl.By); err == nil && by.ByAddress() {
				names = append(names, fmt.Sprintf("%q", rl.Name))
			}
		}
		if len(names) > 0 {
			what := "rule " + names[0] + " counts clients"
			if len(names) > 1 {
				what = "rules " + strings.Join(names, ", ") + " count clients"
			}
			out = append(out, what+` by their address (by "ip") and server.trusted_proxies is empty: `+
				"behind a load balancer, a CDN or any reverse proxy every client arrives from the proxy's address and all share one budget; "+
				`list the proxy's addresses in trusted_proxies (e.g. ["10.0.0.0/8"]), or ignore this if clients connect directly`)
		}
	}
	if blocks := c.storing(); blocks != "" && c.Persist.Path != "" && c.Persist.AppKey() == "" {
		out = append(out, fmt.Sprintf("%s blocks store responses, persist.path is set and persist.key is empty: "+
			"after a deploy, a restart serves the responses the previous build stored, which the new one may not produce; "+
			`set persist.key to the application's version (e.g. key = "v1.42.0" or its git SHA), or persist.key_file to a file the deploy writes (echo "$GIT_SHA" > /etc/preforkd/app-version)`, blocks))
	}
	for _, rl := range c.RateLimits {
		by, err := clientip.ParseBy(rl.By)
		if err != nil {
			continue
		}
		for i, o := range rl.Overrides {
			if o.Key != "" && !keyMatchable(by, o.Key) {
				out = append(out, fmt.Sprintf(`rule %q override %d: a key override never applies to a rule by %q: `+
					`it matches the value of a header:, cookie: or query: element, or a path (starting with /) of a path element; `+
					`for client addresses use client = ["192.0.2.7/32"]`, rl.Name, i+1, rl.By))
			}
		}
	}
	return out
}

// keyMatchable reports whether a request counted by by may carry key as
// the value an override's key is matched against (clientip's
// AppendKeyValue): one of a header, cookie or query element, or a path.
func keyMatchable(by clientip.By, key string) bool {
	for _, e := range by.Elements() {
		switch {
		case e == "path":
			if strings.HasPrefix(key, "/") {
				return true
			}
		case e != "ip" && e != "global":
			return true
		}
	}
	return false
}

// Notes are what `preforkd check` points out about a configuration that
// is fine as it is, but trades something away: one note per rule whose
// key is chosen by the client (a header:, cookie: or query: element),
// since every new value the client makes up starts a fresh budget.
func (c Config) Notes() []string {
	c = c.WithDefaults()
	var out []string
	for _, rl := range c.RateLimits {
		by, err := clientip.ParseBy(rl.By)
		if err != nil {
			continue
		}
		chosen := by.ClientChosen()
		if len(chosen) == 0 {
			continue
		}
		what := chosen[0] + " is"
		if len(chosen) > 1 {
			what = strings.Join(chosen, ", ") + " are"
		}
		out = append(out, fmt.Sprintf(`rule %q (by %q): %s chosen by the client: each new value it sends starts a fresh budget, `+
			"unless something in front sets or checks it (an edge that authenticates the API key, a session cookie the application issues); "+
			`a rule by "ip" on the same path bounds what one address can do with made-up values`, rl.Name, by.String(), what))
	}
	return out
}

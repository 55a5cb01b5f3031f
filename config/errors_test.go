package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestErrors checks that each bad file gives an *Error naming the file, the
// line marked "<-" (or line when set) and a message containing msg.
func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src, msg string
		line           int
	}{
		// Syntax, reported by the TOML decoder.
		{"syntax", "[server]\nlisten = \"x <-\n", "", 0},
		{"syntax key", "[server]\n= 5 # <-\n", "", 0},
		{"key defined twice", "[server]\nlisten = \":1\"\nlisten = \":2\" # <-\n", "already been defined", 0},

		// Unknown keys and tables.
		{"unknown key", "[server]\nlisten = \":1\"\nlisen = \"x\" # <-\n", `unknown key "lisen" in server (did you mean "listen"?)`, 0},
		{"key in wrong case", "[server]\nListen = \":1\" # <-\n", `unknown key "Listen" in server (did you mean "listen"?)`, 0},
		{"unknown table", "[server]\n\n[sever] # <-\nlisten = \":1\"\n", `unknown table "sever" (did you mean "server"?)`, 0},
		{"unknown table in a dotted header", "# c\n[sever.tls] # <-\n", `unknown table "sever" (did you mean "server"?)`, 0},
		{"unknown top-level key", "# c\nfoo = 1 # <-\n", `unknown key "foo"`, 0},
		{"unknown dotted key", "server.listen = \":1\"\nserver.wrokers = 2 # <-\n", `unknown key "wrokers" in server (did you mean "workers"?)`, 0},
		{"unknown key in second rule", rule + "[[ratelimit]]\nname = \"b\"\npath = \"/b\"\nlimt = 5 # <-\nlimit = 1\nwindow = \"1s\"\n",
			`unknown key "limt" in ratelimit[2] (did you mean "limit"?)`, 0},
		{"unknown key in inline table", "\nadmin = { listen = \"\", tokenfile = \"x\" } # <-\n", `unknown key "tokenfile" in admin`, 0},
		{"unknown key in idempotency", "[[idempotency]]\npath = \"/o\"\nheaders = \"X\" # <-\n", `unknown key "headers" in idempotency[1] (did you mean "header"?)`, 0},

		// Types.
		{"table not array", "\n[ratelimit] # <-\nname = \"x\"\n", "want an array of tables ([[ratelimit]]), got table", 0},
		{"section not table", "server = 1 # <-\n", "server: want a table, got integer", 0},
		// The header the message asks for is one TOML takes: without the
		// rule's index.
		{"override not array", rule + "[ratelimit.override] # <-\nkey = \"k\"\nlimit = 3\n",
			"ratelimit[1].override: want an array of tables ([[ratelimit.override]]), got table", 0},
		{"certificate not array", "[tls.certificate] # <-\ncert = \"c\"\nkey = \"k\"\n",
			"tls.certificate: want an array of tables ([[tls.certificate]]), got table", 0},
		{"int as string", "[server]\nworkers = \"4\" # <-\n", "server.workers: want an integer, got string", 0},
		{"string as int", "[server]\nlisten = 8080 # <-\n", "server.listen: want a string, got integer", 0},
		{"float limit", rule + "[[ratelimit]]\nname = \"b\"\npath = \"/b\"\nlimit = 5.0 # <-\nwindow = \"1s\"\n", "ratelimit[2].limit: want an integer, got float", 0},
		{"methods not array", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nmethods = \"POST\" # <-\nlimit = 1\nwindow = \"1s\"\n", "want an array of strings, got string", 0},
		{"method not string", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nmethods = [\n  \"GET\",\n  1,\n] # <-\nlimit = 1\nwindow = \"1s\"\n", "methods[2]: want a string, got integer", 4},
		{"bool as string", "[[idempotency]]\npath = \"/o\"\nrequired = \"yes\" # <-\n", "want true or false, got string", 0},
		{"duration as int", "[server]\nshutdown_timeout = 30 # <-\n", "want a duration string", 0},
		// A window alone may be a whole number of seconds.
		{"window of no seconds", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = 0 # <-\n", "want a positive whole number of seconds", 0},
		{"window as float", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = 1.5 # <-\n", "a whole number of seconds (300) or a duration string", 0},
		{"date", "[persist]\nkey = 1979-05-27 07:32:00Z # <-\n", "want a string, got date-time", 0},

		// Conversions.
		{"bad duration", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"5 minutes\" # <-\n", `invalid duration "5 minutes"`, 0},
		{"bad size", "[table]\nresponse_bytes = \"1 megabyte\" # <-\n", `invalid size "1 megabyte"`, 0},
		{"negative size", "[table]\nresponse_bytes = -5 # <-\n", "negative size", 0},
		{"bad CIDR", "[server]\ntrusted_proxies = [\"10.0.0.0/8\", \"10.0.0.0/33\"] # <-\n", `trusted_proxies[2]: invalid CIDR "10.0.0.0/33"`, 0},
		{"bad address", "[server]\ntrusted_proxies = [\n\"nonsense\",\n] # <-\n", `invalid IP address or CIDR "nonsense"`, 2},
		{"zone", "[server]\ntrusted_proxies = [\"fe80::1%eth0\"] # <-\n", "invalid IP address", 0},

		// Values of [server], [admin], [table], [persist].
		{"listen", "[server]\nlisten = \"8080\" # <-\n", `invalid address "8080"`, 0},
		{"listen port", "[server]\nlisten = \":http\" # <-\n", "invalid port", 0},
		{"workers", "[server]\nworkers = -1 # <-\n", "server.workers: must not be negative", 0},
		{"log format", "[log]\nformat = \"xml\" # <-\n", `"xml" is not one of "text", "json"`, 0},
		{"log level", "[log]\nlevel = \"verbose\" # <-\n", `"verbose" is not one of "info", "debug", "warn", "error"`, 0},
		{"too many workers", "[server]\nworkers = 40000 # <-\n", "server.workers: must be at most 4096, got 40000", 0},
		{"upstream scheme", "[server]\nupstream = \"ftp://x\" # <-\n", "absolute http:// or https:// URL", 0},
		{"upstream relative", "[server]\nupstream = \"localhost:8080\" # <-\n", "absolute http:// or https:// URL", 0},
		{"upstream no host", "[server]\nupstream = \"http:///x\" # <-\n", "with a host", 0},
		{"upstream builtin", "[server]\nupstream = \"builtin:echo\" # <-\n", "unknown built-in upstream", 0},
		{"upstream credentials", "[server]\nupstream = \"http://u:p@h\" # <-\n", "credentials", 0},
		{"upstream query", "[server]\nupstream = \"http://h/?a=1\" # <-\n", "no query", 0},
		{"negative timeout", "[server]\nupstream_timeout = \"-1s\" # <-\n", "upstream_timeout: must be positive", 0},
		{"small header limit", "[server]\nmax_header_bytes = \"1KiB\" # <-\n", "max_header_bytes: must be at least 4KiB", 0},
		// fasthttp holds a read buffer of max_header_bytes for each connection.
		{"large header limit", "[server]\nmax_header_bytes = \"1TiB\" # <-\n", "max_header_bytes: must be at most 1MiB", 0},
		{"no request body", "[server]\nmax_request_body = 0 # <-\n", "server.max_request_body: must be positive", 0},
		// A body up to the bound is read into memory: the largest int64 overflowed the read's +1.
		{"huge request body", "[server]\nmax_request_body = 9223372036854775807 # <-\n", "server.max_request_body: must be positive and at most 1GiB", 0},
		{"negative connections", "[server]\nmax_connections = -1 # <-\n", "max_connections: must not be negative", 0},
		{"negative idle pool", "[server]\nupstream_max_idle = -2 # <-\n", "upstream_max_idle: must not be negative", 0},
		// A zero or "" the file writes is its own, never the default.
		{"no idle pool", "[server]\nupstream_max_idle = 0 # <-\n", "server.upstream_max_idle: is 0; it must be at least 1 (leave the key out for the default 256)", 0},
		{"a negative upstream idle timeout", "[server]\nupstream_idle_timeout = \"-1s\" # <-\n", "upstream_idle_timeout: must be positive", 0},
		{"redis timeout 0", "[redis]\nurl = \"redis://127.0.0.1:6379\"\ntimeout = \"0s\" # <-\n", "redis.timeout: is 0; leave the key out for the default 25ms", 0},
		{"redis prefix empty", "[redis]\nurl = \"redis://127.0.0.1:6379\"\nprefix = \"\" # <-\n", `redis.prefix: is empty; leave the key out for the default "preforkd:"`, 0},
		{"idempotency header empty", "[[idempotency]]\npath = \"/o\"\nheader = \"\" # <-\n", `idempotency[1]: header: is empty; leave the key out for the default "Idempotency-Key"`, 0},
		{"cache targeted empty", "[[cache]]\npath = \"/c\"\ntargeted = \"\" # <-\n", `cache[1]: targeted: is empty; leave the key out for the default "Preforkd-Cache-Control"`, 0},
		{"ipv6_prefix 0", "[server]\nipv6_prefix = 0 # <-\n", "between 1 and 128, got 0", 0},
		{"ipv6_prefix 129", "[server]\nipv6_prefix = 129 # <-\n", "between 1 and 128, got 129", 0},
		{"shutdown_timeout", "[server]\nshutdown_timeout = \"0s\" # <-\n", "must be positive", 0},
		{"headers", "[server]\nheaders = \"all\" # <-\n", `server.headers: "all" is not one of "both", "ietf", "x", "none"`, 0},
		{"max_request_body 0", "[server]\nmax_request_body = 0 # <-\n", "must be positive", 0},
		{"admin listen", "[admin]\nlisten = \"127.0.0.1:8080\" # <-\n", "takes server.listen's port", 0},
		{"admin listen beside a wildcard", "[server]\nlisten = \"0.0.0.0:18541\"\n[admin]\nlisten = \"127.0.0.1:18541\" # <-\n", "takes server.listen's port", 0},
		{"admin listen under a wildcard", "[server]\nlisten = \"127.0.0.1:18541\"\n[admin]\nlisten = \":18541\" # <-\n", "takes server.listen's port", 0},
		{"admin listen on localhost", "[server]\nlisten = \"127.0.0.1:18541\"\n[admin]\nlisten = \"localhost:18541\" # <-\n", "takes server.listen's port", 0},
		{"admin unix relative", "[admin]\nlisten = \"unix:run/admin.sock\" # <-\n", "want an absolute path", 0},
		{"admin unix long", "[admin]\nlisten = \"unix:/" + strings.Repeat("d", 107) + "\" # <-\n", "at most 107 fit a socket address", 0},
		{"admin unix dir", "[admin]\nlisten = \"unix:/run/\" # <-\n", "names a directory", 0},
		{"counters small", "[table]\ncounters = 7 # <-\n", "between 8 and 67108864, got 7", 0},
		{"counters large", "[table]\ncounters = 67108865 # <-\n", "got 67108865", 0},
		{"counters huge", "[table]\ncounters = 9223372036854775807 # <-\n", "between 8 and", 0},
		{"responses negative", "[table]\nresponses = -1 # <-\n", "must not be negative", 0},
		{"responses 0 with idempotency", "[table]\nresponses = 0 # <-\n[[idempotency]]\npath = \"/o\"\n", "need stored responses", 0},
		{"response_bytes 0 with idempotency", "[table]\nresponse_bytes = 0 # <-\n[[idempotency]]\npath = \"/o\"\n", "table.response_bytes: is 0 but [[idempotency]] blocks need room for stored bodies", 0},
		// 0 written in the file is checked as 0, not taken for the default.
		{"cost 0", rule + "[[ratelimit]]\nname = \"b\"\npath = \"/b\"\nlimit = 5\nwindow = \"1s\"\ncost = 0 # <-\n", `ratelimit "b": cost: must be at least 1, got 0`, 0},
		{"status 0", rule + "[[ratelimit]]\nname = \"b\"\npath = \"/b\"\nlimit = 5\nwindow = \"1s\"\nstatus = 0 # <-\n", `ratelimit "b": status: want 429 or 503, got 0`, 0},
		{"override window 0s", rule + "[[ratelimit.override]]\nkey = \"k\"\nlimit = 3\nwindow = \"0s\" # <-\n", `"0s": want a positive duration (or leave it out for the rule's window)`, 0},
		{"cache ttl 0s", "[[cache]]\npath = \"/c\"\nttl = \"0s\" # <-\n", "cache[1]: ttl: must be positive", 0},
		{"cache max_body 0", "[[cache]]\npath = \"/c\"\nmax_body = 0 # <-\n", "cache[1]: max_body: must be positive", 0},
		// The region's own bounds: check refuses what run would.
		{"responses past the region's", "[table]\nresponses = 67108865 # <-\n[[cache]]\npath = \"/c\"\n", "table.responses: must be between 0 and 67108864, got 67108865", 0},
		{"response_bytes past the region's", "[table]\nresponse_bytes = \"99999999GiB\" # <-\n[[idempotency]]\npath = \"/o\"\n", "table.response_bytes: must be between 0 and 17592186036224 bytes", 0},
		{"response_bytes 0 with cache", "[table]\nresponse_bytes = 0 # <-\n[[cache]]\npath = \"/c\"\n", "table.response_bytes: is 0 but [[cache]] blocks need room for stored bodies", 0},
		{"persist live", "[persist]\npath = \"/x\"\nlive = \"/x\" # <-\n", "same file", 0},
		{"max_requests", "[server]\nmax_requests = -1 # <-\n", "server.max_requests: must not be negative", 0},
		{"max_rss", "[server]\nmax_rss = \"lots\" # <-\n", `server.max_rss: invalid size "lots"`, 0},
		{"max_rss bool", "[server]\nmax_rss = true # <-\n", "server.max_rss: want a size", 0},
		{"max_rss below a worker", "[server]\nmax_rss = \"1MiB\" # <-\n", "server.max_rss: must be at least 32MiB", 0},
		{"max_rss just below", "[server]\nmax_rss = \"33554431\" # <-\n", "got 33554431", 0},

		// [reload].
		{"canary string", "[reload]\ncanary = \"yes\" # <-\n", "reload.canary: want true or false, got string", 0},
		{"canary_window 0", "[reload]\ncanary_window = \"0s\" # <-\n", "reload.canary_window: must be between 100ms and 1h0m0s, got 0s", 0},
		{"canary_window long", "[reload]\ncanary_window = \"2h\" # <-\n", "got 2h0m0s", 0},
		{"canary_min_requests", "[reload]\ncanary_min_requests = 0 # <-\n", "reload.canary_min_requests: must be at least 1, got 0", 0},
		{"canary_max_error_delta 0", "[reload]\ncanary_max_error_delta = 0 # <-\n", "reload.canary_max_error_delta: must be more than 0", 0},
		{"canary_max_error_delta 101", "[reload]\ncanary_max_error_delta = 101.5 # <-\n", "got 101.5", 0},
		{"canary_max_error_delta nan", "[reload]\ncanary_max_error_delta = nan # <-\n", "got NaN", 0},
		{"canary_max_error_delta string", "[reload]\ncanary_max_error_delta = \"2%\" # <-\n", "want a number, got string", 0},
		{"canary_inconclusive", "[reload]\ncanary_inconclusive = \"pass\" # <-\n", `reload.canary_inconclusive: "pass" is not one of "continue", "abort"`, 0},

		// [[ratelimit]].
		{"duplicate name", rule + "[[ratelimit]]\nname = \"r\" # <-\npath = \"/b\"\nlimit = 1\nwindow = \"1s\"\n", `ratelimit "r": name: duplicate rule name (first used at line 2)`, 0},
		{"duplicate name inline", "ratelimit = [\n{name = \"a\", path = \"/a\", limit = 1, window = \"1s\"},\n{name = \"a\", path = \"/b\", limit = 1, window = \"1s\"}, # <-\n]\n", "duplicate rule name (first used at line 2)", 0},
		{"missing name", "\n[[ratelimit]] # <-\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\n", "ratelimit[1]: name: is required", 0},
		{"bad name", "[[ratelimit]]\nname = \"a b\" # <-\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\n", "only letters", 0},
		{"long name", "[[ratelimit]]\nname = \"" + strings.Repeat("a", 65) + "\" # <-\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\n", "longer than 64", 0},
		{"missing limit", "[[ratelimit]] # <-\nname = \"a\"\npath = \"/a\"\nwindow = \"1s\"\n", `ratelimit "a": limit must be between 1 and 1048575, got 0`, 0},
		{"limit 0", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 0 # <-\nwindow = \"1s\"\n", `ratelimit "a": limit must be between 1 and 1048575, got 0`, 0},
		{"limit too large", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1048576 # <-\nwindow = \"1h\"\n", "got 1048576", 0},
		{"path without slash", "[[ratelimit]]\nname = \"a\"\npath = \"login\" # <-\nlimit = 1\nwindow = \"1s\"\n", `ratelimit "a": path "login" must start with /`, 0},
		{"missing path", "[[ratelimit]] # <-\nname = \"a\"\nlimit = 1\nwindow = \"1s\"\n", `ratelimit "a": path "" must start with /`, 0},
		{"star inside", "[[ratelimit]]\nname = \"a\"\npath = \"/a*b\" # <-\nlimit = 1\nwindow = \"1s\"\n", `path "/a*b": '*' is only allowed as a final "/*"`, 0},
		{"star segment", "[[ratelimit]]\nname = \"a\"\npath = \"/api/*/x\" # <-\nlimit = 1\nwindow = \"1s\"\n", `'*' is only allowed`, 0},
		{"star without slash", "[[ratelimit]]\nname = \"a\"\npath = \"/api*\" # <-\nlimit = 1\nwindow = \"1s\"\n", `'*' is only allowed`, 0},
		{"star alone", "[[ratelimit]]\nname = \"a\"\npath = \"*\" # <-\nlimit = 1\nwindow = \"1s\"\n", `path "*" must start with /`, 0},
		{"query in path", "[[ratelimit]]\nname = \"a\"\npath = \"/a?b=1\" # <-\nlimit = 1\nwindow = \"1s\"\n", `path "/a?b=1": a path has no query or fragment`, 0},
		{"bad method", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nmethods = [\"GET\", \"PO ST\"] # <-\nlimit = 1\nwindow = \"1s\"\n", `ratelimit "a": method "PO ST" is not a token`, 0},
		{"method twice", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nmethods = [\"GET\", \"get\"] # <-\nlimit = 1\nwindow = \"1s\"\n", `method "GET" is listed twice`, 0},
		{"window too short", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"999us\" # <-\n", "between 1ms and", 0},
		{"window too long", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"4887h\" # <-\n", "between 1ms and", 0},
		{"window fraction", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1ms500ns\" # <-\n", "whole number of microseconds", 0},
		// 2^44µs passed config's own window check and failed bucket's in
		// every worker; bucket's is now the only one.
		{"window 2^44µs", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"4886h43m6.044416s\" # <-\n",
			`ratelimit "a": window must be between 1ms and 4886h43m6.044415s, got 4886h43m6.044416s`, 0},
		{"path with a blank", "[[ratelimit]]\nname = \"a\"\npath = \"/a b\" # <-\nlimit = 1\nwindow = \"1s\"\n", "contains a blank or control character", 0},
		{"window negative", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"-1s\" # <-\n", "between 1ms and", 0},
		{"rate too high", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 2000\nwindow = \"1ms\" # <-\n", "at least 1µs per request", 0},
		{"burst refill too long", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1000h\"\nburst = 10 # <-\n", "to refill", 0},
		{"algorithm", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nalgorithm = \"leaky\" # <-\n", `ratelimit[1].algorithm: unknown algorithm "leaky" (want "gcra" or "fixed-window")`, 0},
		{"burst with fixed-window", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nalgorithm = \"fixed-window\"\nburst = 3 # <-\n", `ratelimit "a": burst applies to algorithm gcra only, not fixed-window`, 0},
		{"burst negative", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nburst = -1 # <-\n", `ratelimit "a": burst must be between 0 and 1048575 (0 means limit), got -1`, 0},
		{"mode", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nmode = \"Shadow\" # <-\n", `mode: "Shadow" is not one of "enforce", "shadow"`, 0},
		{"on_full", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\non_full = \"fail\" # <-\n", `ratelimit[1].on_full: unknown on-full policy "fail" (want "open" or "closed")`, 0},
		{"by unknown", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nby = \"session:sid\" # <-\n", `unknown element "session:sid"`, 0},
		{"by empty", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nby = \"\" # <-\n", `ratelimit "a": invalid by "": empty`, 0},
		{"by global chain", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nby = \"global|ip\" # <-\n", `invalid by "global|ip": "global" must stand alone`, 0},
		{"by after ip", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nby = \"ip|header:X\" # <-\n", `invalid by "ip|header:X": ip must be the last element`, 0},
		{"by bad header", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nby = \"header:X Key|ip\" # <-\n", `header name "X Key" is not a token`, 0},
		{"by no header", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nby = \"header:\" # <-\n", `invalid by "header:": empty header name`, 0},
		{"by header twice", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nby = \"header:X|header:x\" # <-\n", "header:X repeated", 0},
		{"by spaces", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nby = \"header:X | ip\" # <-\n", `header name "X " is not a token`, 0},

		{"by cookie and path", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nby = \"path|cookie:s\" # <-\n", `nothing after "path" is ever used`, 0},
		{"cost over the burst", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 10\nwindow = \"1s\"\ncost = 11 # <-\n", `ratelimit "a": cost 11 is more than the 10 a key can ever hold`, 0},
		{"cost negative", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 10\nwindow = \"1s\"\ncost = -1 # <-\n", "cost must not be negative", 0},
		{"max_keys negative", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 10\nwindow = \"1s\"\nmax_keys = -1 # <-\n", `ratelimit "a": max_keys must not be negative`, 0},
		{"two rules on one account", "[[ratelimit]]\nname = \"rule-18\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\n[[ratelimit]]\nname = \"rule-39\" # <-\npath = \"/b\"\nlimit = 1\nwindow = \"1s\"\n",
			`ratelimit "rule-39": name: its name hashes to the 16-bit account 0xdde1 of rule "rule-18"`, 0},
		// An override's state is kept under a tag of its own; one that
		// another rule has would lose both at every restart.
		{"override on another rule's tag", "[[ratelimit]]\nname = \"login\"\npath = \"/login\"\nlimit = 5\nwindow = \"1h\"\n[[ratelimit]]\nname = \"api\" # <-\npath = \"/api\"\nlimit = 100\nwindow = \"1h\"\n[[ratelimit.override]]\nkey = \"k1\"\nlimit = 1000\n[[ratelimit.override]]\nkey = \"k47527\"\nlimit = 1000\n",
			`ratelimit "api": name: the state of its override 2 hashes to the 16-bit tag 0x1239 of rule "login"`, 0},
		// A Redis rule's overrides keep counts in this host's table too
		// (sync mode, on_unavailable "local").
		{"redis override on its rule's tag", "[redis]\nurl = \"redis://127.0.0.1:6379\"\n[[ratelimit]]\nname = \"api\" # <-\npath = \"/api\"\nlimit = 100\nwindow = \"1m\"\nalgorithm = \"fixed-window\"\nstore = \"redis\"\nsync = \"1s\"\n[[ratelimit.override]]\nkey = \"k56449\"\nlimit = 1000\n",
			`ratelimit "api": name: the state of its override 1 hashes to the 16-bit tag`, 0},
		{"status", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nstatus = 418 # <-\n", `ratelimit "a": status 418: want 429 or 503`, 0},
		{"exempt", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nexempt = [\"10.0.0.0/33\"] # <-\n", `invalid CIDR "10.0.0.0/33"`, 0},
		{"server exempt", "[server]\nexempt = [\"x\"] # <-\n", `invalid IP address or CIDR "x"`, 0},
		{"override neither", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\n[[ratelimit.override]] # <-\nlimit = 5\n", `ratelimit "a": override 1: give it either a key or clients`, 0},
		{"override both", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\n[[ratelimit.override]]\nkey = \"k\" # <-\nclient = [\"10.0.0.0/8\"]\nlimit = 5\n", `override 1: give it either a key or clients`, 0},
		{"override limit", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\n[[ratelimit.override]]\nkey = \"k\"\nlimit = 3\n[[ratelimit.override]]\nkey = \"j\"\nlimit = 0 # <-\n", `ratelimit "a": override 2: limit must be between 1 and 1048575, got 0`, 0},
		{"override of clients an earlier one takes", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\n[[ratelimit.override]]\nclient = [\"10.0.0.0/8\"]\nlimit = 2\n[[ratelimit.override]]\nclient = [\"10.1.0.0/16\", \"10.2.3.4/32\"] # <-\nlimit = 3\n", `override 2: every client range of it is exempt or an earlier override's: it would never apply`, 0},
		{"override of exempt clients", "[server]\nexempt = [\"192.0.2.0/24\"]\n[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nexempt = [\"10.0.0.0/8\"]\n[[ratelimit.override]]\nclient = [\"10.1.0.0/16\", \"192.0.2.7/32\"] # <-\nlimit = 2\n", `override 1: every client range of it is exempt or an earlier override's: it would never apply`, 0},
		{"override key twice", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\n[[ratelimit.override]]\nkey = \"k\"\nlimit = 2\n[[ratelimit.override]]\nkey = \"k\" # <-\nlimit = 3\n", `override 2: key "k" is overridden twice`, 0},
		{"override unknown key", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\n[[ratelimit.override]]\nkeys = \"k\" # <-\nlimit = 2\n", `keys`, 0},

		// [[idempotency]].
		{"idempotency path", "[[idempotency]]\npath = \"orders\" # <-\n", `idempotency[1]: path "orders" must start with /`, 0},
		{"idempotency missing path", "\n[[idempotency]] # <-\nttl = \"1h\"\n", `idempotency[1]: path "" must start with /`, 0},
		{"idempotency empty methods", "[[idempotency]]\npath = \"/o\"\nmethods = [] # <-\n", "methods: is empty", 0},
		{"idempotency header", "[[idempotency]]\npath = \"/o\"\nheader = \"Idem Key\" # <-\n", "not a valid header name", 0},
		{"idempotency ttl", "[[idempotency]]\npath = \"/o\"\nttl = \"0s\" # <-\n", "ttl: must be positive", 0},
		{"idempotency wait", "[[idempotency]]\npath = \"/o\"\nwait = \"-1s\" # <-\n", `invalid wait "-1s": want a duration such as "10s" ("0s": no wait), or "until-done"`, 0},
		{"idempotency by", "[[idempotency]]\npath = \"/o\"\nby = \"header:Authorization|global\" # <-\n", `idempotency[1]: invalid by "header:Authorization|global": "global" must stand alone`, 0},
		{"idempotency max_body", "[[idempotency]]\npath = \"/o\"\nmax_body = \"65MiB\" # <-\n", "larger than table.response_bytes", 0},
		{"idempotency max_records", "[[idempotency]]\npath = \"/o\"\nmax_records = -2 # <-\n", "idempotency[1]: max_records: must not be negative", 0},
		{"idempotency duplicate", "[[idempotency]]\npath = \"/o\"\n[[idempotency]]\npath = \"/o\" # <-\nmethods = [\"PUT\", \"PATCH\"]\n", "PATCH /o is already covered by idempotency[1]", 0},
		{"cache methods", "[[cache]]\npath = \"/c\"\nmethods = [\"GET\", \"POST\"] # <-\n", "cache[1]: methods: only GET and HEAD are answered from a cache, not POST", 0},
		{"cache without GET", "[[cache]]\npath = \"/c\"\nmethods = [\"HEAD\"] # <-\n", "methods: must include GET", 0},
		{"cache ttl", "[[cache]]\npath = \"/c\"\nttl = \"-1s\" # <-\n", "cache[1]: ttl: must be positive", 0},
		{"cache max_body", "[[cache]]\npath = \"/c\"\nmax_body = \"65MiB\" # <-\n", "larger than table.response_bytes", 0},
		{"cache lock_timeout", "[[cache]]\npath = \"/c\"\nlock_timeout = \"-1s\" # <-\n", "lock_timeout: must be between 0 and", 0},
		{"cache lock_timeout too long", "[[cache]]\npath = \"/c\"\nlock_timeout = \"10000h\" # <-\n", "lock_timeout: must be between 0 and", 0},
		{"cache tag header", "[[cache]]\npath = \"/c\"\ntag_headers = [\"Cache Tag\"] # <-\n", `tag_headers: "Cache Tag" is not a valid header name`, 0},
		{"cache path", "[[cache]] # <-\nttl = \"1h\"\n", `cache[1]: path "" must start with /`, 0},
		{"cache duplicate", "[[cache]]\npath = \"/c/*\"\n[[cache]]\npath = \"/c/*\" # <-\n", "/c/* is already covered by cache[1]", 0},
		{"cache duplicate once matched", "[[cache]]\npath = \"/c/*\"\n[[cache]]\npath = \"/%43/*\" # <-\n", "/%43/* is already covered by cache[1]", 0},
		{"cache under an earlier prefix", "[[cache]]\npath = \"/c/*\"\n[[cache]]\npath = \"/c/d\" # <-\n", "/c/d is already covered by cache[1]", 0},
		{"idempotency HEAD after GET", "[[idempotency]]\npath = \"/o\"\nmethods = [\"GET\"]\n[[idempotency]]\npath = \"/o\" # <-\nmethods = [\"HEAD\"]\n", "HEAD /o is already covered by idempotency[1]", 0},
		{"idempotency duplicate once matched", "[[idempotency]]\npath = \"/o\"\n[[idempotency]]\npath = \"/O/\" # <-\n", "POST /O/ is already covered by idempotency[1]", 0},
		{"cache without a response table", "[table]\nresponses = 0 # <-\n[[cache]]\npath = \"/c\"\n", "[[cache]] blocks need stored responses", 0},
		{"cache unknown key", "[[cache]]\npath = \"/c\"\ntags = [\"X\"] # <-\n", `unknown key "tags" in cache[1]`, 0},

		// Line numbers after constructs that span lines.
		{"after multi-line string", "[persist]\nkey = \"\"\"\n[server]\nx = 1\n\"\"\"\nlive = '''\n'''\n[server]\nlisen = 1 # <-\n", `unknown key "lisen"`, 0},
		{"after multi-line array", "[server]\ntrusted_proxies = [\n  \"10.0.0.0/8\", # comment, \"]\n  '::1',\n]\nworkers = -1 # <-\n", "server.workers", 0},
		// The first problem in the file wins, whatever the order of checks.
		{"first in file", rule + "[[ratelimit]]\nname = \"b\"\npath = \"/b\"\nlimit = 0 # <-\nwindow = \"1s\"\n[server]\nworkers = -1\n", `ratelimit "b": limit`, 0},
		{"first in file, decode", "[server]\nlisen = 1 # <-\n[table]\nresponses = \"x\"\n", "lisen", 0},
		{"byte-order mark and CRLF", "\xef\xbb\xbf[server]\r\nlisten = \":1\"\r\nlisen = 1 # <-\r\n", "lisen", 0},

		// Redis rules and [redis].
		{"redis without [redis]", rule + "store = \"redis\" # <-\n", `store: is "redis" but [redis] sets no url, cluster or sentinel`, 0},
		{"unknown store", rule + "store = \"memcached\" # <-\n", `ratelimit[1].store: "memcached" is not one of "local", "redis"`, 0},
		{"unknown on_unavailable", rule + "on_unavailable = \"maybe\" # <-\n", `on_unavailable "maybe": want "open", "closed" or "local"`, 0},
		{"sync on a local rule", rule + "sync = \"100ms\" # <-\n", `sync: applies to store = "redis" only`, 0},
		{"on_unavailable on a local rule", rule + "on_unavailable = \"open\" # <-\n", `on_unavailable: applies to store = "redis" only`, 0},
		{"sync not a duration", rule + "sync = \"often\" # <-\n", `want "exact" or an interval`, 0},
		{"sync on gcra", "[redis]\nurl = \"redis://127.0.0.1:6379\"\n" + rule + "store = \"redis\"\nsync = \"100ms\" # <-\n", `ratelimit "r": sync: 100ms needs algorithm fixed-window`, 0},
		{"local share 0", "[redis]\nurl = \"redis://127.0.0.1:6379\"\n" + rule + "store = \"redis\"\nlocal_share = 0 # <-\n", "local_share: must be between 1 and 65536, got 0", 0},
		{"local share too large", "[redis]\nurl = \"redis://127.0.0.1:6379\"\n" + rule + "store = \"redis\"\nlocal_share = 70000 # <-\n", `ratelimit "r": local_share: must be between 1 and 65536, got 70000`, 0},
		{"local share that holds no request", "[redis]\nurl = \"redis://127.0.0.1:6379\"\n[[ratelimit]]\nname = \"api\"\npath = \"/api\"\nlimit = 15\ncost = 10\nwindow = \"1m\"\nstore = \"redis\"\nlocal_share = 2 # <-\n",
			`ratelimit "api": local_share: its local share (limit 15 ÷ 2) cannot hold one request`, 0},
		// Each override of a redis rule has a local share of its own.
		{"redis override whose local share holds no request", "[redis]\nurl = \"redis://127.0.0.1:6379\"\n[[ratelimit]]\nname = \"api\"\npath = \"/api\"\nlimit = 100\ncost = 10\nwindow = \"1m\"\nstore = \"redis\"\nlocal_share = 2\n[[ratelimit.override]]\nkey = \"gold\"\nlimit = 15 # <-\n",
			`ratelimit "api": override 1: limit: its local share (limit 15 ÷ 2) cannot hold one request`, 0},
		// [redis]: package redisstore refuses a value, the file names its
		// key, at its line.
		{"bad redis url", "[redis]\nurl = \"http://:hunter2@x\" # <-\n", `redis.url: "http://:xxxxx@x": want redis://`, 0},
		{"redis url port out of range", "[redis]\nurl = \"redis://127.0.0.1:99999\" # <-\n", `redis.url: "redis://127.0.0.1:99999": the port is not one from 1 to 65535`, 0},
		// go-redis would take a query's options (pool_size, read_timeout,
		// skip_verify, …) which the store then ignores, and a negative
		// database as 0: each is refused rather than run as another setting.
		{"redis url with options", "[redis]\nurl = \"redis://127.0.0.1:6379/0?pool_size=3\" # <-\n", `redis.url: "redis://127.0.0.1:6379/0?pool_size=3": options in the URL are not read: use the keys of [redis]`, 0},
		{"redis url with a fragment", "[redis]\nurl = \"redis://127.0.0.1:6379/0#x\" # <-\n", `redis.url: "redis://127.0.0.1:6379/0#x": want redis://`, 0},
		{"redis url negative database", "[redis]\nurl = \"redis://127.0.0.1:6379/-1\" # <-\n", `redis.url: "redis://127.0.0.1:6379/-1": the database is not a number from 0 to 2147483646`, 0},
		{"redis url port 0", "[redis]\nurl = \"redis://127.0.0.1:0/0\" # <-\n", "redis.url: \"redis://127.0.0.1:0/0\": the port is not one from 1 to 65535", 0},
		{"cluster seed port out of range", "[redis]\ncluster = [\"a:1\", \"redis://b:70000\"] # <-\n", `redis.cluster: address "redis://b:70000": want host:port`, 0},
		{"cluster seed port not a number", "[redis]\ncluster = [\"a:http\"] # <-\n", `redis.cluster: address "a:http": want host:port`, 0},
		{"cluster seeds that disagree", "[redis]\ncluster = [\"redis://:p@a:1\", \"redis://:q@b:2\"] # <-\n", "redis.cluster: the seeds disagree on the password", 0},
		{"two redis targets", "[redis]\nurl = \"redis://127.0.0.1:6379\"\ncluster = [\"a:1\"] # <-\n", "redis: set only one of url, cluster and sentinel", 1},
		{"sentinel without addrs", "[redis]\nurl = \"redis://127.0.0.1:6379\"\nsentinel = { master = \"m\" } # <-\n", "redis.sentinel: needs both a master name and addresses", 0},
		{"sentinel address", "[redis]\nsentinel = { master = \"m\", addrs = [\"s\"] } # <-\n", `redis.sentinel.addrs: address "s": want host:port`, 0},
		{"sentinel username without a sentinel", "[redis]\nurl = \"redis://127.0.0.1:6379\"\nsentinel_username = \"s\" # <-\n", "redis.sentinel_username: no sentinel to use it: set sentinel, or drop sentinel_username and sentinel_password_file", 0},
		{"redis username given twice", "[redis]\nurl = \"redis://u:p@127.0.0.1:6379\"\nusername = \"v\" # <-\n", `redis.username: given twice: the url names "u", and "v" is given besides`, 0},
		{"redis timeout", "[redis]\nurl = \"redis://127.0.0.1:6379\"\ntimeout = \"2m\" # <-\n", "redis.timeout: must be between 1ms and 1m0s, got 2m0s", 0},
		{"redis pool size", "[redis]\nurl = \"redis://127.0.0.1:6379\"\npool_size = 10001 # <-\n", "redis.pool_size: must be between 0 and 10000, got 10001", 0},
		{"redis pool size negative", "[redis]\nurl = \"redis://127.0.0.1:6379\"\npool_size = -1 # <-\n", "redis.pool_size: must be between 0 and 10000, got -1", 0},
		{"redis prefix with a hash tag", "[redis]\nurl = \"redis://127.0.0.1:6379\"\nprefix = \"app{}:\" # <-\n", `redis.prefix: "app{}:" has a brace`, 0},
		{"redis breaker failures", "[redis]\nurl = \"redis://127.0.0.1:6379\"\nbreaker_failures = 70000 # <-\n", "redis.breaker_failures: must be between 1 and 65535, got 70000", 0},
		{"redis breaker backoff", "[redis]\nurl = \"redis://127.0.0.1:6379\"\nbreaker_backoff = \"2h\" # <-\n", "redis.breaker_backoff: must be between 1ms and 1h0m0s, got 2h0m0s", 0},
		{"redis success threshold", "[redis]\nurl = \"redis://127.0.0.1:6379\"\nsuccess_threshold = 17 # <-\n", "redis.success_threshold: must be between 1 and 16, got 17", 0},
		// The store takes 0 for its default; a file that writes 0 asked
		// for something else.
		{"redis timeout 0", "[redis]\nurl = \"redis://127.0.0.1:6379\"\ntimeout = \"0s\" # <-\n", "redis.timeout: is 0", 0},
		{"redis breaker failures 0", "[redis]\nurl = \"redis://127.0.0.1:6379\"\nbreaker_failures = 0 # <-\n", "redis.breaker_failures: is 0", 0},
		{"redis breaker backoff 0", "[redis]\nurl = \"redis://127.0.0.1:6379\"\nbreaker_backoff = \"0s\" # <-\n", "redis.breaker_backoff: is 0", 0},
		{"redis success threshold 0", "[redis]\nurl = \"redis://127.0.0.1:6379\"\nsuccess_threshold = 0 # <-\n", "redis.success_threshold: is 0", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line := tc.line
			if line == 0 {
				line = markedLine(t, tc.src)
			}
			_, err := Parse([]byte(tc.src), "t.toml")
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse = %v, want an *Error\n%s", err, tc.src)
			}
			t.Log(err)
			if e.File != "t.toml" || e.Line != line || !strings.Contains(e.Msg, tc.msg) {
				t.Errorf("Parse = %q (file %q, line %d)\nwant line %d and a message containing %q", err, e.File, e.Line, line, tc.msg)
			}
			if !strings.HasPrefix(err.Error(), fmt.Sprintf("config: t.toml:%d: ", line)) {
				t.Errorf("Error() = %q", err)
			}
		})
	}
}

func markedLine(t *testing.T, src string) int {
	t.Helper()
	for i, l := range strings.Split(src, "\n") {
		if strings.Contains(l, "<-") {
			return i + 1
		}
	}
	t.Fatalf("no line marked <- in\n%s", src)
	return 0
}

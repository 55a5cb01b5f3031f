package config

import (
	"encoding"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/preforkd/preforkd/accesslog"
	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/cpuquota"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/shm"
)

// rule is a valid [[ratelimit]] of five lines.
const rule = `[[ratelimit]]
name = "r"
path = "/r"
limit = 1
window = "1s"
`

func mustParse(t *testing.T, src string) Config {
	t.Helper()
	c, err := Parse([]byte(src), "t.toml")
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, src)
	}
	return c
}

func TestDefault(t *testing.T) {
	d := Default()
	for _, tc := range []struct {
		key       string
		got, want any
	}{
		{"server.listen", d.Server.Listen, "127.0.0.1:8080"},
		{"server.workers", d.Server.Workers, 0},
		{"server.upstream", d.Server.Upstream, "builtin:demo"},
		{"server.engine", d.Server.Engine, EngineLoop},
		{"server.trusted_proxies", len(d.Server.TrustedProxies), 0},
		{"server.ipv6_prefix", d.Server.IPv6Prefix, 64},
		{"server.shutdown_timeout", d.Server.ShutdownTimeout, 30 * time.Second},
		{"server.request_id", d.Server.RequestID, "X-Request-Id"},
		{"server.health_path", d.Server.HealthPath, ""},
		{"server.drain_delay", d.Server.DrainDelay, time.Duration(0)},
		{"server.upgrade_timeout", d.Server.UpgradeTimeout, 30 * time.Second},
		{"log.access", d.Log.Access, "off"},
		{"server.headers", d.Server.Headers.String(), "both"},
		{"server.max_request_body", d.Server.MaxRequestBody, Size(1 << 20)},
		{"server.read_header_timeout", d.Server.ReadHeaderTimeout, 10 * time.Second},
		{"server.idle_timeout", d.Server.IdleTimeout, 75 * time.Second},
		{"server.max_header_bytes", d.Server.MaxHeaderBytes, Size(64 << 10)},
		{"server.max_connections", d.Server.MaxConnections, 0},
		{"server.client_body_timeout", d.Server.ClientBodyTimeout, 60 * time.Second},
		{"server.send_timeout", d.Server.SendTimeout, 60 * time.Second},
		{"server.upstream_connect_timeout", d.Server.UpstreamConnectTimeout, 5 * time.Second},
		{"server.upstream_timeout", d.Server.UpstreamTimeout, 60 * time.Second},
		{"server.upstream_max_idle", d.Server.UpstreamMaxIdle, 256},
		{"server.upstream_idle_timeout", d.Server.UpstreamIdleTimeout, 60 * time.Second},
		{"admin.listen", d.Admin.Listen, ""},
		{"admin.token_file", d.Admin.TokenFile, ""},
		{"table.counters", d.Table.Counters, 262144},
		{"table.responses", d.Table.Responses, 16384},
		{"table.response_bytes", d.Table.ResponseBytes, Size(64 << 20)},
		{"persist.path", d.Persist.Path, ""},
		{"persist.key", d.Persist.Key, ""},
		{"persist.live", d.Persist.Live, ""},
		{"server.max_requests", d.Server.MaxRequests, 0},
		{"server.max_rss", d.Server.MaxRSS, SizeLimit(0)},
		{"reload.canary", d.Reload.Canary, On},
		{"reload.canary_window", d.Reload.CanaryWindow, 10 * time.Second},
		{"reload.canary_min_requests", d.Reload.CanaryMinRequests, 50},
		{"reload.canary_max_error_delta", d.Reload.CanaryMaxErrorDelta, 2.0},
		{"reload.canary_inconclusive", d.Reload.CanaryInconclusive.String(), "continue"},
		{"rules", len(d.RateLimits) + len(d.Idempotency), 0},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s = %#v, want %#v", tc.key, tc.got, tc.want)
		}
	}
	if err := d.Validate(); err != nil {
		t.Errorf("Default().Validate() = %v", err)
	}
	if got := mustParse(t, "# nothing\n"); !reflect.DeepEqual(got, d) {
		t.Errorf("Parse(empty) = %+v, want Default() %+v", got, d)
	}
}

func TestRuleDefaults(t *testing.T) {
	c := mustParse(t, "\n"+rule+`
[[idempotency]]
path = "/orders"
`)
	r, d := c.RateLimits[0], c.Idempotency[0]
	for _, tc := range []struct {
		key       string
		got, want any
	}{
		{"ratelimit.methods", len(r.Methods), 0},
		{"ratelimit.algorithm", r.Algorithm.String(), "gcra"},
		{"ratelimit.burst", r.Burst, int64(0)},
		{"ratelimit effective burst", r.EffectiveBurst(), int64(1)},
		{"ratelimit.by", r.By, "ip"},
		{"ratelimit.mode", r.Mode.String(), "enforce"},
		{"ratelimit.on_full", r.OnFull.String(), "open"},
		{"idempotency.methods", d.Methods, []string{"POST", "PATCH"}},
		{"idempotency.header", d.Header, "Idempotency-Key"},
		{"idempotency.required", d.Required, false},
		{"idempotency.ttl", d.TTL, 24 * time.Hour},
		{"idempotency.wait", d.Wait, IdemWait(10 * time.Second)},
		{"idempotency.by", d.By, "header:Authorization|ip"},
		{"idempotency.max_body", d.MaxBody, Size(1 << 20)},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s = %#v, want %#v", tc.key, tc.got, tc.want)
		}
	}
}

// TestParseEveryKey sets every key to a value other than its default.
func TestParseEveryKey(t *testing.T) {
	c := mustParse(t, `
[server]
listen = ":9000"
workers = 3
upstream = "http://127.0.0.1:3000/app"
engine = "fasthttp"
trusted_proxies = ["10.1.2.3/8", "192.0.2.1", "2001:db8::/32", "::1"]
ipv6_prefix = 56
shutdown_timeout = "1m30s"
headers = "ietf"
max_request_body = 4096
read_header_timeout = "3s"
idle_timeout = "20s"
max_header_bytes = "16KiB"
max_connections = 1000
client_body_timeout = "15s"
send_timeout = "25s"
upstream_connect_timeout = "2s"
upstream_timeout = "2m"
upstream_max_idle = 32
upstream_idle_timeout = "5s"
max_requests = 1000
max_rss = "512MiB"
request_id = "x-trace-id"
health_path = "/healthz"
drain_delay = "5s"
upgrade_timeout = "1m"
[admin]
listen = "127.0.0.1:9901"
token_file = "/etc/preforkd/token"
[table]
counters = 1000
responses = 0
response_bytes = "10KB"
[persist]
path = "/var/lib/preforkd/dump"
key = "abc123"
live = "/dev/shm/preforkd"
[log]
access = "/var/log/preforkd/access.log"
access_format = "json"
[tls]
min_version = "1.3"
http2 = false
ticket_rotation = "1h"
[[tls.certificate]]
cert = "/etc/tls/a.crt"
key = "/etc/tls/a.key"
[redis]
url = "redis://10.0.0.5:6380/2"
username = "app"
password_file = "/run/credentials/preforkd.service/redis"
tls = true
ca_file = "/etc/ssl/redis-ca.pem"
timeout = "40ms"
pool_size = 8
prefix = "app1:"
breaker_failures = 3
breaker_backoff = "2s"
success_threshold = 5
[reload]
canary = false
canary_window = "2s"
canary_min_requests = 7
canary_max_error_delta = 0.5
canary_inconclusive = "abort"
[[ratelimit]]
name = "Fixed_1.x-y"
path = "/api/*"
methods = ["get", "Post"]
limit = 1048575
window = "1h"
algorithm = "fixed-window"
by = "header:X-Api-Key|header:X-Token|ip"
mode = "shadow"
on_full = "closed"
store = "redis"
on_unavailable = "closed"
local_share = 3
sync = "100ms"
[[ratelimit]]
name = "g"
path = "/*"
limit = 10
window = "1ms"
burst = 20
by = "global"
`)
	want := Config{
		Server: Server{
			Listen:   ":9000",
			Workers:  3,
			Upstream: "http://127.0.0.1:3000/app",
			Engine:   EngineFasthttp,
			TrustedProxies: []netip.Prefix{
				netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.1/32"),
				netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("::1/128"),
			},
			IPv6Prefix:      56,
			ShutdownTimeout: 90 * time.Second,
			Headers:         HeadersIETF,
			MaxRequestBody:  4096,

			ReadHeaderTimeout:      3 * time.Second,
			IdleTimeout:            20 * time.Second,
			MaxHeaderBytes:         16 << 10,
			MaxConnections:         1000,
			ClientBodyTimeout:      15 * time.Second,
			SendTimeout:            25 * time.Second,
			UpstreamConnectTimeout: 2 * time.Second,
			UpstreamTimeout:        2 * time.Minute,
			UpstreamMaxIdle:        32,
			UpstreamIdleTimeout:    5 * time.Second,
			MaxRequests:            1000,
			MaxRSS:                 512 << 20,
			RequestID:              "x-trace-id",
			HealthPath:             "/healthz",
			DrainDelay:             5 * time.Second,
			UpgradeTimeout:         time.Minute,
		},
		Admin:   Admin{Listen: "127.0.0.1:9901", TokenFile: "/etc/preforkd/token"},
		Table:   Table{Counters: 1024, Responses: 0, ResponseBytes: 10000},
		Persist: Persist{Path: "/var/lib/preforkd/dump", Key: "abc123", Live: "/dev/shm/preforkd"},
		Log:     Log{Access: "/var/log/preforkd/access.log", AccessFormat: accesslog.JSON},
		TLS: TLS{Certificates: []Certificate{{Cert: "/etc/tls/a.crt", Key: "/etc/tls/a.key"}},
			MinVersion: TLS13, HTTP2: Off, TicketRotation: time.Hour},
		Redis: Redis{URL: "redis://10.0.0.5:6380/2", Username: "app", PasswordFile: "/run/credentials/preforkd.service/redis",
			TLS: true, CAFile: "/etc/ssl/redis-ca.pem", Timeout: 40 * time.Millisecond, PoolSize: 8, Prefix: "app1:",
			BreakerFailures: 3, BreakerBackoff: 2 * time.Second, SuccessThreshold: 5},
		Reload: Reload{
			Canary: Off, CanaryWindow: 2 * time.Second, CanaryMinRequests: 7, CanaryMaxErrorDelta: 0.5,
			CanaryInconclusive: InconclusiveAbort,
		},
		RateLimits: []RateLimit{{
			Name: "Fixed_1.x-y", Path: "/api/*", Methods: []string{"GET", "POST"}, Limit: 1048575,
			Window: time.Hour, Algorithm: bucket.FixedWindow, By: "header:X-Api-Key|header:X-Token|ip",
			Mode: Shadow, OnFull: bucket.Closed,
			Store: StoreRedis, OnUnavailable: redisstore.FailClosed, LocalShare: 3, Sync: redisstore.Sync(100 * time.Millisecond),
			Cost: 1, Status: 429,
		}, {
			Name: "g", Path: "/*", Limit: 10, Window: time.Millisecond, Burst: 20, By: "global", LocalShare: 1, Cost: 1, Status: 429,
		}},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", c, want)
	}
}

// TestLongestWindow: the longest window config accepts is one a limiter
// runs with.
func TestLongestWindow(t *testing.T) {
	c := mustParse(t, "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"4886h43m6.044415s\"\n")
	region, err := shm.CreatePrivate(shm.Options{Counters: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	if _, err := bucket.NewLimiter(c.RateLimits[0].BucketRule(), region.Counters()); err != nil {
		t.Errorf("NewLimiter(%+v): %v", c.RateLimits[0], err)
	}
}

func TestSizes(t *testing.T) {
	for _, tc := range []struct {
		in   string // TOML value of table.response_bytes
		want int64  // -1: error
	}{
		{`512`, 512},
		{`0`, 0}, // none: no block stores responses
		{`"512"`, 512},
		{`"512B"`, 512},
		{`"64KiB"`, 64 << 10},
		{`"1MiB"`, 1 << 20},
		{`"1GiB"`, 1 << 30},
		{`"2TiB"`, 2 << 40},
		{`"10KB"`, 10000},
		{`"1MB"`, 1000000},
		{`"3GB"`, 3000000000},
		{`"1TB"`, 1000000000000},
		{`" 64 KiB "`, 64 << 10},
		{`-1`, -1},
		{`"-1KiB"`, -1},
		{`"+1KiB"`, -1},
		{`"1.5MiB"`, -1},
		{`"1 megabyte"`, -1},
		{`"1kib"`, -1},
		{`"KiB"`, -1},
		{`""`, -1},
		{`"0x10"`, -1},
		{`"9999999999TiB"`, -1},
		{`"99999999999999999999"`, -1},
		{`1.5`, -1},
		{`true`, -1},
	} {
		// A key whose own bound is past every size here (without a
		// block that stores responses, the table is not made).
		c, err := Parse([]byte("[table]\nresponse_bytes = "+tc.in+"\n"), "t.toml")
		switch {
		case tc.want < 0 && err == nil:
			t.Errorf("%s: parsed as %d, want an error", tc.in, c.Table.ResponseBytes)
		case tc.want >= 0 && err != nil:
			t.Errorf("%s: %v", tc.in, err)
		case tc.want >= 0 && c.Table.ResponseBytes != Size(tc.want):
			t.Errorf("%s = %d, want %d", tc.in, c.Table.ResponseBytes, tc.want)
		}
	}
}

// TestTextForms: the typed fields write what they read (the handoff of a
// configuration to the workers goes through JSON, which uses them), and
// refuse to write a value they could not read back.
func TestTextForms(t *testing.T) {
	for _, v := range []interface {
		encoding.TextMarshaler
		fmt.Stringer
	}{Size(0), Size(1000), Size(1 << 20), Size(3 << 40), Size(1<<63 - 1), Enforce, Shadow, InconclusiveContinue, InconclusiveAbort, HeadersBoth, HeadersIETF, HeadersX, HeadersNone} {
		b, err := v.MarshalText()
		back := reflect.New(reflect.TypeOf(v))
		if err != nil || string(b) != v.String() || back.Interface().(encoding.TextUnmarshaler).UnmarshalText(b) != nil ||
			back.Elem().Interface() != v {
			t.Errorf("%v: marshalled %q (%v), read back %v", v, b, err, back.Elem())
		}
	}
	for _, v := range []SizeLimit{0, 512 << 20, 1000} {
		b, err := v.MarshalText()
		var back SizeLimit
		if err != nil || string(b) != v.String() || back.UnmarshalText(b) != nil || back != v {
			t.Errorf("SizeLimit %d: marshalled %q (%v), read back %v", v, b, err, back)
		}
	}
	for _, v := range []Toggle{ToggleDefault, On, Off} {
		b, err := v.MarshalJSON()
		var back Toggle
		if err != nil || back.UnmarshalJSON(b) != nil || back != v {
			t.Errorf("Toggle %v: marshalled %q (%v), read back %v", v, b, err, back)
		}
	}
	if b, err := Toggle(3).MarshalJSON(); err == nil {
		t.Errorf("Toggle(3) marshalled as %q", b)
	}
	if !On.IsOn(false) || Off.IsOn(true) || !ToggleDefault.IsOn(true) || ToggleDefault.IsOn(false) {
		t.Error("Toggle.IsOn")
	}
	if b, err := Mode(2).MarshalText(); err == nil {
		t.Errorf("Mode(2) marshalled as %q", b)
	}
	if b, err := Headers(4).MarshalText(); err == nil {
		t.Errorf("Headers(4) marshalled as %q", b)
	}
	var m Mode
	if err := m.UnmarshalText([]byte("Shadow")); err == nil || err.Error() != `config: "Shadow" is not one of "enforce", "shadow"` {
		t.Errorf("mode Shadow: %v", err)
	}
}

func TestDurationsAndCounters(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`"30s"`, "30s"}, {`"1h30m"`, "1h30m0s"}, {`"1.5s"`, "1.5s"}, {`"250ms"`, "250ms"},
	} {
		c := mustParse(t, "[server]\nshutdown_timeout = "+tc.in+"\n")
		if got := c.Server.ShutdownTimeout.String(); got != tc.want {
			t.Errorf("shutdown_timeout = %s: got %s, want %s", tc.in, got, tc.want)
		}
	}
	for _, tc := range []struct{ in, want int }{
		{8, 8}, {9, 16}, {1000, 1024}, {262144, 262144}, {262145, 524288}, {1<<26 - 1, 1 << 26}, {1 << 26, 1 << 26},
	} {
		c := mustParse(t, fmt.Sprintf("[table]\ncounters = %d\n", tc.in))
		if c.Table.Counters != tc.want {
			t.Errorf("counters = %d: got %d, want %d", tc.in, c.Table.Counters, tc.want)
		}
	}
}

// A window written as a bare integer is that many seconds however the
// rule is written: an inline array of tables as a [[ratelimit]].
func TestWindowSecondsInline(t *testing.T) {
	for _, src := range []string{
		"[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = 300\n[[ratelimit.override]]\nkey = \"k\"\nlimit = 2\nwindow = 600\n",
		"ratelimit = [{name = \"a\", path = \"/a\", limit = 1, window = 300, override = [{key = \"k\", limit = 2, window = 600}]}]\n",
		"[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = 300\noverride = [{key = \"k\", limit = 2, window = 600}]\n",
	} {
		c := mustParse(t, src)
		if got := c.RateLimits[0].Window; got != 300*time.Second {
			t.Errorf("window = 300: got %v\n%s", got, src)
		}
		if got := c.RateLimits[0].Overrides[0].Window; got != 600*time.Second {
			t.Errorf("override window = 600: got %v\n%s", got, src)
		}
	}
}

func TestValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
	// Zero is a setting of its own for the response store: none.
	want := Default()
	want.Table.Responses, want.Table.ResponseBytes = 0, 0
	want.Server.RequestID = "" // off in Go, on in the file
	if got := (Config{}).WithDefaults(); !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config with defaults = %+v, want %+v", got, want)
	}

	methods := []string{"post"}
	c := Config{
		RateLimits:  []RateLimit{{Name: "a", Path: "/a", Methods: methods, Limit: 1, Window: time.Second}},
		Idempotency: []Idempotency{{Path: "/o"}},
		Table:       Table{Responses: 10, ResponseBytes: 1 << 20},
	}
	if err := c.Validate(); err != nil {
		t.Errorf("rule with zero fields: %v", err)
	}
	d := c.WithDefaults()
	if r := d.RateLimits[0]; r.Algorithm != bucket.GCRA || r.By != "ip" || r.Mode != Enforce || r.OnFull != bucket.Open || r.Methods[0] != "POST" {
		t.Errorf("WithDefaults rule = %+v", r)
	}
	if i := d.Idempotency[0]; !reflect.DeepEqual(i.Methods, []string{"POST", "PATCH"}) || i.Header != "Idempotency-Key" ||
		i.TTL != 24*time.Hour || i.Wait != 0 || i.By != "header:Authorization|ip" || i.MaxBody != 1<<20 {
		t.Errorf("WithDefaults idempotency = %+v", i)
	}
	if methods[0] != "post" {
		t.Errorf("WithDefaults modified the caller's slice: %v", methods)
	}
	if !reflect.DeepEqual(d, d.WithDefaults()) {
		t.Errorf("WithDefaults is not idempotent")
	}

	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"workers", func(c *Config) { c.Server.Workers = -1 }, "config: server.workers: must not be negative (0 means one per CPU), got -1"},
		{"prefix", func(c *Config) { c.Server.TrustedProxies = []netip.Prefix{{}} }, "config: server.trusted_proxies: element 1 is not a valid prefix"},
		{"limit", func(c *Config) { c.RateLimits[0].Limit = 0 }, `config: ratelimit "a": limit must be between 1 and 1048575, got 0`},
		{"window", func(c *Config) { c.RateLimits[0].Window = bucket.MaxWindow + time.Microsecond }, `config: ratelimit "a": window must be between 1ms and 4886h43m6.044415s, got 4886h43m6.044416s`},
		{"mode", func(c *Config) { c.RateLimits[0].Mode = 2 }, `config: ratelimit "a": mode: 2 is not one of "enforce", "shadow"`},
		{"on_full", func(c *Config) { c.RateLimits[0].OnFull = 2 }, `config: ratelimit "a": unknown on-full policy OnFull(2)`},
		{"headers", func(c *Config) { c.Server.Headers = 4 }, `config: server.headers: 4 is not one of "both", "ietf", "x", "none"`},
		{"negative size", func(c *Config) { c.Idempotency[0].MaxBody = -1 }, "config: idempotency[1]: max_body: must be positive, got -1"},
		{"duplicate", func(c *Config) { c.RateLimits = append(c.RateLimits, c.RateLimits[0]) },
			`config: ratelimit "a": name: duplicate rule name (first used at rule 1)`},
		{"empty methods", func(c *Config) { c.Idempotency[0].Methods = []string{} }, "config: idempotency[1]: methods: is empty"},
		{"no responses", func(c *Config) { c.Table.Responses = 0 }, "config: table.responses: is 0"},
		{"bad path", func(c *Config) { c.Idempotency[0].Path = "o" }, `config: idempotency[1]: path "o" must start with /`},
	} {
		c := c.WithDefaults()
		tc.edit(&c)
		err := c.Validate()
		var e *Error
		if !errors.As(err, &e) || e.File != "" || e.Line != 0 || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: Validate = %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestErrorString(t *testing.T) {
	for _, tc := range []struct {
		e    Error
		want string
	}{
		{Error{File: "a.toml", Line: 3, Msg: "m"}, "config: a.toml:3: m"},
		{Error{File: "a.toml", Msg: "m"}, "config: a.toml: m"},
		{Error{Line: 3, Msg: "m"}, "config: line 3: m"},
		{Error{Msg: "m"}, "config: m"},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("%+v.Error() = %q, want %q", tc.e, got, tc.want)
		}
	}
}

func TestLoad(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "missing.toml"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "config: ") {
		t.Errorf("Load(missing) = %v, want a config: error wrapping fs.ErrNotExist", err)
	}
	path := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(path, []byte("[server]\nworkers = -2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if want := "config: " + path + ":2: server.workers"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Load(bad) = %v, want %s...", err, want)
	}
}

func TestWorkerCount(t *testing.T) {
	if got := (Server{Workers: 3}).WorkerCount(); got != 3 {
		t.Errorf("WorkerCount(3) = %d", got)
	}
	if got, want := (Server{}).WorkerCount(), cpuquota.CPUs(); got != want {
		t.Errorf("WorkerCount(0) = %d, want the CPUs this process may use, %d", got, want)
	}
}

// A [[cache]] block: what the file leaves out takes its default (a 5s
// lock_timeout, which is no wait in Go), what it sets is kept, and the
// core gets it.
func TestCacheBlock(t *testing.T) {
	c := mustParse(t, "[[cache]]\npath = \"/a/*\"\n[[cache]]\npath = \"/b\"\nmethods = [\"get\"]\nttl = \"10m\"\nmax_body = \"4KiB\"\ntag_headers = []\nlock_timeout = \"0s\"\nheuristic = true\ntargeted = \"Edge-Cache-Control\"\n")
	want := []Cache{
		{Path: "/a/*", Methods: []string{"GET", "HEAD"}, TTL: 24 * time.Hour, MaxBody: 1 << 20, TagHeaders: []string{"Cache-Tag", "Surrogate-Key"}, LockTimeout: 5 * time.Second,
			Targeted: "Preforkd-Cache-Control"},
		{Path: "/b", Methods: []string{"GET"}, TTL: 10 * time.Minute, MaxBody: 4 << 10, TagHeaders: []string{}, Heuristic: true, Targeted: "Edge-Cache-Control"},
	}
	if !reflect.DeepEqual(c.Caches, want) {
		t.Fatalf("caches = %+v\nwant %+v", c.Caches, want)
	}
	if g := (Config{Caches: []Cache{{Path: "/g"}}}).WithDefaults().Caches[0]; g.LockTimeout != 0 || g.TTL != 24*time.Hour {
		t.Fatalf("a block built in Go: %+v", g)
	}
	o, err := c.CoreOptions()
	if cs := o.Caches.Blocks(); err != nil || len(cs) != 2 || cs[1].MaxBody != 4<<10 || !cs[1].Heuristic || len(cs[1].TagHeaders) != 0 || cs[0].LockTimeout != 5*time.Second ||
		cs[1].Targeted != "Edge-Cache-Control" {
		t.Fatalf("core options: %+v %v", cs, err)
	}
	var b strings.Builder
	c.WriteEffective(&b)
	for _, line := range []string{
		`cache /a/*: methods=GET,HEAD ttl=24h0m0s max_body=1MiB lock_timeout=5s heuristic=false targeted=Preforkd-Cache-Control tag_headers=Cache-Tag,Surrogate-Key`,
		`cache /b: methods=GET ttl=10m0s max_body=4KiB lock_timeout=0s heuristic=true targeted=Edge-Cache-Control tag_headers=""`,
	} {
		if !strings.Contains(b.String(), line+"\n") {
			t.Errorf("WriteEffective lacks %q:\n%s", line, b.String())
		}
	}
}

func TestWriteEffective(t *testing.T) {
	c := mustParse(t, `
[server]
workers = 2
trusted_proxies = ["10.0.0.0/8", "::1"]
[admin]
listen = "127.0.0.1:9901"
[persist]
path = "/var/lib/my dump"
[[ratelimit]]
name = "login"
path = "/login"
limit = 5
window = "5m"
[[ratelimit]]
name = "api"
path = "/api/*"
methods = ["GET", "POST"]
limit = 100
window = "1m"
algorithm = "fixed-window"
by = "header:X-Api-Key|ip"
mode = "shadow"
on_full = "closed"
max_keys = 1000
[[idempotency]]
path = "/orders"
max_body = 1000
`)
	var b strings.Builder
	if err := c.WriteEffective(&b); err != nil {
		t.Fatal(err)
	}
	want := `server: listen=127.0.0.1:8080 workers=2 upstream=builtin:demo engine=loop trusted_proxies=[10.0.0.0/8,::1/128] ipv6_prefix=64 shutdown_timeout=30s headers=both max_request_body=1MiB exempt=[] shadow=false case_sensitive=false reset_header="" read_header_timeout=10s idle_timeout=1m15s max_header_bytes=64KiB max_connections=0 client_body_timeout=1m0s send_timeout=1m0s upstream_connect_timeout=5s upstream_timeout=1m0s upstream_max_idle=256 upstream_idle_timeout=1m0s max_requests=0 max_rss="" request_id=X-Request-Id health_path="" drain_delay=0s upgrade_timeout=30s
admin: listen=127.0.0.1:9901 token_file=""
table: counters=262144 responses=16384 response_bytes=64MiB
persist: path="/var/lib/my dump" key="" key_file="" live="" interval=0s
log: format=text level=info access=off access_format=combined
reload: canary=true canary_window=10s canary_min_requests=50 canary_max_error_delta=2 canary_inconclusive=continue
rule "login": path=/login methods=* limit=5 window=5m0s algorithm=gcra burst=5 by=ip mode=enforce on_full=open cost=1 status=429 exempt=[] max_keys=131072 store=local on_unavailable=local local_share=1 sync=exact
rule "api": path=/api/* methods=GET,POST limit=100 window=1m0s algorithm=fixed-window burst=100 by=header:X-Api-Key|ip mode=shadow on_full=closed cost=1 status=429 exempt=[] max_keys=1000 store=local on_unavailable=local local_share=1 sync=exact
idempotency /orders: methods=POST,PATCH header=Idempotency-Key required=false ttl=24h0m0s wait=10s by=header:Authorization|ip max_body=1000 max_records=163
`
	if got := b.String(); got != want {
		t.Errorf("WriteEffective:\n%s\nwant:\n%s", got, want)
	}

	// Defaults are filled in for a Config built in Go, and Workers resolved.
	b.Reset()
	if err := (Config{}).WriteEffective(&b); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("server: listen=127.0.0.1:8080 workers=%d ", cpuquota.CPUs()); !strings.HasPrefix(b.String(), want) {
		t.Errorf("WriteEffective(Config{}) = %q, want prefix %q", b.String(), want)
	}

	if err := c.WriteEffective(failWriter{}); err == nil {
		t.Errorf("WriteEffective to a failing writer: no error")
	}
}

// The response table is made only for a configuration with a block that
// stores responses; without one, [table]'s responses and response_bytes
// take no memory, whatever the file says, and check says so.
func TestRegionTable(t *testing.T) {
	for _, tc := range []struct {
		name, toml string
		want       Table
	}{
		{"rules only", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\n",
			Table{Counters: 262144}},
		{"rules only, table set", "[table]\nresponses = 100\nresponse_bytes = \"1MiB\"\n",
			Table{Counters: 262144}},
		{"idempotency", "[[idempotency]]\npath = \"/orders\"\n",
			Table{Counters: 262144, Responses: 16384, ResponseBytes: 64 << 20}},
		{"cache, table set", "[table]\nresponses = 100\nresponse_bytes = \"1MiB\"\n[[cache]]\npath = \"/c/*\"\n",
			Table{Counters: 262144, Responses: 128, ResponseBytes: 1 << 20}},
		// As the region is made: records up to a power of two, the block
		// pool down to whole 4 KiB blocks; check says so, and an
		// idempotency block's default max_records (1% of the records)
		// is that of the records the region has.
		{"idempotency, table rounded", "[table]\nresponses = 3000\nresponse_bytes = 3000000\n[[idempotency]]\npath = \"/o\"\n",
			Table{Counters: 262144, Responses: 4096, ResponseBytes: 2998272}},
	} {
		c := mustParse(t, tc.toml)
		if got := c.RegionTable(); got != tc.want {
			t.Errorf("%s: RegionTable() = %+v, want %+v", tc.name, got, tc.want)
		}
		var b strings.Builder
		if err := c.WriteEffective(&b); err != nil {
			t.Fatal(err)
		}
		wantLine := fmt.Sprintf("table: counters=%d responses=%d response_bytes=%v\n", tc.want.Counters, tc.want.Responses, tc.want.ResponseBytes)
		if !strings.Contains(b.String(), wantLine) {
			t.Errorf("%s: check prints\n%s\nwant the line %q", tc.name, b.String(), wantLine)
		}
		if tc.want.Responses == 4096 && !strings.Contains(b.String(), " max_records=40\n") {
			t.Errorf("%s: check prints\n%s\nwant max_records=40 (1%% of 4096 records)", tc.name, b.String())
		}
		if note := strings.Contains(b.String(), "no response table"); note != (tc.want.Responses == 0) {
			t.Errorf("%s: the note about no response table printed: %v\n%s", tc.name, note, b.String())
		}
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// TestExample parses examples/preforkd.toml, checks what it promises, and
// checks that it shows every key the parser accepts, also those of the
// commented-out [[idempotency]] block, which must be valid when uncommented.
func TestExample(t *testing.T) {
	src, err := os.ReadFile("../examples/preforkd.toml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Load("../examples/preforkd.toml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	s := c.Server
	if s.Listen != "127.0.0.1:8080" || s.Workers != 4 || s.Upstream != "builtin:demo" || c.Persist.Path != "" || len(c.Idempotency) != 0 ||
		c.Admin.Listen != "127.0.0.1:9901" {
		t.Errorf("example server/admin/persist = %+v %+v %+v", s, c.Admin, c.Persist)
	}
	if len(c.Caches) != 1 || c.Caches[0].Path != "/cacheable/*" {
		t.Errorf("example caches = %+v, want the one over the demo's /cacheable/*", c.Caches)
	}
	want := []RateLimit{
		{Name: "login", Path: "/login", Methods: []string{"POST"}, Limit: 5, Window: 5 * time.Minute, By: "ip", Cost: 1, Status: 429, Exempt: Prefixes{}, LocalShare: 1},
		{Name: "api", Path: "/api/*", Limit: 100, Window: time.Minute, By: "header:X-Api-Key|ip", LocalShare: 1, Cost: 1, Status: 429, Overrides: []Override{
			{Key: "gold-customer-key", Limit: 1000, Window: time.Minute, Burst: 1000},
			{Client: Prefixes{netip.MustParsePrefix("198.51.100.0/24")}, Limit: 500},
		}},
	}
	if !reflect.DeepEqual(c.RateLimits, want) {
		t.Errorf("example rules = %+v\nwant %+v", c.RateLimits, want)
	}
	var b strings.Builder
	if err := c.WriteEffective(&b); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		`rule "login": path=/login methods=POST limit=5 window=5m0s algorithm=gcra burst=5 by=ip mode=enforce on_full=open cost=1 status=429 exempt=[] max_keys=131072 store=local on_unavailable=local local_share=1 sync=exact`,
		`rule "api": path=/api/* methods=* limit=100 window=1m0s algorithm=gcra burst=100 by=header:X-Api-Key|ip mode=enforce on_full=open cost=1 status=429 exempt=[] max_keys=131072 store=local on_unavailable=local local_share=1 sync=exact`,
		`rule "api" override 1: key=gold-customer-key client=[] limit=1000 window=1m0s burst=1000`,
	} {
		if !strings.Contains(b.String(), line+"\n") {
			t.Errorf("WriteEffective lacks %q:\n%s", line, b.String())
		}
	}

	// Uncomment the [[idempotency]] block.
	var out []string
	in := false
	for _, l := range strings.Split(string(src), "\n") {
		if l == "# [[idempotency]]" {
			in = true
		}
		if in {
			l = strings.TrimPrefix(strings.TrimPrefix(l, "#"), " ")
		}
		out = append(out, l)
	}
	full := strings.Join(out, "\n")
	c, err = Parse([]byte(full), "uncommented")
	if err != nil {
		t.Fatalf("example with [[idempotency]] uncommented: %v", err)
	}
	if len(c.Idempotency) != 1 || c.Idempotency[0].Path != "/orders" {
		t.Errorf("uncommented idempotency = %+v", c.Idempotency)
	}
	if len(c.Caches) != 2 || c.Caches[1].Path != "/articles/*" || c.Caches[1].LockTimeout != 5*time.Second || len(c.Caches[1].TagHeaders) != 2 {
		t.Errorf("uncommented cache = %+v", c.Caches)
	}
	if !c.Redis.Enabled() {
		t.Errorf("uncommented [redis] names no Redis: %+v", c.Redis)
	}
	ix := indexLines(full)
	for _, sec := range []struct {
		path []string
		keys []string
	}{
		{[]string{"server"}, tomlKeys(reflect.TypeFor[Server]())}, {[]string{"admin"}, tomlKeys(reflect.TypeFor[Admin]())},
		{[]string{"table"}, tomlKeys(reflect.TypeFor[Table]())}, {[]string{"persist"}, tomlKeys(reflect.TypeFor[Persist]())},
		{[]string{"reload"}, tomlKeys(reflect.TypeFor[Reload]())},
		{[]string{"ratelimit", elem(0)}, slices.DeleteFunc(tomlKeys(reflect.TypeFor[RateLimit]()), func(k string) bool { return k == "override" })},
		{[]string{"ratelimit", elem(1), "override", elem(0)}, []string{"key", "limit", "window", "burst"}},
		{[]string{"ratelimit", elem(1), "override", elem(1)}, []string{"client", "limit"}},
		{[]string{"idempotency", elem(0)}, tomlKeys(reflect.TypeFor[Idempotency]())},
		{[]string{"cache", elem(1)}, tomlKeys(reflect.TypeFor[Cache]())},
		{[]string{"redis"}, tomlKeys(reflect.TypeFor[Redis]())},
		{[]string{"tls"}, []string{"min_version", "http2", "ticket_rotation"}},
	} {
		for _, k := range sec.keys {
			if k == "" {
				continue // no key: read from the file another key names
			}
			if _, ok := ix[joinPath(append(sec.path, k))]; !ok {
				t.Errorf("example does not show %s.%s", sec.path[0], k)
			}
		}
	}
}

// fileKeys are the keys a file may hold, as [Config]'s toml tags name
// them, dotted from the top ("server.listen", "ratelimit.override.key"),
// each with whether it is a table of its own (a struct, or an array of
// them: "redis.sentinel", "tls.certificate").
func fileKeys() map[string]bool {
	keys := map[string]bool{}
	var walk func(prefix string, typ reflect.Type)
	walk = func(prefix string, typ reflect.Type) {
		for f := range typ.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if name == "" || name == "-" {
				continue
			}
			ft := f.Type
			for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
				ft = ft.Elem()
			}
			table := ft.Kind() == reflect.Struct
			keys[prefix+name] = table
			if table {
				walk(prefix+name+".", ft)
			}
		}
	}
	walk("", reflect.TypeFor[Config]())
	return keys
}

// exampleKey is a key examples/preforkd.toml shows, written or
// commented out, at line ln: dotted ("tls.cleartext"), with its value as
// the line writes it, and the comment lines above it.
type exampleKey struct {
	ln                  int
	key, value, comment string
	commented           bool
}

// exampleKeys are the keys examples/preforkd.toml shows, in order: those
// it writes and those it shows commented out ("# cleartext_listen = ...";
// "# [[idempotency]]" and the "# key = ..." lines after it, whose
// comments are "# # ..."), and the tables it names. A key of an inline
// table ("sentinel = { master = ... }") is shown with it.
func exampleKeys(src string) []exampleKey {
	var keys []exampleKey
	header := regexp.MustCompile(`^(# )?\[\[?([a-z_.]+)\]\]?$`)
	assign := regexp.MustCompile(`^(# )?([a-z_0-9]+) = (.*)$`)
	live, commented := "", "" // the tables of the lines written, and of those commented out
	comment := ""
	for ln, l := range strings.Split(src, "\n") {
		if m := header.FindStringSubmatch(l); m != nil {
			if m[1] == "" {
				live = m[2]
			}
			commented = m[2]
			keys = append(keys, exampleKey{ln: ln + 1, key: m[2], commented: m[1] != ""})
			comment = ""
			continue
		}
		m := assign.FindStringSubmatch(l)
		var v map[string]any
		if m == nil || toml.Unmarshal([]byte(strings.TrimPrefix(l, "# ")), &v) != nil {
			// prose: `# cleartext = "serve", it does nothing`
			if strings.HasPrefix(l, "#") {
				comment += strings.TrimLeft(l, "# ") + " "
			} else {
				comment = ""
			}
			continue
		}
		table := live
		if m[1] == "" {
			commented = live // a key written ends the commented-out table
		} else {
			table = commented
		}
		key := m[2]
		if table != "" {
			key = table + "." + key
		}
		value, _, _ := strings.Cut(m[3], " #")
		keys = append(keys, exampleKey{ln + 1, key, strings.TrimSpace(value), comment, m[1] != ""})
		comment = ""
		if inline, ok := v[m[2]].(map[string]any); ok {
			for k := range inline {
				keys = append(keys, exampleKey{ln: ln + 1, key: key + "." + k, commented: m[1] != ""})
			}
		}
	}
	return keys
}

// TestEveryKeyDocumented: every key a file may hold, as [Config]'s toml
// tags name it, is in README.md's configuration table and in the example
// file, in its own table: a key of [server] in a row of its own
// ("server.listen"), a key of a block in its block's row ("[[cache]]",
// "redis.sentinel"), and shown in the example under its table, commented
// out where it is optional. Neither shows a key that does not exist. A
// key that exists is documented.
func TestEveryKeyDocumented(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("../examples/preforkd.toml")
	if err != nil {
		t.Fatal(err)
	}
	keys := fileKeys()
	if len(keys) < 100 {
		t.Fatalf("found %d keys: the walk missed the tags", len(keys))
	}
	// README's rows, by what their first cell names: "server.listen",
	// "redis.sentinel_username" (one of two), "[[ratelimit]]".
	_, ref, _ := strings.Cut(string(readme), "\n## Configuration\n")
	ref, _, _ = strings.Cut(ref, "\n## ")
	rows := map[string]string{}
	for _, l := range strings.Split(ref, "\n") {
		cells := strings.SplitN(l, " | ", 2)
		if !strings.HasPrefix(l, "| `") || len(cells) < 2 {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[0], -1) {
			rows[strings.Trim(m[1], "[]")] = cells[1]
		}
	}
	if len(rows) < 60 {
		t.Fatalf("read %d rows of README's configuration table: the scan misreads it", len(rows))
	}
	for k := range keys {
		table, name := "", k
		if i := strings.LastIndex(k, "."); i >= 0 {
			table, name = k[:i], k[i+1:]
		}
		if _, ok := rows[k]; ok || table == "" && keys[k] {
			continue // a row of its own; or [server], whose keys have theirs
		}
		row, ok := rows[table] // a block's row names its keys
		if !ok {
			t.Errorf("README's configuration table has no row for %s", k)
			continue
		}
		if !regexp.MustCompile(`\b` + name + `\b`).MatchString(row) {
			t.Errorf("README's row for %s does not name its key %s", table, name)
		}
	}
	for k := range rows {
		if _, ok := keys[k]; !ok {
			t.Errorf("README's configuration table has a row for %s, which is no key", k)
		}
	}

	shown := map[string]bool{}
	for _, k := range exampleKeys(string(example)) {
		shown[k.key] = true
		if _, ok := keys[k.key]; !ok {
			t.Errorf("examples/preforkd.toml:%d shows %s, which is no key", k.ln, k.key)
		}
	}
	for k := range keys {
		if !shown[k] {
			t.Errorf("examples/preforkd.toml does not show %s", k)
		}
	}
}

// Every [server] key an engine takes reaches it, by the one translation
// every engine uses; an unset key is the engine's default.
func TestEngineSettings(t *testing.T) {
	c := mustParse(t, `
[server]
read_header_timeout = "3s"
idle_timeout = "20s"
max_header_bytes = "16KiB"
max_connections = 1000
client_body_timeout = "15s"
send_timeout = "25s"
upstream_connect_timeout = "2s"
upstream_timeout = "2m"
upstream_max_idle = 32
upstream_idle_timeout = "4s"
`)
	wantLimits := engine.Limits{ReadHeaderTimeout: 3 * time.Second, IdleTimeout: 20 * time.Second, MaxHeaderBytes: 16 << 10,
		MaxConnections: 1000, ClientBodyTimeout: 15 * time.Second, SendTimeout: 25 * time.Second}
	if got := c.Server.Limits(); got != wantLimits {
		t.Errorf("Limits: got %+v, want %+v", got, wantLimits)
	}
	wantClient := engine.Upstream{ConnectTimeout: 2 * time.Second, Timeout: 2 * time.Minute, MaxIdle: 32, IdleTimeout: 4 * time.Second}
	if got := c.Server.UpstreamClient(); got != wantClient {
		t.Errorf("Client: got %+v, want %+v", got, wantClient)
	}
	d := mustParse(t, "")
	limits, err := engine.Limits{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Server.Limits().WithDefaults(); got != limits {
		t.Errorf("default Limits: got %+v, want the engines' defaults %+v", got, limits)
	}
	client, _ := engine.Upstream{}.WithDefaults()
	if got, _ := d.Server.UpstreamClient().WithDefaults(); got != client {
		t.Errorf("default Client: got %+v, want the engines' defaults %+v", got, client)
	}
}

// check says which engine the workers serve with when it is not
// server.engine's, and why; the daemon picks by the same function.
func TestServingEngine(t *testing.T) {
	for _, tc := range []struct{ src, engine, note string }{
		{"", "loop", ""},
		{"[server]\nengine = \"fasthttp\"\n", "fasthttp", ""},
		{"[server]\nupstream = \"https://app.example\"\n", "fasthttp",
			"server: the workers serve with fasthttp, not server.engine's loop: the upstream is https://, which the event loop does not speak\n"},
	} {
		c := mustParse(t, tc.src)
		if e, _ := c.ServingEngine(); e != tc.engine {
			t.Errorf("%q: %s, want %s", tc.src, e, tc.engine)
		}
		var b strings.Builder
		c.WriteEffective(&b)
		if got := strings.Contains(b.String(), "the workers serve with"); got != (tc.note != "") || !strings.Contains(b.String(), tc.note) {
			t.Errorf("%q: check says\n%s\nwant the note %q", tc.src, b.String(), tc.note)
		}
	}
}

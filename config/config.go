package config

import (
	"fmt"
	"math"
	"math/bits"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/preforkd/preforkd/accesslog"
	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/smallfile"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/shm"
	"github.com/preforkd/preforkd/tlsconf"
)

// Config is the whole configuration of preforkd. The TOML file is one way to
// fill it (the toml tags name its keys); an embedder may fill it in Go, call
// [Config.Validate], and pass [Config.WithDefaults] to whatever consumes it.
//
// Fields whose zero value is not a meaningful setting (an empty listen
// address, a zero TTL) mean "the default" to [Config.Validate] and
// [Config.WithDefaults]. Fields whose zero value is meaningful (Workers,
// Burst, Wait, Responses) keep it; their comments say what zero does.
type Config struct {
	Server      Server        `toml:"server"`
	Admin       Admin         `toml:"admin"`
	Table       Table         `toml:"table"`
	Persist     Persist       `toml:"persist"`
	Log         Log           `toml:"log"`
	Redis       Redis         `toml:"redis"`
	Reload      Reload        `toml:"reload"`
	TLS         TLS           `toml:"tls"`
	RateLimits  []RateLimit   `toml:"ratelimit"`
	Idempotency []Idempotency `toml:"idempotency"`
	Caches      []Cache       `toml:"cache"`
}

// Server is the [server] table: the proxy itself.
type Server struct {
	// Listen is the address of the one socket shared by all workers.
	// "" means "127.0.0.1:8080".
	Listen string `toml:"listen"`
	// Workers is the number of worker processes, at most [MaxWorkers];
	// 0 means one per CPU this process may use (see [Server.WorkerCount]).
	Workers int `toml:"workers"`
	// Upstream is "builtin:demo" or an absolute http:// or https:// URL of
	// the application. "" means "builtin:demo".
	Upstream string `toml:"upstream"`
	// Engine is the HTTP/1.1 engine the workers serve with: the event
	// loop (the zero value), or fasthttp, the engine before it. An
	// https:// upstream is served by fasthttp whatever it says.
	Engine Engine `toml:"engine"`
	// TrustedProxies are the peers whose X-Forwarded-For and Forwarded
	// headers are believed. Empty: none is.
	TrustedProxies Prefixes `toml:"trusted_proxies"`
	// IPv6Prefix is the prefix length IPv6 clients are keyed by, 1..128.
	// 0 means 64.
	IPv6Prefix int `toml:"ipv6_prefix"`
	// ShutdownTimeout bounds the graceful drain. 0 means 30s.
	ShutdownTimeout time.Duration `toml:"shutdown_timeout"`
	// Headers selects the rate-limit response headers; the zero value
	// sends both kinds.
	Headers Headers `toml:"headers"`
	// MaxRequestBody is the largest request body buffered for an
	// idempotency fingerprint; larger ones get 413. At most 1 GiB; 0
	// means 1 MiB.
	MaxRequestBody Size `toml:"max_request_body"`
	// Exempt clients (judged on the resolved client address) are never
	// counted or refused by any rule and get no rate-limit header.
	Exempt Prefixes `toml:"exempt"`
	// Shadow puts every rule in shadow mode (a dry run) without editing
	// them; preforkd run -shadow sets it too.
	Shadow bool `toml:"shadow"`
	// CaseSensitive makes rule and block paths match with case; by
	// default "/LOGIN" is "/login", as case-insensitive routers serve it.
	CaseSensitive bool `toml:"case_sensitive"`
	// ResetHeader is the response field by which the application resets
	// rules for the request's key ("Preforkd-Reset: login" after a
	// successful login): removed from every response, ignored (and not
	// forwarded) on requests. "" means none.
	ResetHeader string `toml:"reset_header"`

	// The data plane's timeouts and limits, owned by package engine
	// (their defaults and checks are engine.Limits' and engine.Upstream's,
	// which Server.Limits and Server.UpstreamClient fill).

	// ReadHeaderTimeout bounds the reading of a request's header section
	// (slowloris). 0 means 10s.
	ReadHeaderTimeout time.Duration `toml:"read_header_timeout"`
	// IdleTimeout is how long a keep-alive connection may wait for its
	// next request. 0 means 75s.
	IdleTimeout time.Duration `toml:"idle_timeout"`
	// MaxHeaderBytes bounds a request's line and header section; larger:
	// 431. 4 KiB..1 MiB; 0 means 64 KiB.
	MaxHeaderBytes Size `toml:"max_header_bytes"`
	// MaxConnections bounds the client connections each worker has open;
	// 0 means no bound.
	MaxConnections int `toml:"max_connections"`
	// ClientBodyTimeout bounds the wait between two reads of a request
	// body (408 after it). 0 means 60s.
	ClientBodyTimeout time.Duration `toml:"client_body_timeout"`
	// SendTimeout bounds the wait between two writes to a client. 0 means
	// 60s.
	SendTimeout time.Duration `toml:"send_timeout"`
	// UpstreamConnectTimeout bounds a connection attempt to the upstream
	// (502 after it). 0 means 5s.
	UpstreamConnectTimeout time.Duration `toml:"upstream_connect_timeout"`
	// UpstreamTimeout bounds the wait for the upstream's response header
	// (504 after it), and between two reads of its body. 0 means 60s.
	UpstreamTimeout time.Duration `toml:"upstream_timeout"`
	// UpstreamMaxIdle is how many idle keep-alive connections to the
	// upstream each worker keeps. 0 means 256.
	UpstreamMaxIdle int `toml:"upstream_max_idle"`
	// UpstreamIdleTimeout is how long an idle keep-alive connection to
	// the upstream is kept (less when the upstream's Keep-Alive says
	// less). 0 means 60s.
	UpstreamIdleTimeout time.Duration `toml:"upstream_idle_timeout"`
	// MaxRequests recycles a worker after it served about this many
	// requests (each worker draws its own limit within ±10%, so that they
	// do not recycle together). 0 means never.
	MaxRequests int `toml:"max_requests"`
	// MaxRSS recycles a worker whose resident memory grew past it. 0 (""
	// in a file) means never; otherwise at least 32MiB (prefork.MinMaxRSS).
	MaxRSS SizeLimit `toml:"max_rss"`
	// RequestID is the header field of the request id (core's
	// Options.RequestID): kept from the client when well formed, else
	// made, forwarded, returned and logged. "" turns ids off; Default()
	// and the file use "X-Request-Id".
	RequestID string `toml:"request_id"`
	// HealthPath, if set, is answered by every worker itself on the
	// data port (GET, HEAD): 200 "ok", never counted by a rule, never
	// forwarded; 503 once the instance or the worker is stopping. ""
	// means none.
	HealthPath string `toml:"health_path"`
	// DrainDelay is how long after TERM or QUIT the workers go on
	// serving while readiness and health_path answer 503, before they
	// drain (Kubernetes' preStop). 0 means none.
	DrainDelay time.Duration `toml:"drain_delay"`
	// UpgradeTimeout bounds a binary upgrade (USR2): a new supervisor
	// not ready by then is killed and the running one serves on. 0 means
	// 30s.
	UpgradeTimeout time.Duration `toml:"upgrade_timeout"`
}

// Admin is the [admin] table. Zero is "off".
type Admin struct {
	Listen    string `toml:"listen"`     // host:port, or unix:PATH (a socket of mode 0600), of /metrics and /status; "" = off
	TokenFile string `toml:"token_file"` // file holding the bearer token for mutating endpoints; "" = none
}

// Table is the [table] table: the geometry of the shared-memory region.
type Table struct {
	// Counters is the number of counter slots (64 bytes each), 8..1<<26.
	// Parse and WithDefaults round it up to a power of two. 0 means 262144.
	Counters int `toml:"counters"`
	// Responses is the number of stored-response records. 0 means none: no
	// idempotency rule can then be configured. Default() sets 16384. Only
	// a configuration with an [[idempotency]] or [[cache]] block has them
	// (see [Config.RegionTable]).
	Responses int `toml:"responses"`
	// ResponseBytes is the size of the block pool for stored bodies. 0
	// means none, as for Responses. Default() sets 64 MiB.
	ResponseBytes Size `toml:"response_bytes"`
}

// Persist is the [persist] table. Zero is "off".
type Persist struct {
	Path string `toml:"path"` // dump file written on graceful shutdown and loaded at boot; "" = off
	Key  string `toml:"key"`  // application version; stored responses are dropped when it changes
	// KeyFile holds the application version alone, written by the deploy
	// (echo "$GIT_SHA" > FILE): read at start, in check and at every
	// reload into FileKey. Set Key or KeyFile, not both. "" = none.
	KeyFile string `toml:"key_file"`
	Live    string `toml:"live"` // tmpfs path for the region itself, to survive a crash; "" = off
	// Interval makes the supervisor dump the region every interval while
	// it serves, besides at shutdown, so that a crash of the whole
	// process tree or a power loss costs at most the interval's counts.
	// 0 means off; otherwise at least MinPersistInterval, with Path set.
	Interval time.Duration `toml:"interval"`

	// FileKey is what KeyFile holds: [Load] reads it, [Parse] (which does
	// no I/O) leaves it empty, and a Config built in Go sets Key instead.
	FileKey string `toml:"-" file:"key_file"`
}

// AppKey is the application version that stamps a dump: Key, or what
// KeyFile holds.
func (p Persist) AppKey() string {
	if p.KeyFile != "" {
		return p.FileKey
	}
	return p.Key
}

// maxKeyFile bounds persist.key_file: a version, not a document.
const maxKeyFile = 4 << 10

// readFiles reads persist.key_file, reporting a file that cannot be used
// at the line of its key.
func (p *Persist) readFiles(rep *report) {
	if p.KeyFile == "" {
		return
	}
	f := rep.at([]string{"persist"}, "persist.")
	key, err := readKeyFile(p.KeyFile)
	if err != nil {
		f("key_file", "%s", err)
		return
	}
	p.FileKey = key
}

// readKeyFile reads a one-line version from path, without its line end.
func readKeyFile(path string) (string, error) {
	b, err := smallfile.Read(path, maxKeyFile, nil)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), " \t\r\n")
	switch {
	case s == "":
		return "", fmt.Errorf("%s is empty: write the application's version to it (a git SHA, a release number)", path)
	case strings.ContainsAny(s, "\r\n"):
		return "", fmt.Errorf("%s has several lines: it holds the application's version alone", path)
	}
	return s, nil
}

// TLS is the [tls] table: with a certificate, server.listen speaks TLS
// (HTTP/2 and HTTP/1.1 by ALPN), served by the net/http engine. Zero is
// "off".
type TLS struct {
	// Certificates are the [[tls.certificate]] the listener serves: the
	// first to a client whose SNI names no other's, the others chosen by
	// SNI against their names.
	Certificates []Certificate `toml:"certificate"`
	// MinVersion is the least TLS version: "1.2" (the zero value) or
	// "1.3".
	MinVersion TLSVersion `toml:"min_version"`
	// HTTP2 offers HTTP/2 (ALPN h2) before HTTP/1.1. The zero value means
	// the default, on.
	HTTP2 Toggle `toml:"http2"`
	// TicketRotation is how often the session ticket keys, shared by
	// every worker, change; a ticket is accepted for up to two periods.
	// 1m..168h; 0 means 12h.
	TicketRotation time.Duration `toml:"ticket_rotation"`
	// CleartextListen is the address of a cleartext HTTP/1.1 listener
	// beside the TLS one (server.listen), served by the same workers over
	// the same region; "" means none. Only with a certificate; a restart
	// changes it, as server.listen.
	CleartextListen string `toml:"cleartext_listen"`
	// Cleartext is what that listener does: redirect to https (the zero
	// value), or serve as the TLS listener does.
	Cleartext Cleartext `toml:"cleartext"`
	// RedirectPort is the port the redirect's Location names (443: none),
	// for clients that reach the TLS listener at another port than
	// server.listen's (a container's port mapping, a load balancer's);
	// 0 means server.listen's port. 0..65535.
	RedirectPort int `toml:"redirect_port"`
	// cleartextSet and redirectPortSet say that the file writes
	// cleartext and redirect_port, for Warnings: either written without
	// a cleartext_listen does nothing.
	cleartextSet, redirectPortSet bool
	// Tickets is the secret the supervisor draws at start, from which
	// every worker derives the ticket keys: handed to the workers with
	// the configuration, in memory; never in a file or a dump.
	Tickets tlsconf.Tickets `toml:"-"`
}

// Enabled reports whether the listener speaks TLS.
func (t TLS) Enabled() bool { return len(t.Certificates) > 0 }

// Certificate is one [[tls.certificate]].
type Certificate struct {
	// Cert is the PEM file of the certificate chain, leaf first.
	// Required.
	Cert string `toml:"cert"`
	// Key is the PEM file of its private key. Required.
	Key string `toml:"key"`
	// CertPEM and KeyPEM are what the files hold: [Load] reads them (at
	// start and at every reload: the supervisor reads them, workers never
	// need to); [Parse], which does no I/O, leaves them empty. KeyPEM
	// never prints.
	CertPEM []byte      `toml:"-" file:"cert"`
	KeyPEM  tlsconf.Key `toml:"-" file:"key"`
}

// Reload is the [reload] table: how a HUP replaces the workers. The
// settings of the configuration being loaded apply to its own reload.
type Reload struct {
	// Canary makes the first worker replaced a canary, judged against
	// the other workers for CanaryWindow before the rest are replaced.
	// The zero value means the default, On.
	Canary Toggle `toml:"canary"`
	// CanaryWindow is how long the canary's 5xx rate is compared with
	// the other workers', 100ms..1h. 0 means 10s.
	CanaryWindow time.Duration `toml:"canary_window"`
	// CanaryMinRequests is how many requests the canary must serve in
	// the window for a verdict; fewer is inconclusive. 0 means 50.
	CanaryMinRequests int `toml:"canary_min_requests"`
	// CanaryMaxErrorDelta: the reload is aborted when the canary's 5xx
	// rate exceeds the others' by at least this many percentage points
	// (and significantly so), in (0, 100]. 0 means 2.
	CanaryMaxErrorDelta float64 `toml:"canary_max_error_delta"`
	// CanaryInconclusive is what a reload does when the canary served
	// too few requests to be judged: continue (the zero value) or abort.
	CanaryInconclusive Inconclusive `toml:"canary_inconclusive"`
}

// Log is the [log] table: how the supervisor and its workers write their
// log. The zero value is text at info. A reload applies it.
type Log struct {
	// Format is text (logfmt, the zero value) or json.
	Format LogFormat `toml:"format"`
	// Level is the least level written: info (the zero value), debug,
	// warn or error.
	Level LogLevel `toml:"level"`
	// Access is where the access log goes, one line per request: "off"
	// ("" means it too), "stderr", or the absolute path of a file
	// (appended to, created with mode 0640; its directory must exist).
	// Each worker buffers its lines and writes them at least once a
	// second; SIGUSR1 reopens the file.
	Access string `toml:"access"`
	// AccessFormat is combined (nginx's, the zero value) or json.
	AccessFormat accesslog.Format `toml:"access_format"`
}

// AccessOff is the value of Log.Access that turns the access log off.
const AccessOff = "off"

// AccessLog reports whether the access log is on, and where it goes.
func (l Log) AccessLog() (path string, on bool) {
	if l.Access == "" || l.Access == AccessOff {
		return "", false
	}
	return l.Access, true
}

// RateLimit is one [[ratelimit]] rule. Limit, Window, Algorithm, Burst and
// OnFull are those of a [bucket.Rule] (see [RateLimit.BucketRule]), with
// its limits.
type RateLimit struct {
	// Name identifies the rule and its state across restarts: unique,
	// 1..64 of [A-Za-z0-9_.-]. Required.
	Name string `toml:"name"`
	// Path is an exact path ("/login") or a prefix ending in "/*"
	// ("/api/*"), as route.Compile takes it. Required.
	Path string `toml:"path"`
	// Methods are HTTP methods; empty means every method.
	Methods []string `toml:"methods"`
	// Limit requests are allowed per Window; 1..1048575. Required.
	Limit int64 `toml:"limit"`
	// Window is 1ms to about 203 days, in whole microseconds. Required.
	Window time.Duration `toml:"window"`
	// Algorithm is gcra (the zero value) or fixed-window.
	Algorithm bucket.Algorithm `toml:"algorithm"`
	// Burst is the gcra bucket size, 0..1048575; 0 means Limit (see
	// [RateLimit.EffectiveBurst]). Must be 0 with fixed-window.
	Burst int64 `toml:"burst"`
	// By is the key: "ip", "global", "header:NAME", or a fallback chain such
	// as "header:X-Api-Key|ip" (see clientip.ParseBy). "" means "ip".
	By string `toml:"by"`
	// Mode is Enforce (the zero value) or Shadow.
	Mode Mode `toml:"mode"`
	// OnFull decides when no slot can be had for a new key: open (the zero
	// value: allow) or closed (503).
	OnFull bucket.OnFull `toml:"on_full"`
	// Cost is what one request takes from a key's allowance; 0 means 1.
	Cost int64 `toml:"cost"`
	// Status is the status of a refusal: 429 (0 means 429) or 503.
	Status int `toml:"status"`
	// Exempt clients are never counted or refused by this rule.
	Exempt Prefixes `toml:"exempt"`
	// Overrides give some keys or clients another limit
	// ([[ratelimit.override]]).
	Overrides []Override `toml:"override"`
	// MaxKeys bounds the counter slots the rule's keys (its overrides'
	// included) hold; past it a new key gets on_full, and other rules
	// keep their room. 0 means half of table.counters when there are
	// several rules, else all of it (core.DefaultMaxKeys).
	MaxKeys int `toml:"max_keys"`

	// Store is where the rule's counts live: local (the zero value: this
	// host's table) or redis ([redis], shared by every host).
	Store Store `toml:"store"`
	// OnUnavailable answers for a redis rule when Redis cannot decide:
	// local (the zero value: this host enforces Limit ÷ LocalShare), open
	// or closed (503).
	OnUnavailable redisstore.OnUnavailable `toml:"on_unavailable"`
	// LocalShare is how many hosts share a redis rule, 1..65536. 0 means
	// 1 in Go; the file's default is 1.
	LocalShare int `toml:"local_share"`
	// Sync is exact (the zero value: every decision in Redis) or an
	// interval (fixed-window redis rules: count locally, add to Redis
	// every interval).
	Sync redisstore.Sync `toml:"sync"`
}

// Redis is the [redis] table: the Redis that rules with store = "redis"
// share with the other hosts. Zero is "off"; set one of URL, Cluster and
// Sentinel. A field's owner tag is the redisstore.Options field it sets
// where their names differ: a refusal of that field is reported at its
// key.
type Redis struct {
	// URL is one server, "redis://[[user]:password@]host:6379/0" or
	// "rediss://…". It is shown with its password redacted.
	URL RedisURL `toml:"url"`
	// Cluster are seed addresses of a Redis Cluster: "host:port", or
	// URLs as URL (without a database), shown redacted.
	Cluster []RedisURL `toml:"cluster"`
	// Sentinel is a master name and the addresses of its Sentinels.
	Sentinel Sentinel `toml:"sentinel"`
	// Username is the ACL user of every connection to the data nodes;
	// "" is none (the default user).
	Username string `toml:"username"`
	// PasswordFile holds the password of the data nodes, alone: read at
	// start and at every reload into Password, never shown.
	PasswordFile string `toml:"password_file"`
	// TLS connects over TLS (as a rediss:// URL does), to every node.
	TLS bool `toml:"tls"`
	// CAFile holds the PEM certificates that the servers' must chain to;
	// "" is the system's roots. Read with the password.
	CAFile string `toml:"ca_file"`
	// SentinelUsername and SentinelPasswordFile are what the Sentinels
	// themselves want, if anything (Username and PasswordFile are the
	// master's).
	SentinelUsername     string `toml:"sentinel_username" owner:"Sentinel.Username"`
	SentinelPasswordFile string `toml:"sentinel_password_file"`
	// Timeout bounds each call made for a request; no retries. 0 means
	// 25ms.
	Timeout time.Duration `toml:"timeout"`
	// PoolSize is the connection pool per worker, 0..10000; 0 means go-redis's
	// default.
	PoolSize int `toml:"pool_size"`
	// Prefix starts every key. "" means "preforkd:".
	Prefix string `toml:"prefix"`
	// BreakerFailures is how many consecutive failed calls open the
	// breaker shared by the host's workers. 0 means 5.
	BreakerFailures int `toml:"breaker_failures" owner:"Breaker.Failures"`
	// BreakerBackoff is how long the breaker stays open before one
	// worker probes. 0 means 1s.
	BreakerBackoff time.Duration `toml:"breaker_backoff" owner:"Breaker.Backoff"`
	// SuccessThreshold is how many probes, one at a time, must succeed
	// in a row to close the breaker again. 0 means 3.
	SuccessThreshold int `toml:"success_threshold" owner:"Breaker.Successes"`

	// Password, SentinelPassword and CA are what PasswordFile,
	// SentinelPasswordFile and CAFile hold: [Load] reads them (at start
	// and at every reload); [Parse], which does no I/O, leaves them
	// empty, and a Config built in Go sets them itself. They travel to
	// the workers with the rest; nothing prints them.
	Password         redisstore.Secret `toml:"-" file:"password_file"`
	SentinelPassword redisstore.Secret `toml:"-" file:"sentinel_password_file" owner:"Sentinel.Password"`
	CA               []byte            `toml:"-" file:"ca_file"`
}

// Sentinel is the [redis] sentinel table.
type Sentinel struct {
	Master string     `toml:"master"`
	Addrs  []RedisURL `toml:"addrs"`
}

// RedisURL is a Redis URL, or a host:port; it prints with its password
// redacted.
type RedisURL string

func (u RedisURL) String() string {
	if u == "" {
		return `""`
	}
	return redisstore.RedactURL(string(u))
}

// RedactedURLs are us as they print: without passwords.
func RedactedURLs(us []RedisURL) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.String()
	}
	return out
}

func urlStrings(us []RedisURL) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = string(u)
	}
	return out
}

// Enabled reports whether the [redis] table names a Redis.
func (r Redis) Enabled() bool {
	return r.URL != "" || len(r.Cluster) > 0 || r.Sentinel.Master != "" || len(r.Sentinel.Addrs) > 0
}

// StoreOptions are the redisstore options of the [redis] table.
func (r Redis) StoreOptions() redisstore.Options {
	var cluster []string
	if len(r.Cluster) > 0 {
		cluster = urlStrings(r.Cluster)
	}
	var addrs []string
	if len(r.Sentinel.Addrs) > 0 {
		addrs = urlStrings(r.Sentinel.Addrs)
	}
	return redisstore.Options{
		URL: string(r.URL), Cluster: cluster,
		Sentinel: redisstore.Sentinel{Master: r.Sentinel.Master, Addrs: addrs,
			Username: r.SentinelUsername, Password: r.SentinelPassword},
		Username: r.Username, Password: r.Password, TLS: r.TLS, CA: r.CA,
		Timeout: r.Timeout, PoolSize: r.PoolSize, Prefix: r.Prefix,
		Breaker: redisstore.Breaker{Failures: r.BreakerFailures, Backoff: r.BreakerBackoff, Successes: r.SuccessThreshold},
	}
}

// readFiles reads the files the [redis] table names (passwords, the CA),
// reporting a file that cannot be used at the line of its key.
func (r *Redis) readFiles(rep *report) {
	f := rep.at([]string{"redis"}, "redis.")
	var err error
	if p := r.PasswordFile; p != "" {
		if r.Password, err = redisstore.ReadPasswordFile(p); err != nil {
			f("password_file", "%s", detail(err))
		}
	}
	if p := r.SentinelPasswordFile; p != "" {
		if r.SentinelPassword, err = redisstore.ReadPasswordFile(p); err != nil {
			f("sentinel_password_file", "%s", detail(err))
		}
	}
	if p := r.CAFile; p != "" {
		if r.CA, err = redisstore.ReadCAFile(p); err != nil {
			f("ca_file", "%s", detail(err))
		}
	}
}

// RedisRule is the rule as package redisstore applies it (store = "redis").
func (r RateLimit) RedisRule() redisstore.Rule {
	return redisstore.Rule{Rule: r.BucketRule(), OnUnavailable: r.OnUnavailable, LocalShare: r.LocalShare, Sync: time.Duration(r.Sync)}
}

// Override is one [[ratelimit.override]]: another limit for an exact key
// value (Key: an API key, say) or for client ranges (Client); exactly one
// of the two. Limit is required; Window 0 means the rule's; Burst 0 means
// Limit.
type Override struct {
	Key    string        `toml:"key"`
	Client Prefixes      `toml:"client"`
	Limit  int64         `toml:"limit"`
	Window time.Duration `toml:"window"`
	Burst  int64         `toml:"burst"`
}

// Idempotency is one [[idempotency]] block.
type Idempotency struct {
	// Path has the same syntax as [RateLimit.Path]. Required.
	Path string `toml:"path"`
	// Methods are HTTP methods. nil means POST and PATCH.
	Methods []string `toml:"methods"`
	// Header carries the idempotency key. "" means "Idempotency-Key".
	Header string `toml:"header"`
	// Required makes a request without the header a 400.
	Required bool `toml:"required"`
	// TTL is how long a completed response is replayable, at most about
	// 203 days. 0 means 24h.
	TTL time.Duration `toml:"ttl"`
	// Wait is how long a duplicate waits for an in-flight original before
	// it gets 409, or UntilDone. 0 means it does not wait; Default and the
	// file use 10s.
	Wait IdemWait `toml:"wait"`
	// By is the key namespace, same syntax as [RateLimit.By].
	// "" means "header:Authorization|ip".
	By string `toml:"by"`
	// MaxBody is the largest response stored for replay; larger ones are
	// passed through but not replayable. 0 means 1 MiB.
	MaxBody Size `toml:"max_body"`
	// MaxRecords bounds the records one client (by) holds in the block,
	// in flight or stored, and those of one client address whatever its
	// by keys; past either, the client gets 429. 0 means 1% of
	// table.responses, at least 16 (core.DefaultMaxRecords).
	MaxRecords int `toml:"max_records"`
}

// Cache is one [[cache]] block: responses to GET (and HEAD) requests of
// its path are stored in the shared region and served from it, as a
// shared HTTP cache does (RFC 9111).
type Cache struct {
	// Path has the same syntax as [RateLimit.Path]. Required. A successful
	// unsafe request (POST, PUT, DELETE, ...) to a URL of the path
	// invalidates its stored responses.
	Path string `toml:"path"`
	// Methods answered from the cache: GET, and HEAD (answered from what
	// GET stored). nil means both.
	Methods []string `toml:"methods"`
	// TTL caps how long a response is fresh, whatever it says, and each
	// of its stale windows; at most about 203 days. 0 means 24h.
	TTL time.Duration `toml:"ttl"`
	// MaxBody is the largest body stored, at most 1 GiB; larger responses
	// are passed through. 0 means 1 MiB.
	MaxBody Size `toml:"max_body"`
	// TagHeaders are the response fields whose values tag a stored
	// response for purges. nil means Cache-Tag and Surrogate-Key; empty
	// means none.
	TagHeaders []string `toml:"tag_headers"`
	// LockTimeout is how long a miss waits for another request's fetch of
	// the same response before it fetches itself (without storing). 0
	// means it does not wait; Default and the file use 5s.
	LockTimeout time.Duration `toml:"lock_timeout"`
	// Heuristic lets a response without explicit freshness but with a
	// Last-Modified be fresh for a tenth of its age; off, such responses
	// are not stored.
	Heuristic bool `toml:"heuristic"`
	// Targeted is preforkd's own targeted cache-control field (RFC 9213):
	// when a response has it, valid, it decides before CDN-Cache-Control
	// and instead of Cache-Control and Expires, and it is never sent to
	// clients. "" means Preforkd-Cache-Control.
	Targeted string `toml:"targeted"`
	// Since is no key of the file: the region time from which the block
	// serves stored responses (core.Cache.Since), which the daemon sets
	// when a reload adds the block.
	Since time.Duration `toml:"-"`
}

// Defaults that are not the zero value and are used twice; the others are
// in WithDefaults and Default.
const (
	demoUpstream     = "builtin:demo"
	defaultIdemWait  = IdemWait(10 * time.Second) // in the file; zero in Go is no wait
	defaultCacheLock = 5 * time.Second            // in the file; zero in Go is no wait
	defaultRequestID = "X-Request-Id"             // in the file; "" in Go is off
)

// Limits of the values that no other package owns.
const (
	minCounters = 8
	maxCounters = 1 << 26 // 4 GiB of 64-byte slots
	// The response table's bounds (package shm's): checked whether or
	// not a block makes the table, as README states them.
	maxResponses     = 1 << 26
	responseBlock    = 4096 // the region's block of stored bodies
	maxResponseBytes = (1<<32 - 2) * responseBlock
	maxNameLen       = 64 // a rule name is a header parameter and a metric label
)

// MinPersistInterval is the least persist.interval: a dump of a large
// table takes a fraction of a second and an fsync.
const MinPersistInterval = time.Second

// MaxWorkers bounds server.workers: far beyond any machine's CPUs, and
// within what the region's worker table can hold during a reload (twice
// the workers, plus two).
const MaxWorkers = 4096

// Default returns the configuration with every default filled in and no
// rules: what an empty file parses to.
func Default() Config {
	return Config{
		Server: Server{RequestID: defaultRequestID},
		Table:  Table{Responses: 16384, ResponseBytes: 64 << 20},
	}.WithDefaults()
}

// WithDefaults returns a copy of c in which every zero value that stands for
// a default holds that default, Table.Counters is rounded up to a power of
// two and methods are upper-cased. Zero values that are settings of their own
// (Workers, Burst, Wait, Table.Responses, Table.ResponseBytes) are kept.
// [Parse] returns configurations that already went through it. It does not
// validate: an invalid c stays invalid.
func (c Config) WithDefaults() Config {
	s := &c.Server
	setDefault(&s.Listen, "127.0.0.1:8080")
	setDefault(&s.Upstream, demoUpstream)
	setDefault(&s.IPv6Prefix, 64)
	setDefault(&s.ShutdownTimeout, prefork.DefaultShutdownTimeout)
	setDefault(&s.UpgradeTimeout, prefork.DefaultUpgradeTimeout)
	setDefault(&s.MaxRequestBody, 1<<20)
	// The [server] limits are every engine's: their defaults are package
	// engine's.
	setDefault(&s.ReadHeaderTimeout, engine.DefaultReadHeaderTimeout)
	setDefault(&s.IdleTimeout, engine.DefaultIdleTimeout)
	setDefault(&s.MaxHeaderBytes, engine.DefaultMaxHeaderBytes)
	setDefault(&s.ClientBodyTimeout, engine.DefaultClientBodyTimeout)
	setDefault(&s.SendTimeout, engine.DefaultSendTimeout)
	setDefault(&s.UpstreamConnectTimeout, engine.DefaultUpstreamConnectTimeout)
	setDefault(&s.UpstreamTimeout, engine.DefaultUpstreamTimeout)
	setDefault(&s.UpstreamMaxIdle, engine.DefaultUpstreamMaxIdle)
	setDefault(&s.UpstreamIdleTimeout, engine.DefaultUpstreamIdleTimeout)
	s.TrustedProxies = slices.Clone(s.TrustedProxies)
	s.Exempt = slices.Clone(s.Exempt)

	setDefault(&c.Log.Access, AccessOff)
	setDefault(&c.TLS.HTTP2, On)
	setDefault(&c.TLS.TicketRotation, tlsconf.DefaultRotation)
	c.TLS.Certificates = slices.Clone(c.TLS.Certificates)

	rd := &c.Redis
	setDefault(&rd.Timeout, redisstore.DefaultTimeout)
	setDefault(&rd.Prefix, redisstore.DefaultPrefix)
	setDefault(&rd.BreakerFailures, redisstore.DefaultBreakerFailures)
	setDefault(&rd.BreakerBackoff, redisstore.DefaultBreakerBackoff)
	setDefault(&rd.SuccessThreshold, redisstore.DefaultBreakerSuccesses)
	rd.Cluster = slices.Clone(rd.Cluster)
	rd.Sentinel.Addrs = slices.Clone(rd.Sentinel.Addrs)
	rd.CA = slices.Clone(rd.CA)
	rl := &c.Reload
	setDefault(&rl.Canary, On)
	setDefault(&rl.CanaryWindow, prefork.DefaultCanaryWindow)
	setDefault(&rl.CanaryMinRequests, prefork.DefaultCanaryMinRequests)
	setDefault(&rl.CanaryMaxErrorDelta, prefork.DefaultCanaryMaxErrorDelta)

	setDefault(&c.Table.Counters, 262144)
	if n := c.Table.Counters; n >= minCounters && n <= maxCounters {
		c.Table.Counters = 1 << bits.Len(uint(n-1))
	}

	c.RateLimits = slices.Clone(c.RateLimits)
	for i := range c.RateLimits {
		c.RateLimits[i] = c.RateLimits[i].withDefaults()
	}
	c.Idempotency = slices.Clone(c.Idempotency)
	for i := range c.Idempotency {
		c.Idempotency[i] = c.Idempotency[i].withDefaults()
	}
	c.Caches = slices.Clone(c.Caches)
	for i := range c.Caches {
		c.Caches[i] = c.Caches[i].withDefaults()
	}
	return c
}

func (d Cache) withDefaults() Cache {
	if d.Methods == nil {
		d.Methods = []string{"GET", "HEAD"}
	}
	d.Methods = upperAll(d.Methods)
	setDefault(&d.TTL, 24*time.Hour)
	setDefault(&d.MaxBody, 1<<20)
	setDefault(&d.Targeted, core.DefaultTargeted)
	if d.TagHeaders == nil {
		d.TagHeaders = defaultTagHeaders()
	}
	d.TagHeaders = slices.Clone(d.TagHeaders)
	return d
}

// defaultTagHeaders are the response fields a cache block reads its
// entries' tags from when tag_headers is left out.
func defaultTagHeaders() []string { return []string{"Cache-Tag", "Surrogate-Key"} }

func (r RateLimit) withDefaults() RateLimit {
	r.Methods = upperAll(r.Methods)
	setDefault(&r.By, "ip")
	setDefault(&r.LocalShare, 1)
	setDefault(&r.Cost, 1)
	setDefault(&r.Status, http.StatusTooManyRequests)
	r.Exempt = slices.Clone(r.Exempt)
	r.Overrides = slices.Clone(r.Overrides)
	return r
}

func (d Idempotency) withDefaults() Idempotency {
	if d.Methods == nil {
		d.Methods = []string{"POST", "PATCH"}
	}
	d.Methods = upperAll(d.Methods)
	setDefault(&d.Header, core.DefaultIdempotencyHeader)
	setDefault(&d.TTL, 24*time.Hour)
	setDefault(&d.By, "header:Authorization|ip")
	setDefault(&d.MaxBody, 1<<20)
	return d
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// upperAll returns an upper-cased copy, so that a caller's slice is never
// modified; nil stays nil.
func upperAll(ms []string) []string {
	if ms == nil {
		return nil
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = strings.ToUpper(m)
	}
	return out
}

// storing names a kind of block that stores responses ("[[idempotency]]"
// or "[[cache]]"), or is "" when there is none.
func (c Config) storing() string {
	switch {
	case len(c.Idempotency) > 0:
		return "[[idempotency]]"
	case len(c.Caches) > 0:
		return "[[cache]]"
	}
	return ""
}

// RegionTable is the geometry the region is made with for c: Table as
// package shm rounds it (records up to a power of two, the block pool
// down to whole blocks), but without the response table (Responses and
// ResponseBytes 0) when no [[idempotency]] or [[cache]] block would store
// a response in it, so that an instance that only limits rates maps its
// counters and not the 64 MiB of the default block pool. The region's
// geometry is fixed for its life: a reload that adds the first such block
// needs a restart.
func (c Config) RegionTable() Table {
	t := c.Table
	if c.storing() == "" {
		t.Responses, t.ResponseBytes = 0, 0
		return t
	}
	if n, err := (shm.Options{Counters: t.Counters, Responses: t.Responses, ResponseBytes: int64(t.ResponseBytes)}).Normalized(); err == nil {
		t.Responses, t.ResponseBytes = n.Responses, Size(n.ResponseBytes)
	} // else Validate refuses the table
	return t
}

// UntilDone is how long a duplicate of an [[idempotency]] block with
// wait = "until-done" waits for its original at most: the longest the
// original waits for its application's answer to begin (a connection,
// then the response header). By then the original has its answer, whose
// body it reads within upstream_timeout a read, or it failed and let the
// key go, and the duplicate runs in its place. The sum is held at the
// longest Duration: two of the longest timeouts would wrap around to a
// negative wait.
func (s Server) UntilDone() time.Duration {
	if s.UpstreamTimeout > math.MaxInt64-s.UpstreamConnectTimeout {
		return math.MaxInt64
	}
	return s.UpstreamConnectTimeout + s.UpstreamTimeout
}

// WorkerCount is the number of workers to start: Workers, or when Workers
// is 0 the CPUs this process may use: its cgroup's CPU limit (a
// container's, a systemd unit's CPUQuota=) rounded up, else the host's
// (see package internal/cpuquota).
func (s Server) WorkerCount() int { return prefork.WorkerCount(s.Workers) }

// BucketRule is the rule's rate limit as package bucket applies it.
func (r RateLimit) BucketRule() bucket.Rule {
	return bucket.Rule{Name: r.Name, Limit: r.Limit, Window: r.Window, Algorithm: r.Algorithm, Burst: r.Burst, OnFull: r.OnFull, Cost: r.Cost, MaxKeys: r.MaxKeys}
}

// EffectiveBurst is the gcra bucket size: Burst, or Limit when Burst is 0.
func (r RateLimit) EffectiveBurst() int64 {
	if r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

// RuleMode is the mode rule r runs in under c: shadow for every rule when
// [server] shadow (or preforkd run -shadow) says so, else its own.
func (c Config) RuleMode(r RateLimit) Mode {
	if c.Server.Shadow {
		return Shadow
	}
	return r.Mode
}

// Error is a configuration problem, with the file and line it comes from
// when they are known. Parse, Load and Validate return it as *Error.
type Error struct {
	File string // as given to Parse or Load; "" for a Config built in Go
	Line int    // 1-based; 0 when unknown (always, for a Config built in Go)
	Msg  string
}

// Error formats e as "config: FILE:LINE: MSG"; without a line as
// "config: FILE: MSG", without a file as "config: line LINE: MSG", and
// with neither as "config: MSG".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	switch {
	case e.File != "" && e.Line > 0:
		b.WriteString(e.File + ":" + strconv.Itoa(e.Line) + ": ")
	case e.File != "":
		b.WriteString(e.File + ": ")
	case e.Line > 0:
		b.WriteString("line " + strconv.Itoa(e.Line) + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// KeyError is msg, what a caller found wrong with the value of key (its
// dotted name, "admin.token_file"), as an *Error of the file named file
// at the line of the key there, read again: for what only the caller
// checks (a file it reads itself, a directory it writes to), so that the
// operator meets it as the configuration's own problems. The line falls
// back to the key's table's, and is 0 when the file cannot be read.
func KeyError(file, key, msg string) *Error {
	e := &Error{File: file, Msg: msg}
	if src, err := os.ReadFile(file); err == nil {
		r := &report{file: file, src: string(src)}
		e.Line = r.line(strings.Split(key, ".")...)
	}
	return e
}

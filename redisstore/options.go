package redisstore

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/preforkd/preforkd/internal/textvalue"
)

// Options configure a Store: where Redis is, how long a request may wait
// for it, and the shared breaker. Zero values are the documented
// defaults; exactly one of URL, Cluster and Sentinel is set (or Client).
type Options struct {
	// URL is a single Redis server: "redis://[[user]:password@]host:6379/0",
	// or "rediss://…" for TLS.
	URL string
	// Cluster are seed addresses ("host:port") of a Redis Cluster.
	Cluster []string
	// Sentinel is a master watched by Sentinels.
	Sentinel Sentinel
	// Client, if set, is used instead of a client built from the above;
	// Close does not close it. Its own timeouts and retries apply
	// besides Timeout.
	Client redis.UniversalClient

	// Timeout bounds each call made for a request (connection, pool wait,
	// write and read together); a call is never retried on the request
	// path. 0 means DefaultTimeout.
	Timeout time.Duration
	// PoolSize is the connection pool of the client (per worker process).
	// 0 means go-redis's default (10 per CPU).
	PoolSize int
	// Prefix starts every key, so that several deployments can share one
	// Redis. "" means DefaultPrefix.
	Prefix string

	// Breaker is the circuit breaker shared by the workers of the host.
	// Zero fields mean: 5 failures, a 1s backoff, a probe deadline of
	// twice Timeout plus 50ms, 3 probes in a row to close it.
	Breaker Breaker
	// Host names this host's share in the counts of sync-mode rules;
	// "" means an identity drawn from the region (new for every region).
	Host string

	// Logger receives the breaker's transitions and the flushers' errors
	// (rate-limited). nil means slog.Default().
	Logger *slog.Logger
}

// Sentinel is a master name and the addresses of Sentinels that watch it.
type Sentinel struct {
	Master string
	Addrs  []string
}

// Defaults of Options.
const (
	DefaultTimeout         = 25 * time.Millisecond
	DefaultPrefix          = "preforkd:"
	DefaultBreakerFailures = 5
	DefaultBreakerBackoff  = time.Second
	// DefaultBreakerSuccesses is how many probes in a row close the
	// breaker (Breaker.Successes).
	DefaultBreakerSuccesses = 3
)

// Enabled reports whether o names a Redis to use.
func (o *Options) Enabled() bool {
	return o.Client != nil || o.URL != "" || len(o.Cluster) > 0 || o.Sentinel.Master != "" || len(o.Sentinel.Addrs) > 0
}

// Validate reports the first problem with o (zero values standing for
// their defaults), as New would: no I/O.
func (o Options) Validate() error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	if o.Client == nil {
		_, err = clientOptions(o)
	}
	return err
}

// withDefaults fills the zero values and validates.
func (o Options) withDefaults() (Options, error) {
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	b := &o.Breaker
	if b.Failures == 0 {
		b.Failures = DefaultBreakerFailures
	}
	if b.Backoff == 0 {
		b.Backoff = DefaultBreakerBackoff
	}
	if b.ProbeTimeout == 0 {
		b.ProbeTimeout = 2*o.Timeout + 50*time.Millisecond
	}
	if b.Successes == 0 {
		b.Successes = DefaultBreakerSuccesses
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	n := 0
	if o.URL != "" {
		n++
	}
	if len(o.Cluster) > 0 {
		n++
	}
	if o.Sentinel.Master != "" || len(o.Sentinel.Addrs) > 0 {
		n++
		if o.Sentinel.Master == "" || len(o.Sentinel.Addrs) == 0 {
			return o, errors.New("redisstore: sentinel needs both a master name and addresses")
		}
	}
	switch {
	case o.Client != nil && n > 0:
		return o, errors.New("redisstore: give either a Client or an address, not both")
	case o.Client == nil && n == 0:
		return o, errors.New("redisstore: no Redis: set url, cluster or sentinel")
	case n > 1:
		return o, errors.New("redisstore: set only one of url, cluster and sentinel")
	case o.Timeout < time.Millisecond || o.Timeout > time.Minute:
		return o, fmt.Errorf("redisstore: timeout %v outside 1ms..1m", o.Timeout)
	case o.PoolSize < 0:
		return o, fmt.Errorf("redisstore: pool size %d is negative", o.PoolSize)
	}
	return o, b.validate()
}

// newClient builds the go-redis client for o: no retries, and every
// wait (dial, pool, read, write) bounded by the timeout, so that a slow
// or dead Redis costs a request at most Timeout.
func newClient(o Options) (redis.UniversalClient, error) {
	u, err := clientOptions(o)
	if err != nil {
		return nil, err
	}
	return redis.NewUniversalClient(u), nil
}

func clientOptions(o Options) (*redis.UniversalOptions, error) {
	u := &redis.UniversalOptions{
		MaxRetries:            -1,
		DialTimeout:           o.Timeout,
		DialerRetries:         1,
		DialerRetryTimeout:    o.Timeout,
		ReadTimeout:           o.Timeout,
		WriteTimeout:          o.Timeout,
		PoolTimeout:           o.Timeout,
		ContextTimeoutEnabled: true,
		PoolSize:              o.PoolSize,
		// A new connection costs HELLO (and CLIENT SETINFO, which identity
		// skips) before its first command: keep two ready, so that a burst
		// after a restart of Redis does not dial under the timeout.
		MinIdleConns:    2,
		DisableIdentity: true,
		// The server-push maintenance handshake is for managed services;
		// on any other server it costs a round trip at every connection.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	switch {
	case o.URL != "":
		p, err := redis.ParseURL(o.URL)
		if err != nil {
			// go-redis's message may quote the URL, password and all.
			return nil, fmt.Errorf("redisstore: url %q: want redis://[[user]:password@]host:port[/db] or rediss://…", redactURL(o.URL))
		}
		u.Addrs = []string{p.Addr}
		u.Username, u.Password, u.DB = p.Username, p.Password, p.DB
		if p.TLSConfig != nil {
			u.TLSConfig = p.TLSConfig
		}
	case len(o.Cluster) > 0:
		u.Addrs = append([]string(nil), o.Cluster...)
		u.IsClusterMode = true
	default:
		u.Addrs = append([]string(nil), o.Sentinel.Addrs...)
		u.MasterName = o.Sentinel.Master
	}
	for _, a := range u.Addrs {
		if a == "" || !strings.Contains(a, ":") {
			return nil, fmt.Errorf("redisstore: address %q: want host:port", a)
		}
	}
	return u, nil
}

// OnUnavailable is what a Redis rule answers when Redis cannot decide
// (down, slow, or the breaker is open).
type OnUnavailable uint8

const (
	// FailLocal (the zero value) enforces the rule's limit divided by its
	// local share on this host's own table.
	FailLocal OnUnavailable = iota
	// FailOpen lets the request through, uncounted.
	FailOpen
	// FailClosed refuses it: 503 with Retry-After.
	FailClosed
)

// onUnavailableNames are the names ParseOnUnavailable reads and String
// writes, indexed by value.
var onUnavailableNames = textvalue.Enum[OnUnavailable]{FailLocal: "local", FailOpen: "open", FailClosed: "closed"}

// ParseOnUnavailable parses "open", "closed" or "local".
func ParseOnUnavailable(s string) (OnUnavailable, error) {
	if u, ok := onUnavailableNames.Value(s); ok {
		return u, nil
	}
	return 0, fmt.Errorf("redisstore: on_unavailable %q: want \"open\", \"closed\" or \"local\"", s)
}

func (u OnUnavailable) String() string { return onUnavailableNames.String(u, "OnUnavailable") }

// UnmarshalText makes an OnUnavailable a configuration value.
func (u *OnUnavailable) UnmarshalText(b []byte) error {
	return textvalue.Unmarshal(b, u, ParseOnUnavailable)
}

// MarshalText is the value as ParseOnUnavailable reads it; a value out of
// range is an error, as it is for bucket's policies, so that it never
// reaches a file that would not parse back.
func (u OnUnavailable) MarshalText() ([]byte, error) {
	return onUnavailableNames.Marshal("redisstore", u)
}

// RedactURL returns a Redis URL with its password replaced by "xxxxx", for
// logs and status pages; a string that is no URL is returned as "…".
func RedactURL(s string) string { return redactURL(s) }

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "…"
	}
	return u.Redacted()
}

// Sync is how a rule's counts reach Redis: 0 ("exact") decides each
// request in Redis; a positive interval counts on the host and adds the
// counts to Redis every interval.
type Sync time.Duration

// ParseSync parses "exact" or a duration of at least a millisecond.
func ParseSync(s string) (Sync, error) {
	if s == "exact" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Millisecond || d > time.Hour {
		return 0, fmt.Errorf("redisstore: sync %q: want \"exact\" or an interval between 1ms and 1h such as \"100ms\"", s)
	}
	return Sync(d), nil
}

func (s Sync) String() string {
	if s == 0 {
		return "exact"
	}
	return time.Duration(s).String()
}

// UnmarshalText makes a Sync a configuration value.
func (s *Sync) UnmarshalText(b []byte) error { return textvalue.Unmarshal(b, s, ParseSync) }

// MarshalText is the value as ParseSync reads it.
func (s Sync) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

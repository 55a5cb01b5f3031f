package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/internal/textvalue"
)

// Options configure a Store: where Redis is, who connects to it, how long
// a request may wait for it, and the shared breaker. Zero values are the
// documented defaults; exactly one of URL, Cluster and Sentinel is set (or
// Client).
type Options struct {
	// URL is a single Redis server: "redis://[[user]:password@]host:6379/0",
	// or "rediss://…" for TLS.
	URL string
	// Cluster are seed addresses of a Redis Cluster: "host:port", or
	// "redis://[[user]:password@]host:port" ("rediss://…" for TLS), whose
	// user, password and TLS then stand for Username, Password and TLS.
	Cluster []string
	// Sentinel is a master watched by Sentinels.
	Sentinel Sentinel

	// Username and Password authenticate every connection to the data
	// nodes (the server, each Cluster node, a Sentinel set's master):
	// AUTH, or HELLO. "" is none; a Password alone is the "default"
	// user's. A URL's user and password mean the same: each may be given
	// once, in a URL or here.
	Username string
	Password Secret
	// TLS connects to every node (and Sentinel) over TLS; a rediss://
	// URL sets it too. The server's certificate must name the address
	// dialled (each Cluster node's as the Cluster announces it) and chain
	// to CA, PEM certificates, or to the system's roots when CA is empty.
	TLS bool
	CA  []byte
	// Client, if set, is used instead of a client built from the above;
	// Close does not close it. Its own timeouts and retries apply
	// besides Timeout.
	Client redis.UniversalClient

	// Timeout bounds each call made for a request (connection, pool wait,
	// write and read together); a call is never retried on the request
	// path. 0 means DefaultTimeout.
	Timeout time.Duration
	// PoolSize is the connection pool of the client (per worker process),
	// 0..MaxPoolSize. 0 means go-redis's default (10 per CPU).
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
	// (rate-limited). nil means slog.Default(). go-redis logs besides,
	// through a logger of its own for the whole process: a line on
	// stderr for each connection it fails to open, while Redis is away.
	// redis.SetLogger sends those where the program wants them (the
	// daemon: to its log, at debug, as the breaker's lines say what an
	// operator acts on).
	Logger *slog.Logger
	// Observer is told what the Store's calls came to, as they come (a
	// worker's metrics); nil: nobody. Stats counts the same per process.
	Observer Observer
}

// Sentinel is a master name and the addresses of Sentinels that watch it,
// with the user and password the Sentinels want, if any (a Sentinel's
// requirepass or ACL user; Options.Username and Password are the
// master's). Addrs are "host:port" or redis:// URLs, as Options.Cluster.
type Sentinel struct {
	Master   string
	Addrs    []string
	Username string
	Password Secret
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

// MaxPoolSize bounds Options.PoolSize: as each worker builds its client,
// go-redis fills a semaphore of that many tokens and sizes its idle list
// by it (and takes it as an int32).
const MaxPoolSize = 10000

// FieldError is a setting that New, Validate, NewLimiter or ValidateRule
// refuses. Field names it: a field of Options ("Timeout",
// "Breaker.Failures", "Sentinel.Addrs") or of Rule ("LocalShare",
// "Sync"), or "" when no one field is at fault (none of URL, Cluster and
// Sentinel is set, or several are). Rule is the rule's name, for a
// rule's; Msg says what is wrong; Err is the cause, if another error is.
type FieldError struct {
	Field, Msg string
	Rule       string
	Err        error
	// format is Msg with {Field} where it names a field besides Field,
	// and args its values (Message); "" when it names none.
	format string
	args   []any
}

// Message is Msg with each field of Options it names besides Field
// ("set only one of URL, Cluster and Sentinel") named by name(field)
// instead: what a program that fills Options from settings of its own,
// such as a configuration file's keys, shows its users. Field names are
// as Field gives them ("Sentinel.Username").
func (e *FieldError) Message(name func(field string) string) string {
	if e.format == "" {
		return e.Msg
	}
	return fmt.Sprintf(nameFields(e.format, name), e.args...)
}

// nameFields replaces each {Field} of format by name(Field).
func nameFields(format string, name func(string) string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(format, '{')
		j := strings.IndexByte(format[i+1:], '}')
		if i < 0 || j < 0 {
			return b.String() + format
		}
		b.WriteString(format[:i])
		b.WriteString(strings.ReplaceAll(name(format[i+1:i+1+j]), "%", "%%"))
		format = format[i+2+j:]
	}
}

func (e *FieldError) Error() string {
	s := "redisstore: "
	if e.Rule != "" {
		s += "rule " + strconv.Quote(e.Rule) + ": "
	}
	if e.Field != "" {
		s += e.Field + ": "
	}
	return s + e.Msg
}

func (e *FieldError) Unwrap() error { return e.Err }

// fieldErr is a *FieldError about field of Options.
func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// namedErr is fieldErr for a message that names other fields, as
// {Field} in format (FieldError.Message).
func namedErr(field, format string, args ...any) error {
	self := func(f string) string { return f }
	return &FieldError{Field: field, Msg: fmt.Sprintf(nameFields(format, self), args...), format: format, args: args}
}

// Enabled reports whether o names a Redis to use.
func (o *Options) Enabled() bool {
	return o.Client != nil || o.URL != "" || len(o.Cluster) > 0 || o.Sentinel.Master != "" || len(o.Sentinel.Addrs) > 0
}

// Validate reports the first problem with o (zero values standing for
// their defaults), as New would: no I/O. Every problem is a *FieldError.
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
			return o, fieldErr("Sentinel", "needs both a master name and addresses")
		}
	}
	switch {
	case o.Client != nil && n > 0:
		return o, fieldErr("Client", "give either a Client or an address, not both")
	case o.Client != nil && (o.Username != "" || o.Password != "" || o.TLS || len(o.CA) > 0):
		return o, fieldErr("Client", "a Client brings its own username, password and TLS")
	case o.Client == nil && n == 0:
		return o, namedErr("", "no Redis: set {URL}, {Cluster} or {Sentinel}")
	case n > 1:
		return o, namedErr("", "set only one of {URL}, {Cluster} and {Sentinel}")
	case o.Timeout < time.Millisecond || o.Timeout > time.Minute:
		return o, fieldErr("Timeout", "must be between %v and %v, got %v", time.Millisecond, time.Minute, o.Timeout)
	case o.PoolSize < 0 || o.PoolSize > MaxPoolSize:
		return o, fieldErr("PoolSize", "must be between 0 and %d, got %d", MaxPoolSize, o.PoolSize)
	case strings.ContainsAny(o.Prefix, "{}"):
		// Redis Cluster hashes a key's first {...}: the prefix's would
		// take the place of the key's own tag, which keeps one request's
		// rules in one slot.
		return o, fieldErr("Prefix", "%q has a brace: keys carry hash tags of their own ({...}), which a Cluster places them by", o.Prefix)
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
		MaxRetries: -1,
		// A call's budget is its context's (ContextTimeoutEnabled): a
		// request's is Timeout; an operator's, the warm-up's and a
		// flush's are longer, and go-redis would cut them at its dial,
		// read and write timeouts, which only bound what it does on its
		// own (a dial takes the earlier of its context's deadline and
		// DialTimeout: at Timeout, a flush that needed a connection had
		// 25 ms to open one, where a TLS handshake over a slow link
		// takes longer, and a worker's last counts were lost).
		DialTimeout:           max(o.Timeout, controlTimeout),
		DialerRetries:         1,
		DialerRetryTimeout:    o.Timeout,
		ReadTimeout:           max(o.Timeout, controlTimeout),
		WriteTimeout:          max(o.Timeout, controlTimeout),
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
	data := credentials{user: o.Username, pass: string(o.Password), tls: o.TLS, userField: "Username", passField: "Password"}
	sentinel := credentials{user: o.Sentinel.Username, pass: string(o.Sentinel.Password), userField: "Sentinel.Username", passField: "Sentinel.Password"}
	switch {
	case o.URL != "":
		p, err := redis.ParseURL(o.URL)
		if u, uerr := url.Parse(o.URL); err == nil && (uerr != nil || u.Fragment != "") {
			err = errors.New("redisstore: a fragment") // go-redis ignores it
		} else if err == nil && u.RawQuery != "" {
			// go-redis reads pool_size, timeouts, skip_verify… from
			// the query; the client is built from Options alone.
			return nil, fieldErr("URL", "%q: options in the URL are not read: use the keys of [redis]", redactURL(o.URL))
		}
		if err == nil && (p.DB < 0 || p.DB > math.MaxInt32-1) {
			// go-redis selects no database under 1: -1 would be 0.
			return nil, fieldErr("URL", "%q: the database is not a number from 0 to %d", redactURL(o.URL), math.MaxInt32-1)
		}
		if err == nil && !hasPort(p.Addr) {
			return nil, fieldErr("URL", "%q: the port is not one from 1 to 65535", redactURL(o.URL))
		}
		if err != nil {
			// go-redis's message may quote the URL, password and all.
			return nil, fieldErr("URL", "%q: want redis://[[user]:password@]host:port[/db] or rediss://…", redactURL(o.URL))
		}
		u.Addrs = []string{p.Addr}
		u.DB = p.DB
		if err := data.add("URL", "the {URL}", seed{user: p.Username, pass: p.Password, tls: p.TLSConfig != nil}); err != nil {
			return nil, err
		}
	case len(o.Cluster) > 0:
		u.IsClusterMode = true
		for _, a := range o.Cluster {
			sd, err := parseSeed("Cluster", a)
			if err != nil {
				return nil, err
			}
			if err := data.add("Cluster", "a {Cluster} seed", sd); err != nil {
				return nil, err
			}
			u.Addrs = append(u.Addrs, sd.addr)
		}
	default:
		u.MasterName = o.Sentinel.Master
		for _, a := range o.Sentinel.Addrs {
			sd, err := parseSeed("Sentinel.Addrs", a)
			if err != nil {
				return nil, err
			}
			if err := sentinel.add("Sentinel.Addrs", "a {Sentinel} address", sd); err != nil {
				return nil, err
			}
			data.tls = data.tls || sd.tls // one TLS setting for the Sentinels and the master
			u.Addrs = append(u.Addrs, sd.addr)
		}
		u.SentinelUsername, u.SentinelPassword = sentinel.user, sentinel.pass
	}
	if (sentinel.user != "" || sentinel.pass != "") && o.Sentinel.Master == "" {
		field := sentinel.userField
		if sentinel.user == "" {
			field = sentinel.passField
		}
		return nil, namedErr(field, "no sentinel to use it: set {Sentinel}, or drop {Sentinel.Username} and {Sentinel.Password}")
	}
	u.Username, u.Password = data.user, data.pass
	switch {
	case data.tls:
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if len(o.CA) > 0 {
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(o.CA) {
				return nil, fieldErr("CA", "no PEM certificate in it")
			}
		}
		// ServerName stays empty: each connection verifies the host it
		// dials (tls.DialWithDialer), a Cluster node's own name included.
		u.TLSConfig = tc
	case len(o.CA) > 0:
		return nil, namedErr("CA", "a CA is given but TLS is off: set {TLS}, or use rediss:// URLs")
	}
	return u, nil
}

// credentials are who connects to one kind of server (the data nodes, or
// the Sentinels), gathered from the options and from URLs.
type credentials struct {
	user, pass string
	tls        bool
	fromURL    bool // user and pass come from URLs, which may repeat them
	// userField and passField are the Options fields of user and pass.
	userField, passField string
}

// add takes a URL's user, password and TLS (from field, what for
// messages, naming fields as namedErr's format does). A user or password given in a URL and besides is an error,
// even when the same, so that no one edits one copy and wonders why
// nothing changed; several seed URLs may repeat theirs, but must agree.
func (c *credentials) add(field, what string, sd seed) error {
	if sd.user != "" {
		if c.user != "" && !c.fromURL {
			return namedErr(c.userField, "given twice: "+what+" names %q, and %q is given besides", sd.user, c.user)
		}
		if c.user != "" && c.user != sd.user {
			return fieldErr(field, "the seeds disagree on the username: %q and %q", c.user, sd.user)
		}
		c.user = sd.user
	}
	if sd.pass != "" {
		if c.pass != "" && !c.fromURL {
			return namedErr(c.passField, "given twice: "+what+" has a password, and another is given besides")
		}
		if c.pass != "" && c.pass != sd.pass {
			return fieldErr(field, "the seeds disagree on the password")
		}
		c.pass = sd.pass
	}
	c.fromURL = c.fromURL || sd.user != "" || sd.pass != ""
	c.tls = c.tls || sd.tls
	return nil
}

// seed is one address of a Cluster or of Sentinels.
type seed struct {
	addr, user, pass string
	tls              bool
}

// parseSeed reads "host:port" or "redis[s]://[[user]:password@]host:port"
// (no database, no options: a Cluster has one database, and the options
// are Options') for field.
func parseSeed(field, s string) (seed, error) {
	if !strings.Contains(s, "://") {
		if !hasPort(s) {
			return seed{}, fieldErr(field, "address %q: want host:port or redis://[[user]:password@]host:port", redactURL(s))
		}
		return seed{addr: s}, nil
	}
	bad := fieldErr(field, "address %q: want host:port or redis://[[user]:password@]host:port (rediss:// for TLS)", redactURL(s))
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "redis" && u.Scheme != "rediss" || u.Opaque != "" || u.RawQuery != "" || u.Fragment != "" {
		return seed{}, bad
	}
	if u.Path != "" && u.Path != "/" && u.Path != "/0" {
		return seed{}, fieldErr(field, "address %q: a database other than 0 (a Cluster has only one)", redactURL(s))
	}
	if !hasPort(u.Host) || u.Hostname() == "" {
		return seed{}, bad
	}
	sd := seed{addr: u.Host, tls: u.Scheme == "rediss"}
	if u.User != nil {
		sd.user = u.User.Username()
		sd.pass, _ = u.User.Password()
	}
	return sd, nil
}

// hasPort reports whether addr is host:port with a port a TCP dial can
// reach (1-65535; go-redis takes any number): a check at start, not a
// dial refused at the first request.
func hasPort(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	return err == nil && perr == nil && n >= 1 && n <= 65535
}

// OnUnavailable is what a Redis rule answers when Redis cannot decide
// (down, slow, or the breaker is open): core's, since the core decides by
// it.
type OnUnavailable = core.OnUnavailable

// The values of OnUnavailable.
const (
	FailLocal  = core.FailLocal
	FailOpen   = core.FailOpen
	FailClosed = core.FailClosed
)

// ParseOnUnavailable parses "open", "closed" or "local".
func ParseOnUnavailable(s string) (OnUnavailable, error) { return core.ParseOnUnavailable(s) }

// RedactURL returns a Redis URL (or a host:port) with its password
// replaced by "xxxxx", for logs and status pages. Of a string that is
// neither, what could be a password (up to an '@') is replaced.
func RedactURL(s string) string { return redactURL(s) }

func redactURL(s string) string {
	scheme, rest, isURL := strings.Cut(s, "://")
	if isURL {
		// A URL with an '@' but no userinfo has its password in what
		// url.Parse read as a path, query or fragment ("…:2024#pw@h").
		if u, err := url.Parse(s); err == nil && (u.User != nil || !strings.Contains(rest, "@")) {
			return u.Redacted()
		}
		scheme += "://"
	} else {
		scheme, rest = "", s
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		return scheme + "xxxxx@" + rest[i+1:]
	}
	if isURL {
		return "…" // no '@', but unreadable: show nothing of it
	}
	return s
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

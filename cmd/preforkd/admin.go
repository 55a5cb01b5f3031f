package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	preforkdengine "github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/shm"
)

// adminInfo is what the admin endpoint says about the binary and the run.
type adminInfo struct {
	version, commit string
	configPath      string
	// closer, when set, is given a function that closes the endpoint
	// and its connections at once (their descriptors given back).
	closer *func()
}

// admin is the endpoint on [admin] listen, served by the supervisor, which
// never serves application requests: health and readiness, /metrics and
// /status (read-only, open to whoever reaches the address), and the
// actions, which need the bearer token of admin.token_file.
type admin struct {
	adminInfo
	region  *shm.Region
	log     *slog.Logger
	started time.Time // this supervisor's start, when it loaded its configuration
	// since is when the instance started: this supervisor's start, or
	// after a binary upgrade its predecessor's (instanceFile), as its
	// counts go on from the predecessor's (and prefork numbers its
	// generations on from the predecessor's).
	since time.Time

	// status is the supervisor's last snapshot (prefork.Options.OnStatus);
	// nil before the first.
	status atomic.Pointer[prefork.Status]

	unauthorized  preforkdengine.WarnGate // log lines about refused tokens: one a second
	tokenUnusable preforkdengine.WarnGate // log lines about an unusable token file: one a second

	// acting is held (read) by every action while it runs, and taken by
	// stopActions, which sets stopped: from then on actions are refused.
	acting  sync.RWMutex
	stopped bool

	mu     sync.Mutex
	ctl    *core.Control // over the rules of generation ctlGen
	ctlGen int
	// redis is the Redis store ctl looks up and resets Redis rules with;
	// nil when no rule of generation ctlGen is one.
	redis core.SharedStore
}

// adminHooks serves [admin] listen from Prepare to the end of Finish: the
// endpoint is up before the first worker starts and until the dump is
// written, so that /readyz answers 503, not a refused connection, during
// the whole drain.
func adminHooks(opts *prefork.Options, cfg config.Config, info adminInfo) {
	a := &admin{adminInfo: info, started: time.Now()}
	a.since = a.started
	var srv *http.Server
	var ln net.Listener
	var capped *cappedListener
	// After a binary upgrade (USR2) the new supervisor serves the old
	// one's admin listener, from the moment it serves: until then the
	// old one answers on it.
	var adopted net.Listener
	// orphan is the path of an adopted unix socket this supervisor does
	// not serve (its file has no admin.listen): removed once it serves.
	var orphan string
	serveWhenReady := false
	serve := func(log *slog.Logger) {
		go func() {
			if err := srv.Serve(capped); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("admin endpoint stopped", "err", err)
			}
		}()
	}
	if info.closer != nil {
		*info.closer = func() {
			if srv != nil {
				srv.Close()
			}
		}
	}
	prepare, finish, onStatus := opts.Prepare, opts.Finish, opts.OnStatus
	handedOver := opts.HandedOver
	var tallied supervisorCounts
	opts.OnStatus = func(st prefork.Status) {
		if a.region != nil {
			tallied.carry(a.region.SupervisorCounts(), &st)
		}
		a.status.Store(&st)
		if orphan != "" && st.Serving {
			os.Remove(orphan)
			orphan = ""
		}
		if serveWhenReady && st.Serving {
			serveWhenReady = false
			serve(a.log)
		}
		if onStatus != nil {
			onStatus(st)
		}
	}
	addAdopt(opts, func(files map[string]*os.File) error {
		if f := files[instanceFile]; f != nil {
			a.adoptInstance(f)
		}
		if f := files["admin"]; f != nil {
			l, err := net.FileListener(f)
			f.Close()
			if err != nil {
				return fmt.Errorf("admin: the inherited listener: %w", err)
			}
			if ul, ok := l.(*net.UnixListener); ok {
				ul.SetUnlinkOnClose(true) // this supervisor owns the socket's file now
			}
			adopted = l
		}
		return nil
	})
	addHandover(opts, func(files map[string]*os.File) error {
		inst, err := a.instance()
		if err != nil {
			return fmt.Errorf("admin: the instance's start: %w", err)
		}
		files[instanceFile] = inst
		if ln == nil {
			return nil
		}
		f, err := prefork.ListenerFile(ln)
		if err != nil {
			return fmt.Errorf("admin: %w", err)
		}
		files["admin"] = f
		return nil
	})
	opts.HandedOver = func() {
		if srv != nil {
			if ul, ok := ln.(*net.UnixListener); ok {
				ul.SetUnlinkOnClose(false) // the new supervisor serves it
			}
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				srv.Shutdown(ctx)
				cancel()
			}()
		}
		if handedOver != nil {
			handedOver()
		}
	}
	opts.Prepare = func(r *shm.Region, log *slog.Logger) error {
		// The listener first: a start refused for it (the address in
		// use) must come before the inner Prepare loads, and so
		// consumes, the dump, which only a Finish would write back.
		if cfg.Admin.Listen != "" && adopted == nil {
			var err error
			if ln, err = listenAdmin(cfg.Admin.Listen); err != nil {
				return fmt.Errorf("admin: %w", err)
			}
		}
		if prepare != nil {
			if err := prepare(r, log); err != nil {
				if ln != nil && adopted == nil {
					ln.Close()
				}
				return err
			}
		}
		// Also without admin.listen: the supervisor's counts go to the
		// region (OnStatus) for a later one that serves them.
		a.region = r
		if cfg.Admin.Listen == "" {
			if adopted != nil {
				// The old supervisor serves on the socket until it
				// hands over, and on if this one never serves: its file
				// goes only once this one serves.
				if ul, ok := adopted.(*net.UnixListener); ok {
					ul.SetUnlinkOnClose(false)
					orphan = ul.Addr().String()
				}
				adopted.Close()
			}
			return nil
		}
		a.log = log
		if adopted != nil {
			ln = adopted
		}
		capped = capListener(ln, defaultAdminLimits.maxConns, log)
		srv = newAdminServer(a.mux(), defaultAdminLimits, capped, log)
		if adopted != nil {
			serveWhenReady = true
			log.Info("admin endpoint taken over; served once this supervisor serves", "listen", adminAddrString(ln))
		} else {
			serve(log)
			log.Info("admin endpoint listening", "listen", adminAddrString(ln))
		}
		if why := adminExposure(cfg.Admin.Listen); why != "" {
			log.Warn("admin endpoint reachable from other hosts: /metrics and /status answer without a token; keep admin.listen on loopback or a unix: socket", "listen", cfg.Admin.Listen, "why", why)
		}
		return nil
	}
	opts.Finish = func(r *shm.Region, s prefork.Settings, log *slog.Logger) error {
		a.stopActions() // before the dump: what they change would not be in it
		var err error
		if finish != nil {
			err = finish(r, s, log)
		}
		if srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			srv.Shutdown(ctx)
			cancel()
		}
		a.closeRedis()
		return err
	}
}

// mux routes the admin endpoints; the actions come from adminActions.
// What no route serves is answered with problem+json, as everything
// else: 405 with Allow for a known path and another method, else 404.
func (a *admin) mux() http.Handler {
	mux := http.NewServeMux()
	allow := map[string][]string{} // path → methods
	handle := func(pattern string, h http.Handler) {
		mux.Handle(pattern, h)
		method, path, _ := strings.Cut(pattern, " ")
		allow[path] = append(allow[path], method)
		if method == http.MethodGet {
			allow[path] = append(allow[path], http.MethodHead)
		}
	}
	handle("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprintln(w, "ok")
	}))
	handle("GET /readyz", http.HandlerFunc(a.serveReady))
	handle("GET /metrics", http.HandlerFunc(a.serveMetrics))
	handle("GET /status", http.HandlerFunc(a.serveStatus))
	for _, act := range adminActions {
		serve := act.serve
		handle(act.pattern, a.authorize(func(w http.ResponseWriter, r *http.Request) { serve(a, w, r) }))
	}
	for path, methods := range allow {
		allowed := strings.Join(methods, ", ")
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allowed)
			writeProblem(w, http.StatusMethodNotAllowed, "Method Not Allowed", r.Method+" is not served here; "+path+" takes "+allowed)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, "Not Found", "no admin endpoint at this path: /healthz, /readyz, /metrics, /status and the actions README lists")
	})
	return mux
}

// adminAddrString is the address the admin listener serves on, as
// admin.listen writes it.
func adminAddrString(ln net.Listener) string {
	if ln.Addr().Network() == "unix" {
		return adminUnix + ln.Addr().String()
	}
	return ln.Addr().String()
}

// serveReady answers 200 while the instance serves (prefork.Status.Serving):
// every worker was ready once, no drain has begun, a ready worker serves.
// Before that and from the drain on, 503 with the reason.
func (a *admin) serveReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	st := a.status.Load()
	switch {
	case st != nil && st.Serving:
		fmt.Fprintln(w, "ready")
		return
	case st != nil && st.Draining:
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready: draining")
	default:
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready: workers starting")
	}
}

// errNotStarted is control's error before the workers have started.
var errNotStarted = errors.New("admin: the supervisor has not started its workers yet")

// control is a core.Control over the rules of the running configuration,
// built again after a reload; with Redis rules it has a Redis store of
// its own (the supervisor has not joined the region: the store only looks
// up and resets keys). When it cannot be built, control answers the
// request (503) and ok is false: the reason is logged, never sent.
func (a *admin) control(w http.ResponseWriter) (ctl *core.Control, ok bool) {
	ctl, err := a.buildControl()
	switch {
	case err == nil:
		return ctl, true
	case errors.Is(err, errNotStarted):
		writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable", "the workers have not started yet; try again")
	default:
		a.log.Error("admin: cannot act on the running configuration", "err", err)
		writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable", "the admin endpoint cannot act on the running configuration; see the log")
	}
	return nil, false
}

func (a *admin) buildControl() (*core.Control, error) {
	st := a.status.Load()
	if st == nil {
		return nil, errNotStarted
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ctl != nil && a.ctlGen == st.Generation {
		return a.ctl, nil
	}
	o, err := runningConfig(st).CoreOptions()
	if err != nil {
		return nil, err
	}
	var store core.SharedStore
	if usesRedis(o) {
		ro := runningConfig(st).WithDefaults().Redis.StoreOptions()
		ro.Logger = a.log
		s, err := redisstore.New(a.region, ro)
		if err != nil {
			return nil, err
		}
		store, o.Redis = s, core.RedisRules(s)
	}
	ctl, err := core.NewControl(a.region, o)
	if err != nil {
		if store != nil {
			store.Close()
		}
		return nil, err
	}
	// An action still running on the old store gets an error (503): only
	// a reload replaces it.
	if a.redis != nil {
		a.redis.Close()
	}
	a.ctl, a.ctlGen, a.redis = ctl, st.Generation, store
	return ctl, nil
}

// closeRedis closes the Redis store of the admin's control, if any.
func (a *admin) closeRedis() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.redis != nil {
		a.redis.Close()
		a.redis, a.ctl = nil, nil
	}
}

// writeJSON answers 200 with v as one line of JSON (jq makes it pretty).
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(v)
}

func pid() int { return os.Getpid() }

// writeProblem writes an RFC 9457 problem+json answer.
func writeProblem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail})
}

// redisStatus is /status's view of [redis]: where it is (no password),
// which rules use it, and the breaker the workers share, read from the
// region.
func redisStatus(r *shm.Region, cfg config.Config) map[string]any {
	rd := cfg.WithDefaults().Redis
	target := map[string]any{}
	switch {
	case rd.URL != "":
		target["url"] = rd.URL.String()
	case len(rd.Cluster) > 0:
		target["cluster"] = config.RedactedURLs(rd.Cluster)
	default:
		target["sentinel"] = map[string]any{"master": rd.Sentinel.Master, "addrs": config.RedactedURLs(rd.Sentinel.Addrs)}
	}
	rules := []map[string]any{}
	for _, rl := range cfg.RateLimits {
		if rl.Store == config.StoreRedis {
			rules = append(rules, map[string]any{"name": rl.Name, "on_unavailable": rl.OnUnavailable.String(),
				"local_share": rl.LocalShare, "sync": rl.Sync.String()})
		}
	}
	b := redisstore.ReadBreaker(r, rd.StoreOptions(), r.Now())
	breaker := map[string]any{"state": b.Phase.String(), "failures": b.Failures,
		"threshold": rd.BreakerFailures, "backoff": rd.BreakerBackoff.String()}
	switch b.Phase {
	case redisstore.Open:
		breaker["open_for"] = b.Until.String()
	case redisstore.HalfOpen:
		breaker["prober"] = b.Prober
		breaker["probe_deadline_in"] = b.Until.String()
	}
	return map[string]any{"target": target, "timeout": rd.Timeout.String(), "prefix": rd.Prefix,
		"rules": rules, "breaker": breaker}
}

// quietRedisLog sends go-redis's own log lines (one per failed dial) to
// log at debug level: the breaker logs what an operator acts on, once.
func quietRedisLog(log *slog.Logger) {
	redis.SetLogger(redisLog{log})
}

type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.Log(ctx, slog.LevelDebug, "redis client: "+fmt.Sprintf(format, v...))
}

// supervisorCounts are the counts of a prefork.Status that carry moves
// into the region: workers crashed and recycled, reloads accepted,
// refused and aborted.
type supervisorCounts [shm.SupervisorWords]int

func countsOf(st *prefork.Status) []*int {
	return []*int{&st.Crashes, &st.Recycled, &st.Reloads.Accepted, &st.Reloads.Refused, &st.Reloads.Aborted}
}

// carry adds what st counts beyond the last snapshot (c) to the region's
// words, and sets st's counts to their totals there. A supervisor's
// counts start at zero, but the region's go on while it lives, as the
// workers' do: across a binary upgrade, whose two supervisors both add
// to them, and a restart that attaches a persist.live region again. So
// no counter of /metrics goes back while any other goes on.
func (c *supervisorCounts) carry(words []uint64, st *prefork.Status) {
	for i, n := range countsOf(st) {
		if *n > c[i] {
			atomic.AddUint64(&words[i], uint64(*n-c[i]))
		}
		c[i] = *n
		*n = int(atomic.LoadUint64(&words[i]))
	}
}

// instanceFile names the file Handover gives a new supervisor with the
// instance's start (admin.instance).
const instanceFile = "admin.instance"

// instance is a pipe that holds the instance's start in Unix nanoseconds,
// for the new supervisor of a binary upgrade, so that
// preforkd_start_time_seconds stays, as the counts go on.
func (a *admin) instance() (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	_, err = fmt.Fprintf(w, "%d", a.since.UnixNano())
	w.Close()
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// adoptInstance reads what instance handed over; without it (an older
// build's upgrade), the instance starts with this supervisor.
func (a *admin) adoptInstance(f *os.File) {
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 64))
	if start, err := strconv.ParseInt(string(b), 10, 64); err == nil && start > 0 {
		a.since = time.Unix(0, start)
	}
}

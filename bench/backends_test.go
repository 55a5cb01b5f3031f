package bench

import (
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"
	_ "modernc.org/sqlite" // registers the "sqlite" driver (pure Go, no cgo)

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
)

// skipError means a backend cannot run on this machine (a missing server):
// its benchmarks and tests are skipped with the reason.
type skipError struct{ reason string }

func (e skipError) Error() string { return e.reason }

// gcraParams is rule's GCRA in microseconds, as bucket computes it: the
// emission interval t (rounded up, so the rate is never exceeded) and the
// capacity tau = burst × t. The Redis and SQLite contenders use it so that
// every backend decides alike.
func gcraParams(rule bucket.Rule) (t, tau int64) {
	window := int64(rule.Window / time.Microsecond)
	burst := rule.Burst
	if burst == 0 {
		burst = rule.Limit
	}
	t = (window + rule.Limit - 1) / rule.Limit
	return t, t * burst
}

// shmDecider is preforkd's own path: a bucket.Limiter on a memfd region,
// reading the region's clock.
type shmDecider struct {
	r   *shm.Region
	lim *bucket.Limiter
}

func openShm(tb testing.TB, rule bucket.Rule) (decider, error) {
	r, err := shm.Create(shm.Options{Counters: numSlots})
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { r.Close() })
	if err := r.Join(0); err != nil {
		return nil, err
	}
	lim, err := bucket.NewLimiter(rule, r.Counters())
	if err != nil {
		return nil, err
	}
	return &shmDecider{r: r, lim: lim}, nil
}

func (d *shmDecider) decide(key string) (bool, error) {
	return d.lim.Allow(key, d.r.Now()).Allowed, nil
}

// mutexMap is the usual in-process limiter: one x/time/rate.Limiter per key
// in a map under a mutex, created on first sight.
type mutexMap struct {
	mu    sync.Mutex
	m     map[string]*rate.Limiter
	limit rate.Limit
	burst int
}

func openMutexMap(_ testing.TB, rule bucket.Rule) (decider, error) {
	burst := rule.Burst
	if burst == 0 {
		burst = rule.Limit
	}
	return &mutexMap{
		m:     make(map[string]*rate.Limiter),
		limit: rate.Limit(float64(rule.Limit) / rule.Window.Seconds()),
		burst: int(burst),
	}, nil
}

func (d *mutexMap) decide(key string) (bool, error) {
	now := time.Now()
	d.mu.Lock()
	lim, ok := d.m[key]
	if !ok {
		lim = rate.NewLimiter(d.limit, d.burst)
		d.m[key] = lim
	}
	d.mu.Unlock()
	return lim.AllowN(now, 1), nil
}

// sqliteUpsert is one GCRA decision in one statement. ?1 key, ?2 now, ?3 the
// emission interval t, ?4 the capacity tau (µs). A new key is inserted with
// tat = now + t (always allowed: t ≤ tau). An existing key is updated only
// when the request conforms; a refusal updates nothing, so RETURNING yields
// no row and the caller sees sql.ErrNoRows.
const sqliteUpsert = `INSERT INTO gcra(key, tat) VALUES (?1, ?2 + ?3)
ON CONFLICT(key) DO UPDATE SET tat = max(tat, ?2) + ?3
	WHERE max(tat, ?2) + ?3 - ?2 <= ?4
RETURNING tat`

// sqliteDecider keeps each key's theoretical arrival time in a WAL-mode file
// database. It holds one connection: SQLite admits one writer at a time,
// and every decision writes, so more connections would only add busy waits.
type sqliteDecider struct {
	db     *sql.DB
	stmt   *sql.Stmt
	t, tau int64
}

func openSQLite(tb testing.TB, rule bucket.Rule) (decider, error) {
	path := filepath.Join(tb.TempDir(), "gcra.db")
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=busy_timeout(5000)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	var mode string
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil {
		return nil, err
	}
	if mode != "wal" {
		return nil, fmt.Errorf("sqlite: journal_mode is %q, want wal", mode)
	}
	if _, err := db.Exec(`CREATE TABLE gcra (key TEXT PRIMARY KEY, tat INTEGER NOT NULL) WITHOUT ROWID`); err != nil {
		return nil, err
	}
	stmt, err := db.Prepare(sqliteUpsert)
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { stmt.Close() })
	t, tau := gcraParams(rule)
	return &sqliteDecider{db: db, stmt: stmt, t: t, tau: tau}, nil
}

func (d *sqliteDecider) decide(key string) (bool, error) {
	now := time.Now().UnixMicro()
	var tat int64
	switch err := d.stmt.QueryRow(key, now, d.t, d.tau).Scan(&tat); {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

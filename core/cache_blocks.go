package core

import (
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"time"

	"github.com/preforkd/preforkd/core/httpcache"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// Cache is one compiled response cache block. It stores what the
// application marks fresh (Cache-Control s-maxage or max-age, Expires),
// never a private, no-store or Set-Cookie response, nor one to a request
// with Authorization unless it says public, s-maxage or must-revalidate
// (README.md "Response cache" has every rule). A request with cookies is
// answered from the cache like any other: a response meant for one
// client says private, or Vary on what tells clients apart.
type Cache struct {
	// Route is the block's path, and the methods answered from the cache:
	// GET, and optionally HEAD (answered from GET's entries), as in
	// route.MustCompile("/pages/*", []string{"GET", "HEAD"}); a route of
	// every method (nil) is refused. A
	// successful unsafe request (POST, PUT, DELETE, ...) to the path
	// invalidates its entries whatever the methods.
	Route route.Route
	// TTL caps how long an entry is fresh, whatever the response says,
	// and each of its stale windows; must be positive.
	TTL time.Duration
	// MaxBody is the largest body stored; larger responses are passed
	// through and not stored. Must be positive, at most 1 GiB.
	MaxBody int64
	// TagHeaders are the response fields whose values tag an entry, for
	// purges. nil means Cache-Tag and Surrogate-Key; empty means none.
	TagHeaders []string
	// LockTimeout is how long a miss waits for another request's fetch of
	// the same response (in any process) before it fetches itself,
	// without storing; 0 means it does not wait.
	LockTimeout time.Duration
	// Heuristic lets a response without explicit freshness (no
	// Cache-Control max-age or s-maxage, no Expires) but with a
	// Last-Modified be fresh for a tenth of the time from its
	// Last-Modified to its Date (RFC 9111 §4.2.2), for the statuses RFC
	// 9110 §15.1 makes heuristically cacheable. Off, such responses are
	// not stored.
	Heuristic bool
	// Targeted is the cache's own targeted cache-control field (RFC
	// 9213): when a response has it, valid, its directives decide, before
	// CDN-Cache-Control's and instead of Cache-Control's and Expires. It
	// is never sent to clients (it speaks to this cache alone);
	// CDN-Cache-Control is, for the CDNs in front. Empty means
	// DefaultTargeted.
	Targeted string
	// Since is the region time (shm.Region.Now) from which the block
	// serves stored responses: one stored before it is a miss, and is
	// replaced. A program that adds a block to a running region sets it
	// to the time it adds it: while no block covered a URL, an unsafe
	// request to it invalidated nothing, so a response stored under an
	// earlier block may be one that request changed. 0 serves every
	// stored response.
	Since time.Duration
}

// DefaultTargeted is the targeted field a cache block obeys when
// Cache.Targeted is empty.
const DefaultTargeted = "Preforkd-Cache-Control"

// cdnCacheControl is the targeted field of every CDN (RFC 9213 §3), second
// on each block's target list.
const cdnCacheControl = "Cdn-Cache-Control"

// maxCacheBody bounds MaxBody: an entry's length is 32 bits.
const maxCacheBody = 1 << 30

var defaultTagHeaders = []string{"Cache-Tag", "Surrogate-Key"}

// Check reports what is wrong with a block, as New would; every problem
// is a *FieldError.
func (d *Cache) Check() error {
	fail := func(field, format string, args ...any) error {
		return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	ms := d.Route.Methods()
	get := false
	for _, m := range ms {
		switch m {
		case http.MethodGet:
			get = true
		case http.MethodHead:
		default:
			return fail("Methods", "methods: only GET and HEAD are answered from a cache, not %s (unsafe requests invalidate it whatever the methods)", m)
		}
	}
	switch {
	case !get:
		return fail("Methods", "methods: must include GET (HEAD is answered from what GET stored)")
	case d.TTL <= 0 || d.TTL > maxTTL:
		return fail("TTL", "ttl: must be positive and at most %v, got %v", maxTTL, d.TTL)
	case d.MaxBody <= 0 || d.MaxBody > maxCacheBody:
		return fail("MaxBody", "max_body: must be positive and at most %d, got %d", maxCacheBody, d.MaxBody)
	case d.LockTimeout < 0 || d.LockTimeout > maxTTL:
		return fail("LockTimeout", "lock_timeout: must be between 0 and %v, got %v", maxTTL, d.LockTimeout)
	}
	for _, h := range d.TagHeaders {
		if !route.IsToken(h) {
			return fail("TagHeaders", "tag_headers: %q is not a valid header name", h)
		}
	}
	if t := d.Targeted; t != "" && !route.IsToken(t) {
		return fail("Targeted", "targeted: %q is not a valid header name", t)
	}
	if t := textproto.CanonicalMIMEHeaderKey(d.Targeted); t == cdnCacheControl || t == "Cache-Control" {
		return fail("Targeted", "targeted: %s is not a field of this cache's own (CDN-Cache-Control and Cache-Control are obeyed anyway)", d.Targeted)
	}
	return nil
}

// cacheBlock is one compiled cache block.
type cacheBlock struct {
	route       route.Route
	head        bool // HEAD is answered from the cache
	ttl         time.Duration
	maxBody     int64
	tagHeaders  []string // canonical
	lockTimeout time.Duration
	since       time.Duration    // entries stored before it are not served
	policy      httpcache.Policy // TTL, heuristic and the target list
	own         string           // the block's targeted field (canonical): hidden
	hide        []string         // Forward.Hide: own
}

// installCache compiles the blocks of ds and installs the stage that
// runs them (CacheBlocks).
func (c *Core) installCache(ds []Cache) error {
	if len(ds) == 0 {
		return nil
	}
	if c.region.Responses().Len() == 0 || c.region.Tags().Len() == 0 {
		return fmt.Errorf("core: %w (cache blocks need one: "+howResponses+")", shm.ErrNoResponses)
	}
	for i := range ds {
		d := &ds[i]
		if err := d.Check(); err != nil {
			return fmt.Errorf("core: cache block %d: %s", i+1, err.(*FieldError).Msg)
		}
		b := &cacheBlock{
			route:       d.Route,
			head:        slices.Contains(d.Route.Methods(), http.MethodHead),
			ttl:         d.TTL,
			maxBody:     d.MaxBody,
			lockTimeout: d.LockTimeout,
			since:       d.Since,
		}
		b.own = DefaultTargeted
		if d.Targeted != "" {
			b.own = textproto.CanonicalMIMEHeaderKey(d.Targeted)
		}
		b.hide = []string{b.own}
		b.policy = httpcache.Policy{TTL: d.TTL, Heuristic: d.Heuristic, Targets: []string{b.own, cdnCacheControl}}
		tags := d.TagHeaders
		if tags == nil {
			tags = defaultTagHeaders
		}
		for _, h := range tags {
			b.tagHeaders = append(b.tagHeaders, textproto.CanonicalMIMEHeaderKey(h))
		}
		c.caches = append(c.caches, b)
	}
	c.steps[stepCache] = (*Exchange).decideCache
	c.steps[stepCacheWait] = (*Exchange).lookup
	c.cache = &stageHooks{
		forward:  (*Exchange).cacheForward,
		head:     (*Exchange).cacheHead,
		fallback: (*Exchange).fallback,
		complete: (*Exchange).completeCache,
		release:  (*Exchange).releaseCache,
		refresh:  (*Exchange).startRefresh,
	}
	return nil
}

// startRefresh starts the background refresh by by, which has a method
// Refresh(*Exchange) (see RefreshBy), and reports whether it has one.
func (ex *Exchange) startRefresh(by any) bool {
	r, ok := by.(interface{ Refresh(*Exchange) })
	if ok {
		r.Refresh(ex)
	}
	return ok
}

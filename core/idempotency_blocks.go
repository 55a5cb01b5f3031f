package core

import (
	"fmt"
	"net/textproto"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// block is one compiled idempotency block.
type block struct {
	route    route.Route
	header   string // canonical header name
	required bool
	ttl      time.Duration
	wait     time.Duration
	by       clientip.By
	maxBody  int64
	ns       uint64 // key namespace: the block's path, so that reloads keep records
	// maxRecords bounds the records of one client (one account: a hash of
	// the namespace and the client's `by` key), and those of one client
	// address (an account of the address set: a hash of the namespace and
	// the address as rules key it).
	maxRecords int
	problems   [nProblems]Problem
}

// DefaultIdempotencyHeader is the field that carries the key when a
// block names none (IdempotencyBlock.Header "").
const DefaultIdempotencyHeader = "Idempotency-Key"

// maxTTL bounds a block's ttl: the longest span the region's times are
// meant to count, as for a rule's window.
const maxTTL = bucket.MaxWindow

// FieldError is an option the core refuses: Field names it (as the field
// of Idempotency, say: "TTL"), Msg says what is wrong, and Rule is the
// name of the rate-limit rule it is an option of ("" for none), which
// Error puts before Msg: a caller that names the rule itself reads Msg.
type FieldError struct {
	Field, Msg string
	Rule       string
}

func (e *FieldError) Error() string {
	if e.Rule != "" {
		return `core: rule "` + e.Rule + `": ` + e.Msg
	}
	return "core: " + e.Msg
}

// Check reports what is wrong with a block, as New would; every problem
// is a *FieldError.
func (d *Idempotency) Check() error {
	fail := func(field, format string, args ...any) error {
		return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case d.Route.String() == "": // the zero Route matches no request
		return fail("Route", "no route: give it one (route.Compile)")
	case d.Header != "" && !route.IsToken(d.Header):
		return fail("Header", "header: %q is not a valid header name", d.Header)
	case d.TTL <= 0 || d.TTL > maxTTL:
		return fail("TTL", "ttl: must be positive and at most %v, got %v", maxTTL, d.TTL)
	case d.Wait < 0:
		return fail("Wait", "wait: must not be negative, got %v", d.Wait)
	case d.MaxBody <= 0:
		return fail("MaxBody", "max_body: must be positive, got %d", d.MaxBody)
	case d.MaxRecords < 0:
		return fail("MaxRecords", "max_records: must not be negative (0 means 1%% of the table, at least 16), got %d", d.MaxRecords)
	}
	return nil
}

// installIdempotency compiles the blocks of ds and installs the stage
// that runs them (IdempotencyBlocks).
func (c *Core) installIdempotency(ds []Idempotency) error {
	if len(ds) == 0 {
		return nil
	}
	if c.region.Responses().Len() == 0 {
		return fmt.Errorf("core: %w (idempotency blocks need one: "+howResponses+")", shm.ErrNoResponses)
	}
	for i := range ds {
		d := &ds[i]
		if err := d.Check(); err != nil {
			return fmt.Errorf("core: idempotency block %d: %s", i+1, err.(*FieldError).Msg)
		}
		header := d.Header
		if header == "" {
			header = DefaultIdempotencyHeader
		}
		b := &block{
			route:      d.Route,
			header:     textproto.CanonicalMIMEHeaderKey(header),
			required:   d.Required,
			ttl:        d.TTL,
			wait:       d.Wait,
			by:         d.By,
			maxBody:    d.MaxBody,
			maxRecords: d.MaxRecords,
			// The route's path, not its methods: a reload that adds a
			// method keeps the records, and the fingerprint (which has the
			// method) tells a POST from a PATCH under one key.
			ns: xxhash.Sum64String("idempotency\x00" + d.Route.String()),
		}
		if b.maxRecords == 0 {
			b.maxRecords = DefaultMaxRecords(c.region.Responses().Len())
		}
		for p := range b.problems {
			b.problems[p] = newIdemProblem(problemKind(p), b, c.maxReq)
		}
		c.blocks = append(c.blocks, b)
	}
	c.steps[stepDeclaredSize] = (*Exchange).declaredTooLarge
	c.steps[stepIdempotency] = (*Exchange).idempotency
	c.steps[stepIdempotencyWait] = (*Exchange).reserveAgain
	c.idem = &stageHooks{complete: (*Exchange).completeIdem, release: (*Exchange).releaseIdem}
	return nil
}

// Idempotency is one compiled idempotent-replay block.
type Idempotency struct {
	// Route is the requests the block keeps (route.Compile). Required:
	// the zero Route matches none, and is refused.
	Route route.Route
	// Header carries the key. "" means "Idempotency-Key".
	Header string
	// Required makes a request without the header a 400.
	Required bool
	// TTL is how long a completed response is replayable; must be positive.
	TTL time.Duration
	// Wait is how long a duplicate waits for an original in flight before
	// it gets 409; 0 means it does not wait.
	Wait time.Duration
	// By is the key namespace: the same key from two clients never
	// collides.
	By clientip.By
	// MaxBody is the largest response stored for replay; must be positive.
	MaxBody int64
	// MaxRecords bounds the records one client (one namespace: the
	// block's path and the client's By key) holds, reserved or stored,
	// and also those of one client address (the address By's "ip" keys
	// by, IPv6 masked to the resolver's prefix), whatever By keys its
	// requests came with: values a client invents for a header never
	// widen its share. Past either, that client gets 429 and other
	// clients are unaffected. 0 means DefaultMaxRecords of the response
	// table. Clients and addresses are counted in 65,536 buckets each (a
	// hash seeded per region): two in one bucket share its budget.
	MaxRecords int
}

// DefaultMaxRecords is a block's MaxRecords when it sets none: 1% of the
// response table's records, at least 16.
func DefaultMaxRecords(records int) int { return max(records/100, 16) }

// howResponses says how a region gets a response table, for the error of
// a stage that needs one.
const howResponses = "create the region with shm.Options.Responses, prefork.Options.Region's in a supervised program"

package core

import "context"

// The optional stages, idempotent replay and the response cache, are
// reached only through what their constructor installs: a program that
// builds neither (a rate limit in front of its own handler) links none of
// their code, which with the response table's is 100 KB of machine code
// (a quarter of what preforkd adds to a net/http program).

// Stage is an optional stage of a Core, over blocks of type B: idempotent
// replay (Options.Idempotency, built by IdempotencyBlocks), the response
// cache (Options.Caches, built by CacheBlocks) or the Redis rules'
// round trip (Options.Redis, built by RedisRules over one store). The
// zero value is no stage.
type Stage[B any] struct {
	blocks  []B
	install func(*Core, []B) error
}

// IdempotencyBlocks is the idempotent-replay stage of blocks: the first
// whose route matches a request applies. New checks them.
func IdempotencyBlocks(blocks ...Idempotency) Stage[Idempotency] {
	return Stage[Idempotency]{blocks: blocks, install: (*Core).installIdempotency}
}

// CacheBlocks is the response cache stage of blocks: the first whose path
// matches a request applies. New checks them.
func CacheBlocks(blocks ...Cache) Stage[Cache] {
	return Stage[Cache]{blocks: blocks, install: (*Core).installCache}
}

// RedisRules is the stage that decides the rules whose RateLimit.Redis is
// set in store (a redisstore.Store), for Options.Redis; nil is no stage.
// Its code, the round trip's, is linked only into a program that calls
// it.
func RedisRules(store SharedStore) Stage[SharedStore] {
	if store == nil {
		return Stage[SharedStore]{}
	}
	return Stage[SharedStore]{blocks: []SharedStore{store}, install: (*Core).installRedis}
}

// installRedis makes s's store the Core's, and its round trip a step.
func (c *Core) installRedis(s []SharedStore) error {
	c.redis = s[0]
	c.redisCtx, c.cutRedis = context.WithCancel(context.Background())
	c.steps[stepRedis] = (*Exchange).rateLimitRemote
	c.preRedis = (*Exchange).preRedis
	return nil
}

// Blocks are the stage's blocks, in order (nil for the zero value).
func (s Stage[B]) Blocks() []B { return s.blocks }

// installIn installs the stage in c, if there is one.
func (s Stage[B]) installIn(c *Core) error {
	if s.install == nil {
		return nil
	}
	return s.install(c, s.blocks)
}

// stageHooks are an optional stage's code, as the exchange reaches it
// outside the decision's steps; a hook that a stage does not need is nil.
type stageHooks struct {
	// forward completes the Forward of a request the stage runs.
	forward func(*Exchange, Forward) Forward
	// head sees the application's response head: it returns what to send
	// instead, or nil.
	head func(*Exchange, int, Header) *Response
	// fallback is what to send in place of a failed response, or nil.
	fallback func(*Exchange, int) *Response
	// complete is given what was recorded of the application's response.
	complete func(*Exchange, *recorded)
	// release ends the stage's part of an exchange.
	release func(*Exchange)
	// refresh starts a background refresh by an engine's value (RefreshBy).
	refresh func(*Exchange, any) bool
}

// passStep is the step of a stage a Core was not built with.
func passStep(*Exchange) (Verdict, bool) { return Pass, false }

// installStages installs the optional stages of opts: until then, their
// steps pass.
func (c *Core) installStages(opts *Options) error {
	for s := len(baseSteps); s < len(c.steps); s++ {
		c.steps[s] = passStep
	}
	if err := opts.Idempotency.installIn(c); err != nil {
		return err
	}
	return opts.Caches.installIn(c)
}

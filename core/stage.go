package core

// The optional stages, idempotent replay and the response cache, are
// reached only through what their constructor installs: a program that
// builds neither (a rate limit in front of its own handler) links none of
// their code, which with the response table's is 100 KB of machine code
// (a quarter of what preforkd adds to a net/http program).

// IdempotencyStage is the idempotent-replay stage of a Core
// (Options.Idempotency), built by IdempotencyBlocks. The zero value is no
// stage.
type IdempotencyStage struct {
	blocks  []Idempotency
	install func(*Core, []Idempotency) error
}

// IdempotencyBlocks is the idempotent-replay stage of blocks: the first
// whose route matches a request applies. New checks them.
func IdempotencyBlocks(blocks ...Idempotency) IdempotencyStage {
	return IdempotencyStage{blocks: blocks, install: (*Core).installIdempotency}
}

// Blocks are the stage's blocks, in order (nil for the zero value).
func (s IdempotencyStage) Blocks() []Idempotency { return s.blocks }

// CacheStage is the response cache stage of a Core (Options.Caches),
// built by CacheBlocks. The zero value is no stage.
type CacheStage struct {
	blocks  []Cache
	install func(*Core, []Cache) error
}

// CacheBlocks is the response cache stage of blocks: the first whose path
// matches a request applies. New checks them.
func CacheBlocks(blocks ...Cache) CacheStage {
	return CacheStage{blocks: blocks, install: (*Core).installCache}
}

// Blocks are the stage's blocks, in order (nil for the zero value).
func (s CacheStage) Blocks() []Cache { return s.blocks }

// stage is an optional stage's code, as the exchange's steps outside the
// decision reach it; a hook that a stage does not need is nil.
type stage struct {
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
}

// passStep is the step of a stage a Core was not built with.
func passStep(*Exchange) (Verdict, bool) { return Pass, false }

// installStages installs the optional stages of opts: until then, their
// steps pass.
func (c *Core) installStages(opts *Options) error {
	for s := len(baseSteps); s < len(c.steps); s++ {
		c.steps[s] = passStep
	}
	if opts.Idempotency.install != nil {
		if err := opts.Idempotency.install(c, opts.Idempotency.blocks); err != nil {
			return err
		}
	}
	if opts.Caches.install != nil {
		if err := opts.Caches.install(c, opts.Caches.blocks); err != nil {
			return err
		}
	}
	return nil
}

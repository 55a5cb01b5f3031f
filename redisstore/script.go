package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// decideScript decides every Redis rule of one request at once, from
// Redis's own clock (TIME), so that the hosts' clocks never matter.
//
// KEYS are the rules' keys. ARGV[1] is "d" (decide), "r" (refund) or "p"
// (peek), then
// five numbers per key: the algorithm (0 GCRA, 1 fixed window), a and b
// (GCRA: the emission interval and the capacity in µs; fixed window: the
// limit and the window in µs), the cost of the request, and 1 for a shadow
// rule (it never refuses).
//
// Deciding, it first looks at every key; when an enforcing rule refuses,
// it writes nothing and returns {1, per key: would-pass, remaining, reset,
// retry, remaining and reset before the charge} with each rule's state as
// it stands. Otherwise it charges every rule that lets the request through
// (a shadow rule that would refuse is not charged, as on the local table)
// and returns {0, per key: allowed, remaining, reset, retry, remaining and
// reset before the charge}. Times are µs. A GCRA key holds its
// theoretical arrival time, a fixed-window key "window:count"; both
// expire when they are as a fresh key.
//
// Refunding gives back one request's cost on every key, as
// bucket.Policy.Refund does: never more than the current window or the
// bucket holds.
//
// Peeking (an operator's look at a key) decides as deciding does and
// writes nothing: it returns {0, per key: would-pass, remaining, reset,
// retry, 1 if the key exists, 0}, each rule's state as it stands.
const decideScript = `
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local n = #KEYS
local refund = ARGV[1] == 'r'
local peek = ARGV[1] == 'p'
local out = {0}
local writes = {}
local refused = false
for i = 1, n do
	local o = 2 + (i - 1) * 5
	local algo = tonumber(ARGV[o])
	local a = tonumber(ARGV[o + 1])
	local b = tonumber(ARGV[o + 2])
	local cost = tonumber(ARGV[o + 3])
	local shadow = ARGV[o + 4] == '1'
	local ok, rem, reset, retry, prem, preset, val, ttl
	local exists = 0
	if algo == 0 then
		local stored = redis.call('GET', KEYS[i])
		if stored then exists = 1 end
		local tat = tonumber(stored or 0)
		if refund then
			if tat > now then
				tat = math.max(tat - cost * a, now)
				writes[i] = {string.format('%.0f', tat), tat - now}
			end
		else
			if tat < now then tat = now end
			local nt = tat + cost * a
			prem = math.floor(math.max(b - (tat - now), 0) / a)
			preset = tat - now
			if nt - now > b then
				ok, rem, reset, retry = 0, prem, preset, nt - b - now
			else
				ok, rem, reset, retry = 1, math.floor((b - (nt - now)) / a), nt - now, 0
				val, ttl = string.format('%.0f', nt), nt - now
			end
		end
	else
		local w = math.floor(now / b)
		local cnt = 0
		local v = redis.call('GET', KEYS[i])
		if v then
			exists = 1
			local sw, sc = string.match(v, '^(%d+):(%d+)$')
			sw, sc = tonumber(sw), tonumber(sc)
			if sw and sw >= w then
				w, cnt = sw, sc
			end
		end
		reset = (w + 1) * b - now
		if refund then
			if cnt > 0 then
				writes[i] = {string.format('%.0f:%.0f', w, cnt - math.min(cost, cnt)), reset}
			end
		else
			-- a lower limit (a reload, another host) may find more counted
			prem, preset = math.max(a - cnt, 0), reset
			if cnt + cost > a then
				ok, rem, retry = 0, prem, reset
			else
				ok, rem, retry = 1, a - cnt - cost, 0
				val, ttl = string.format('%.0f:%.0f', w, cnt + cost), reset
			end
		end
	end
	if peek then
		out[#out + 1] = ok
		out[#out + 1] = prem
		out[#out + 1] = preset
		out[#out + 1] = retry
		out[#out + 1] = exists
		out[#out + 1] = 0
	elseif not refund then
		if ok == 0 and not shadow then refused = true end
		if val then writes[i] = {val, ttl} end
		out[#out + 1] = ok
		out[#out + 1] = rem
		out[#out + 1] = reset
		out[#out + 1] = retry
		out[#out + 1] = prem
		out[#out + 1] = preset
	end
end
if peek then
	return out
end
if refused then
	out[1] = 1
	for i = 1, n do
		local o = 2 + (i - 1) * 6
		if out[o] == 1 then
			out[o + 1], out[o + 2] = out[o + 4], out[o + 5]
		end
	end
	return out
end
for i = 1, n do
	local w = writes[i]
	if w then
		redis.call('SET', KEYS[i], w[1], 'PX', math.floor(w[2] / 1000) + 1)
	end
end
return out
`

// flushScript adds one host's count to a sync-mode key. KEYS[1] is the
// key of one window; ARGV: this host's name, the count to add, the key's
// time to live in ms. It returns {the window's total over every host, this
// host's part of it, Redis's clock in µs}.
const flushScript = `
local total = redis.call('HINCRBY', KEYS[1], 't', ARGV[2])
local mine = redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local tm = redis.call('TIME')
return {total, mine, tonumber(tm[1]) * 1000000 + tonumber(tm[2])}
`

// script is a Lua script run with EVALSHA, and with EVAL when the server
// does not know it (NOSCRIPT: a restart, a failover, SCRIPT FLUSH): EVAL
// also caches it, so the next EVALSHA finds it.
type script struct {
	src, sha string
}

func newScript(src string) script {
	return script{src: src, sha: redis.NewScript(src).Hash()}
}

// isNoScript reports whether err says that the server does not know the
// script.
func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

// run runs the script once: EVALSHA, and EVAL on NOSCRIPT. noscript
// reports that it took the second call.
func (s *script) run(ctx context.Context, c redis.Scripter, keys []string, args []any) (v any, noscript bool, err error) {
	v, err = c.EvalSha(ctx, s.sha, keys, args...).Result()
	if isNoScript(err) {
		v, err = c.Eval(ctx, s.src, keys, args...).Result()
		return v, true, err
	}
	return v, false, err
}

// ints reads a script's reply of integers.
func ints(v any, want int) ([]int64, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) != want {
		return nil, fmt.Errorf("redisstore: the script answered %T of %d values, want %d", v, lenOf(arr), want)
	}
	out := make([]int64, len(arr))
	for i, x := range arr {
		n, ok := x.(int64)
		if !ok {
			return nil, fmt.Errorf("redisstore: the script answered %T at %d, want an integer", x, i)
		}
		out[i] = n
	}
	return out, nil
}

func lenOf(a []any) int { return len(a) }

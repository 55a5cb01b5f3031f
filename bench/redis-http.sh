#!/usr/bin/env bash
# HTTP throughput of one Redis rule against the same rule on the host's
# table, with wrk on loopback: under the limit (every request a Redis
# round trip) and over it (every request answered by the deny cache).
# Prints requests/s and the two ratios the targets talk about: Redis
# under its limit ≥ 0.5 × local, over its limit ≥ 0.95 × local; and the
# Redis rule under its limit on the event loop (the default engine, where
# a round trip is finished off the loop) against the fasthttp engine
# (server.engine = "fasthttp", a goroutine per connection): ≥ 1.0.
#
#   WORKERS=2 DURATION=5 CONNS=32 bash bench/redis-http.sh
set -euo pipefail
. "$(dirname "$0")/lib.sh" 5 18190 # default DURATION and PORT
REDIS_PORT=$UPSTREAM_PORT
need redis-server redis-server

go build -o "$tmp/preforkd" ./cmd/preforkd
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >"$tmp/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$REDIS_PORT" ping >/dev/null || { echo "$me: redis-server did not start on 127.0.0.1:$REDIS_PORT" >&2; exit 1; }

# scripts: how many scripts (EVALSHA, EVAL: one a decision) Redis has run
# so far; the commands inside them are counted apart.
scripts() {
	redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' |
		awk -F'[:=,]' '$1 == "cmdstat_evalsha" || $1 == "cmdstat_eval" {n += $3} END {print n + 0}'
}

declare -A rps
# run NAME STORE LIMIT [ENGINE]: one daemon with one rule on /, then wrk.
run() {
	cat >"$tmp/$1.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
workers = $WORKERS
engine = "${4:-loop}"
[redis]
url = "redis://127.0.0.1:$REDIS_PORT/0"
timeout = "100ms"
[[ratelimit]]
name = "$1"
path = "/*"
limit = $3
window = "1h"
store = "$2"
TOML
	"$tmp/preforkd" run -config "$tmp/$1.toml" 2>"$tmp/$1.log" &
	local pid=$!
	pids+=("$pid")
	wait_up "http://127.0.0.1:$PORT/"
	curl -s -o /dev/null "http://127.0.0.1:$PORT/" # over the limit: the first refusal fills the deny cache
	local out before calls
	before=$(scripts)
	out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:$PORT/")
	calls=$(($(scripts) - before))
	rps[$1]=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
	local non2xx
	non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
	printf '%-22s %12s req/s   non-2xx: %s   redis calls: %s\n' "$1" "${rps[$1]}" "${non2xx:-0}" "$calls"
	local expect=2xx invalid
	[ "$3" = 1 ] && expect=refused
	invalid=$(wrk_invalid "$out" "$expect")
	if [ "$2" = redis ] && [ "$expect" = 2xx ] && [ -z "$invalid" ]; then
		# Under the limit every request is a round trip; a request decided
		# without one (a timeout, the breaker open: on_unavailable lets it
		# through, as a 200) measures no Redis at all.
		invalid=$(awk -v c="$calls" '/ requests in / { if (c < $1 * 0.999) printf "%d requests, %d Redis calls: decided without Redis", $1, c }' <<<"$out")
	fi
	if thrown_out "$invalid"; then
		rps[$1]=n/a
	fi
	stop "$pid"
}

echo "wrk -t$THREADS -c$CONNS -d${DURATION}s, $WORKERS workers, one rule, redis-server on loopback"
# Interleaved, ROUNDS times; the ratios use the best of each (a shared
# machine's noise only ever slows a run down).
ROUNDS=${ROUNDS:-2}
declare -A best
for _ in $(seq "$ROUNDS"); do
	for spec in "local-under local 1000000" "redis-under redis 1000000" "local-over local 1" "redis-over redis 1" \
		"fasthttp-redis-under redis 1000000 fasthttp"; do
		# shellcheck disable=SC2086
		run $spec
		name=${spec%% *}
		if [ -z "${best[$name]:-}" ] || awk -v a="${rps[$name]}" -v b="${best[$name]}" 'BEGIN {exit !(a + 0 > b + 0)}'; then
			best[$name]=${rps[$name]}
		fi
	done
done
for k in local-under redis-under local-over redis-over fasthttp-redis-under; do rps[$k]=${best[$k]}; done
echo "redis/local under the limit: $(ratio "${rps[redis-under]}" "${rps[local-under]}") (target >= 0.5)"
echo "redis/local over the limit (deny cache): $(ratio "${rps[redis-over]}" "${rps[local-over]}") (target >= 0.95)"
echo "redis under the limit, loop/fasthttp engine: $(ratio "${rps[redis-under]}" "${rps[fasthttp-redis-under]}") (target >= 1.0)"

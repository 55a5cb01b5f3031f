#!/usr/bin/env bash
# The event-loop engine (server.engine = "loop", the default) against
# nginx, in alternating pairs: every contender runs at once on a port of
# its own (an idle one costs nothing), and each round measures both of a
# pair back to back, in turns (A then B, then B then A), so that a shared
# machine's drift falls on both alike. Per pair it prints every round and
# the median of the rounds' ratios, which the targets talk about:
#
#   - proxy with one rule vs nginx proxy_pass (keepalive 64) + limit_req,
#     in front of the same 1-worker nginx upstream: ≥ 1.0, and p99 ≤
#     nginx's;
#   - builtin:demo with one rule vs nginx static + limit_req: ≥ 1.0;
#   - proxy rules on / rules off: ≥ 0.95;
#   - one new connection per request (ab -n 20000 -c 32, no keep-alive),
#     proxy with one rule vs nginx: ≥ 0.9;
#   - and, for the record, the loop against the fasthttp engine it
#     replaces (server.engine = "fasthttp").
#
#   WORKERS=2 DURATION=5 CONNS=32 ROUNDS=3 bash bench/loop.sh
set -euo pipefail
. "$(dirname "$0")/lib.sh" 5 18490 # default DURATION and PORT
need nginx nginx-light
need ab apache2-utils
ROUNDS=${ROUNDS:-3}
ABN=${ABN:-20000}

go build -o "$tmp/preforkd" ./cmd/preforkd

rule='
[[ratelimit]]
name = "all"
path = "/*"
limit = 1000000
window = "1s"'

# preforkd NAME PORT UPSTREAM RULES [ENGINE]: a daemon in the background.
preforkd() {
	local conf=$tmp/$1.toml
	printf '[server]\nlisten = "127.0.0.1:%s"\nworkers = %s\nupstream = "%s"\nengine = "%s"\n' "$2" "$WORKERS" "$3" "${5:-loop}" >"$conf"
	[ "$4" = off ] || echo "$rule" >>"$conf"
	"$tmp/preforkd" run -config "$conf" 2>"$tmp/$1.log" &
	pids+=("$!")
}

# nginx_at NAME PORT LOCATION-BODY LIMIT: an nginx in the background.
nginx_at() {
	nginx_conf "$tmp/$1" "$WORKERS" "$2" "$3" "$4"
	nginx -c "$tmp/$1/nginx.conf" -p "$tmp/$1" &
	pids+=("$!")
}

nginx_conf "$tmp/upstream" 1 "$UPSTREAM_PORT" "$static"
nginx -c "$tmp/upstream/nginx.conf" -p "$tmp/upstream" &
pids+=("$!")
up=http://127.0.0.1:$UPSTREAM_PORT

declare -A url
url[proxy]=http://127.0.0.1:$PORT/
url[proxy-off]=http://127.0.0.1:$((PORT + 1))/
url[demo]=http://127.0.0.1:$((PORT + 2))/
url[nginx-proxy]=http://127.0.0.1:$((PORT + 3))/
url[nginx-static]=http://127.0.0.1:$((PORT + 4))/
url[fasthttp]=http://127.0.0.1:$((PORT + 5))/
preforkd proxy "$PORT" "$up" on
preforkd proxy-off $((PORT + 1)) "$up" off
preforkd demo $((PORT + 2)) builtin:demo on
nginx_at nginx-proxy $((PORT + 3)) "$proxy_pass" on
nginx_at nginx-static $((PORT + 4)) "$static" on
preforkd fasthttp $((PORT + 5)) "$up" on fasthttp
for u in "${url[@]}" "$up/"; do wait_up "$u"; done

declare -A rps p99
# run NAME: wrk on the contender NAME (keep-alive), or ab with a new
# connection per request for NAME:ab.
run() {
	local name=$1 out
	if [ "${name%:ab}" != "$name" ]; then
		out=$(ab -q -n "$ABN" -c "$CONNS" "${url[${name%:ab}]}" 2>&1)
		rps[$name]=$(awk '/^Requests per second:/ {print $4}' <<<"$out")
		p99[$name]=$(awk '$1 == "99%" {print $2}' <<<"$out")
		local failed non2xx
		failed=$(awk '/^Failed requests:/ {print $3}' <<<"$out")
		non2xx=$(awk '/^Non-2xx responses:/ {print $3}' <<<"$out")
		printf '    %-18s %10s req/s   p99 %7s ms   failed: %s   non-2xx: %s\n' "$name" "${rps[$name]}" "${p99[$name]}" "${failed:-?}" "${non2xx:-0}"
		if [ "${failed:-1}" != 0 ] || [ "${non2xx:-0}" != 0 ]; then
			thrown_out "${failed:-?} failed, ${non2xx:-0} non-2xx" "      "
			rps[$name]=n/a p99[$name]=n/a
		fi
		return
	fi
	out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "${url[$name]}")
	rps[$name]=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
	p99[$name]=$(to_ms "$(awk '$1 == "99%" {print $2}' <<<"$out")")
	local non2xx errors
	non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
	errors=$(awk '/Socket errors:/ {print}' <<<"$out")
	printf '    %-18s %10s req/s   p99 %7s ms   non-2xx: %s %s\n' "$name" "${rps[$name]}" "${p99[$name]}" "${non2xx:-0}" "$errors"
	if thrown_out "$(wrk_invalid "$out" 2xx)" "      "; then
		rps[$name]=n/a p99[$name]=n/a
	fi
}

pairs=("proxy nginx-proxy" "demo nginx-static" "proxy proxy-off" "proxy:ab nginx-proxy:ab" "proxy fasthttp")
declare -A ratios p99ratios
echo "wrk -t$THREADS -c$CONNS -d${DURATION}s --latency (ab -n $ABN -c $CONNS), $WORKERS workers each, $ROUNDS rounds, upstream nginx 1 worker, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
	echo "round $r (load $(cut -d' ' -f1 /proc/loadavg))"
	for pair in "${pairs[@]}"; do
		read -r a b <<<"$pair"
		if [ $((r % 2)) = 1 ]; then run "$a"; run "$b"; else run "$b"; run "$a"; fi
		ratios[$pair]+="$(ratio "${rps[$a]}" "${rps[$b]}") "
		p99ratios[$pair]+="$(ratio "${p99[$a]}" "${p99[$b]}") "
	done
done

echo
printf '%-58s %-24s %7s %8s %s\n' "ratio (median of the rounds)" "rounds" "median" "target" ""
row() { # label pair target direction [p99]
	local list=${ratios[$2]}
	[ "${5:-}" = p99 ] && list=${p99ratios[$2]}
	local m
	# shellcheck disable=SC2086
	m=$(median $list)
	local op=">="
	[ "$4" = at-most ] && op="<="
	printf '%-58s %-24s %7s %8s %s\n' "$1" "$list" "$m" "$op $3" "$(verdict "$m" "$3" "$4")"
}
row "proxy rules=on / nginx proxy_pass+limit_req" "proxy nginx-proxy" 1.0 at-least
row "p99: proxy rules=on / nginx proxy_pass+limit_req" "proxy nginx-proxy" 1.0 at-most p99
row "demo rules=on / nginx static+limit_req" "demo nginx-static" 1.0 at-least
row "p99: demo rules=on / nginx static+limit_req" "demo nginx-static" 1.0 at-most p99
row "proxy rules=on / proxy rules=off" "proxy proxy-off" 0.95 at-least
row "new connection per request (ab): proxy / nginx" "proxy:ab nginx-proxy:ab" 0.9 at-least
row "loop / fasthttp engine, proxy rules=on (no target)" "proxy fasthttp" 0 at-least

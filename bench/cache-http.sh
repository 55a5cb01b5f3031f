#!/usr/bin/env bash
# HTTP throughput of a cache hit with wrk on loopback: preforkd's response
# cache against nginx proxy_cache, the same number of workers each, in
# front of the same upstream (a 1-worker nginx serving a 4 KiB file,
# fresh for an hour), both running at once and measured in alternating
# turns, ROUNDS times, so that the ratio holds. Every measured request is
# a hit: each cache is filled (and checked to hit) first. Prints
# requests/s, p99 and the median of the rounds' ratios the target talks
# about: preforkd ≥ 1.0 × nginx.
#
#   WORKERS=2 DURATION=5 CONNS=32 ROUNDS=3 bash bench/cache-http.sh
set -euo pipefail
. "$(dirname "$0")/lib.sh" 5 18290 # default DURATION and PORT
need nginx nginx-light

go build -o "$tmp/preforkd" ./cmd/preforkd

declare -A rps p99
measure() { # name url
	local x out non2xx
	curl -s -o /dev/null "$2" # the fill
	x=$(curl -s -o /dev/null -D - "$2" | tr -d '\r' | awk -F': ' 'tolower($1) == "x-cache" {print $2}')
	if [ "$x" != HIT ]; then
		echo "$me: $1 does not hit (X-Cache: ${x:-none})" >&2
		exit 1
	fi
	out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "$2")
	rps[$1]=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
	p99[$1]=$(to_ms "$(awk '$1 == "99%" {print $2}' <<<"$out")")
	non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
	printf '%-20s %12s req/s   p99 %8s ms   non-2xx: %s\n' "$1" "${rps[$1]}" "${p99[$1]}" "${non2xx:-0}"
	if thrown_out "$(wrk_invalid "$out" 2xx)"; then
		rps[$1]=n/a p99[$1]=n/a
	fi
}

# The upstream: a 4 KiB file with ETag, Last-Modified and max-age=3600.
mkdir -p "$tmp/upstream/www"
head -c 3072 /dev/urandom | base64 -w 0 >"$tmp/upstream/www/page.html"
chmod 755 "$tmp" "$tmp/upstream" "$tmp/upstream/www" # nginx's workers run as another user
chmod 644 "$tmp/upstream/www/page.html"
nginx_http "$tmp/upstream" 1 "server { listen 127.0.0.1:$UPSTREAM_PORT; root $tmp/upstream/www; expires 1h; }"
nginx -c "$tmp/upstream/nginx.conf" -p "$tmp/upstream" &
pids+=("$!")
wait_up "http://127.0.0.1:$UPSTREAM_PORT/page.html"

echo "wrk -t$THREADS -c$CONNS -d${DURATION}s --latency, $WORKERS workers each, a 4 KiB hit, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

# preforkd: one [[cache]] block.
cat >"$tmp/preforkd.toml" <<CONF
[server]
listen = "127.0.0.1:$PORT"
workers = $WORKERS
upstream = "http://127.0.0.1:$UPSTREAM_PORT"

[[cache]]
path = "/*"
CONF
"$tmp/preforkd" run -config "$tmp/preforkd.toml" 2>"$tmp/preforkd.log" &
pids+=("$!")
wait_up "http://127.0.0.1:$PORT/page.html"

# nginx: proxy_cache with its lock, keep-alive to the upstream.
mkdir -p "$tmp/nginx/cache"
nginx_http "$tmp/nginx" "$WORKERS" "
	proxy_cache_path $tmp/nginx/cache levels=1:2 keys_zone=c:10m max_size=100m inactive=60m use_temp_path=off;
	upstream app { server 127.0.0.1:$UPSTREAM_PORT; keepalive 64; }
	server {
		listen 127.0.0.1:$((PORT + 1));
		location / {
			proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\";
			proxy_cache c; proxy_cache_lock on;
			add_header X-Cache \$upstream_cache_status;
		}
	}"
nginx -c "$tmp/nginx/nginx.conf" -p "$tmp/nginx" &
pids+=("$!")
wait_up "http://127.0.0.1:$((PORT + 1))/page.html"

ROUNDS=${ROUNDS:-3}
ratios=()
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then
		measure "preforkd cache" "http://127.0.0.1:$PORT/page.html"
		measure "nginx proxy_cache" "http://127.0.0.1:$((PORT + 1))/page.html"
	else
		measure "nginx proxy_cache" "http://127.0.0.1:$((PORT + 1))/page.html"
		measure "preforkd cache" "http://127.0.0.1:$PORT/page.html"
	fi
	ratios+=("$(ratio "${rps[preforkd cache]}" "${rps[nginx proxy_cache]}")")
done

echo
awk -v r="$(median "${ratios[@]}")" -v rounds="${ratios[*]}" 'BEGIN {
	printf "%-44s %-16s %6s   >= 1.00 %s\n", "preforkd cache hit / nginx proxy_cache hit", rounds, r, (r == "n/a" ? "n/a" : r >= 1.0 ? "met" : "MISSED")
}'

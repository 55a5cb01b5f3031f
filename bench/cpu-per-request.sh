#!/usr/bin/env bash
# Where a proxied request's cost goes: preforkd in proxy mode (the event
# loop, the default engine, and the fasthttp engine) against nginx
# proxy_pass, rules off and on, in front of the same 1-worker nginx
# upstream, with wrk on loopback. For each it prints requests/s and the
# CPU time per request of the proxy's processes and of the upstream,
# read from /proc/PID/stat around the wrk run. With STRACE=1 it also
# counts one proxy worker's system calls for 2 s in the middle of the run
# (strace -c: the run and its CPU figures are inflated then; the counts
# per request hold).
#
# This is the measurement behind bench/README.md "Why the misses": not a
# target of its own, and not part of make bench.
#
#   WORKERS=2 DURATION=8 CONNS=32 STRACE=1 bash bench/cpu-per-request.sh
set -euo pipefail
. "$(dirname "$0")/lib.sh" 8 18390 # default DURATION and PORT
need nginx nginx-light
[ -z "${STRACE:-}" ] || need strace strace

go build -o "$tmp/preforkd" ./cmd/preforkd

# ticks PID...: user + system clock ticks of the processes.
ticks() {
	local sum=0 f
	for p in "$@"; do
		read -r -a f <"/proc/$p/stat"
		sum=$((sum + f[13] + f[14]))
	done
	echo "$sum"
}

# measure NAME PID: wrk against the proxy whose processes are PID and its
# children; the upstream's are its workers.
measure() {
	local name=$1 pid=$2 procs up before upBefore out req
	wait_up "http://127.0.0.1:$PORT/"
	procs=("$pid" $(pgrep -P "$pid"))
	up=($(pgrep -P "$upstream"))
	before=$(ticks "${procs[@]}")
	upBefore=$(ticks "${up[@]}")
	wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:$PORT/" >"$tmp/wrk.out" &
	local wrk=$!
	wait "$wrk"
	out=$(cat "$tmp/wrk.out")
	req=$(awk '/requests in/ {print $1}' <<<"$out")
	awk -v n="$name" -v rps="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")" -v req="$req" \
		-v p="$(($(ticks "${procs[@]}") - before))" -v u="$(($(ticks "${up[@]}") - upBefore))" -v hz="$(getconf CLK_TCK)" \
		'BEGIN { printf "%-34s %10.0f req/s   proxy %5.1f µs CPU/request   upstream %5.1f µs CPU/request\n", n, rps, p / hz * 1e6 / req, u / hz * 1e6 / req }'
	if [ -n "${STRACE:-}" ]; then
		# Every worker's system calls over a short run of its own (strace
		# slows the workers: the counts per request hold, the rate not).
		local attach=() p sp traced
		for p in "${procs[@]:1}"; do attach+=(-p "$p"); done
		strace -c -f "${attach[@]}" -o "$tmp/$name.strace" >/dev/null 2>&1 &
		sp=$!
		sleep 1
		traced=$(wrk -t"$THREADS" -c"$CONNS" -d3s "http://127.0.0.1:$PORT/" | awk '/requests in/ {print $1}')
		kill -INT "$sp"
		wait "$sp" 2>/dev/null || true
		echo "  every worker's system calls under strace -c, per request ($traced requests), most frequent first:"
		awk -v n="$traced" '$NF ~ /^[a-z_0-9]+$/ && $NF != "total" && $4 ~ /^[0-9]+$/ {
			errs = ($5 ~ /^[0-9]+$/) ? $5 : 0; printf "    %-14s %6.2f calls %6.2f errors\n", $NF, $4 / n, errs / n }' "$tmp/$name.strace" | sort -k2 -n -r | head -8
	fi
	stop "$pid"
}

nginx_conf "$tmp/upstream" 1 "$UPSTREAM_PORT" "$static"
nginx -c "$tmp/upstream/nginx.conf" -p "$tmp/upstream" &
upstream=$!
pids+=("$upstream")
wait_up "http://127.0.0.1:$UPSTREAM_PORT/"

echo "wrk -t$THREADS -c$CONNS -d${DURATION}s, $WORKERS workers each, upstream nginx 1 worker, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
for rules in off on; do
	for engine in loop fasthttp; do
		conf=$tmp/preforkd-$engine-$rules.toml
		printf '[server]\nlisten = "127.0.0.1:%s"\nworkers = %s\nupstream = "http://127.0.0.1:%s"\nengine = "%s"\n' "$PORT" "$WORKERS" "$UPSTREAM_PORT" "$engine" >"$conf"
		[ $rules = off ] || printf '[[ratelimit]]\nname = "all"\npath = "/*"\nlimit = 1000000\nwindow = "1s"\n' >>"$conf"
		"$tmp/preforkd" run -config "$conf" 2>"$tmp/preforkd-$engine-$rules.log" &
		pids+=("$!")
		measure "preforkd $engine rules=$rules" "$!"
	done

	nginx_conf "$tmp/nginx-$rules" "$WORKERS" "$PORT" "$proxy_pass" "$rules"
	nginx -c "$tmp/nginx-$rules/nginx.conf" -p "$tmp/nginx-$rules" &
	pids+=("$!")
	measure "nginx proxy_pass rules=$rules" "$!"
done

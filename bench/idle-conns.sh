#!/usr/bin/env bash
# What an idle keep-alive connection costs a worker: N clients (10,000)
# each send one request and then hold their connection open, idle, as a
# browser's pooled connection does. Measured as the growth of the workers'
# resident memory (VmRSS summed over the workers, before the clients
# connect and once they all wait), divided by N: preforkd in proxy mode
# with one rule against nginx proxy_pass + limit_req, the same number of
# workers, in front of the same upstream, alternately, ROUNDS times in
# one run. Prints each round and the median ratio the target talks about:
# preforkd ≤ 1.5 × nginx per connection.
#
#   WORKERS=2 CONNS=10000 ROUNDS=2 bash bench/idle-conns.sh
set -euo pipefail
. "$(dirname "$0")/lib.sh" 0 18590 # no wrk run: DURATION unused
need nginx nginx-light
N=${N:-10000}
ROUNDS=${ROUNDS:-2}

go build -o "$tmp/preforkd" ./cmd/preforkd
go -C bench build -o "$tmp/idleconns" ./cmd/idleconns # bench/ is a module of its own

# rss PID...: the resident memory of the processes, in KiB.
rss() {
	local sum=0 p v
	for p in "$@"; do
		v=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status")
		sum=$((sum + v))
	done
	echo "$sum"
}

nginx_conf "$tmp/upstream" 1 "$UPSTREAM_PORT" "$static"
nginx -c "$tmp/upstream/nginx.conf" -p "$tmp/upstream" &
pids+=("$!")
wait_up "http://127.0.0.1:$UPSTREAM_PORT/"

declare -A perconn
# hold NAME PID URL-ADDR: N idle connections to the server PID (its
# workers are its children), and the growth per connection.
hold() {
	local name=$1 pid=$2 addr=$3 workers before after
	wait_up "http://$addr/"
	for _ in $(seq 20); do curl -s -o /dev/null "http://$addr/"; done # warm: pools, buffers
	sleep 1
	workers=($(pgrep -P "$pid"))
	before=$(rss "${workers[@]}")
	coproc IDLE { "$tmp/idleconns" -addr "$addr" -n "$N"; }
	local line
	read -r line <&"${IDLE[0]}"
	if [ "${line%% *}" != ready ]; then
		echo "$me: $name: the clients did not connect: $line" >&2
		exit 1
	fi
	sleep 2 # the last responses sent, the buffers settled
	after=$(rss "${workers[@]}")
	eval "exec ${IDLE[1]}>&-"
	wait "$IDLE_PID" 2>/dev/null || true
	perconn[$name]=$(awk -v a="$after" -v b="$before" -v n="$N" 'BEGIN { printf "%.2f", (a - b) * 1024 / n / 1000 }')
	printf '%-34s workers %7d KiB -> %7d KiB   %6s KB per idle connection\n' "$name" "$before" "$after" "${perconn[$name]}"
}

run_preforkd() {
	printf '[server]\nlisten = "127.0.0.1:%s"\nworkers = %s\nupstream = "http://127.0.0.1:%s"\nidle_timeout = "10m"\n[[ratelimit]]\nname = "all"\npath = "/*"\nlimit = 1000000\nwindow = "1s"\n' \
		"$PORT" "$WORKERS" "$UPSTREAM_PORT" >"$tmp/preforkd.toml"
	"$tmp/preforkd" run -config "$tmp/preforkd.toml" 2>>"$tmp/preforkd.log" &
	local pid=$!
	pids+=("$pid")
	hold "preforkd proxy rules=on" "$pid" "127.0.0.1:$PORT"
	stop "$pid"
}

run_nginx() {
	local dir=$tmp/nginx
	nginx_conf "$dir" "$WORKERS" $((PORT + 1)) "$proxy_pass" on nofile=40000 conns=30000 keepalive=600s
	nginx -c "$dir/nginx.conf" -p "$dir" &
	local pid=$!
	pids+=("$pid")
	hold "nginx proxy_pass+limit_req" "$pid" "127.0.0.1:$((PORT + 1))"
	stop "$pid"
}

echo "$N idle keep-alive connections, $WORKERS workers each, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
ratios=()
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then run_preforkd; run_nginx; else run_nginx; run_preforkd; fi
	ratios+=("$(ratio "${perconn[preforkd proxy rules=on]}" "${perconn[nginx proxy_pass+limit_req]}")")
	echo "  round $r: preforkd / nginx per connection ${ratios[-1]}"
done
echo
atmost "idle connection: preforkd / nginx (median of $ROUNDS)" "$(median "${ratios[@]}")" 1.5

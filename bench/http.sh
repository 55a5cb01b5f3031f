#!/usr/bin/env bash
# HTTP throughput on loopback with wrk: preforkd with an embedded
# handler and as a reverse proxy, rules off / on / refusing, and nginx
# limit_req with the same number of workers when nginx is installed.
# Prints requests/s and the ratios the targets talk about.
#
#   WORKERS=2 DURATION=8 CONNS=32 bash bench/http.sh
set -euo pipefail
cd "$(dirname "$0")/.."

WORKERS=${WORKERS:-2}
DURATION=${DURATION:-8}
CONNS=${CONNS:-32}
THREADS=${THREADS:-1}
PORT=${PORT:-18090}
UPSTREAM_PORT=$((PORT + 9))

command -v wrk >/dev/null || { echo "http.sh: wrk is not installed (apt-get install wrk)"; exit 1; }

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	sleep 0.5
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT

go build -o "$tmp/preforkd" ./cmd/preforkd
go build -o "$tmp/embedserver" ./bench/cmd/embedserver
go build -o "$tmp/hello" ./bench/cmd/hello

wait_up() { # url
	for _ in $(seq 100); do
		curl -s -o /dev/null "$1" && return 0
		sleep 0.1
	done
	echo "http.sh: $1 did not come up" >&2
	return 1
}

stop() { # pid
	kill -TERM "$1" 2>/dev/null || true
	for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
	kill -KILL "$1" 2>/dev/null || true
}

declare -A rps
measure() { # name url
	curl -s -o /dev/null "$2" # the first request (the only one "refuse" lets through)
	local out
	out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" "$2")
	rps[$1]=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
	local non2xx
	non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
	printf '%-26s %12s req/s   non-2xx: %s\n' "$1" "${rps[$1]}" "${non2xx:-0}"
}

run_embedded() { # rules
	"$tmp/embedserver" -listen "127.0.0.1:$PORT" -workers "$WORKERS" -rules "$1" 2>"$tmp/embed-$1.log" &
	local pid=$!
	pids+=("$pid")
	wait_up "http://127.0.0.1:$PORT/"
	measure "embedded rules=$1" "http://127.0.0.1:$PORT/"
	stop "$pid"
}

run_proxy() { # rules
	local conf=$tmp/proxy-$1.toml
	cat >"$conf" <<EOF
[server]
listen = "127.0.0.1:$PORT"
workers = $WORKERS
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
EOF
	if [ "$1" = on ]; then
		cat >>"$conf" <<EOF
[[ratelimit]]
name = "all"
path = "/*"
limit = 1000000
window = "1s"
EOF
	fi
	"$tmp/preforkd" run -config "$conf" 2>"$tmp/proxy-$1.log" &
	local pid=$!
	pids+=("$pid")
	wait_up "http://127.0.0.1:$PORT/"
	measure "proxy rules=$1" "http://127.0.0.1:$PORT/"
	stop "$pid"
}

run_nginx() { # limit: on|off
	local dir=$tmp/nginx-$1
	mkdir -p "$dir"
	local limit_zone="" limit=""
	if [ "$1" = on ]; then
		limit_zone='limit_req_zone $binary_remote_addr zone=all:10m rate=10000000r/s;'
		limit='limit_req zone=all burst=1000000 nodelay;'
	fi
	cat >"$dir/nginx.conf" <<EOF
worker_processes $WORKERS;
pid $dir/nginx.pid;
error_log $dir/error.log;
daemon off;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path $dir/body;
	proxy_temp_path $dir/proxy;
	fastcgi_temp_path $dir/fastcgi;
	uwsgi_temp_path $dir/uwsgi;
	scgi_temp_path $dir/scgi;
	$limit_zone
	server {
		listen 127.0.0.1:$PORT;
		location / {
			$limit
			default_type text/plain;
			return 200 "hello\n";
		}
	}
}
EOF
	nginx -c "$dir/nginx.conf" -p "$dir" &
	local pid=$!
	pids+=("$pid")
	wait_up "http://127.0.0.1:$PORT/"
	measure "nginx limit_req=$1" "http://127.0.0.1:$PORT/"
	stop "$pid"
}

echo "wrk -t$THREADS -c$CONNS -d${DURATION}s, $WORKERS workers, $(nproc) CPUs"
run_embedded off
run_embedded on
run_embedded refuse
"$tmp/hello" -listen "127.0.0.1:$UPSTREAM_PORT" &
pids+=("$!")
wait_up "http://127.0.0.1:$UPSTREAM_PORT/"
run_proxy off
run_proxy on
if command -v nginx >/dev/null; then
	run_nginx off
	run_nginx on
else
	echo "nginx is not installed: no comparison (apt-get install nginx-light)"
fi

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
verdict() { awk -v r="$1" -v t="$2" 'BEGIN { if (r == "n/a") print "n/a"; else if (r + 0 >= t) print "met"; else print "MISSED" }'; }
echo
printf '%-52s %8s %8s %s\n' "ratio" "value" "target" ""
line() { printf '%-52s %8s %8s %s\n' "$1" "$2" ">= $3" "$(verdict "$2" "$3")"; }
r=$(ratio "${rps[embedded rules=on]}" "${rps[embedded rules=off]}"); line "embedded: rules on / rules off" "$r" 0.95
r=$(ratio "${rps[proxy rules=on]}" "${rps[proxy rules=off]}"); line "proxy: rules on / rules off" "$r" 0.95
r=$(ratio "${rps[embedded rules=refuse]}" "${rps[embedded rules=on]}"); line "embedded: 429s / 200s (a 429 costs no more)" "$r" 1.00
if [ -n "${rps[nginx limit_req=on]:-}" ]; then
	r=$(ratio "${rps[embedded rules=on]}" "${rps[nginx limit_req=on]}"); line "embedded rules on / nginx limit_req" "$r" 0.60
fi

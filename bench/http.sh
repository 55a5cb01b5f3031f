#!/usr/bin/env bash
# HTTP throughput and tail latency on loopback with wrk, each contender
# with the same number of workers, in one run so that the ratios hold:
#
#   - the embedding API (net/http) with rules off / on / refusing;
#   - proxy mode (the default engine, the event loop) vs nginx proxy_pass (keepalive 64) +
#     limit_req, both in front of the same upstream (a 1-worker nginx
#     "return 200", or bench/cmd/hello without nginx), rules off and on;
#   - proxy mode with the access log on (a file, combined format);
#   - proxy mode with ten rules of which one matches, and refusing
#     (every request after the first answered 429 by a rule);
#   - builtin:demo with one rule vs nginx static + limit_req.
#
# Prints requests/s, p99 latency (wrk --latency) and the ratios the
# targets talk about.
#
#   WORKERS=2 DURATION=8 CONNS=32 bash bench/http.sh
set -euo pipefail
. "$(dirname "$0")/lib.sh" 8 18090 # default DURATION and PORT
have_nginx=false
command -v nginx >/dev/null && have_nginx=true

go build -o "$tmp/preforkd" ./cmd/preforkd
go -C bench build -o "$tmp/embedserver" ./cmd/embedserver # bench/ is a module of its own
go -C bench build -o "$tmp/hello" ./cmd/hello

declare -A rps p99
measure() { # name url [expect: 2xx, or refused for a rule refusing every request]
	curl -s -o /dev/null "$2" # the first request (the only one "refuse" lets through)
	local out
	out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "$2")
	rps[$1]=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
	p99[$1]=$(to_ms "$(awk '$1 == "99%" {print $2}' <<<"$out")")
	local non2xx errors
	non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
	errors=$(awk '/Socket errors:/ {print}' <<<"$out")
	printf '%-30s %12s req/s   p99 %8s ms   non-2xx: %s %s\n' "$1" "${rps[$1]}" "${p99[$1]}" "${non2xx:-0}" "$errors"
	if thrown_out "$(wrk_invalid "$out" "${3:-2xx}")"; then
		rps[$1]=n/a p99[$1]=n/a
	fi
}

rule_toml='
[[ratelimit]]
name = "all"
path = "/*"
limit = 1000000
window = "1s"'

# Nine rules on other paths (prefix, exact, with methods, other keys) and
# the one above: what a real configuration looks like to the matcher.
ten_rules_toml=$(for i in 1 2 3 4 5 6 7 8 9; do
	by=ip
	[ $((i % 3)) = 0 ] && by='header:X-Api-Key|ip'
	path="/api/v$i/*"
	[ $((i % 2)) = 0 ] && path="/login$i"
	printf '\n[[ratelimit]]\nname = "other%d"\npath = "%s"\nmethods = ["POST", "PUT"]\nby = "%s"\nlimit = 10\nwindow = "1m"\n' "$i" "$path" "$by"
done)"$rule_toml"

refuse_toml='
[[ratelimit]]
name = "refuse"
path = "/*"
limit = 1
window = "1h"'

# contender NAME PID [EXPECT]: the server PID, just started in the
# background, once it answers on $PORT: measured (EXPECT as measure's),
# then stopped.
contender() {
	pids+=("$2")
	wait_up "http://127.0.0.1:$PORT/"
	measure "$1" "http://127.0.0.1:$PORT/" "${3:-2xx}"
	stop "$2"
}

run_embedded() { # rules
	local expect=2xx
	[ "$1" = refuse ] && expect=refused
	"$tmp/embedserver" -listen "127.0.0.1:$PORT" -workers "$WORKERS" -rules "$1" 2>"$tmp/embed-$1.log" &
	contender "embedded rules=$1" $! "$expect"
}

run_preforkd() { # name upstream rules
	local conf=$tmp/${1//[^a-zA-Z0-9]/-}.toml
	cat >"$conf" <<EOF
[server]
listen = "127.0.0.1:$PORT"
workers = $WORKERS
upstream = "$2"
EOF
	case $3 in
	on) echo "$rule_toml" >>"$conf" ;;
	ten) echo "$ten_rules_toml" >>"$conf" ;;
	refuse) echo "$refuse_toml" >>"$conf" ;;
	access) printf '%s\n[log]\naccess = "%s"\n' "$rule_toml" "$tmp/access.log" >>"$conf" ;;
	esac
	local expect=2xx
	[ "$3" = refuse ] && expect=refused
	"$tmp/preforkd" run -config "$conf" 2>"${conf%.toml}.log" &
	contender "$1" $! "$expect"
}

run_nginx() { # name location-body limit
	local dir=$tmp/${1//[^a-zA-Z0-9]/-}
	nginx_conf "$dir" "$WORKERS" "$PORT" "$2" "$3"
	nginx -c "$dir/nginx.conf" -p "$dir" &
	contender "$1" $!
}

echo "wrk -t$THREADS -c$CONNS -d${DURATION}s --latency, $WORKERS workers each, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

# The upstream of both proxies.
if $have_nginx; then
	nginx_conf "$tmp/upstream" 1 "$UPSTREAM_PORT" "$static"
	nginx -c "$tmp/upstream/nginx.conf" -p "$tmp/upstream" &
	echo "upstream: nginx, 1 worker, return 200"
else
	"$tmp/hello" -listen "127.0.0.1:$UPSTREAM_PORT" &
	echo "upstream: bench/cmd/hello (nginx is not installed: no nginx contender; apt-get install nginx-light)"
fi
pids+=("$!")
wait_up "http://127.0.0.1:$UPSTREAM_PORT/"

run_embedded off
run_embedded on
run_embedded refuse
run_preforkd "proxy rules=off" "http://127.0.0.1:$UPSTREAM_PORT" off
run_preforkd "proxy rules=on" "http://127.0.0.1:$UPSTREAM_PORT" on
run_preforkd "proxy rules=on access=on" "http://127.0.0.1:$UPSTREAM_PORT" access
run_preforkd "proxy rules=10" "http://127.0.0.1:$UPSTREAM_PORT" ten
run_preforkd "proxy rules=refuse" "http://127.0.0.1:$UPSTREAM_PORT" refuse
run_preforkd "demo rules=on" "builtin:demo" on
if $have_nginx; then
	run_nginx "nginx proxy_pass" "$proxy_pass" off
	run_nginx "nginx proxy_pass+limit_req" "$proxy_pass" on
	run_nginx "nginx static+limit_req" "$static" on
fi

echo
printf '%-56s %8s %8s %s\n' "ratio" "value" "target" ""
atleast "embedded (net/http): rules on / rules off" "$(ratio "${rps[embedded rules=on]}" "${rps[embedded rules=off]}")" 0.95
atleast "proxy: rules on / rules off" "$(ratio "${rps[proxy rules=on]}" "${rps[proxy rules=off]}")" 0.95
atleast "proxy: access log on / off (rules on)" "$(ratio "${rps[proxy rules=on access=on]}" "${rps[proxy rules=on]}")" 0.90
atleast "proxy: 10 rules, 1 matching / rules off" "$(ratio "${rps[proxy rules=10]}" "${rps[proxy rules=off]}")" 0.95
atleast "embedded: 429s / 200s (a 429 costs no more)" "$(ratio "${rps[embedded rules=refuse]}" "${rps[embedded rules=on]}")" 1.00
atleast "proxy: 429s / 200s (a 429 costs no more)" "$(ratio "${rps[proxy rules=refuse]}" "${rps[proxy rules=on]}")" 1.00
if $have_nginx; then
	atleast "proxy rules=on / nginx proxy_pass+limit_req" "$(ratio "${rps[proxy rules=on]}" "${rps[nginx proxy_pass+limit_req]}")" 0.90
	atleast "proxy rules=off / nginx proxy_pass" "$(ratio "${rps[proxy rules=off]}" "${rps[nginx proxy_pass]}")" 0.90
	atmost "p99: proxy rules=on / nginx proxy_pass+limit_req" "$(ratio "${p99[proxy rules=on]}" "${p99[nginx proxy_pass+limit_req]}")" 1.50
	atleast "demo rules=on / nginx static+limit_req" "$(ratio "${rps[demo rules=on]}" "${rps[nginx static+limit_req]}")" 0.80
	atmost "p99: demo rules=on / nginx static+limit_req" "$(ratio "${p99[demo rules=on]}" "${p99[nginx static+limit_req]}")" 1.50
	atleast "embedded rules on / nginx static+limit_req" "$(ratio "${rps[embedded rules=on]}" "${rps[nginx static+limit_req]}")" 0.60
fi

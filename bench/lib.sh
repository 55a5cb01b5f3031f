# Shared by the benchmark scripts (http.sh, loop.sh, idle-conns.sh,
# redis-http.sh, cache-http.sh, cpu-per-request.sh, tls-http.sh), sourced
# first as
#
#   . "$(dirname "$0")/lib.sh" DURATION PORT
#
# with the script's default run length in seconds and its first port. It
# moves to the repository root and sets the common knobs (each may be
# set in the environment), a temporary directory and the processes to
# stop at exit, and helpers; it checks that wrk is installed.

cd "$(dirname "$0")/.."
me=${0##*/}
DURATION=${DURATION:-$1}
PORT=${PORT:-$2}
UPSTREAM_PORT=$((PORT + 9)) # what the proxy fronts (or redis-server)
WORKERS=${WORKERS:-2}
CONNS=${CONNS:-32}
THREADS=${THREADS:-1}

# need COMMAND PACKAGE: stop with a hint when COMMAND is missing.
need() {
	command -v "$1" >/dev/null || { echo "$me: $1 is not installed (apt-get install $2)"; exit 1; }
}
need wrk wrk

# The ports a script uses (PORT to UPSTREAM_PORT) must be free: a server
# left on one (another run's, a failed stop) would answer in place of the
# contender, which then fails to bind, and wait_up and wrk would measure
# the stranger.
for p in $(seq "$PORT" "$UPSTREAM_PORT"); do
	if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
		echo "$me: 127.0.0.1:$p is in use (this script uses $PORT-$UPSTREAM_PORT; PORT=N moves them)" >&2
		exit 1
	fi
done

tmp=$(mktemp -d)
pids=() # started in the background: stopped at exit
cleanup() {
	local rc=$? f
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	sleep 0.5
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	# A failure (not Ctrl-C): the servers' logs say why (a contender
	# that did not start, a bad nginx.conf); they go with $tmp. Their
	# errors are shown, at most 5 lines a log.
	if [ "$rc" != 0 ] && [ "$rc" != 130 ] && [ "$rc" != 143 ]; then
		for f in "$tmp"/*.log "$tmp"/*/error.log; do
			[ -s "$f" ] || continue
			grep -i -m 5 -E '^[a-z]+: |level=error|\[(emerg|crit|alert)\]|fatal|panic|invalid|in use|denied' "$f" |
				sed "s|^|${f#"$tmp"/}: |" >&2 || true
		done
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

wait_up() { # url [curl-option...], such as -k for a self-signed certificate
	for _ in $(seq 100); do
		curl -s -o /dev/null "${@:2}" "$1" && return 0
		sleep 0.1
	done
	echo "$me: $1 did not come up" >&2
	return 1
}

stop() { # pid
	kill -TERM "$1" 2>/dev/null || true
	for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
	kill -KILL "$1" 2>/dev/null || true
}

# to_ms converts wrk's latency ("812.00us", "4.11ms", "1.02s") to ms.
to_ms() {
	awk -v v="$1" 'BEGIN {
		n = v + 0
		if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /s$/) n *= 1000
		printf "%.2f", n
	}'
}

# nginx_http dir workers http-body [knob...]: an nginx.conf with
# everything in dir (pid, logs, temporary files) and http-body inside
# http { }. The knobs: nofile=N (worker_rlimit_nofile), conns=N
# (worker_connections, 4096 unless given), keepalive=T
# (keepalive_timeout, nginx's own unless given).
nginx_http() {
	local dir=$1 workers=$2 body=$3 knob main="" conns=4096 http=""
	shift 3
	for knob; do
		case $knob in
		nofile=*) main="worker_rlimit_nofile ${knob#*=};" ;;
		conns=*) conns=${knob#*=} ;;
		keepalive=*) http="keepalive_timeout ${knob#*=};" ;;
		*) echo "$me: nginx_http: unknown knob $knob" >&2; return 1 ;;
		esac
	done
	mkdir -p "$dir"
	cat >"$dir/nginx.conf" <<EOF
worker_processes $workers;
$main
pid $dir/nginx.pid;
error_log $dir/error.log;
daemon off;
events { worker_connections $conns; }
http {
	access_log off;
	keepalive_requests 1000000;
	$http
	client_body_temp_path $dir/body;
	proxy_temp_path $dir/proxy;
	fastcgi_temp_path $dir/fastcgi;
	uwsgi_temp_path $dir/uwsgi;
	scgi_temp_path $dir/scgi;
	$body
}
EOF
}

# nginx_conf dir workers listen-port location-body [limit on|off]
# [knob...]: an nginx.conf (nginx_http) with one server on 127.0.0.1:
# listen-port and one location; upstream "app" is 127.0.0.1:
# $UPSTREAM_PORT, and limit on adds a limit_req that never refuses.
# Besides nginx_http's knobs, tls=DIR listens with TLS and HTTP/2, with
# DIR/cert.pem and DIR/key.pem and a shared session cache.
nginx_conf() {
	local dir=$1 workers=$2 listen="127.0.0.1:$3" location=$4 http="" limit="" tls="" knob knobs=()
	if [ "${5:-off}" = on ]; then
		http='limit_req_zone $binary_remote_addr zone=all:10m rate=10000000r/s;'
		limit='limit_req zone=all burst=1000000 nodelay;'
	fi
	shift $(($# < 5 ? $# : 5))
	for knob; do
		case $knob in
		tls=*)
			# (nginx 1.25.1 and later prefer "http2 on;", and take this with a warning)
			listen+=" ssl http2"
			http="${http:+$http }ssl_session_cache shared:SSL:10m;"
			tls="ssl_certificate ${knob#*=}/cert.pem; ssl_certificate_key ${knob#*=}/key.pem;"
			;;
		*) knobs+=("$knob") ;;
		esac
	done
	nginx_http "$dir" "$workers" "$http
	upstream app { server 127.0.0.1:$UPSTREAM_PORT; keepalive 64; }
	server {
		listen $listen;
		$tls
		location / {
			$limit
			$location
		}
	}" "${knobs[@]}"
}

# Location bodies for nginx_conf: the upstream's answer, and a proxy to it.
static='default_type text/plain; return 200 "hello\n";'
proxy_pass='proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection "";'

# ratio a b: a / b to two decimals, n/a when either is not above zero
# (such as a measurement that wrk_invalid threw out, n/a).
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "n/a" }'; }

# wrk_invalid wrk-output expect: why the run is no measurement of what it
# was meant to measure, or nothing when it is one. expect is 2xx (every
# answer 2xx or 3xx: a 429 or a 502 is not the throughput of a proxy) or
# refused (every answer non-2xx, a rule refusing each request). Socket
# errors (connect, read, write, timeout) count against either. Up to
# 0.1% of the requests may miss (a connection cut at the run's end).
wrk_invalid() {
	awk -v want="$2" '
		/ requests in / { n = $1 }
		/Socket errors:/ { e = $4 + $6 + $8 + $10 }
		/Non-2xx or 3xx responses:/ { bad = $5 }
		END {
			if (n + 0 == 0) { print "no requests"; exit }
			miss = (want == "refused") ? n - bad : bad
			if (miss + e > n / 1000)
				printf "%d of %d requests %s, %d socket errors\n", miss, n, (want == "refused") ? "not refused" : "non-2xx", e
		}' <<<"$1"
}

# thrown_out why [indent]: says that a run is thrown out and why (what
# wrk_invalid or a script's own check found), and succeeds; says nothing
# and fails when why is empty. The caller then makes the run's numbers
# n/a: not the answers meant, no throughput and no ratio.
thrown_out() {
	[ -n "$1" ] || return 1
	echo "${2-  }INVALID, left out of the ratios${1:+: $1}"
}

# verdict ratio target [at-least|at-most]: met, MISSED, or n/a for a
# ratio that is n/a; at-least unless told.
verdict() {
	awk -v r="$1" -v t="$2" -v d="${3:-at-least}" 'BEGIN {
		if (r == "n/a") print "n/a"
		else if ((d == "at-least" && r + 0 >= t) || (d == "at-most" && r + 0 <= t)) print "met"
		else print "MISSED"
	}'
}

# atleast / atmost label ratio target: a row of the ratio table (its head
# is printf '%-56s %8s %8s %s\n' "ratio" "value" "target" "").
atleast() { printf '%-56s %8s %8s %s\n' "$1" "$2" ">= $3" "$(verdict "$2" "$3" at-least)"; }
atmost() { printf '%-56s %8s %8s %s\n' "$1" "$2" "<= $3" "$(verdict "$2" "$3" at-most)"; }

# median number...: the middle one, or the mean of the middle two; what
# is not a number (n/a: a round thrown out) is left out, n/a if all are.
median() { printf '%s\n' "$@" | { grep -E '^[0-9.]+$' || true; } | sort -n | awk '{a[NR] = $1} END { print (NR == 0 ? "n/a" : NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }

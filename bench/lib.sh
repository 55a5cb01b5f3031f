# Shared by the wrk benchmarks (http.sh, redis-http.sh, cache-http.sh),
# sourced once they are at the repository root: the common knobs, a
# temporary directory and the processes to stop at exit, and helpers.

me=${0##*/}
WORKERS=${WORKERS:-2}
CONNS=${CONNS:-32}
THREADS=${THREADS:-1}

# need COMMAND PACKAGE: stop with a hint when COMMAND is missing.
need() {
	command -v "$1" >/dev/null || { echo "$me: $1 is not installed (apt-get install $2)"; exit 1; }
}

tmp=$(mktemp -d)
pids=() # started in the background: stopped at exit
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	sleep 0.5
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT

wait_up() { # url
	for _ in $(seq 100); do
		curl -s -o /dev/null "$1" && return 0
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

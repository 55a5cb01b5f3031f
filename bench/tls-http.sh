#!/usr/bin/env bash
# TLS and HTTP/2 toward clients: preforkd (the net/http engine, forwarding
# to its upstream) against nginx (ssl, http2, proxy_pass with upstream
# keepalive), the same number of workers and the same certificate
# (ECDSA P-256, made here with openssl), in front of the same upstream (a
# 1-worker nginx "return 200"), in one run so that the ratios hold:
#
#   - TLS keep-alive: wrk over https, requests/s   (target >= 0.9 x nginx)
#   - new TLS handshakes: wrk with Connection: close, one request per
#     connection, each a full handshake: connections/s (target >= 0.8 x)
#   - HTTP/2: h2load -c32 -m10, requests/s          (target >= 0.9 x)
#
#   WORKERS=2 DURATION=8 CONNS=32 bash bench/tls-http.sh
set -euo pipefail
. "$(dirname "$0")/lib.sh" 8 18690 # default DURATION and PORT
need nginx nginx-light
need h2load nghttp2-client
need openssl openssl

go build -o "$tmp/preforkd" ./cmd/preforkd
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=bench.example" \
	-addext "subjectAltName=DNS:bench.example,IP:127.0.0.1" -keyout "$tmp/key.pem" -out "$tmp/cert.pem" 2>/dev/null
chmod 755 "$tmp"
chmod 644 "$tmp/cert.pem" "$tmp/key.pem" # nginx's workers run as another user

declare -A rate
measure_wrk() { # name url [header]
	local out args=(-t"$THREADS" -c"$CONNS" -d"${DURATION}s")
	[ -n "${3:-}" ] && args+=(-H "$3")
	out=$(wrk "${args[@]}" "$2")
	rate[$1]=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
	local non2xx errors
	non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
	errors=$(awk '/Socket errors:/ {print}' <<<"$out")
	printf '%-36s %12s req/s   non-2xx: %s %s\n' "$1" "${rate[$1]}" "${non2xx:-0}" "$errors"
	if thrown_out "$(wrk_invalid "$out" 2xx)"; then
		rate[$1]=n/a
	fi
}
measure_h2() { # name url
	local out
	out=$(h2load -c "$CONNS" -m 10 -D "$DURATION" --warm-up-time=1 "$2" 2>&1)
	rate[$1]=$(awk '/^finished in/ {gsub(",", "", $4); print $4}' <<<"$out")
	local codes
	codes=$(awk '/^status codes:/ {print $3, $4, $5, $6, $7, $8, $9, $10}' <<<"$out")
	printf '%-36s %12s req/s   %s\n' "$1" "${rate[$1]}" "$codes"
	# "requests: N total, N started, N done, N succeeded, N failed, N errored, N timeout"
	if thrown_out "$(awk '/^requests:/ { n = $2; failed = $10 } /^status codes:/ { bad = $7 + $9 }
		END { if (n + 0 == 0 || failed + bad > n / 1000) printf "%d of %d requests failed, %d 4xx/5xx", failed, n, bad }' <<<"$out")"; then
		rate[$1]=n/a
	fi
}
# contender NAME PID: the server PID, just started in the background,
# once it answers on url: measured the three ways, then stopped.
contender() {
	pids+=("$2")
	wait_up "$url" -k
	measure_wrk "$1 TLS keep-alive" "$url"
	measure_wrk "$1 TLS new handshakes" "$url" "Connection: close"
	measure_h2 "$1 HTTP/2" "$url"
	stop "$2"
}

echo "wrk -t$THREADS -c$CONNS -d${DURATION}s, h2load -c$CONNS -m10 -D$DURATION, $WORKERS workers each, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

nginx_conf "$tmp/upstream" 1 "$UPSTREAM_PORT" "$static"
nginx -c "$tmp/upstream/nginx.conf" -p "$tmp/upstream" &
pids+=("$!")
wait_up "http://127.0.0.1:$UPSTREAM_PORT/"

url="https://127.0.0.1:$PORT/"

# preforkd: TLS on server.listen, forwarding to the upstream.
cat >"$tmp/preforkd.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
workers = $WORKERS
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
[tls]
[[tls.certificate]]
cert = "$tmp/cert.pem"
key = "$tmp/key.pem"
TOML
"$tmp/preforkd" run -config "$tmp/preforkd.toml" 2>"$tmp/preforkd.log" &
contender preforkd $!

# nginx: the same certificate, workers and upstream.
nginx_conf "$tmp/edge" "$WORKERS" "$PORT" "$proxy_pass" off tls="$tmp"
nginx -c "$tmp/edge/nginx.conf" -p "$tmp/edge" &
contender nginx $!

echo
printf '%-56s %8s %8s %s\n' "ratio" "value" "target" ""
atleast "TLS keep-alive: preforkd / nginx" "$(ratio "${rate[preforkd TLS keep-alive]}" "${rate[nginx TLS keep-alive]}")" 0.90
atleast "new TLS handshakes/s: preforkd / nginx" "$(ratio "${rate[preforkd TLS new handshakes]}" "${rate[nginx TLS new handshakes]}")" 0.80
atleast "HTTP/2 (h2load -c$CONNS -m10): preforkd / nginx" "$(ratio "${rate[preforkd HTTP/2]}" "${rate[nginx HTTP/2]}")" 0.90

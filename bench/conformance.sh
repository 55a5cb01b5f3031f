#!/usr/bin/env bash
# The response cache against the public HTTP cache test suite
# (http-tests/cache-tests, the one behind cache-tests.fyi): the built
# preforkd, 2 workers, `[[cache]] path = "/test/*"` (the tests' URLs; not
# the harness's own PUT /config/ID, whose invalidations would share
# generation slots with other tests' URLs), ttl 24h, heuristic on, in
# front of the suite's own origin, as the suite's published results of
# other caches were measured. It runs once per engine (ENGINES: the event
# loop, fasthttp, and net/http behind a TLS listener with a certificate
# made here), prints the counts, lists the failures, and exits 1 when a
# required test fails, fewer than MIN_PASS pass, or two engines differ on
# any test: one request path gives one result.
#
# The suite runs 25 tests at once, so a test can fail once by another
# test's invalidation (URL generations share slots by hash) or by timing
# on a loaded machine. A test on which two engines differ is run
# again, by itself, RERUNS times on every engine: a difference of the
# engines shows again there and fails; one that does not (every run of
# every engine gives one outcome) is printed as FLAKY, with both results,
# and does not fail the run.
#
#   make conformance                        # the suite at ../shared/cache-tests
#   CACHE_TESTS=DIR make conformance        # another copy of it
#   ENGINES=loop bash bench/conformance.sh  # one engine
#   RESULTS=out.json bash bench/conformance.sh   # keep the raw results (of the first engine)
#
# The suite stays outside the repository: it is copied to a temporary
# directory and run there with Node (>= 20.18: its interim-response tests
# load undici 7, the version its package.json names, installed once with
# npm into ~/.cache/preforkd/cache-tests when Node cannot find it). The
# ports are fixed and below 32768 (ORIGIN_PORT, PORT), out of the range
# the kernel gives client sockets.
set -euo pipefail
cd "$(dirname "$0")/.."
me=${0##*/}
suite=${CACHE_TESTS:-../shared/cache-tests}
BIN=${BIN:-bin/preforkd}
ORIGIN_PORT=${ORIGIN_PORT:-18470}
PORT=${PORT:-18471}
MIN_PASS=${MIN_PASS:-230}
ENGINES=${ENGINES:-loop fasthttp tls}
RERUNS=${RERUNS:-3}
UNDICI=${UNDICI:-undici@7}
modules=${XDG_CACHE_HOME:-$HOME/.cache}/preforkd/cache-tests

fail() { echo "$me: $*" >&2; exit 1; }
[ -f "$suite/test-engine/cli.mjs" ] || fail "no cache test suite at $suite (set CACHE_TESTS)"
[ -x "$BIN" ] || fail "$BIN is not built (make build)"
command -v node >/dev/null || fail "node is not installed (apt-get install nodejs)"
node -e 'const [a, b, c] = process.versions.node.split(".").map(Number); process.exit(a > 20 || a == 20 && (b > 18 || b == 18 && c >= 1) ? 0 : 1)' ||
	fail "node $(node --version) is too old: the suite's interim tests need undici 7, which needs Node >= 20.18.1"

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT

cp -r "$suite" "$tmp/suite"
chmod -R u+w "$tmp/suite"
if ! (cd "$tmp/suite" && node --input-type=module -e 'await import("undici")' 2>/dev/null); then
	if ! (cd "$modules" 2>/dev/null && node --input-type=module -e 'await import("undici")' 2>/dev/null); then
		command -v npm >/dev/null || fail "npm is not installed, and the suite needs undici"
		mkdir -p "$modules"
		npm install --prefix "$modules" --no-save --no-package-lock --no-audit --no-fund --loglevel=error "$UNDICI" >/dev/null ||
			fail "npm install $UNDICI failed"
	fi
	rm -rf "$tmp/suite/node_modules"
	ln -s "$modules/node_modules" "$tmp/suite/node_modules"
fi

up() { # url: wait until something answers it
	for _ in $(seq 100); do
		code=$(curl -sk -o /dev/null -w '%{http_code}' "$1" || true)
		[ "$code" != 000 ] && [ "$code" != 502 ] && return 0
		sleep 0.1
	done
	fail "$1 did not come up"
}

(cd "$tmp/suite" && exec env npm_config_protocol=http npm_config_port="$ORIGIN_PORT" npm_config_pidfile="$tmp/origin.pid" \
	node test-engine/server/server.mjs >"$tmp/origin.log" 2>&1) &
pids+=("$!")
up "http://127.0.0.1:$ORIGIN_PORT/"

# start ENGINE: preforkd with that engine in front of the origin, on
# $base; stop ends it.
start() {
	local engine=$1 scheme=http extra="" tlsconf=""
	case $engine in
	loop) ;;
	fasthttp) extra='engine = "fasthttp"' ;;
	tls) # net/http serves a listener with a certificate
		scheme=https
		[ -f "$tmp/key.pem" ] || openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
			-keyout "$tmp/key.pem" -out "$tmp/cert.pem" -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 2>/dev/null ||
			fail "openssl could not make a certificate"
		chmod 600 "$tmp/key.pem"
		tlsconf=$(printf '[tls]\n[[tls.certificate]]\ncert = "%s"\nkey = "%s"\n' "$tmp/cert.pem" "$tmp/key.pem") ;;
	*) fail "engine $engine: want loop, fasthttp or tls" ;;
	esac
	cat >"$tmp/preforkd.toml" <<CONF
[server]
listen = "127.0.0.1:$PORT"
workers = 2
upstream = "http://127.0.0.1:$ORIGIN_PORT"
$extra

[[cache]]
path = "/test/*"
ttl = "24h"
heuristic = true

$tlsconf
CONF
	"$BIN" run -config "$tmp/preforkd.toml" 2>>"$tmp/preforkd-$engine.log" &
	pid=$!
	pids+=("$pid")
	base="$scheme://127.0.0.1:$PORT"
	up "$base/"
}
stop() {
	kill -TERM "$pid"
	wait "$pid" 2>/dev/null || true
}

# run ENGINE: the suite through preforkd with that engine; the raw
# results in $tmp/results-ENGINE.json.
run() {
	start "$1"
	(cd "$tmp/suite" && env npm_config_base="$base" npm_config_id= npm_package_config_id= \
		NODE_TLS_REJECT_UNAUTHORIZED=0 node --no-warnings test-engine/cli.mjs >"$tmp/results-$1.json") ||
		fail "the suite did not run on $1 (origin log: $(tail -3 "$tmp/origin.log"))"
	stop
}

# Counted as cache-tests.fyi counts: a test whose dependency did not pass
# is a dependency failure, whatever its own result.
cat >"$tmp/suite/count.mjs" <<'JS'
import fs from 'fs'
import tests from './tests/index.mjs'
import { determineTestResult, resultTypes } from './test-engine/lib/results.mjs'
const [results, minPass] = [JSON.parse(fs.readFileSync(process.argv[2])), Number(process.argv[3])]
const names = Object.fromEntries(Object.entries(resultTypes).map(([k, v]) => [v[2], k]))
const counts = {}
const listed = []
const signature = []
for (const suite of tests) {
  for (const t of suite.tests) {
    const r = names[determineTestResult(tests, t.id, results)[2]]
    counts[r] = (counts[r] || 0) + 1
    signature.push(`${t.id} ${r}`)
    if (['fail', 'optional_fail', 'setup_fail', 'harness_fail', 'retry'].includes(r)) {
      listed.push(`  ${r.padEnd(14)} ${t.id}: ${(results[t.id] && results[t.id][1]) || ''}`)
    }
  }
}
const n = (k) => counts[k] || 0
console.log(`pass ${n('pass')}, required fails ${n('fail')}, optional fails ${n('optional_fail')}; ` +
  `checks yes ${n('yes')} no ${n('no')}; dependency fails ${n('dependency_fail')}, setup fails ${n('setup_fail')}, ` +
  `harness fails ${n('harness_fail')}, retries ${n('retry')}, untested ${n('untested')}; ` +
  `${Object.values(counts).reduce((a, b) => a + b, 0)} tests`)
for (const l of listed) console.log(l)
fs.writeFileSync(process.argv[4], signature.join('\n') + '\n')
if (n('fail') > 0) { console.log(`FAIL: ${n('fail')} required tests failed`); process.exit(1) }
if (n('pass') < minPass) { console.log(`FAIL: ${n('pass')} passes, fewer than ${minPass}`); process.exit(1) }
JS

# rerun.mjs ROUNDS ID...: the tests named, by themselves, ROUNDS times
# through $npm_config_base; one line a test: its id and its outcomes (true
# for a pass, else the failure), each different one once, in the order
# they came.
cat >"$tmp/suite/rerun.mjs" <<'JS'
import { runTests } from './test-engine/client/runner.mjs'
import { testResults } from './test-engine/client/test.mjs'
import tests from './tests/index.mjs'
const [rounds, ...ids] = process.argv.slice(2)
const want = new Set(ids)
const picked = tests.map(s => ({ ...s, tests: s.tests.filter(t => want.has(t.id)) })).filter(s => s.tests.length > 0)
const seen = Object.fromEntries(ids.map(id => [id, []]))
for (let i = 0; i < Number(rounds); i++) {
  for (const k of Object.keys(testResults)) delete testResults[k]
  await runTests(picked, false, process.env.npm_config_base)
  for (const id of ids) {
    const r = JSON.stringify(id in testResults ? testResults[id] : 'not run')
    if (!seen[id].includes(r)) seen[id].push(r)
  }
}
for (const id of ids) console.log(`${id} ${seen[id].join(' | ')}`)
JS

echo "$me: $(node --version), $(git describe --always --dirty 2>/dev/null || echo preforkd) in front of the suite's origin, $(nproc) CPUs"
status=0
first=""
for engine in $ENGINES; do
	run "$engine"
	echo "$engine:"
	(cd "$tmp/suite" && node count.mjs "$tmp/results-$engine.json" "$MIN_PASS" "$tmp/signature-$engine") || status=1
	if [ -z "$first" ]; then
		first=$engine
		[ -z "${RESULTS:-}" ] || cp "$tmp/results-$engine.json" "$RESULTS"
	elif ! diff "$tmp/signature-$first" "$tmp/signature-$engine" >"$tmp/differ-$engine"; then
		echo "$engine and $first differ (test result):"
		cat "$tmp/differ-$engine"
		sed -n 's/^[<>] \([^ ]*\) .*/\1/p' "$tmp/differ-$engine" >>"$tmp/differ-ids"
	fi
done

# A test the engines differed on, by itself on every engine.
if [ -s "$tmp/differ-ids" ]; then
	mapfile -t ids < <(sort -u "$tmp/differ-ids")
	echo "running ${ids[*]} by itself $RERUNS times on each engine"
	for engine in $ENGINES; do
		start "$engine"
		(cd "$tmp/suite" && env npm_config_base="$base" NODE_TLS_REJECT_UNAUTHORIZED=0 \
			node --no-warnings rerun.mjs "$RERUNS" "${ids[@]}" >"$tmp/rerun-$engine") ||
			fail "the tests did not run again on $engine"
		stop
	done
	for id in "${ids[@]}"; do
		outcomes=$(for engine in $ENGINES; do grep "^$id " "$tmp/rerun-$engine" | cut -d' ' -f2-; done | sort -u)
		if [ "$(wc -l <<<"$outcomes")" = 1 ] && [[ $outcomes != *' | '* ]]; then
			echo "FLAKY: $id differed in the full run, and gave $outcomes in each of $RERUNS runs on every engine"
		else
			echo "FAIL: the engines differ on $id, run by itself:"
			for engine in $ENGINES; do echo "  $engine: $(grep "^$id " "$tmp/rerun-$engine" | cut -d' ' -f2-)"; done
			status=1
		fi
	done
fi
exit $status

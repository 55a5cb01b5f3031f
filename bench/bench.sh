#!/usr/bin/env bash
# What `make bench` runs: the Go benchmarks side by side in one
# run, the raw output kept in a file, then the summary table with the
# target ratios. About 25 s on 2 cores with the defaults (well under the
# 3-minute budget; raise BENCHTIME or COUNT on a noisy machine).
#
# Knobs (environment):
#   PKGS       packages to benchmark            (default: ./bench/)
#              other benchmark packages add themselves here, e.g.
#              PKGS="./bench/ ./persist/"; benchsummary reads them all.
#              bench/ is a module of its own (its dependencies stay out
#              of the daemon's go.mod): its packages are benchmarked from
#              there, the others from the root, into the one output.
#   BENCH      -bench regexp                    (default: .)
#   BENCHTIME  -benchtime                       (default: 1s)
#   COUNT      -count; the summary takes medians (default: 1)
#   OUT        raw output file                  (default: bench/last-run.txt)
#   AFTER      scripts run after the Go benchmarks, each with its own
#              output (e.g. AFTER=bench/http.sh once it exists)
#
# Performance is reported, never asserted: the script fails only when a
# benchmark fails to run, not when a target is missed.
set -euo pipefail

cd "$(dirname "$0")/.."

PKGS=${PKGS:-./bench/}
BENCH=${BENCH:-.}
BENCHTIME=${BENCHTIME:-1s}
COUNT=${COUNT:-1}
OUT=${OUT:-bench/last-run.txt}
AFTER=${AFTER:-}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Build the summariser first: a compile error shows before minutes of benchmarks.
go -C bench build -o "$tmp/benchsummary" ./cmd/benchsummary

root_pkgs=() bench_pkgs=()
for p in $PKGS; do
	case $p in
	./bench | ./bench/) bench_pkgs+=(.) ;;
	./bench/*) bench_pkgs+=("./${p#./bench/}") ;;
	*) root_pkgs+=("$p") ;;
	esac
done
flags=(-run '^$' -bench "$BENCH" -benchmem -count "$COUNT" -benchtime "$BENCHTIME" -timeout 15m -v)

{
	if [ ${#bench_pkgs[@]} -gt 0 ]; then
		echo "# command: go -C bench test ${bench_pkgs[*]} -run '^\$' -bench '$BENCH' -benchmem -count $COUNT -benchtime $BENCHTIME -v"
	fi
	if [ ${#root_pkgs[@]} -gt 0 ]; then
		echo "# command: go test ${root_pkgs[*]} -run '^\$' -bench '$BENCH' -benchmem -count $COUNT -benchtime $BENCHTIME -v"
	fi
	echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "# nproc: $(nproc)"
	echo "# cpu model: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
	echo "# $(go version)"
	echo "# kernel: $(uname -sr)"
	echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
	if command -v redis-server >/dev/null; then
		echo "# $(redis-server --version)"
	fi
} | tee "$OUT"

# -v makes a skipped benchmark print why (the summary shows it).
if [ ${#bench_pkgs[@]} -gt 0 ]; then
	go -C bench test "${bench_pkgs[@]}" "${flags[@]}" 2>&1 | tee -a "$OUT"
fi
if [ ${#root_pkgs[@]} -gt 0 ]; then
	go test "${root_pkgs[@]}" "${flags[@]}" 2>&1 | tee -a "$OUT"
fi

echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"
echo
"$tmp/benchsummary" <"$OUT"

# Each script runs whatever happened to the one before (a missing tool,
# a contender that did not start): the failures are listed at the end.
failed=()
for script in $AFTER; do
	echo
	bash "$script" || failed+=("$script")
done
if [ ${#failed[@]} -gt 0 ]; then
	echo
	echo "bench.sh: failed: ${failed[*]}" >&2
	exit 1
fi

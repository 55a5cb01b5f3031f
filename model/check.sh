#!/bin/bash
# Checks model/slot.pml, the spin model of the counter-slot protocol of
# package shm, model/cache.pml, the model of the response cache's
# records, and model/blocks.pml, the model of the response blocks, in
# every configuration below, and exits non-zero unless
#   - every "ok" configuration is searched exhaustively with errors: 0
#     (no assertion violated, no invalid end state, search complete),
#   - every "nocycle" configuration has no non-progress cycle,
#   - every broken configuration ("violates") yields the expected assertion
#     violation, and every "cycle" configuration a non-progress cycle.
#
# Usage: bash model/check.sh          (from any directory)
#        SHOW_TRAILS=1 bash model/check.sh   also print each counterexample
# Needs spin and gcc (Debian: apt-get install -y spin gcc).
# Memory: each pan run is capped at MEMLIM_MB (default 3500 MiB); the largest
# configuration (cache.pml -DN=3 -DCRASH) needs about 1.4 GiB.  Runtime:
# about 5-6 minutes on 2 cores.
set -eu

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
model=$here/slot.pml
memlim=${MEMLIM_MB:-3500}
CFLAGS_EXTRA=""
limit=${PAN_TIMEOUT:-240}          # seconds per pan run

for tool in spin gcc timeout; do
  command -v "$tool" >/dev/null 2>&1 || { echo "check.sh: $tool not found (apt-get install -y spin gcc)" >&2; exit 2; }
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fails=0
start=$(date +%s)

# run EXPECT WIDTH FLAGS...
#   EXPECT: ok | nocycle | violates:TEXT | cycle
#   TEXT is a fixed string that the violated assertion must contain:
#     P1 "key[i]==K"  P2 "allowed["  P3 "key[j]!=K"
#     P6 "held[(K%2)]<="  P7 "held[i]=="  P8 "chg[i]==qa"
#   WIDTH: log2 of pan's hash table (-w), sized to the state count.
run() {
  local expect=$1 width=$2; shift 2
  local d=$tmp/run$((++n)) mode=safety
  case $expect in nocycle|cycle) mode=np ;; esac
  mkdir "$d"
  local pml
  pml=$(basename "$model")
  cp "$model" "$d/$pml"
  local cflags="-O2 -DMEMLIM=$memlim -DSAFETY" panflags="-m200000 -w$width"
  if [ "$mode" = np ]; then
    cflags="-O2 -DMEMLIM=$memlim -DNP"
    panflags="$panflags -l"
  fi
  local t0 result rc=0 secs states
  t0=$(date +%s.%N)
  if ! (cd "$d" && spin "$@" -a "$pml" >spin.log 2>&1); then
    cat "$d/spin.log" >&2
    result="spin failed"
  elif ! (cd "$d" && gcc $cflags $CFLAGS_EXTRA -o pan pan.c >gcc.log 2>&1); then
    cat "$d/gcc.log" >&2
    result="gcc failed"
  else
    (cd "$d" && timeout "$limit" ./pan $panflags >pan.log 2>&1) || rc=$?
    result=$(classify "$d/pan.log" "$rc")
  fi
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  states=$(awk '/states, stored/ { print $1; exit }' "$d/pan.log" 2>/dev/null || true)

  local verdict=FAIL
  case $expect in
    ok)           [ "$result" = "errors: 0" ] && verdict=pass ;;
    nocycle)      [ "$result" = "errors: 0" ] && verdict=pass ;;
    cycle)        [ "$result" = "non-progress cycle" ] && verdict=pass ;;
    violates:*)   case $result in
                    "assertion violated: "*"${expect#violates:}"*) verdict=pass ;;
                  esac ;;
  esac
  [ "$verdict" = pass ] || fails=$((fails + 1))
  printf '%-4s | %-44s | %-22s | %-48s | %10s states | %6ss\n' \
    "$verdict" "$*" "$expect" "$result" "${states:-?}" "$secs"

  if [ "${SHOW_TRAILS:-}" != "" ] && [ -f "$d/$pml.trail" ]; then
    (cd "$d" && spin -t "$@" "$pml" 2>&1 | grep -E '^ +(W[01]|clock|worker|evictor)|START OF CYCLE' | sed 's/^ */      /') || true
  fi
  rm -rf "$d"
}

# classify PANLOG RC -> one line: "errors: 0", "assertion violated: ...",
# "non-progress cycle", "invalid end state", or why the search is not valid.
classify() {
  local log=$1 rc=$2
  if [ "$rc" = 124 ]; then echo "timeout after ${limit}s"; return; fi
  if grep -q 'reached -DMEMLIM bound' "$log"; then echo "out of memory (MEMLIM)"; return; fi
  if grep -q 'max search depth too small' "$log"; then echo "depth limit reached (raise -m)"; return; fi
  if grep -q 'assertion violated' "$log"; then
    echo "assertion violated: $(grep -m1 -o 'assertion violated .*' "$log" | sed 's/assertion violated //; s/ (at depth.*//')"
    return
  fi
  if grep -q 'non-progress cycle' "$log" && ! grep -q 'errors: 0' "$log"; then echo "non-progress cycle"; return; fi
  if grep -q 'invalid end state' "$log" && ! grep -q 'errors: 0' "$log"; then echo "invalid end state (deadlock)"; return; fi
  if grep -q 'Search not completed' "$log"; then echo "search not completed"; return; fi
  if [ "$rc" != 0 ]; then echo "pan exit status $rc"; return; fi
  if grep -q 'errors: 0' "$log"; then echo "errors: 0"; return; fi
  echo "unrecognised pan output"
}

n=0
echo "spin model: $model"
printf '%-4s | %-44s | %-22s | %-48s | %17s | %7s\n' "" "configuration (spin -D...)" "expected" "result" "states stored" "time"

# The protocol as built (shm/table.go): the claim publishes the key's first
# decision, LIVE(gen, op(0, max(now, watermark))), and every decision on
# payload 0 runs at max(now, watermark).
built="-DPUBLISH1 -DTIMEFIX=2"
# ...and with a limiter given a clock (bucket.Limiter.SetClock, as every
# limiter of package core is): every decision runs no earlier than the
# clock read after the key's state.
clocked="$built -DREREAD"

# --- the protocol as built: exhaustive, must hold ---
run ok 22        -DN=2 -DNK=3 $built
run ok 23        -DN=2 -DNK=3 -DCRASH $built
run ok 21        -DN=3 -DNK=3 -DCRASH $built
run ok 24        -DN=3 -DNK=4 -DCRASH $built
run ok 20        -DN=1 -DNK=2 -DCRASH -DLOCKTIMEOUT $built
run ok 23        -DN=2 -DNK=3 -DL=1 -DOPS=3 -DCRASH $built
run ok 23        -DN=2 -DNK=3 -DOPS=3 -DCRASH $built
run nocycle 22   -DN=2 -DNK=3 -DCRASH -DLIVENESS $built
# the same with the clock read again after the state (REREAD)
run ok 23        -DN=2 -DNK=3 -DCRASH $clocked
run ok 24        -DN=3 -DNK=4 -DCRASH $clocked
run ok 23        -DN=2 -DNK=3 -DL=1 -DOPS=3 -DCRASH $clocked
run nocycle 22   -DN=2 -DNK=3 -DCRASH -DLIVENESS $clocked

# --- the earlier protocol (publish LIVE(gen, 0), apply afterwards): the
# defects this model found in it, kept as counterexamples (README "Findings") ---
# F1: a decision on a key that another process installed and has not yet
# applied (payload 0) runs at the caller's stale `now`: more than L in a window.
run violates:allowed[ 22  -DN=2 -DNK=3 -DL=1 -DOPS=3
# F2: a newly published LIVE(gen, 0) is fresh, so two installers can take
# the last slot from each other for ever (livelock): a non-progress cycle.
run cycle 18              -DN=1 -DNK=2 -DLIVENESS

# --- broken variants of the protocol as built: each must produce a counterexample ---
run violates:key[j]!=K 20  -DN=2 -DNK=3 -DNOLOCK $built          # P3: K installed in two slots
run violates:key[i]==K 18  -DN=1 -DNK=2 -DKEYFIRST $built        # P1: stale CAS lands on another key
run violates:allowed[ 20   -DN=2 -DNK=3 -DNEWINDOW $built        # P2: "window != now" resets a limited key
# Without the reclaim watermark (-DTIMEFIX=0) the protocol as built is unsafe
# for a caller whose `now` lags by more than a window, but this model's clock
# has two windows, so no slot is fresh at a lagging `now` and pan finds no
# counterexample. shm's TestMultiProcessTinyTable (many windows, callers
# descheduled between clock and decision) fails without it instead.

# --- accounts (-DQUOTA, shm/accounts.go): each key's slot charged to its
# account (ACC(K) = K mod 2) under the account's lock, at most M slots per
# account; a dead holder's lock taken over with a recount; EVICT adds the
# sweep (a fresh slot freed without the insert lock). Must hold; the two
# largest with the clock read again only (as package core runs them), to
# keep the run's time: ---
run ok 23        -DN=3 -DNK=3 -DCRASH $built -DQUOTA
run ok 20        -DN=1 -DNK=2 -DCRASH -DLOCKTIMEOUT $built -DQUOTA
run nocycle 22   -DN=2 -DNK=3 -DCRASH $built -DQUOTA -DLIVENESS
run ok 23        -DN=2 -DNK=3 -DCRASH $clocked -DQUOTA
run ok 24        -DN=2 -DNK=3 -DCRASH -DM=2 $clocked -DQUOTA -DEVICT
# --- broken variants of the accounts: each must produce a counterexample ---
run violates:held[i]== 20     -DN=2 -DNK=3 -DCRASH -DM=2 $built -DQUOTA -DEVICT -DNORECOUNT   # P7: a dead holder's half change stays
run 'violates:held[(K%2)]<=' 20 -DN=3 -DNK=3 $built -DQUOTA -DNOQCHECK                         # P6: the cap checked outside the lock only
run violates:chg[i]==qa 22    -DN=2 -DNK=3 -DCRASH -DM=2 $built -DQUOTA -DEVICT -DNOSTATECHECK # P8: a releaser clears another's charge
# --- the response cache's records (model/cache.pml; shm/cache.go as built) ---
model=$here/cache.pml
echo "spin model: $model"
CFLAGS_EXTRA="-DCOLLAPSE -w"
run ok 24                  -DN=2
run ok 25                  -DN=3
run ok 25                  -DN=3 -DCRASH
# broken variants: each must produce a counterexample
run 'violates:ph[0]==2' 20   -DN=2 -DOPS=1 -DNOLOCK   # P1 (LOCKS<=1): two fill locks of one key
run 'violates:d==pub' 22     -DN=3 -DNORECHECK        # P2: a torn read served
run 'violates:d>=floor' 22   -DN=3 -DNODROP           # P3: an older response after a newer fill
CFLAGS_EXTRA=""
# --- the response blocks (model/blocks.pml; shm/blocks.go as built) ---
model=$here/blocks.pml
echo "spin model: $model"
CFLAGS_EXTRA="-DCOLLAPSE -w"
run ok 24                        -DNB=3
# broken variants: each must produce a counterexample
run 'violates:who[fh]==5' 22     -DNB=3 -DNOCAS        # B2: a freer takes a block the reaper took
run 'violates:who[i]==1' 22      -DNB=3 -DNOHELD       # B3: the reaper frees a completed record's block
run 'violates:st[i]==rB' 22      -DNB=3 -DNOPROGRESS   # B4: a dead freer's chain left taken
CFLAGS_EXTRA=""

total=$(( $(date +%s) - start ))
echo "total: ${total}s, $n configurations, $fails failed"
[ "$fails" -eq 0 ]

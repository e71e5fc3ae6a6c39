#!/usr/bin/env bash
# Runs every libFuzzer target (tests/fuzz/fuzz_*.c) for SECONDS each, from its
# seed corpus tests/fuzz/corpus_<name> plus a working corpus kept in
# build-clang/corpus_<name>, and prints executions and crashes per target and
# in total. Builds build-clang (clang, -DKKV_FUZZ=ON) first.
#   scripts/fuzz.sh [SECONDS]      (default 60; CI runs it with a short time)
# Exit status 1 if any target crashed (its reproducer is left in build-clang/).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
JOBS=${JOBS:-2}
command -v clang >/dev/null || { echo "fuzz.sh: clang is needed" >&2; exit 1; }
CC=clang cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=Release -DKKV_FUZZ=ON >/dev/null
cmake --build build-clang -j"$JOBS" >/dev/null
total=0
crashes=0
for src in tests/fuzz/fuzz_*.c; do
  name=$(basename "$src" .c)
  short=${name#fuzz_}
  bin=build-clang/tests/$name
  [ -x "$bin" ] || { echo "fuzz.sh: $bin was not built" >&2; exit 1; }
  work=build-clang/corpus_$short
  mkdir -p "$work"
  seeds=tests/fuzz/corpus_$short
  [ -d "$seeds" ] || seeds=
  log=build-clang/fuzz_$short.log
  rc=0
  (cd build-clang && "../$bin" -max_total_time="$SECONDS_EACH" -max_len=65536 \
      -print_final_stats=1 "corpus_$short" ${seeds:+"../$seeds"}) >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  execs=${execs:-0}
  bad=0
  if [ "$rc" -ne 0 ]; then
    bad=1
    echo "--- $name crashed (exit $rc); the end of $log:"
    tail -n 30 "$log"
  fi
  printf '%-20s %12s execs  %d crash(es)  %ss\n' "$name" "$execs" "$bad" "$SECONDS_EACH"
  total=$((total + execs))
  crashes=$((crashes + bad))
done
printf '%-20s %12s execs  %d crash(es)\n' "total" "$total" "$crashes"
[ "$crashes" -eq 0 ]

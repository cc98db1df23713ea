#!/usr/bin/env bash
# The installed package is what an engine needs, and only that:
#   - `cmake --install` of the build tree into a fresh prefix puts attnres.h,
#     libattnres.so/.a, attnres.pc, the CMake package, the CLI and templates;
#   - libattnres.so needs only libc, libm, libdl, pthreads and SQLite, and
#     exports exactly the functions attnres.h declares;
#   - libattnres.a is self-contained (it holds the database layer);
#   - examples/, copied out of the tree, builds against the prefix with
#     pkg-config and with find_package, shared and static, and passes its
#     forward check and its training step.
# Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d /tmp/attnres-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

step "cmake --install into $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "install"; }
libdir=
for d in lib lib64 lib/*-linux-gnu; do
  if [ -f "$prefix/$d/libattnres.a" ]; then libdir=$d; break; fi
done
[ -n "$libdir" ] || fail "no libattnres.a under $prefix"
for f in include/attnres.h "$libdir/libattnres.a" "$libdir/libattnres.so" "$libdir/pkgconfig/attnres.pc" \
         "$libdir/cmake/attnres/attnresConfig.cmake" "$libdir/cmake/attnres/attnresConfigVersion.cmake" \
         "$libdir/cmake/attnres/attnresTargets.cmake" bin/attnres share/attnres/templates/cpu/mix.lua; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
so=$(readlink -f "$prefix/$libdir/libattnres.so")

step "link dependencies of libattnres.so"
needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "$needed" | sed 's/^/   /'
for lib in $needed; do
  case "$lib" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|libsqlite3.so.*|ld-linux*) ;;
    *) fail "libattnres.so needs $lib (allowed: libc, libm, libdl, pthreads, SQLite)" ;;
  esac
done

step "exported symbols are exactly the API of attnres.h"
nm -D --defined-only "$so" | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$work/exported.txt"
grep -o 'ATTNRES_API[^(]*attnres_[a-z0-9_]*' "$prefix/include/attnres.h" | grep -o 'attnres_[a-z0-9_]*$' |
  sort -u >"$work/declared.txt"
if ! diff -u "$work/declared.txt" "$work/exported.txt"; then
  fail "libattnres.so exports differ from attnres.h (- declared only, + exported only)"
fi
echo "   $(wc -l <"$work/exported.txt") functions"

step "libattnres.a holds the read side of the database layer and none of its writers"
nm "$prefix/$libdir/libattnres.a" >"$work/static-symbols.txt" 2>/dev/null
grep -q ' T ardb_open_readonly$' "$work/static-symbols.txt" || fail "libattnres.a lacks ardb_open_readonly"
grep -q ' T attnres_plan_create$' "$work/static-symbols.txt" || fail "libattnres.a lacks the API"
# db/write's: a writer's open (creation, migration), the records of a run.
for writer in ardb_open ardb__migrate ardb__schema_init ardb_run_begin ardb_measurement_add ardb_winner_set; do
  if grep -q " T $writer\$" "$work/static-symbols.txt"; then fail "libattnres.a carries $writer, a writer"; fi
done

step "the installed command line runs"
"$prefix/bin/attnres" devices >"$work/devices.txt" 2>&1 || { cat "$work/devices.txt"; fail "attnres devices"; }
"$prefix/bin/attnres" plan --device cpu --dtype f32 --d 256 --n 9 --explain >"$work/plan.txt" 2>&1 ||
  { cat "$work/plan.txt"; fail "attnres plan"; }

# The examples, copied where nothing of the source or build tree is near.
cp -r "$src/examples" "$work/examples"
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
run_example() { # name binary
  local out
  out=$("$2" --tokens 2 --train 2>&1) || { echo "$out"; fail "$1: k3_engine failed"; }
  grep '^PASS$' <<<"$out" >/dev/null || { echo "$out"; fail "$1: k3_engine did not pass"; }
  echo "$out" | sed -n 's/^/   /;/model load\|check\|train:/p'
}

step "pkg-config, shared"
make -s -C "$work/examples" >/dev/null || fail "make with pkg-config (shared)"
ldd "$work/examples/k3_engine" | grep "$prefix" >/dev/null || fail "the shared example does not use the installed library"
run_example "pkg-config shared" "$work/examples/k3_engine"

step "pkg-config, static"
make -s -C "$work/examples" clean >/dev/null
make -s -C "$work/examples" STATIC=1 >/dev/null || fail "make with pkg-config (static)"
if ldd "$work/examples/k3_engine" | grep libattnres >/dev/null; then fail "the static example links libattnres.so"; fi
run_example "pkg-config static" "$work/examples/k3_engine"
make -s -C "$work/examples" clean >/dev/null

for kind in shared static; do
  step "find_package, $kind"
  static=OFF
  [ "$kind" = static ] && static=ON
  cmake -S "$work/examples" -B "$work/build-$kind" -DCMAKE_PREFIX_PATH="$prefix" \
        -DATTNRES_EXAMPLES_STATIC=$static >"$work/cmake-$kind.log" 2>&1 ||
    { cat "$work/cmake-$kind.log"; fail "configure with find_package ($kind)"; }
  cmake --build "$work/build-$kind" >>"$work/cmake-$kind.log" 2>&1 ||
    { cat "$work/cmake-$kind.log"; fail "build with find_package ($kind)"; }
  if [ "$kind" = shared ]; then
    ldd "$work/build-$kind/k3_engine" | grep "$prefix" >/dev/null || fail "find_package shared: not the installed library"
  fi
  run_example "find_package $kind" "$work/build-$kind/k3_engine"
done
echo "PASS"

#!/usr/bin/env bash
# The minimal template of docs/templates.md is true: taken out of the page
# into a templates folder of its own (beside a copy of lib/), it lists the
# variants its space and constraint give, emits a source the host compiler
# takes, and tunes: the replacement problem gets a verified winner among its
# variants, the additive one none (its applies refuses that form).
#
# usage: test_templates_doc.sh ATTNRES_CLI DOCS/templates.md TEMPLATE_DIR
set -uo pipefail
cli="$1" page="$2" shipped="$3"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
. "$(dirname "$0")/../lib/checks.sh"

# The fenced block after the example marker.
mkdir -p "$dir/templates/cpu"
cp -r "$shipped/lib" "$dir/templates/lib"
awk '/^<!-- example: templates\/cpu\/mix_example.lua/ { marked = 1; next }
     marked && /^```lua$/ { inside = 1; next }
     inside && /^```$/ { exit }
     inside { print }' "$page" >"$dir/templates/cpu/mix_example.lua"
if [ -s "$dir/templates/cpu/mix_example.lua" ]; then ok "the page holds the example"; else
  bad "no example block after the marker in $page"; finish; fi
export ATTNRES_TEMPLATE_DIR="$dir/templates" ATTNRES_CACHE_DIR="$dir/cache"

expect_rc 0 "gen --list" -- "$cli" gen --list --template cpu/mix_example
ids=$(cat "$dir/out.txt")
if grep -qx mix_c_f32_example_s1_t1 <<<"$ids" && grep -qx mix_c_f32_example_s2_t64 <<<"$ids" &&
  ! grep -qx mix_c_f32_example_s2_t1 <<<"$ids" && [ "$(wc -l <<<"$ids")" = 13 ]; then
  ok "13 variants, without the one the constraint removes"
else
  bad "the variants are not the page's: $(tr '\n' ' ' <<<"$ids")"
fi

expect_rc 0 "gen ID" -- "$cli" gen mix_c_f32_example_s2_t2
cp "$dir/out.txt" "$dir/k.c"
if head -2 "$dir/k.c" | grep -q "kernel attnres_mix_c_f32_example_s2: dtype=f32 sums=2 (threads: set at launch)"; then
  ok "the header names the kernel and the parameters"
else
  bad "header: $(head -2 "$dir/k.c")"
fi
expect_rc 0 "the host compiler takes the source" -- "${CC:-cc}" -O2 -Wall -Werror -fPIC -shared "$dir/k.c" \
  -o "$dir/k.so" -lm

printf 'mix f32 256 3 2 replace 0 8\nmix f32 256 3 1 additive 0 8\n' >"$dir/problems.txt"
expect_rc 0 "tune" -- "$cli" tune --device cpu --problems "$dir/problems.txt" --db "$dir/t.db"
if grep -E "^mix f32 d=256 N=3 H=2 replace T=8 +mix_c_f32_example_s[12]_t" "$dir/out.txt" >/dev/null; then
  ok "the replacement problem has a verified winner of the example"
else
  bad "no winner for the replacement problem: $(grep '^mix' "$dir/out.txt")"
fi
if grep -E "^mix f32 d=256 N=3 H=1 additive T=8 +\(none verified\)" "$dir/out.txt" >/dev/null; then
  ok "the additive problem has none"
else
  bad "the additive problem: $(grep 'additive' "$dir/out.txt")"
fi
finish

#!/usr/bin/env bash
# Installs what building attnres needs on Debian/Ubuntu, if it is missing:
# a C compiler, CMake, pkg-config, Lua 5.4 and SQLite 3 development files,
# and the sqlite3 shell and Python 3 that the tests use.
# The CUDA toolkit is optional and never installed here.
set -euo pipefail

missing=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
for pkg in liblua5.4-dev libsqlite3-dev sqlite3 make; do
  have_pkg "$pkg" || missing+=("$pkg")
done

if ((${#missing[@]})); then
  echo "attnres: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

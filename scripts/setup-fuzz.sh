#!/usr/bin/env bash
# Installs what the fuzz targets need (clang with libFuzzer and the ASan/UBSan runtimes) from
# Debian's packages. Not needed to build or test gemma4rt itself (scripts/setup.sh does that).
# Idempotent: a second run installs nothing. Run as root (or with sudo available).
set -euo pipefail
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
updated=0
apt_update() { ((updated)) || { $SUDO apt-get update -qq; updated=1; }; }
if ! installed clang; then
  apt_update
  echo "setup-fuzz: installing clang"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang
fi
# libFuzzer and the sanitizer runtimes are in libclang-rt-<major>-dev (Debian 12: clang 14).
major="$(clang --version | sed -n 's/.*clang version \([0-9][0-9]*\).*/\1/p' | head -n1)"
rt="libclang-rt-$major-dev"
if ! installed "$rt"; then
  apt_update
  echo "setup-fuzz: installing $rt"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$rt"
fi
echo "setup-fuzz: clang $major with libFuzzer present"

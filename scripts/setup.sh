#!/usr/bin/env bash
# Installs everything gemma4rt needs to build and test, from Debian's packages. Idempotent: a
# second run installs nothing. Run as root (or with sudo available).
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev libgtest-dev
      libgmock-dev libcpp-httplib-dev libhwy-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
else
  echo "setup: all build dependencies present"
fi

#!/usr/bin/env bash
# Installs what the XLA backend needs to build and test, pinned by version and sha256, into a cache
# outside the repository (GEMMA4RT_XLA_CACHE, default ~/.cache/gemma4rt/xla):
#   - pypjrt 0.1.1's source distribution: its vendor/xla/pjrt/c/pjrt_c_api.h (PJRT C API 0.114);
#   - lammps-jax-pjrt-cpu 0.11.2's wheel: pjrt_c_api_cpu_plugin.so, XLA's CPU plugin (API 0.115),
#     installed without its dependencies (it declares jax, which the plugin does not need).
# Prints the two paths as NAME=VALUE lines (eval-able): configure with
# -DGEMMA4RT_XLA_INCLUDE_DIR=<include dir> (the build finds it in the default cache by itself) and run
# the tests with GEMMA4RT_PJRT_PLUGIN=<plugin>. Idempotent. The CPU plugin wheel exists for x86-64 Linux only:
# elsewhere only the header is installed and the plugin line says so.
set -euo pipefail
CACHE="${GEMMA4RT_XLA_CACHE:-$HOME/.cache/gemma4rt/xla}"
PY="${PYTHON:-python3}"
mkdir -p "$CACHE/dl"

HEADER_SDIST=pypjrt-0.1.1.tar.gz
HEADER_SHA=e85e8fd382801726f9b8d1348deeebe5fb3aab35e95147c09d693cc701190dec
PLUGIN_WHEEL=lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl
PLUGIN_SHA=1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1

# pip checks each file against its hash (--require-hashes) before saving it.
fetch() {  # requirement, sha256, extra pip args...
  local req="$1" sha="$2"; shift 2
  printf '%s --hash=sha256:%s\n' "$req" "$sha" > "$CACHE/dl/req.txt"
  "$PY" -m pip download -q --no-deps --require-hashes -r "$CACHE/dl/req.txt" -d "$CACHE/dl" "$@"
}
verify() {  # file, sha256
  echo "$2  $1" | sha256sum -c --quiet - || { echo "setup-xla: sha256 mismatch for $1" >&2; exit 1; }
}

INCLUDE="$CACHE/pypjrt-0.1.1/vendor"
if [ ! -f "$INCLUDE/xla/pjrt/c/pjrt_c_api.h" ]; then
  [ -f "$CACHE/dl/$HEADER_SDIST" ] || fetch pypjrt==0.1.1 "$HEADER_SHA" --no-binary :all:
  verify "$CACHE/dl/$HEADER_SDIST" "$HEADER_SHA"
  tar -xzf "$CACHE/dl/$HEADER_SDIST" -C "$CACHE" pypjrt-0.1.1/vendor
fi
echo "GEMMA4RT_XLA_INCLUDE_DIR=$INCLUDE"

if [ "$(uname -m)" != x86_64 ] || [ "$(uname -s)" != Linux ]; then
  echo "# no XLA CPU plugin wheel for $(uname -s) $(uname -m): the XLA tests are skipped" >&2
  echo "GEMMA4RT_PJRT_PLUGIN="
  exit 0
fi
PLUGIN="$CACHE/lammps-jax-pjrt-cpu-0.11.2/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"
if [ ! -f "$PLUGIN" ]; then
  [ -f "$CACHE/dl/$PLUGIN_WHEEL" ] || fetch lammps-jax-pjrt-cpu==0.11.2 "$PLUGIN_SHA" --only-binary :all:
  verify "$CACHE/dl/$PLUGIN_WHEEL" "$PLUGIN_SHA"
  mkdir -p "$CACHE/lammps-jax-pjrt-cpu-0.11.2"
  "$PY" -m zipfile -e "$CACHE/dl/$PLUGIN_WHEEL" "$CACHE/lammps-jax-pjrt-cpu-0.11.2"
fi
echo "GEMMA4RT_PJRT_PLUGIN=$PLUGIN"

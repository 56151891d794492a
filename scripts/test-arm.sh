#!/usr/bin/env bash
# The CPU kernel tests on 64-bit Arm: cross-compiles gemma4rt_kernel_tests (CMake option
# GEMMA4RT_KERNEL_TESTS_ONLY, toolchain cmake/aarch64-linux-gnu.cmake) into build-aarch64 with
# Debian's g++-aarch64-linux-gnu and runs it under qemu-user (each test runs once per Highway target
# the emulated CPU supports):
#   -cpu max                               NEON, SVE and SVE2, SVE vectors of qemu's default 512 bits
#   -cpu max,sve-default-vector-length=16  only SVE2_128, the target Highway adds for 128-bit SVE
#                                          (Neoverse N2/V2-class cores)
#   -cpu cortex-a57                        a NEON-only core (ARMv8.0: no SVE, no dot product)
# Installs what it needs from Debian when missing (cross compiler, qemu-user-static, googletest
# sources) and downloads arm64 Highway (libhwy-dev, libhwy1) into ~/.cache/gemma4rt/arm64 with a
# private apt state (no `dpkg --add-architecture`, the system's package setup is left alone).
# Env: GEMMA4RT_ARM_RUNS, space-separated qemu CPUs each with an optional :GTEST_FILTER (default
# below); GEMMA4RT_ARM_GTEST_FILTER, a filter for runs that name none.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(uname -m)" = aarch64 ]; then
  echo "test-arm: native Arm host: the kernel tests already run natively in ctest (gemma4rt_tests)"
  exit 0
fi
ROOT="$PWD"
BUILD="$ROOT/build-aarch64"
CACHE="${GEMMA4RT_CACHE:-$HOME/.cache/gemma4rt}/arm64"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

# 1. Host packages: the cross compiler (pulls the arm64 libc/libstdc++ cross sysroot in
#    /usr/aarch64-linux-gnu), qemu-user-static, GoogleTest sources, nlohmann/json header, cmake.
PKGS=(g++-aarch64-linux-gnu qemu-user-static googletest nlohmann-json3-dev cmake ninja-build)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "test-arm: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
QEMU="$(command -v qemu-aarch64-static || command -v qemu-aarch64)"

# 2. arm64 Highway, same Debian release as the host's: apt with its own state directory and
#    arm64 as the only architecture, the host's sources list, then `apt-get download` and
#    `dpkg-deb -x` into the cache.
HWY_DIR="$CACHE/root/usr/lib/aarch64-linux-gnu/cmake/hwy"
if [ ! -f "$HWY_DIR/hwy-config.cmake" ]; then
  echo "test-arm: fetching arm64 Highway into $CACHE"
  APT=(-o APT::Architecture=arm64 -o APT::Architectures::=arm64 -o Dir::State::Lists="$CACHE/apt/lists"
       -o Dir::State::status="$CACHE/apt/status" -o Dir::Cache="$CACHE/apt/cache" -o Debug::NoLocking=1
       -o APT::Sandbox::User="$(id -un)")
  rm -rf "$CACHE/apt" "$CACHE/debs" "$CACHE/root"
  mkdir -p "$CACHE/apt/lists/partial" "$CACHE/apt/cache/archives/partial" "$CACHE/debs" "$CACHE/root"
  : >"$CACHE/apt/status"
  apt-get "${APT[@]}" -qq update
  (cd "$CACHE/debs" && apt-get "${APT[@]}" -qq download libhwy-dev libhwy1)
  for deb in "$CACHE"/debs/*.deb; do dpkg-deb -x "$deb" "$CACHE/root"; done
  rm -rf "$CACHE/apt"  # the arm64 package lists (~20 MB) are not needed again
fi

# 3. Configure and build.
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/aarch64-linux-gnu.cmake" \
    -DGEMMA4RT_KERNEL_TESTS_ONLY=ON -Dhwy_DIR="$HWY_DIR" >/dev/null
fi
cmake --build "$BUILD" -j"$(nproc)"

# 4. Run under qemu-user: -L gives the dynamic loader and libraries of the cross sysroot; libhwy
#    is found through the binary's build RPATH (the cache directory).
RUNS="${GEMMA4RT_ARM_RUNS:-max max,sve-default-vector-length=16:*/SVE2_128 cortex-a57}"
status=0
set -f  # the gtest filters are not file globs
for run in $RUNS; do
  cpu="${run%%:*}"
  filter="${GEMMA4RT_ARM_GTEST_FILTER:-*}"
  if [ "$run" != "$cpu" ]; then filter="${run#*:}"; fi
  echo "test-arm: qemu-aarch64 -cpu $cpu, tests $filter"
  log="$BUILD/kernel_tests-${cpu//[^a-z0-9-]/_}.log"
  start=$SECONDS
  if "$QEMU" -L /usr/aarch64-linux-gnu -cpu "$cpu" "$BUILD/gemma4rt_kernel_tests" \
      --gtest_filter="$filter" >"$log" 2>&1; then
    result=passed
  else
    result=FAILED; status=1
    grep -E '^\[  FAILED  \]|Failure|error' "$log" | head -40 || true
  fi
  # The targets Highway dispatched to: the /TARGET suffixes of the per-target tests that ran.
  targets="$(grep -oE '^\[ +(OK|FAILED) +\] [^ ]+/[A-Z0-9_]+ ' "$log" | sed -E 's|.*/||; s| ||g' | sort -u | paste -sd' ')"
  if [ -z "$targets" ]; then result="FAILED (no per-target test ran)"; status=1; fi
  echo "test-arm: -cpu $cpu: $result: $(grep -E '^\[==========\] [0-9]+ tests' "$log" | tail -1 | cut -c14-);" \
       "Highway targets run: ${targets:-none}; $((SECONDS - start)) s (log: $log)"
done
exit $status

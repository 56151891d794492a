#!/usr/bin/env bash
# One prepared check of the XLA backend on a lent accelerator (an H200 with JAX's CUDA PJRT plugin),
# under 8 minutes: build (or a carried build), the XLA golden tests on the device's plugin, and
# `gemma4rt bench --backend xla` on the synthetic full-size Gemma 4 E2B (tools/make_synthetic_e2b.py)
# as stored (BF16) and quantised to 4 bits at load (W4A16): decode at batch 1, 8 and 32 and prefill
# of 512 tokens, tokens/s and the fraction of the HBM bandwidth limit (bytes each decode step reads
# x steps/s, over a device copy rate measured in the same run). Figures: $OUT/figures.txt; each
# step's log and the bench JSON beside it.
#
#   OUT=/tmp/out bash scripts/device-check.sh            # on the device
#   bash scripts/device-check.sh --prepare               # here: fills build-carry/ to carry there
#   DEVICE_CHECK_PLATFORM=cpu OUT=/tmp/out bash scripts/device-check.sh   # here, no GPU
#
# --prepare copies what the device may lack into build-carry/ (ignored by git; carry it): the PJRT
# C API header (scripts/setup-xla.sh's cache) and this machine's gemma4rt and gemma4rt_tests with
# the shared libraries they need beyond the C/C++ runtime, used when the device cannot configure
# the build (no Debian dev packages there).
# DEVICE_CHECK_PLATFORM=cpu: the same steps on XLA's CPU plugin with the tiny E2B-like golden
# fixture instead of the synthetic E2B (generation only checked with --dry-run) and a numpy copy
# for the bandwidth: everything but the GPU parts.
# Env: GEMMA4RT_PJRT_PLUGIN (default: JAX's CUDA plugin in python3's site-packages), E2B_DIR
# (default /tmp/g4-synthetic-e2b; kept when complete), JOBS (build jobs, default nproc),
# DEVICE_CHECK_BUILD_DIR (default build-device; an existing build directory builds incrementally),
# DEVICE_CHECK_BUDGET (seconds for the whole run, default 460).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PLATFORM="${DEVICE_CHECK_PLATFORM:-cuda}"
CARRY="$ROOT/build-carry"
PY="${PYTHON:-python3}"

if [ "${1:-}" = --prepare ]; then
  eval "$(bash scripts/setup-xla.sh | sed 's/^/export /')"
  if [ ! -x build/gemma4rt ] || [ ! -x build/gemma4rt_tests ]; then
    echo "device-check: build first (scripts/build.sh)" >&2
    exit 1
  fi
  rm -rf "$CARRY"
  mkdir -p "$CARRY/include/xla/pjrt/c" "$CARRY/bin" "$CARRY/lib"
  cp "$GEMMA4RT_XLA_INCLUDE_DIR/xla/pjrt/c/pjrt_c_api.h" "$CARRY/include/xla/pjrt/c/"
  cp build/gemma4rt build/gemma4rt_tests build/libgemma4rt_fake_pjrt_*.so "$CARRY/bin/" 2>/dev/null || cp build/gemma4rt build/gemma4rt_tests "$CARRY/bin/"
  strip "$CARRY/bin/gemma4rt" "$CARRY/bin/gemma4rt_tests" 2>/dev/null || true
  # Shared libraries beyond glibc and the C++ runtime (libhwy, ...), for a device without them.
  ldd "$CARRY/bin/gemma4rt" "$CARRY/bin/gemma4rt_tests" | awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' | xargs -r -I{} cp -L {} "$CARRY/lib/"
  pwd > "$CARRY/source_dir"  # the tests' data directory is compiled in: <source dir>/tests
  du -sh "$CARRY"
  size=$(du -sm "$CARRY" | cut -f1)
  [ "$size" -le 64 ] || { echo "device-check: build-carry/ is ${size} MiB, more than the 64 MiB a run carries" >&2; exit 1; }
  echo "device-check: carry build-carry/ (header, binaries, $(find "$CARRY/lib" -type f | wc -l) libraries)"
  exit 0
fi

OUT="${OUT:?OUT must name the output directory}"
mkdir -p "$OUT"
FIG="$OUT/figures.txt"
: > "$FIG"
T0=$(date +%s)
log() { printf '[device-check %4ds] %s\n' "$(( $(date +%s) - T0 ))" "$*" | tee -a "$OUT/steps.log" >&2; }
fig() { printf '%s\n' "$*" | tee -a "$FIG"; }
FAILED=()
BUDGET="${DEVICE_CHECK_BUDGET:-460}"  # seconds for the whole run: each step's limit is cut to what is left
# step NAME SECONDS CMD...: runs CMD under a time limit, its output in $OUT/NAME.log; a failure is
# recorded (the script goes on) and returns non-zero.
step() {
  local name="$1" limit="$2" rc=0 s left
  shift 2
  left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$left" -lt 15 ]; then
    log "$name: SKIPPED (${left}s of the ${BUDGET}s budget left)"
    FAILED+=("$name")
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  s=$(date +%s)
  log "$name: start (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    log "$name: ok in $(( $(date +%s) - s ))s"
  else
    log "$name: FAILED (exit $rc$([ "$rc" -eq 124 ] && echo ', timed out')) after $(( $(date +%s) - s ))s; last lines:"
    tail -n 15 "$OUT/$name.log" | sed 's/^/    /' >&2
    FAILED+=("$name")
  fi
  return "$rc"
}
fig "# gemma4rt device check: platform $PLATFORM, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

# 1. The machine.
if [ "$PLATFORM" = cuda ]; then
  step gpu 30 nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || true
  [ -f "$OUT/gpu.log" ] && fig "gpu: $(tail -n 1 "$OUT/gpu.log")"
fi
fig "cpu: $(nproc) cores"

# 2. The plugin.
if [ -z "${GEMMA4RT_PJRT_PLUGIN:-}" ]; then
  if [ "$PLATFORM" = cpu ]; then
    eval "$(bash scripts/setup-xla.sh | sed 's/^/export /')"
  else
    GEMMA4RT_PJRT_PLUGIN=$("$PY" - <<'EOF'
import glob, site, sys
dirs = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for d in dirs:
    for p in sorted(glob.glob(d + "/jax_plugins/xla_cuda*/xla_cuda_plugin.so"), reverse=True):
        print(p)
        sys.exit(0)
sys.exit(1)
EOF
) || { log "no JAX CUDA plugin (jax_plugins/xla_cuda*/xla_cuda_plugin.so) in $PY's site-packages"; exit 1; }
  fi
fi
export GEMMA4RT_PJRT_PLUGIN
fig "plugin: $GEMMA4RT_PJRT_PLUGIN"

# 3. The synthetic E2B (cuda), written in the background while the build runs.
E2B_DIR="${E2B_DIR:-/tmp/g4-synthetic-e2b}"
GEN_PID=""
if [ "$PLATFORM" = cuda ]; then
  if "$PY" tools/make_synthetic_e2b.py "$E2B_DIR" --check >/dev/null 2>&1; then
    log "synthetic E2B: complete in $E2B_DIR"
  else
    log "synthetic E2B: writing $E2B_DIR in the background"
    rm -rf "$E2B_DIR"
    (timeout 300 "$PY" tools/make_synthetic_e2b.py "$E2B_DIR" >"$OUT/synthetic.log" 2>&1) &
    GEN_PID=$!
  fi
else
  step synthetic-dry-run 60 "$PY" tools/make_synthetic_e2b.py "$OUT/e2b-plan" --dry-run || true
fi

# 4. The build: configured here when the device has the dependencies, else the carried binaries.
BIN=""
TESTS=""
INC="${GEMMA4RT_XLA_INCLUDE_DIR:-}"
for d in "$INC" "$CARRY/include" "$HOME/.cache/gemma4rt/xla/pypjrt-0.1.1/vendor"; do
  if [ -n "$d" ] && [ -f "$d/xla/pjrt/c/pjrt_c_api.h" ]; then INC="$d"; break; fi
done
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
BUILD_DIR="${DEVICE_CHECK_BUILD_DIR:-build-device}"
[ -f "$BUILD_DIR/CMakeCache.txt" ] && GEN=()  # keep the generator it was configured with
if [ -n "$INC" ] && step configure 120 cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
     -DGEMMA4RT_XLA_INCLUDE_DIR="$INC" &&
   step build 300 cmake --build "$BUILD_DIR" -j"${JOBS:-$(nproc)}" --target gemma4rt gemma4rt_tests; then
  BIN="$BUILD_DIR/gemma4rt"
  TESTS="$BUILD_DIR/gemma4rt_tests"
elif [ -x "$CARRY/bin/gemma4rt" ]; then
  log "using the carried binaries in build-carry/bin"
  export LD_LIBRARY_PATH="$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  BIN="$CARRY/bin/gemma4rt"
  TESTS="$CARRY/bin/gemma4rt_tests"
  src=$(cat "$CARRY/source_dir")
  if [ "$src" != "$ROOT" ] && [ ! -e "$src/tests" ]; then  # the compiled-in fixture directory
    if ! { mkdir -p "$src" && ln -s "$ROOT/tests" "$src/tests"; }; then
      log "cannot link $src/tests: the golden tests will not find their fixtures"
    fi
  fi
else
  log "no build: configure failed and no build-carry/ (run --prepare where the project builds and carry it)"
  fig "build: FAILED"
  exit 1
fi
fig "build: $BIN"

# 5. The XLA golden tests (and per-op conformance) on the device's plugin: f32 compute, 1e-4.
GOLDEN_FILTER='*XlaGoldenTest.*:XlaWarmupTest.*:XlaLoweringTest.*:XlaAttentionTest.*:XlaComputeDtypeTest.*'
[ "$PLATFORM" = cpu ] && GOLDEN_FILTER='*XlaGoldenTest.*/gemma4_e2b_tiny:XlaComputeDtypeTest.*'
if step golden 240 "$TESTS" --gtest_filter="$GOLDEN_FILTER" --gtest_brief=1; then
  fig "golden: $(grep -Eo '\[  PASSED  \] [0-9]+ tests?' "$OUT/golden.log" | tail -1 | sed 's/\[  PASSED  \] //') passed"
else
  fig "golden: FAILED ($(grep -c '^\[  FAILED  \]' "$OUT/golden.log" || true) lines of failures; golden.log)"
fi
grep '^\[ compute \]' "$OUT/golden.log" | sed 's/^\[ compute \] /golden bf16\/f16: /' | tee -a "$FIG" >/dev/null || true

# 6. The device's copy rate (read + written bytes per second), the bandwidth the fractions use.
if [ "$PLATFORM" = cuda ]; then
  BW_CMD=("$PY" -c '
import torch, time
n = 2 << 30
x = torch.empty(n, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); best = 1e9
for _ in range(10):
    t = time.perf_counter(); y.copy_(x); torch.cuda.synchronize(); best = min(best, time.perf_counter() - t)
print(2 * n / best / 1e9)')
else
  BW_CMD=("$PY" -c '
import numpy as np, time
n = 256 << 20
x = np.ones(n, dtype=np.uint8); y = np.empty_like(x); best = 1e9
for _ in range(5):
    t = time.perf_counter(); np.copyto(y, x); best = min(best, time.perf_counter() - t)
print(2 * n / best / 1e9)')
fi
BW_GBPS=""
if step bandwidth 60 "${BW_CMD[@]}"; then
  BW_GBPS=$(tail -n 1 "$OUT/bandwidth.log")
  fig "copy bandwidth: $(printf '%.1f' "$BW_GBPS") GB/s (read + written bytes, best of 10 copies)"
fi

# 7. The benches: decode at batch 1, 8, 32 and prefill of 512, as stored and at 4 bits.
if [ -n "$GEN_PID" ]; then
  log "waiting for the synthetic E2B"
  wait "$GEN_PID" || { log "synthetic E2B: FAILED ($(tail -n 3 "$OUT/synthetic.log"))"; FAILED+=(synthetic); }
fi
if [ "$PLATFORM" = cuda ]; then
  MODEL="$E2B_DIR"
  BENCH_ARGS=(-p 512 -n 32 -r 2 --decode-batch "1,8,32" --cache-type bf16)
  LIMIT=200
else
  MODEL="$ROOT/tests/golden/gemma4-e2b-tiny"
  BENCH_ARGS=(-p 32 -n 4 -r 1 --decode-batch "1,2,4" --cache-type f32)
  LIMIT=120
fi
for variant in as-stored w4a16; do
  extra=()
  [ "$variant" = w4a16 ] && extra=(--quantize w4a16)
  # stdout (the JSON object) to its own file, stderr to the step's log.
  # shellcheck disable=SC2016  # expanded by the inner bash
  if step "bench-$variant" "$LIMIT" bash -c 'j="$1"; shift; "$@" > "$j"' _ "$OUT/bench-$variant.json" \
       "$BIN" bench -m "$MODEL" --backend xla --pjrt-plugin "$GEMMA4RT_PJRT_PLUGIN" --bw-mib 0 --json \
       "${BENCH_ARGS[@]}" "${extra[@]}"; then
    "$PY" - "$OUT/bench-$variant.json" "$variant" "${BW_GBPS:-0}" <<'EOF' | tee -a "$FIG"
import json, sys
j = json.load(open(sys.argv[1])); variant = sys.argv[2]; bw = float(sys.argv[3]) * 1e9
print(f"bench {variant}: {j['model_desc']}, {j['device_policy'].split(' weights=')[0]}")
for r in j["results"]:
    line = f"  {variant} {r['test']:>10}: {r['tokens_per_second']:10.1f} tokens/s"
    if r["n_gen"] and bw > 0:
        per_token = r["weight_bytes_per_token"] + r["kv_bytes_per_token"]
        line += f", {per_token * r['tokens_per_second'] / bw:6.1%} of the copy bandwidth"
        line += f" ({per_token * r['batch'] / 2**20:.1f} MiB read per step)"
    print(line)
EOF
  else
    fig "bench $variant: FAILED (bench-$variant.log)"
  fi
done

log "done in $(( $(date +%s) - T0 ))s; failed steps: ${FAILED[*]:-none}"
fig "elapsed: $(( $(date +%s) - T0 ))s; failed steps: ${FAILED[*]:-none}"
[ "${#FAILED[@]}" -eq 0 ]

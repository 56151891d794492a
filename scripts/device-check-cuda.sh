#!/usr/bin/env bash
# The CUDA backend on a GPU (an H200, say), in two halves:
#
#   bash scripts/device-check-cuda.sh prepare   # here, no GPU needed: builds for sm_90 into
#                                               # .devcheck-cuda/ (ignored: add it to carry)
#   bash scripts/device-check-cuda.sh run       # there: tests, then the synthetic-E2B benchmark
#
# `prepare` builds gemma4rt_tests, gemma4rt_cuda_bench and the backend module (libgemma4rt_cuda.so,
# found beside them) for sm_90 only and copies them with the
# shared libraries the GPU machine's image lacks (Highway, cpp-httplib; its CUDA toolkit provides
# cudart and cuBLAS) into .devcheck-cuda/ (about 35 MiB). They are Debian 12 builds (glibc 2.36):
# on an image with an older glibc they do not start, and the build has to happen there. `run`
# (under 10 minutes: timeout_s 600) needs that folder, the repository's tests/ and tools/, the CUDA
# runtime and Python with numpy:
#  0. the synthetic E2B written in the background while the tests run (step 2);
#  1. the CUDA tests (gtest filter *Cuda*: per-op conformance against the CPU backend and the golden
#     fixtures), log to $OUT/cuda-tests.log;
#  2. tools/make_synthetic_e2b.py writes the full-size random-weight E2B (BF16, ~9.3 GB) to
#     /tmp/e2b-synth, then gemma4rt_cuda_bench on it as BF16 and quantised to Q4_0 at load:
#     prefill 512, decode at batch 1, 8 and 32, and the device's copy rate in the same run; then
#     BF16 decode at batch 1 after a 4000-token prompt with f16, q8 (int8) and fp8 (e4m3) KV caches;
#     JSON lines to $OUT/cuda-bench.jsonl.
# Carry: .devcheck-cuda (e.g. run(command="bash scripts/device-check-cuda.sh run", carry=[".devcheck-cuda"])).
set -euo pipefail
cd "$(dirname "$0")/.."
DC=.devcheck-cuda
case "${1:-}" in
prepare)
  nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
  B="${BUILD_DIR:-build-devcheck-cuda}"  # BUILD_DIR: an existing sm_90 build to reuse
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGEMMA4RT_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 "${@:2}" >/dev/null
  cmake --build "$B" -j"${JOBS:-$(nproc)}" --target gemma4rt_tests gemma4rt_cuda_bench gemma4rt gemma4rt_cuda
  rm -rf "$DC"
  mkdir -p "$DC/lib"
  cp "$B"/gemma4rt_tests "$B"/gemma4rt_cuda_bench "$B"/gemma4rt "$B"/libgemma4rt_cuda.so "$DC/"
  # Shared libraries from Debian packages (not libc, not CUDA's): the GPU image has none of them.
  for bin in "$DC"/gemma4rt_tests "$DC"/gemma4rt_cuda_bench "$DC"/gemma4rt "$DC"/libgemma4rt_cuda.so; do
    ldd "$bin" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*|libcuda[^/]*|libcublas[^/]*|libcudart[^/]*)\.so' \
      | while read -r lib; do cp -Ln "$lib" "$DC/lib/" 2>/dev/null || true; done || true
  done
  # The tests find tests/ at the absolute path they were built in; `run` links it there.
  pwd > "$DC/source_dir"
  du -sh "$DC"
  ;;
run)
  OUT="${OUT:-$PWD/devcheck-out}"
  mkdir -p "$OUT"
  [ -x "$DC/gemma4rt_tests" ] || { echo "device-check-cuda: no $DC/ (run 'prepare' here and carry it)"; exit 1; }
  nvidia-smi --query-gpu=name,compute_cap,memory.total,clocks.max.memory --format=csv | tee "$OUT/gpu.txt"
  src="$(cat "$DC/source_dir")"
  if [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
  cuda_lib="$(dirname "$(find /usr /opt -name 'libcublas.so.13' 2>/dev/null | head -1)")"
  export LD_LIBRARY_PATH="$PWD/$DC/lib:${cuda_lib}:${LD_LIBRARY_PATH:-}"
  set +e
  synth=0
  if [ ! -f /tmp/e2b-synth/config.json ]; then
    timeout 300 python3 tools/make_synthetic_e2b.py /tmp/e2b-synth > "$OUT/synth.log" 2>&1 &
    synth=$!
  fi
  timeout 200 "$DC/gemma4rt_tests" --gtest_filter='*Cuda*' > "$OUT/cuda-tests.log" 2>&1
  echo "tests: exit $?" | tee -a "$OUT/cuda-tests.log"
  grep -E '^\[  FAILED|^\[  PASSED|SKIPPED \]|tests? ran|Failure|error' "$OUT/cuda-tests.log" | head -60
  if [ "$synth" != 0 ] && ! wait "$synth"; then echo "synthetic E2B: failed (see synth.log)"; fi
  : > "$OUT/cuda-bench.jsonl"
  for q in bf16 q4_0; do
    args=(-m /tmp/e2b-synth -p 512 -n 32 --batches 1,8,32 --label "e2b-$q")
    [ "$q" = bf16 ] || args+=(--quantize "$q")
    timeout 120 "$DC/gemma4rt_cuda_bench" "${args[@]}" 2>&1 | tee -a "$OUT/cuda-bench.jsonl"
  done
  for kv in f16 q8 fp8; do
    timeout 70 "$DC/gemma4rt_cuda_bench" -m /tmp/e2b-synth -p 4000 -n 32 --batches 1 --cache-type "$kv" \
      --label "e2b-bf16-kv-$kv-depth4000" 2>&1 | tee -a "$OUT/cuda-bench.jsonl"
  done
  ;;
*)
  echo "usage: $0 prepare|run" >&2
  exit 2
  ;;
esac

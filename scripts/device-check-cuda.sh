#!/usr/bin/env bash
# The CUDA backend on a GPU (an H200, say), in two halves:
#
#   bash scripts/device-check-cuda.sh prepare   # here, no GPU needed: builds for sm_90 into
#                                               # .devcheck-cuda/ (ignored: add it to carry)
#   bash scripts/device-check-cuda.sh run       # there: tests, then the synthetic-E2B benchmark
#                                               # beside llama.cpp's on the same GGUF
#   DRY_RUN=1 bash scripts/device-check-cuda.sh run   # here: the shell logic, no GPU step run
#
# `prepare` builds gemma4rt_tests, gemma4rt_cuda_bench and the backend module (libgemma4rt_cuda.so,
# found beside them) for sm_90 only and copies them with the
# shared libraries the GPU machine's image lacks (Highway, cpp-httplib; its CUDA toolkit provides
# cudart and cuBLAS) into .devcheck-cuda/ (about 35 MiB). They are Debian 12 builds (glibc 2.36):
# on an image with an older glibc they do not start, and the build has to happen there.
# `prepare-llama` (part of `prepare`, or alone) packs the llama.cpp sources that
# bench/compare-llamacpp.sh builds from (vendor/llama.cpp of the llama-cpp-python sdist from PyPI,
# LLAMA_CPP_PYTHON_VERSION, default 0.3.36) into .devcheck-cuda/llama-src.tar.xz, without what a
# CUDA build of llama-bench never reads (vocab models, docs, media, tests, the other GPU backends):
# about 10 MiB, inside the 64 MiB the device run carries.
#
# `run` (under 8 minutes: timeout_s 600 leaves room) needs that folder, the repository's tests/ and
# tools/, the CUDA toolkit (nvcc, cmake; for llama.cpp's build) and Python with numpy and torch (for
# llama.cpp's converter). Steps run side by side where they can, each under a time limit, so that
# the whole stays under RUN_BUDGET seconds (default 470); a step that would not fit is skipped with
# a line saying so (stages.tsv says what took how long):
#  A. in the background from the start: llama.cpp from llama-src.tar.xz, CUDA for sm_90 only,
#     target llama-bench only, -j16, static, flash attention kernels included (LLAMA_CUDA_FA=OFF
#     leaves them out: about a quarter of the build's nvcc work), log $OUT/llama-build.log; at most
#     LLAMA_BUILD_S seconds (default 330: 144 nvcc compilations for sm_90, the heaviest (the 22 mmq
#     and 21 fattn-mma instances) some 25 s of one core each on a build machine: ~2-4 minutes on 16
#     cores beside the tests);
#  B. in the background from the start: tools/make_synthetic_e2b.py writes the full-size
#     random-weight E2B (BF16, ~9.3 GB) to /tmp/e2b-synth, then llama.cpp's convert_hf_to_gguf.py
#     (from the same sources, as bench/compare-e2b.sh does) makes /tmp/e2b-synth-bf16.gguf;
#  1. the CUDA tests (gtest filter *Cuda*: per-op conformance against the CPU backend and the golden
#     fixtures), log to $OUT/cuda-tests.log;
#  2. gemma4rt_cuda_bench on the BF16 GGUF (the safetensors directory where the GGUF could not be
#     made), as BF16 and quantised to Q4_0 at load: prefill 512, decode at batch 1, 8 and 32, and
#     the device's copy rate in the same run; then BF16 decode at batch 1 after a
#     4000-token prompt with f16, q8 (int8) and fp8 (e4m3)
#     KV caches; JSON lines to $OUT/cuda-bench.jsonl;
#  3. llama-bench on the same BF16 GGUF, all layers on the GPU (-ngl 99): pp512 and tg32 at batch 1,
#     3 repetitions; its JSON lines appended to $OUT/cuda-bench.jsonl, each with
#     "engine":"llama.cpp" (ours have "label"), and a one-line summary beside ours.
# Carry: .devcheck-cuda (e.g. run(command="bash scripts/device-check-cuda.sh run", carry=[".devcheck-cuda"])).
set -euo pipefail
cd "$(dirname "$0")/.."
DC=.devcheck-cuda
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${GEMMA4RT_CACHE:-$HOME/.cache/gemma4rt}"

prepare_llama() {
  local src="$CACHE/llama.cpp-src/llama_cpp_python-$VERSION" tarball="$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz"
  if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
    if [ ! -f "$tarball" ]; then
      mkdir -p "$CACHE/sdist"
      python3 -m pip download --quiet --no-deps --no-binary :all: --disable-pip-version-check \
        -d "$CACHE/sdist" "llama-cpp-python==$VERSION"
    fi
    mkdir -p "$CACHE/llama.cpp-src"
    tar -xzf "$tarball" -C "$CACHE/llama.cpp-src" "llama_cpp_python-$VERSION/vendor/llama.cpp"
  fi
  mkdir -p "$DC"
  local b
  local excludes=(llama.cpp/models llama.cpp/docs llama.cpp/media llama.cpp/tests llama.cpp/benches llama.cpp/pocs
                  llama.cpp/examples/model-conversion llama.cpp/.git)
  for b in vulkan sycl metal opencl cann hexagon webgpu openvino et virtgpu musa hip zdnn blas rpc kompute; do
    excludes+=("llama.cpp/ggml/src/ggml-$b")
  done
  tar -cJf "$DC/llama-src.tar.xz.tmp" -C "$src/vendor" "${excludes[@]/#/--exclude=}" llama.cpp
  mv "$DC/llama-src.tar.xz.tmp" "$DC/llama-src.tar.xz"
  echo "llama-cpp-python==$VERSION" > "$DC/llama-src.version"
  du -h "$DC/llama-src.tar.xz"
}

case "${1:-}" in
prepare)
  nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
  B="${BUILD_DIR:-build-devcheck-cuda}"  # BUILD_DIR: an existing sm_90 build to reuse
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGEMMA4RT_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 "${@:2}" >/dev/null
  cmake --build "$B" -j"${JOBS:-$(nproc)}" --target gemma4rt_tests gemma4rt_cuda_bench gemma4rt gemma4rt_cuda
  llama_keep="$(mktemp -d)"
  [ -f "$DC/llama-src.tar.xz" ] && mv "$DC/llama-src.tar.xz" "$DC/llama-src.version" "$llama_keep/" 2>/dev/null || true
  rm -rf "$DC"
  mkdir -p "$DC/lib"
  mv "$llama_keep"/* "$DC/" 2>/dev/null || true
  rmdir "$llama_keep"
  cp "$B"/gemma4rt_tests "$B"/gemma4rt_cuda_bench "$B"/gemma4rt "$B"/libgemma4rt_cuda.so "$DC/"
  # Shared libraries from Debian packages (not libc, not CUDA's): the GPU image has none of them.
  for bin in "$DC"/gemma4rt_tests "$DC"/gemma4rt_cuda_bench "$DC"/gemma4rt "$DC"/libgemma4rt_cuda.so; do
    ldd "$bin" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*|libcuda[^/]*|libcublas[^/]*|libcudart[^/]*)\.so' \
      | while read -r lib; do cp -Ln "$lib" "$DC/lib/" 2>/dev/null || true; done || true
  done
  # The tests find tests/ at the absolute path they were built in; `run` links it there.
  pwd > "$DC/source_dir"
  # The llama.cpp sources: kept from an earlier prepare of the same version, else packed.
  if [ "$(cat "$DC/llama-src.version" 2>/dev/null)" != "llama-cpp-python==$VERSION" ]; then prepare_llama; fi
  du -sh "$DC"
  ;;
prepare-llama)
  prepare_llama
  ;;
run)
  OUT="${OUT:-$PWD/devcheck-out}"
  mkdir -p "$OUT"
  DRY="${DRY_RUN:-0}"
  BUDGET="${RUN_BUDGET:-470}"
  T0=$(date +%s)
  left() { echo $((BUDGET - ($(date +%s) - T0))); }
  STAGES="$OUT/stages.tsv"
  printf 'stage\tend_s\tnote\n' > "$STAGES"
  stage() { printf '%s\t%s\t%s\n' "$1" "$(($(date +%s) - T0))" "${2:-}" | tee -a "$STAGES"; }
  # x CMD...: runs CMD, or with DRY_RUN=1 prints it (the GPU's steps).
  x() { if [ "$DRY" = 1 ]; then echo "dry-run: $*"; else "$@"; fi; }
  if [ "$DRY" != 1 ]; then
    [ -x "$DC/gemma4rt_tests" ] || { echo "device-check-cuda: no $DC/ (run 'prepare' here and carry it)"; exit 1; }
    nvidia-smi --query-gpu=name,compute_cap,memory.total,clocks.max.memory --format=csv | tee "$OUT/gpu.txt"
    src="$(cat "$DC/source_dir")"
    if [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
  fi
  cuda_lib="$(dirname "$(find /usr /opt -name 'libcublas.so.13' 2>/dev/null | head -1)")"
  export LD_LIBRARY_PATH="$PWD/$DC/lib:${cuda_lib}:${LD_LIBRARY_PATH:-}"
  set +e
  W=/tmp/devcheck-work
  SYNTH=/tmp/e2b-synth GGUF=/tmp/e2b-synth-bf16.gguf LL="$W/llama.cpp" LLB="$W/llama-build"
  mkdir -p "$W"

  # A. llama.cpp's llama-bench, CUDA sm_90 (background).
  llama_build=0
  if [ "${SKIP_LLAMA:-0}" != 1 ] && [ -f "$DC/llama-src.tar.xz" ]; then
    rm -rf "$LL" "$LLB"
    tar -xJf "$DC/llama-src.tar.xz" -C "$W" 2>/dev/null ||  # (Python's tarfile where tar has no xz)
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$DC/llama-src.tar.xz" "$W"
    nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
    gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    (
      # Static, nothing that reaches the network, no CPU-native code (the CPU backend is not measured).
      cmake -S "$LL" -B "$LLB" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc_bin" \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA="${LLAMA_CUDA_FA:-ON}" -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_LLGUIDANCE=OFF &&
        x timeout "${LLAMA_BUILD_S:-330}" cmake --build "$LLB" --target llama-bench -j16
    ) > "$OUT/llama-build.log" 2>&1 &
    llama_build=$!
  else
    stage llama-build "skipped (SKIP_LLAMA=1 or no $DC/llama-src.tar.xz)"
  fi

  # B. the synthetic E2B and its BF16 GGUF (background).
  (
    if [ ! -f "$SYNTH/config.json" ]; then
      x timeout 240 python3 tools/make_synthetic_e2b.py "$SYNTH" || exit 1
    fi
    [ -f "$LL/convert_hf_to_gguf.py" ] || exit 0
    # As bench/compare-e2b.sh: the checkpoint's files linked beside a minimal tokenizer, which the
    # converter requires; the directory's name becomes the GGUF's general.name.
    stg="$W/hf-input/gemma-4-e2b-synthetic"
    rm -rf "$W/hf-input" && mkdir -p "$stg"
    for f in "$SYNTH"/*.json "$SYNTH"/*.safetensors; do
      case "$(basename "$f")" in tokenizer.json|tokenizer_config.json) continue ;; esac
      [ -e "$f" ] && ln -s "$(readlink -f "$f")" "$stg/"
    done
    x python3 tools/make_synthetic_e2b.py "$stg" --tokenizer-only &&
      (cd "$LL" && HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="$LL/gguf-py" \
        x timeout 180 python3 convert_hf_to_gguf.py --outtype bf16 --outfile "$GGUF.tmp" "$stg") &&
      x mv "$GGUF.tmp" "$GGUF"
  ) > "$OUT/synth.log" 2>&1 &
  synth=$!

  # 1. the CUDA tests.
  x timeout 200 "$DC/gemma4rt_tests" --gtest_filter='*Cuda*' > "$OUT/cuda-tests.log" 2>&1
  echo "tests: exit $?" | tee -a "$OUT/cuda-tests.log"
  grep -E '^\[  FAILED|^\[  PASSED|SKIPPED \]|tests? ran|Failure|error' "$OUT/cuda-tests.log" | head -60
  stage tests

  # 2. gemma4rt on the GGUF (or the checkpoint).
  wait "$synth" || echo "synthetic E2B or its GGUF: failed (see synth.log)"
  stage synth+gguf "$( [ -f "$GGUF" ] && echo "$GGUF" || echo "no GGUF")"
  model="$GGUF"
  [ -f "$GGUF" ] || model="$SYNTH"
  : > "$OUT/cuda-bench.jsonl"
  for q in bf16 q4_0; do
    if (($(left) < 150)); then stage "gemma4rt-$q" "skipped: $(left) s of the budget left"; continue; fi
    args=(-m "$model" -p 512 -n 32 --batches "1,8,32" --label "e2b-$q")
    [ "$q" = bf16 ] || args+=(--quantize "$q")
    x timeout 100 "$DC/gemma4rt_cuda_bench" "${args[@]}" 2>&1 | tee -a "$OUT/cuda-bench.jsonl"
    if [ "${PIPESTATUS[0]}" != 0 ] && [ "$model" = "$GGUF" ] && (($(left) >= 150)); then
      stage "gemma4rt-$q" "failed on the GGUF: once more on the checkpoint $SYNTH"
      args[1]="$SYNTH"
      x timeout 100 "$DC/gemma4rt_cuda_bench" "${args[@]}" 2>&1 | tee -a "$OUT/cuda-bench.jsonl"
    fi
    stage "gemma4rt-$q" "$model"
  done
  for kv in f16 q8 fp8; do
    if (($(left) < 120)); then stage "gemma4rt-kv-$kv" "skipped: $(left) s of the budget left"; continue; fi
    x timeout 70 "$DC/gemma4rt_cuda_bench" -m "$model" -p 4000 -n 32 --batches 1 --cache-type "$kv" \
      --label "e2b-bf16-kv-$kv-depth4000" 2>&1 | tee -a "$OUT/cuda-bench.jsonl"
    stage "gemma4rt-kv-$kv" "$model"
  done

  # 3. llama.cpp on the same GGUF.
  if [ "$llama_build" != 0 ]; then
    wait "$llama_build"
    rc=$?
    stage llama-build "exit $rc"
    tail -3 "$OUT/llama-build.log"
    lb="$LLB/bin/llama-bench"
    if [ "$DRY" != 1 ] && { [ ! -x "$lb" ] || [ ! -f "$GGUF" ]; }; then
      stage llama-bench "skipped: $( [ -x "$lb" ] || echo "no llama-bench; ")$( [ -f "$GGUF" ] || echo "no GGUF")"
    elif (($(left) < 60)); then
      stage llama-bench "skipped: $(left) s of the budget left"
    else
      x timeout "$(($(left) - 10))" "$lb" -m "$GGUF" -ngl 99 -p 512 -n 32 -r 3 -o jsonl > "$OUT/llama-bench.jsonl" 2> "$OUT/llama-bench.log"
      stage llama-bench "exit $?"
      # Tagged and appended beside ours, with one summary line (tokens/s: avg_ts over repetitions).
      python3 - "$OUT/llama-bench.jsonl" >> "$OUT/cuda-bench.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    r["engine"] = "llama.cpp"
    print(json.dumps(r))
    test = f"pp{r.get('n_prompt')}" if r.get("n_gen", 0) == 0 else f"tg{r.get('n_gen')}"
    print(f"llama.cpp {r.get('model_type', '')} {test}: {r.get('avg_ts', 0):.1f} tokens/s", file=sys.stderr)
EOF
    fi
  fi
  stage finished "budget ${BUDGET} s"
  ;;
*)
  echo "usage: $0 prepare|prepare-llama|run" >&2
  exit 2
  ;;
esac

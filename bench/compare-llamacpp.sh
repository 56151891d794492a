#!/usr/bin/env bash
# Compares gemma4rt with llama.cpp on the same GGUF, same thread count, same test sizes.
#
#   bench/compare-llamacpp.sh [-m GGUF] [-t THREADS] [-r REPS] [-p 512] [-n 128] [-d 0,4000] [--rounds K]
#                             [--cache-type f16,q8] [--build-only]
#
# llama.cpp's own llama-bench is built from the llama.cpp sources vendored in the
# llama-cpp-python source distribution on PyPI (pip download, no install; no other network), with
# -DGGML_NATIVE=ON, targets llama-bench and llama-quantize only (bench/compare-e2b.sh quantizes with
# the latter). The build is cached in $GEMMA4RT_CACHE/llama.cpp-build (default
# ~/.cache/gemma4rt/llama.cpp-build), so a second run starts benchmarking at once; a cached build
# of the same version that lacks one of the targets is completed incrementally.
#
# Then K rounds (default 2) run both engines alternately, A B then B A (so drift over time does
# not favour one engine): `gemma4rt bench --json -p P -n N -t T -r REPS` and
# `llama-bench -o json -p P -n N -t T -r REPS`. Each engine's figure is the median of all its
# samples over the rounds. Prints ppP and tgN in tokens/s for both and the ratio
# gemma4rt / llama.cpp of those medians, and the per-round ratios (each round's two engines ran
# back to back, so a ratio within a round is less moved by the machine's drift) with their
# median; the raw JSON of every run is kept in $OUT_DIR (default a temp dir, printed).
#
# --cache-type LIST (default f16): the KV cache types, comma-separated, of f16, bf16, f32 and q8:
# gemma4rt gets `--cache-type T`, llama-bench `-ctk T -ctv T` with q8 as llama.cpp's q8_0 (blocks of
# 32 int8 with an f16 scale; gemma4rt's q8 has one f32 scale per token and KV head) and, for q8,
# `-fa 1` (llama.cpp keeps a quantised V cache only with flash attention). Each round runs every
# type on both engines; with more than one type, each type's JSON is in $OUT_DIR/TYPE and the
# report is printed once per type.
#
# -d LIST (default 0): context depths, comma-separated, given to both engines (each test runs
# with that many tokens already in the KV cache, of the --cache-type). With
# more than one depth the report adds, per engine, tgN at each depth against the smallest, and
# what the bandwidth limit alone predicts for gemma4rt (the weights plus the KV cache bytes a
# token reads at that depth, from gemma4rt's JSON: (w + kv(d0)) / (w + kv(d))); "excess" is the
# time a token gained beyond d0 over the time those extra KV bytes take at the rate the token
# read its weights (1.0: decode falls by the KV reads alone, "only by the full layers'
# share"), each with two standard errors from the samples' spread (a verdict needs the
# excess's interval to lie on one side of 1.0). Even rounds run the depths in reverse order in both
# engines, so that neither depth always runs first in its process (a process's first test can
# run slower).
#
# Environment: LLAMA_BENCH_ARGS: more llama-bench arguments for every run (e.g. "--repack 0": on a
# CPU with AMX, llama.cpp's AMX matmul of this build crashes on batches, as a depth's fill or pp;
# --repack 0 keeps its weights out of the AMX buffers, at a large cost to its speed).
# LLAMA_CMAKE_ARGS: more CMake arguments for llama.cpp's build, in a build directory of their own
# (e.g. "-DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8" leaves out its AMX code on
# such a CPU, as gemma4rt has none). GEMMA4RT_BIN (default build/gemma4rt, built with scripts/build.sh when missing),
# GEMMA4RT_MODEL (default model), GEMMA4RT_CACHE, LLAMA_CPP_PYTHON_VERSION (default 0.3.36),
# OUT_DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${GEMMA4RT_CACHE:-$HOME/.cache/gemma4rt}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
MODEL="${GEMMA4RT_MODEL:-$CACHE/gemma-3-270m-q4_k_m.gguf}"
THREADS="$(nproc)"
REPS=3
P=512
N=128
ROUNDS=2
DEPTHS=0
CACHE_TYPES=f16
BUILD_ONLY=0

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d;s/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in -m|-t|-r|-p|-n|-d|--rounds|--cache-type) (($# >= 2)) || { echo "compare-llamacpp: $1 needs a value" >&2; exit 2; } ;; esac
  case "$1" in
    -m) MODEL="$2"; shift 2 ;;
    -t) THREADS="$2"; shift 2 ;;
    -r) REPS="$2"; shift 2 ;;
    -p) P="$2"; shift 2 ;;
    -n) N="$2"; shift 2 ;;
    -d) DEPTHS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --cache-type) CACHE_TYPES="$2"; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare-llamacpp: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for v in THREADS REPS P N ROUNDS; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "compare-llamacpp: $v must be a non-negative integer, got '${!v}'" >&2; exit 2; }
done
[[ "$DEPTHS" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "compare-llamacpp: -d must be a comma-separated list of depths, got '$DEPTHS'" >&2; exit 2; }
((THREADS >= 1 && REPS >= 1 && ROUNDS >= 1)) || { echo "compare-llamacpp: -t, -r and --rounds must be >= 1" >&2; exit 2; }
[[ "$CACHE_TYPES" =~ ^(f16|bf16|f32|q8)(,(f16|bf16|f32|q8))*$ ]] \
  || { echo "compare-llamacpp: --cache-type must be a comma-separated list of f16, bf16, f32, q8; got '$CACHE_TYPES'" >&2; exit 2; }
IFS=, read -r -a TYPES <<<"$CACHE_TYPES"
log() { echo "compare-llamacpp: $*" >&2; }

# ---- llama-bench, built once from the PyPI sdist --------------------------------------------
SDIST_DIR="$CACHE/sdist"
SRC_DIR="$CACHE/llama.cpp-src/llama_cpp_python-$VERSION"
# LLAMA_CMAKE_ARGS (space-separated CMake arguments) get a build directory of their own.
LLAMA_CMAKE_ARGS="${LLAMA_CMAKE_ARGS:-}"
read -ra LLAMA_CMAKE_EXTRA <<<"$LLAMA_CMAKE_ARGS"
BUILD_DIR="$CACHE/llama.cpp-build${LLAMA_CMAKE_ARGS:+-$(printf '%s' "$LLAMA_CMAKE_ARGS" | md5sum | cut -c1-8)}"
LLAMA_BENCH="$BUILD_DIR/bin/llama-bench"
LLAMA_QUANTIZE="$BUILD_DIR/bin/llama-quantize"
STAMP="$BUILD_DIR/.gemma4rt-stamp"
WANT_STAMP="llama-cpp-python==$VERSION native=ON${LLAMA_CMAKE_ARGS:+ $LLAMA_CMAKE_ARGS}"
TARGETS=(llama-bench llama-quantize)

if [ -x "$LLAMA_BENCH" ] && [ -x "$LLAMA_QUANTIZE" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT_STAMP" ]; then
  log "using cached $LLAMA_BENCH ($WANT_STAMP)"
elif [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT_STAMP" ] && [ -f "$BUILD_DIR/CMakeCache.txt" ] && [ -f "$SRC_DIR/vendor/llama.cpp/CMakeLists.txt" ]; then
  # Same version and configuration, a target missing (a cache from before llama-quantize was
  # added): build what is missing in place. The stamp stays; it names the configuration.
  log "completing the cached llama.cpp build in $BUILD_DIR (${TARGETS[*]})"
  cmake --build "$BUILD_DIR" --target "${TARGETS[@]}" -j"$(nproc)" >"$CACHE/llama.cpp-build.log" 2>&1 \
    || { log "build failed; see $CACHE/llama.cpp-build.log"; tail -30 "$CACHE/llama.cpp-build.log" >&2; exit 1; }
  [ -x "$LLAMA_BENCH" ] && [ -x "$LLAMA_QUANTIZE" ] || { log "build finished but a binary is missing"; exit 1; }
else
  command -v cmake >/dev/null || { log "cmake is needed (bash scripts/setup.sh)"; exit 1; }
  PY="$(command -v python3 || true)"
  [ -n "$PY" ] || { log "python3 (with pip) is needed to download the llama.cpp sources"; exit 1; }
  mkdir -p "$SDIST_DIR"
  TARBALL="$SDIST_DIR/llama_cpp_python-$VERSION.tar.gz"
  if [ ! -f "$TARBALL" ]; then
    log "downloading llama-cpp-python==$VERSION source distribution from PyPI (about 75 MB)"
    "$PY" -m pip download --quiet --no-deps --no-binary :all: --disable-pip-version-check \
      -d "$SDIST_DIR" "llama-cpp-python==$VERSION" >&2
  fi
  [ -f "$TARBALL" ] || { log "pip did not produce $TARBALL"; exit 1; }
  if [ ! -f "$SRC_DIR/vendor/llama.cpp/CMakeLists.txt" ]; then
    log "unpacking vendor/llama.cpp"
    mkdir -p "$CACHE/llama.cpp-src"
    rm -rf "$SRC_DIR"
    tar -xzf "$TARBALL" -C "$CACHE/llama.cpp-src" "llama_cpp_python-$VERSION/vendor/llama.cpp"
  fi
  GEN=()
  command -v ninja >/dev/null && GEN=(-G Ninja)
  rm -rf "$BUILD_DIR"
  log "configuring llama.cpp (GGML_NATIVE=ON, CPU only) in $BUILD_DIR"
  # Everything that could reach the network (curl/openssl, the web UI, tests' model downloads)
  # is off; static libraries so the binary does not depend on the source tree.
  cmake -S "$SRC_DIR/vendor/llama.cpp" -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_LLGUIDANCE=OFF "${LLAMA_CMAKE_EXTRA[@]}" >"$CACHE/llama.cpp-configure.log" 2>&1 \
    || { log "cmake configure failed; see $CACHE/llama.cpp-configure.log"; tail -20 "$CACHE/llama.cpp-configure.log" >&2; exit 1; }
  log "building ${TARGETS[*]} with $(nproc) jobs (several minutes on a small machine; once)"
  cmake --build "$BUILD_DIR" --target "${TARGETS[@]}" -j"$(nproc)" >"$CACHE/llama.cpp-build.log" 2>&1 \
    || { log "build failed; see $CACHE/llama.cpp-build.log"; tail -30 "$CACHE/llama.cpp-build.log" >&2; exit 1; }
  [ -x "$LLAMA_BENCH" ] && [ -x "$LLAMA_QUANTIZE" ] || { log "build finished but $LLAMA_BENCH or $LLAMA_QUANTIZE is missing"; exit 1; }
  echo "$WANT_STAMP" >"$STAMP"
  log "built $LLAMA_BENCH"
fi
((BUILD_ONLY)) && { echo "$LLAMA_BENCH"; exit 0; }

# ---- gemma4rt ---------------------------------------------------------------------------------
G4="${GEMMA4RT_BIN:-$ROOT/build/gemma4rt}"
if [ ! -x "$G4" ]; then
  log "building gemma4rt (scripts/build.sh)"
  bash "$ROOT/scripts/build.sh" >&2
fi
if ! "$G4" bench --help >/dev/null 2>&1; then
  log "$G4 has no 'bench' subcommand (src/cli/bench.cc must be wired into src/cli/main.cc)"; exit 1
fi
[ -f "$MODEL" ] || { log "model '$MODEL' does not exist (scripts/fetch-default-model.sh fetches the default one)"; exit 1; }

OUT_DIR="${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/compare-llamacpp.XXXXXX")}"
mkdir -p "$OUT_DIR"
log "model $MODEL, threads $THREADS, pp$P tg$N, depths $DEPTHS, KV cache $CACHE_TYPES, $REPS repetitions x $ROUNDS rounds; raw JSON in $OUT_DIR"
# One type: its files in $OUT_DIR itself; several: in $OUT_DIR/TYPE.
dir_of() { if ((${#TYPES[@]} > 1)); then echo "$OUT_DIR/$1"; else echo "$OUT_DIR"; fi; }
for t in "${TYPES[@]}"; do mkdir -p "$(dir_of "$t")"; done

# Other processes on the machine distort both engines (llama.cpp's spinning OpenMP threads most):
# the 1-minute load average before each run is logged and printed with the results.
load1() { cut -d' ' -f1 /proc/loadavg; }
if awk -v l="$(load1)" -v t="$THREADS" 'BEGIN { exit !(l > 0.5) }'; then
  log "warning: load average is $(load1) before starting; other processes will distort the figures"
fi
# Odd rounds run the depths as given, even rounds reversed.
depths_of_round() {
  if (($1 % 2)); then echo "$DEPTHS"; else echo "$DEPTHS" | tr ',' '\n' | tac | paste -sd, -; fi
}
run_g4() {  # round type
  local d; d="$(dir_of "$2")"
  echo "gemma4rt round $1: load $(load1)" >>"$d/load.txt"
  log "round $1: gemma4rt bench, $2 cache (load $(load1))"
  "$G4" bench -m "$MODEL" -t "$THREADS" -p "$P" -n "$N" -d "$(depths_of_round "$1")" -r "$REPS" --cache-type "$2" --json \
    >"$d/gemma4rt.$1.json" 2>"$d/gemma4rt.$1.log" \
    || { log "gemma4rt bench failed:"; cat "$d/gemma4rt.$1.log" >&2; exit 1; }
}
run_llama() {  # round type
  local d; d="$(dir_of "$2")"
  local kv=(-ctk "$2" -ctv "$2")
  local extra=()
  read -r -a extra <<<"${LLAMA_BENCH_ARGS:-}"
  [ "$2" = q8 ] && kv=(-ctk q8_0 -ctv q8_0 -fa 1)
  echo "llama.cpp round $1: load $(load1)" >>"$d/load.txt"
  log "round $1: llama-bench, ${kv[*]} (load $(load1))"
  "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p "$P" -n "$N" -d "$(depths_of_round "$1")" -r "$REPS" "${kv[@]}" "${extra[@]}" -o json \
    >"$d/llama.$1.json" 2>"$d/llama.$1.log" \
    || { log "llama-bench failed:"; tail -20 "$d/llama.$1.log" >&2; exit 1; }
}
for ((k = 1; k <= ROUNDS; ++k)); do
  for t in "${TYPES[@]}"; do
    if ((k % 2)); then run_g4 "$k" "$t"; run_llama "$k" "$t"; else run_llama "$k" "$t"; run_g4 "$k" "$t"; fi
  done
done

for t in "${TYPES[@]}"; do
if ((${#TYPES[@]} > 1)); then printf '## KV cache %s\n\n' "$t"; fi

python3 - "$(dir_of "$t")" "$P" "$N" "$THREADS" "$MODEL" "$VERSION" "$DEPTHS" <<'PYEOF'
import glob, json, statistics, sys, os
out_dir, P, N, T, model, version = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
depths = sorted(set(int(d) for d in sys.argv[7].split(",")))

def g4_results(kind, n, depth, pattern="gemma4rt.*.json"):
    out = []
    for f in sorted(glob.glob(os.path.join(out_dir, pattern))):
        for r in json.load(open(f))["results"]:
            if r["test"].startswith(kind) and r["depth"] == depth and r[("n_prompt" if kind == "pp" else "n_gen")] == n:
                out.append(r)
    return out

def g4_samples(kind, n, depth, pattern="gemma4rt.*.json"):
    return [x for r in g4_results(kind, n, depth, pattern) for x in r["samples_ts"]]

def llama_samples(kind, n, depth, pattern="llama.*.json"):
    s = []
    for f in sorted(glob.glob(os.path.join(out_dir, pattern))):
        for r in json.load(open(f)):
            if r.get("n_depth", 0) != depth:
                continue
            if kind == "pp" and r["n_prompt"] == n and r["n_gen"] == 0:
                s += r["samples_ts"]
            if kind == "tg" and r["n_gen"] == n and r["n_prompt"] == 0:
                s += r["samples_ts"]
    return s

def name(kind, n, depth):
    return f"{kind}{n}" + (f" @ d{depth}" if depth else "")

g4 = json.load(open(sorted(glob.glob(os.path.join(out_dir, "gemma4rt.*.json")))[0]))
ll = json.load(open(sorted(glob.glob(os.path.join(out_dir, "llama.*.json")))[0]))
print(f"model: {model}")
print(f"threads: {T}   cpu: {ll[0].get('cpu_info', '?')}")
print(f"gemma4rt: {g4.get('device_policy', '')}, KV cache {g4.get('type_k', '?')}")
print(f"llama.cpp: llama-bench from llama-cpp-python {version} (vendor/llama.cpp, build {ll[0].get('build_commit', '?')}), "
      f"{ll[0].get('model_type', '')}, n_ubatch {ll[0].get('n_ubatch', '?')}, flash_attn {ll[0].get('flash_attn', '?')}, "
      f"KV cache {ll[0].get('type_k', '?')}")
print()
rounds = sorted(int(os.path.basename(f).split(".")[1]) for f in glob.glob(os.path.join(out_dir, "gemma4rt.*.json")))
print(f"| test | gemma4rt t/s | llama.cpp t/s | gemma4rt / llama.cpp | per-round ratios (median) |")
print(f"|---|---:|---:|---:|---|")
summary = {}
for depth in depths:
    for kind, n in (("pp", P), ("tg", N)):
        if n == 0:
            continue
        key = name(kind, n, depth)
        a, b = g4_samples(kind, n, depth), llama_samples(kind, n, depth)
        if not a or not b:
            print(f"| {key} | missing | missing | | |")
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        per_round = []
        for k in rounds:
            ra, rb = g4_samples(kind, n, depth, f"gemma4rt.{k}.json"), llama_samples(kind, n, depth, f"llama.{k}.json")
            if ra and rb:
                per_round.append(statistics.median(ra) / statistics.median(rb))
        paired = statistics.median(per_round) if per_round else None
        summary[key] = {"gemma4rt": ma, "llama.cpp": mb, "ratio": ma / mb, "round_ratios": per_round,
                        "paired_ratio": paired, "gemma4rt_samples": a, "llama.cpp_samples": b}
        rr = ", ".join(f"{x:.3f}" for x in per_round)
        print(f"| {key} | {ma:.2f} (n={len(a)}) | {mb:.2f} (n={len(b)}) | {ma / mb:.3f} | {rr} ({paired:.3f}) |" if per_round else f"| {key} | {ma:.2f} (n={len(a)}) | {mb:.2f} (n={len(b)}) | {ma / mb:.3f} | - |")
print()

# Decode against depth: each engine's tgN at a depth over its tgN at the smallest depth, and what
# the bandwidth limit alone predicts (gemma4rt's bytes per token: weights + KV at that depth).
if N > 0 and len(depths) > 1:
    d0 = depths[0]
    base = g4_results("tg", N, d0)
    g0, l0 = g4_samples("tg", N, d0), llama_samples("tg", N, d0)
    depth_rows = {}
    if base and g0 and l0:
        w, kv0 = base[0]["weight_bytes_per_token"], base[0]["kv_bytes_per_token"]
        mg0, ml0 = statistics.median(g0), statistics.median(l0)
        print(f"| depth | gemma4rt tg{N} | vs d{d0} | bandwidth-bound prediction | excess | gemma4rt decode / bandwidth limit "
              f"| llama.cpp tg{N} | vs d{d0} |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for depth in depths[1:]:
            rs, g, l = g4_results("tg", N, depth), g4_samples("tg", N, depth), llama_samples("tg", N, depth)
            if not rs or not g or not l:
                print(f"| {depth} | missing (gemma4rt clamps a depth past the model's context: see its log) | | | | | | |")
                continue
            kv = rs[0]["kv_bytes_per_token"]
            mg, ml = statistics.median(g), statistics.median(l)
            predicted = (w + kv0) / (w + kv)
            # Seconds a token gained past d0, over the extra KV bytes' seconds at the rate of d0's token.
            excess = (1 / mg - 1 / mg0) / ((kv - kv0) / ((w + kv0) * mg0)) if kv > kv0 else None
            # Two standard errors of gemma4rt's ratio, from the spread of both depths' samples (of the
            # mean; the figures are medians, whose error is larger still), and of the excess, which
            # moves by 1 / (ratio^2 (1 / predicted - 1)) per unit of the ratio. None with one sample.
            def rel_var(x):
                return (statistics.stdev(x) / statistics.mean(x)) ** 2 / len(x) if len(x) > 1 else None
            v0, vd = rel_var(g0), rel_var(g)
            se2 = 2 * (mg / mg0) * (v0 + vd) ** 0.5 if v0 is not None and vd is not None else None
            ex_se2 = se2 / ((mg / mg0) ** 2 * (1 / predicted - 1)) if se2 is not None and predicted < 1 else None
            # A verdict only where the excess's interval lies on one side of 1.0.
            verdict = None
            if excess is not None and ex_se2 is not None:
                verdict = True if excess + ex_se2 <= 1.0 else False if excess - ex_se2 > 1.0 else None
            fr = [x for r in rs for x in r.get("bandwidth_fraction_samples") or [] if x is not None]
            frac = statistics.median(fr) if fr else None
            depth_rows[str(depth)] = {"gemma4rt_ratio": mg / mg0, "predicted_ratio": predicted, "excess": excess,
                                      "llama.cpp_ratio": ml / ml0, "kv_bytes_per_token": kv, "weight_bytes_per_token": w,
                                      "bandwidth_fraction": frac, "ratio_2se": se2, "excess_2se": ex_se2,
                                      "met": verdict}
            pm = lambda x: "" if x is None else f" ± {x:.3f}"
            print(f"| {depth} | {mg:.2f} | {mg / mg0:.3f}{pm(se2)} | {predicted:.3f} | "
                  f"{'-' if excess is None else format(excess, '.2f') + pm(ex_se2)} | "
                  f"{'-' if frac is None else format(100 * frac, '.1f') + '%'} | {ml:.2f} | {ml / ml0:.3f} |")
        print(f"(bytes per token: weights {w / 1e9:.3f} GB, KV {kv0 / 1e6:.1f} MB at d{d0}; excess 1.0 = decode falls by "
              "the extra KV reads alone at the token's own read rate; the bandwidth fraction counts the weights and the "
              "KV cache bytes a token reads at that depth, against the copy bandwidth measured after each repetition; "
              "± two standard errors from the samples' spread)")
        print()
    summary["depth"] = {"base": d0, "tg": N, "depths": depth_rows}
g4_all = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(out_dir, "gemma4rt.*.json")))]
fr = [j["bandwidth_fraction"] for j in g4_all if j.get("bandwidth_fraction") is not None]
rfr = [j["read_bandwidth_fraction"] for j in g4_all if j.get("read_bandwidth_fraction") is not None]
summary["peak_rss_bytes"] = max(j.get("peak_rss_bytes", 0) for j in g4_all)
summary["peak_rss_budget_bytes"] = min(j.get("peak_rss_budget_bytes", 0) for j in g4_all)
summary["peak_rss_within_budget"] = all(j.get("peak_rss_within_budget", False) for j in g4_all)
print(f"gemma4rt peak RSS {summary['peak_rss_bytes'] / 2**20:.1f} MiB (budget: weights + KV cache + 10% = "
      f"{summary['peak_rss_budget_bytes'] / 2**20:.1f} MiB, {'within' if summary['peak_rss_within_budget'] else 'OVER'}), copy bandwidth "
      f"{statistics.median(j.get('bandwidth_gbps') or 0 for j in g4_all):.2f} GB/s, decode at "
      f"{100 * (statistics.median(fr) if fr else 0):.1f}% of the bandwidth limit "
      f"({100 * (statistics.median(rfr) if rfr else 0):.1f}% of the read bandwidth; medians over the rounds)")
loads = open(os.path.join(out_dir, "load.txt")).read().split("\n")
print("1-minute load average before each run: " + "; ".join(l for l in loads if l))
json.dump(summary, open(os.path.join(out_dir, "summary.json"), "w"), indent=1)
print(f"(t/s: medians over all samples; raw JSON and summary.json in {out_dir})")
PYEOF
if ((${#TYPES[@]} > 1)); then echo; fi
done

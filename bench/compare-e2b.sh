#!/usr/bin/env bash
# Synthetic Gemma 4 E2B side-by-side: gemma4rt against llama.cpp on identical weights, BF16 and 4-bit.
#
#   bench/compare-e2b.sh [-t THREADS] [-r REPS] [-p 512] [-n 128] [--rounds K]
#                        [--formats "bf16 q4_0 q4_k_m"] [--depths 0,4000] [--no-270m] [--no-hf]
#                        [--prepare-only] [--out DIR]
#
# One run measures every speed and memory target (the summary's "Targets" table says which are
# met): the synthetic E2B per format, decode at depth, and the default Gemma 3 270M, side by side.
#
# Stages (each one cached, so a rerun goes straight to the benchmarks):
#  1. checkpoint: tools/make_synthetic_e2b.py writes the full-size random-weight E2B checkpoint
#     (HF safetensors, 9.3 GB) into $E2B_SYNTH_DIR (default ~/.cache/gemma4rt/e2b-synth), unless
#     that directory already passes the tool's --check. If it does not but /tmp/e2b-synth does,
#     /tmp/e2b-synth is used as it is.
#  2. llama.cpp: bench/compare-llamacpp.sh --build-only builds llama-bench and llama-quantize
#     from the llama-cpp-python sdist (cached in ~/.cache/gemma4rt/llama.cpp-build).
#  3. BF16 GGUF: llama.cpp's own convert_hf_to_gguf.py (from the same sdist) --outtype bf16 on a
#     staging directory: symlinks to the checkpoint plus a minimal 262144-token tokenizer.json
#     (make_synthetic_e2b.py --tokenizer-only; the converter requires a tokenizer, and keeps only
#     as many embedding rows as the tokenizer has tokens).
#  4. 4-bit GGUFs: llama.cpp's llama-quantize BF16 -> Q4_0 and Q4_K_M.
#     GGUFs live in $E2B_GGUF_DIR (default ~/.cache/gemma4rt/e2b-synth-gguf); each is written to
#     a .tmp file and renamed, so an existing file is complete. Delete a file to redo it.
#  5. check: `gemma4rt info` and a tiny bench (-p 16 -n 4 -r 1) on each GGUF, and llama-bench
#     -p 16 -n 4 -r 1, so that a loading failure shows before the long runs.
#  6. benchmarks: bench/compare-llamacpp.sh -m GGUF (both engines alternately, K rounds of REPS)
#     for each format, then `gemma4rt bench` on the HF directory itself (BF16 safetensors).
#  7. depth (unless --depths names a single depth): compare-llamacpp.sh -p 0 -n N -d DEPTHS on the
#     Q4_K_M GGUF (Q4_0 if q4_k_m is not among --formats, else BF16): decode at each depth against
#     the smallest, beside what the bandwidth limit alone predicts (the target: decode falls only
#     by the full layers' share, i.e. by the KV cache reads); then gemma4rt once more with --profile at those depths
#     (the attention ops' growth against the extra KV bytes at the weights' read rate, which the
#     machine's run-to-run noise cannot hide), and on x86-64 with AVX-512 the machine's f32
#     multiply-add rate (bench/experiments/attention_floor.cc, built with g++): the lowest excess
#     an f16 cache's attention can reach on these cores.
#  8. the default model (unless --no-270m): compare-llamacpp.sh -p P -n N on the Gemma 3 270M
#     Q4_K_M GGUF (or GEMMA4RT_MODEL; else fetched by scripts/fetch-default-model.sh).
# Stages 1, 3 and 4 run under nice -n 19; the benchmarks run at normal priority.
#
# Output: $OUT (default ~/.cache/gemma4rt/e2b-results/DATE): one directory per format with the
# raw JSON and compare-llamacpp.sh's report, hf-bf16/gemma4rt.json, depth/ and 270m/ (the same
# for stages 7 and 8), stages.tsv (wall time of each stage), sizes.tsv, summary.json and
# summary.md (tokens/s, ratio, gemma4rt's decode bandwidth fraction, and the Targets table:
# 270M decode and prefill >= 1.0x llama.cpp (aim 1.3x); E2B decode >= 80% of the bandwidth limit
# and >= 1.0x llama.cpp per format; decode at depth falling by no more than the KV reads (excess
# <= 1.0); peak RSS within the weights + KV cache + 10%).
#
# Environment: GEMMA4RT_BIN (default build/gemma4rt), GEMMA4RT_MODEL (stage 8's model), GEMMA4RT_CACHE, E2B_SYNTH_DIR, E2B_GGUF_DIR,
# LLAMA_CPP_PYTHON_VERSION (default 0.3.36), PYTHON (the Python that runs the checkpoint writer
# and llama.cpp's converter; it needs numpy, torch, transformers, safetensors, sentencepiece;
# gguf-py comes from the sdist). Without PYTHON, a venv in $GEMMA4RT_CACHE/bench-venv is made once
# with those packages from PyPI (torch's PyPI wheel: a few GB, once).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${GEMMA4RT_CACHE:-$HOME/.cache/gemma4rt}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PY="${PYTHON:-}"
SYNTH="${E2B_SYNTH_DIR:-$CACHE/e2b-synth}"
GGUF_DIR="${E2B_GGUF_DIR:-$CACHE/e2b-synth-gguf}"
THREADS="$(nproc)"
REPS=3
P=512
N=128
ROUNDS=2
FORMATS="bf16 q4_0 q4_k_m"
HF=1
DEPTHS=0,4000
WITH_270M=1
PREPARE_ONLY=0
OUT=""

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d;s/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in -t|-r|-p|-n|--rounds|--formats|--depths|--out) (($# >= 2)) || { echo "compare-e2b: $1 needs a value" >&2; exit 2; } ;; esac
  case "$1" in
    -t) THREADS="$2"; shift 2 ;;
    -r) REPS="$2"; shift 2 ;;
    -p) P="$2"; shift 2 ;;
    -n) N="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --formats) FORMATS="$2"; shift 2 ;;
    --no-hf) HF=0; shift ;;
    --depths) DEPTHS="$2"; shift 2 ;;
    --no-270m) WITH_270M=0; shift ;;
    --prepare-only) PREPARE_ONLY=1; shift ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare-e2b: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for v in THREADS REPS P N ROUNDS; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "compare-e2b: $v must be a non-negative integer, got '${!v}'" >&2; exit 2; }
done
((THREADS >= 1 && REPS >= 1 && ROUNDS >= 1)) || { echo "compare-e2b: -t, -r and --rounds must be >= 1" >&2; exit 2; }
for f in $FORMATS; do
  case "$f" in bf16|q4_0|q4_k_m) ;; *) echo "compare-e2b: unknown format '$f' (bf16, q4_0, q4_k_m)" >&2; exit 2 ;; esac
done
[[ "$DEPTHS" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "compare-e2b: --depths must be a comma-separated list of depths, got '$DEPTHS'" >&2; exit 2; }
[[ "$DEPTHS" == *,* ]] || DEPTHS=""  # one depth: no depth stage
DEPTH_FORMAT=""
for f in q4_k_m q4_0 bf16; do
  [[ " $FORMATS " == *" $f "* ]] && { DEPTH_FORMAT="$f"; break; }
done
log() { echo "compare-e2b: $*" >&2; }
OUT="${OUT:-$CACHE/e2b-results/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT" "$GGUF_DIR"
STAGES="$OUT/stages.tsv"
printf 'stage\tseconds\tnote\n' >"$STAGES"
stage_start() { STAGE_T0=$(date +%s.%N); }
stage_end() {  # name note
  local s; s=$(awk -v a="$STAGE_T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  printf '%s\t%s\t%s\n' "$1" "$s" "${2:-}" >>"$STAGES"
  log "stage $1: ${s} s ${2:+($2)}"
}
log "results in $OUT"

# ---- 0. Python for the checkpoint writer and the converter ------------------------------------
PY_MODULES='import numpy, torch, transformers, safetensors, sentencepiece'
if [ -z "$PY" ]; then
  VENV="$CACHE/bench-venv"
  if ! "$VENV/bin/python" -c "$PY_MODULES" 2>/dev/null; then
    log "installing numpy, torch, transformers, safetensors, sentencepiece into $VENV (once)"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
      "numpy>=1.26,<3" "torch>=2.4" "transformers==5.24.0" "safetensors>=0.4" "sentencepiece>=0.2" "protobuf>=4"
  fi
  PY="$VENV/bin/python"
fi
"$PY" -c "$PY_MODULES" 2>/dev/null \
  || { log "$PY lacks one of numpy, torch, transformers, safetensors, sentencepiece"; exit 1; }

# ---- 1. checkpoint ---------------------------------------------------------------------------
stage_start
check_ckpt() { "$PY" "$ROOT/tools/make_synthetic_e2b.py" "$1" --check 2>/dev/null; }
if check_ckpt "$SYNTH"; then
  stage_end checkpoint "cached $SYNTH"
elif [ -z "${E2B_SYNTH_DIR:-}" ] && check_ckpt /tmp/e2b-synth; then
  SYNTH=/tmp/e2b-synth
  stage_end checkpoint "reused $SYNTH"
else
  log "writing the synthetic E2B checkpoint to $SYNTH (9.3 GB)"
  nice -n 19 "$PY" "$ROOT/tools/make_synthetic_e2b.py" "$SYNTH"
  check_ckpt "$SYNTH" || { log "$SYNTH is incomplete after writing it"; exit 1; }
  stage_end checkpoint "wrote $SYNTH"
fi

# ---- 2. llama.cpp (llama-bench, llama-quantize) and the converter -----------------------------
stage_start
LLAMA_BENCH="$(GEMMA4RT_CACHE="$CACHE" LLAMA_CPP_PYTHON_VERSION="$VERSION" bash "$ROOT/bench/compare-llamacpp.sh" --build-only)"
LLAMA_QUANTIZE="$(dirname "$LLAMA_BENCH")/llama-quantize"
LCPP="$CACHE/llama.cpp-src/llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -x "$LLAMA_QUANTIZE" ] || { log "$LLAMA_QUANTIZE is missing"; exit 1; }
[ -f "$LCPP/convert_hf_to_gguf.py" ] || { log "$LCPP/convert_hf_to_gguf.py is missing"; exit 1; }
stage_end llama.cpp "$LLAMA_BENCH"

# ---- 3. BF16 GGUF with llama.cpp's converter --------------------------------------------------
BF16="$GGUF_DIR/e2b-synth-bf16.gguf"
stage_start
if [ -s "$BF16" ]; then
  stage_end convert-bf16 "cached $BF16"
else
  # The directory name becomes the GGUF's general.name.
  STAGE="$GGUF_DIR/hf-input/gemma-4-e2b-synthetic"
  rm -rf "$GGUF_DIR/hf-input"
  mkdir -p "$STAGE"
  for f in "$SYNTH"/*.json "$SYNTH"/*.safetensors; do
    case "$(basename "$f")" in tokenizer.json|tokenizer_config.json) continue ;; esac
    ln -s "$(readlink -f "$f")" "$STAGE/"
  done
  "$PY" "$ROOT/tools/make_synthetic_e2b.py" "$STAGE" --tokenizer-only
  log "converting with $LCPP/convert_hf_to_gguf.py --outtype bf16 (log: $GGUF_DIR/convert-bf16.log)"
  (cd "$LCPP" && HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 nice -n 19 "$PY" convert_hf_to_gguf.py \
      --outtype bf16 --outfile "$BF16.tmp" "$STAGE") >"$GGUF_DIR/convert-bf16.log" 2>&1 \
    || { log "llama.cpp's converter failed:"; tail -20 "$GGUF_DIR/convert-bf16.log" >&2; exit 1; }
  mv "$BF16.tmp" "$BF16"
  rm -rf "$GGUF_DIR/hf-input"
  stage_end convert-bf16 "wrote $BF16"
fi

# ---- 4. 4-bit GGUFs with llama-quantize -------------------------------------------------------
gguf_of() { echo "$GGUF_DIR/e2b-synth-$1.gguf"; }
for f in $FORMATS; do
  [ "$f" = bf16 ] && continue
  q="$(gguf_of "$f")"
  stage_start
  if [ -s "$q" ]; then
    stage_end "quantize-$f" "cached $q"
    continue
  fi
  qt="$(echo "$f" | tr a-z A-Z)"
  log "quantizing to $qt (log: $GGUF_DIR/quantize-$f.log)"
  nice -n 19 "$LLAMA_QUANTIZE" "$BF16" "$q.tmp" "$qt" "$THREADS" >"$GGUF_DIR/quantize-$f.log" 2>&1 \
    || { log "llama-quantize $qt failed:"; tail -20 "$GGUF_DIR/quantize-$f.log" >&2; rm -f "$q.tmp"; exit 1; }
  mv "$q.tmp" "$q"
  stage_end "quantize-$f" "wrote $q"
done

{
  printf 'file\tbytes\n'
  for f in "$SYNTH"/*.safetensors "$GGUF_DIR"/e2b-synth-*.gguf; do
    [ -f "$f" ] && printf '%s\t%s\n' "$f" "$(stat -Lc %s "$f")"
  done
} >"$OUT/sizes.tsv"
((PREPARE_ONLY)) && { log "prepared; sizes in $OUT/sizes.tsv"; column -t "$OUT/sizes.tsv" >&2; exit 0; }

# ---- 5. both engines load each GGUF -----------------------------------------------------------
G4="${GEMMA4RT_BIN:-$ROOT/build/gemma4rt}"
if [ ! -x "$G4" ]; then
  log "building gemma4rt (scripts/build.sh)"
  bash "$ROOT/scripts/build.sh" >&2
fi
stage_start
for f in $FORMATS; do
  m="$(gguf_of "$f")"
  mkdir -p "$OUT/$f"
  "$G4" info -m "$m" >"$OUT/$f/info.txt" 2>&1 \
    || { log "gemma4rt info failed on $m:"; tail -20 "$OUT/$f/info.txt" >&2; exit 1; }
  "$G4" bench -m "$m" -t "$THREADS" -p 16 -n 4 -r 1 --bw-mib 0 >"$OUT/$f/check-gemma4rt.txt" 2>&1 \
    || { log "gemma4rt bench failed on $m:"; tail -20 "$OUT/$f/check-gemma4rt.txt" >&2; exit 1; }
  "$LLAMA_BENCH" -m "$m" -t "$THREADS" -p 16 -n 4 -r 1 >"$OUT/$f/check-llama.txt" 2>&1 \
    || { log "llama-bench failed on $m:"; tail -20 "$OUT/$f/check-llama.txt" >&2; exit 1; }
done
stage_end check "info + pp16/tg4 on both engines"

# ---- 6. benchmarks ----------------------------------------------------------------------------
for f in $FORMATS; do
  stage_start
  OUT_DIR="$OUT/$f" GEMMA4RT_BIN="$G4" GEMMA4RT_CACHE="$CACHE" LLAMA_CPP_PYTHON_VERSION="$VERSION" \
    bash "$ROOT/bench/compare-llamacpp.sh" -m "$(gguf_of "$f")" -t "$THREADS" -r "$REPS" -p "$P" -n "$N" \
    --rounds "$ROUNDS" | tee "$OUT/$f/report.md"
  stage_end "bench-$f" "pp$P tg$N, $REPS x $ROUNDS rounds"
done
if ((HF)); then
  stage_start
  mkdir -p "$OUT/hf-bf16"
  log "gemma4rt bench on the HF directory $SYNTH (load $(cut -d' ' -f1 /proc/loadavg))"
  "$G4" bench -m "$SYNTH" -t "$THREADS" -p "$P" -n "$N" -r "$REPS" --json >"$OUT/hf-bf16/gemma4rt.json" \
    2>"$OUT/hf-bf16/gemma4rt.log" || { log "gemma4rt bench on $SYNTH failed:"; tail -20 "$OUT/hf-bf16/gemma4rt.log" >&2; exit 1; }
  stage_end bench-hf-bf16 "pp$P tg$N, $REPS reps"
fi

if [ -n "$DEPTHS" ] && [ -n "$DEPTH_FORMAT" ]; then
  stage_start
  mkdir -p "$OUT/depth"
  OUT_DIR="$OUT/depth" GEMMA4RT_BIN="$G4" GEMMA4RT_CACHE="$CACHE" LLAMA_CPP_PYTHON_VERSION="$VERSION" \
    bash "$ROOT/bench/compare-llamacpp.sh" -m "$(gguf_of "$DEPTH_FORMAT")" -t "$THREADS" -r "$REPS" -p 0 -n "$N" \
    -d "$DEPTHS" --rounds "$ROUNDS" | tee "$OUT/depth/report.md"
  echo "$DEPTH_FORMAT" >"$OUT/depth/format.txt"
  # The same tests once more in gemma4rt alone with --profile: the attention ops' time at each depth,
  # which this machine's run-to-run noise (whole-token speeds) can hide.
  log "gemma4rt bench --profile at depths $DEPTHS (load $(cut -d' ' -f1 /proc/loadavg))"
  "$G4" bench -m "$(gguf_of "$DEPTH_FORMAT")" -t "$THREADS" -p 0 -n "$N" -d "$DEPTHS" -r 2 --bw-mib 0 --profile --json \
    >"$OUT/depth/profile.json" 2>"$OUT/depth/profile.log" \
    || { log "gemma4rt bench --profile failed:"; tail -20 "$OUT/depth/profile.log" >&2; exit 1; }
  # This machine's f32 multiply-add rate on the same threads (bench/experiments/attention_floor.cc;
  # x86-64 with AVX-512 only): the f16 cache's attention does 4 of them per byte of K and V at E2B's
  # 8 query heads per KV head, so where 4 x the read rate exceeds it, the op profile's excess cannot
  # reach 1.0 whatever the kernel (the Targets table prints that floor).
  rm -f "$OUT/depth/floor.txt"
  if [ "$(uname -m)" = x86_64 ] && grep -qw avx512f /proc/cpuinfo && command -v g++ >/dev/null; then
    g++ -std=c++20 -O3 -march=native "$ROOT/bench/experiments/attention_floor.cc" -lpthread -o "$OUT/depth/attention_floor" \
      && "$OUT/depth/attention_floor" "$THREADS" "$(tr , '\n' <<<"$DEPTHS" | sort -n | tail -1)" 64 >"$OUT/depth/floor.txt" \
      || { log "attention_floor failed: the Targets table goes without the arithmetic floor"; rm -f "$OUT/depth/floor.txt"; }
  else
    log "no x86-64 AVX-512 CPU or no g++: the Targets table goes without the arithmetic floor"
  fi
  stage_end depth "$DEPTH_FORMAT tg$N at depths $DEPTHS, $REPS x $ROUNDS rounds, then once with --profile, then attention_floor"
fi
if ((WITH_270M)); then
  stage_start
  mkdir -p "$OUT/270m"
  M270="${GEMMA4RT_MODEL:-$(GEMMA4RT_CACHE="$CACHE" bash "$ROOT/scripts/fetch-default-model.sh")}"
  OUT_DIR="$OUT/270m" GEMMA4RT_BIN="$G4" GEMMA4RT_CACHE="$CACHE" LLAMA_CPP_PYTHON_VERSION="$VERSION" \
    bash "$ROOT/bench/compare-llamacpp.sh" -m "$M270" -t "$THREADS" -r "$REPS" -p "$P" -n "$N" \
    --rounds "$ROUNDS" | tee "$OUT/270m/report.md"
  echo "$M270" >"$OUT/270m/model.txt"
  stage_end 270m "$M270 pp$P tg$N, $REPS x $ROUNDS rounds"
fi
# The summary reads only the stages this run ran (an --out reused from an earlier run may hold others).
RAN_DEPTH=0; [ -n "$DEPTHS" ] && [ -n "$DEPTH_FORMAT" ] && RAN_DEPTH=1

"$PY" - "$OUT" "$P" "$N" "$THREADS" "$FORMATS" "$HF" "$RAN_DEPTH" "$WITH_270M" <<'PYEOF'
import glob, json, os, re, statistics, sys
out, P, N, T, formats, hf = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(), sys.argv[6] == "1"
ran_depth, ran_270m = sys.argv[7] == "1", sys.argv[8] == "1"

def g4_runs(d):
    return [json.load(open(f)) for f in sorted(glob.glob(os.path.join(d, "gemma4rt.*.json")))]

def tg_result(j):
    return next((r for r in j["results"] if r["depth"] == 0 and r["n_gen"] == N), None)

rows, summary = [], {"threads": T, "pp": P, "tg": N, "formats": {}}
for f in formats:
    d = os.path.join(out, f)
    s = json.load(open(os.path.join(d, "summary.json")))
    runs = g4_runs(d)
    fracs = [j["bandwidth_fraction"] for j in runs if j.get("bandwidth_fraction") is not None]
    frac = statistics.median(fracs) if fracs else None
    rfracs = [j["read_bandwidth_fraction"] for j in runs if j.get("read_bandwidth_fraction") is not None]
    rfrac = statistics.median(rfracs) if rfracs else None
    tg = tg_result(runs[0]) if runs else None
    e = {"gemma4rt_pp": s.get(f"pp{P}", {}).get("gemma4rt"), "llama_pp": s.get(f"pp{P}", {}).get("llama.cpp"),
         "gemma4rt_tg": s.get(f"tg{N}", {}).get("gemma4rt"), "llama_tg": s.get(f"tg{N}", {}).get("llama.cpp"),
         "ratio_pp": s.get(f"pp{P}", {}).get("ratio"), "ratio_tg": s.get(f"tg{N}", {}).get("ratio"),
         "paired_ratio_pp": s.get(f"pp{P}", {}).get("paired_ratio"), "paired_ratio_tg": s.get(f"tg{N}", {}).get("paired_ratio"),
         "bandwidth_fraction": frac, "bandwidth_gbps": statistics.median(j.get("bandwidth_gbps") or 0 for j in runs) if runs else None,
         "read_bandwidth_fraction": rfrac,
         "read_bandwidth_gbps": statistics.median(j.get("read_bandwidth_gbps") or 0 for j in runs) if runs else None,
         "weight_bytes_per_token": tg and tg.get("weight_bytes_per_token"), "size_bytes": runs[0].get("size_bytes") if runs else None,
         "peak_rss_bytes": max(j.get("peak_rss_bytes", 0) for j in runs) if runs else None}
    # llama.cpp reads the same weights per token, so its fraction is gemma4rt's scaled by the tg ratio.
    e["llama_bandwidth_fraction"] = frac / e["ratio_tg"] if frac and e["ratio_tg"] else None
    summary["formats"][f] = e
    rows.append((f + " GGUF", e))
if hf:
    j = json.load(open(os.path.join(out, "hf-bf16", "gemma4rt.json")))
    e = {"gemma4rt_pp": j.get(f"pp{P}"), "gemma4rt_tg": j.get(f"tg{N}"), "bandwidth_fraction": j.get("bandwidth_fraction"),
         "read_bandwidth_fraction": j.get("read_bandwidth_fraction"), "read_bandwidth_gbps": j.get("read_bandwidth_gbps"),
         "bandwidth_gbps": j.get("bandwidth_gbps"), "size_bytes": j.get("size_bytes"), "peak_rss_bytes": j.get("peak_rss_bytes")}
    summary["formats"]["hf-bf16"] = e
    rows.append(("bf16 safetensors (HF dir)", e))

def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)

lines = [f"# Synthetic Gemma 4 E2B: gemma4rt vs llama.cpp ({T} threads, pp{P}, tg{N})", "",
         f"| weights | size GB | gemma4rt pp{P} | llama.cpp pp{P} | pp ratio | gemma4rt tg{N} | llama.cpp tg{N} | tg ratio "
         f"| gemma4rt decode / bandwidth limit | llama.cpp decode / limit | gemma4rt decode / read bandwidth "
         f"| targets (>= 80%, >= 1.0x) |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
for name, e in rows:
    ok_bw = e["bandwidth_fraction"] is not None and e["bandwidth_fraction"] >= 0.8
    ok_ratio = e.get("ratio_tg") is not None and e["ratio_tg"] >= 1.0
    targets = f"bw {'met' if ok_bw else 'NOT met'}" + (f", ratio {'met' if ok_ratio else 'NOT met'}" if e.get("ratio_tg") is not None else "")
    lines.append(f"| {name} | {fmt(e['size_bytes'] and e['size_bytes'] / 1e9)} | {fmt(e['gemma4rt_pp'])} | {fmt(e.get('llama_pp'))} "
                 f"| {fmt(e.get('ratio_pp'), '.3f')} ({fmt(e.get('paired_ratio_pp'), '.3f')}) | {fmt(e['gemma4rt_tg'])} "
                 f"| {fmt(e.get('llama_tg'))} | {fmt(e.get('ratio_tg'), '.3f')} ({fmt(e.get('paired_ratio_tg'), '.3f')}) "
                 f"| {fmt(e['bandwidth_fraction'] and 100 * e['bandwidth_fraction'], '.1f')}% "
                 f"| {fmt(e.get('llama_bandwidth_fraction') and 100 * e['llama_bandwidth_fraction'], '.1f')}% "
                 f"| {fmt(e.get('read_bandwidth_fraction') and 100 * e['read_bandwidth_fraction'], '.1f')}% | {targets} |")
bw = [e["bandwidth_gbps"] for _, e in rows if e.get("bandwidth_gbps")]
rbw = [e["read_bandwidth_gbps"] for _, e in rows if e.get("read_bandwidth_gbps")]
lines += ["", f"Copy bandwidth (gemma4rt bench's memcpy test, read + written bytes, median): "
          f"{fmt(statistics.median(bw) if bw else None)} GB/s; read-only bandwidth (same threads): "
          f"{fmt(statistics.median(rbw) if rbw else None)} GB/s. The 80% target is against the copy figure. "
          "Ratios: the engines' medians over all samples (compare-llamacpp.sh), in brackets the median of "
          "the per-round ratios (the two engines of a round ran back to back). gemma4rt's bandwidth fractions: "
          "each tg repetition against the bandwidth measured right after it, median over repetitions and "
          "rounds; llama.cpp's is gemma4rt's scaled by the tg ratio (same bytes per token)."]

# Issue 5's targets, each with its figure from this run.
targets = []
def target(what, figure, ok):
    targets.append((what, figure, None if ok is None else bool(ok)))
s270 = os.path.join(out, "270m", "summary.json")
if ran_270m and os.path.exists(s270):
    j = json.load(open(s270))
    summary["270m"] = j
    mf = os.path.join(out, "270m", "model.txt")
    m270 = os.path.basename(open(mf).read().strip()) if os.path.exists(mf) else "Gemma 3 270M"
    for key, label in ((f"pp{P}", "prefill"), (f"tg{N}", "decode")):
        if (P if key.startswith("pp") else N) == 0:
            continue
        r = j.get(key, {}).get("ratio")
        target(f"{m270} {label} ({key}) >= 1.0x llama.cpp (aim 1.3x)",
               "missing" if r is None else f"{r:.2f}x ({j[key]['gemma4rt']:.1f} vs {j[key]['llama.cpp']:.1f} t/s)",
               None if r is None else r >= 1.0)
    target(f"{m270} peak RSS <= weights + KV cache + 10%",
           f"{j.get('peak_rss_bytes', 0) / 2**20:.0f} of {j.get('peak_rss_budget_bytes', 0) / 2**20:.0f} MiB",
           j.get("peak_rss_within_budget"))
for name, e in rows:
    if e["bandwidth_fraction"] is not None:
        target(f"E2B {name} decode >= 80% of the bandwidth limit", f"{100 * e['bandwidth_fraction']:.1f}% "
               f"({fmt(e.get('read_bandwidth_fraction') and 100 * e['read_bandwidth_fraction'], '.1f')}% of the read figure)",
               e["bandwidth_fraction"] >= 0.8)
    for k in ("tg", "pp"):
        r = e.get(f"ratio_{k}")
        if r is not None:
            target(f"E2B {name} {'decode' if k == 'tg' else 'prefill'} >= 1.0x llama.cpp", f"{r:.2f}x", r >= 1.0)
    d = os.path.join(out, name.split()[0]) if name.endswith("GGUF") else os.path.join(out, "hf-bf16")
    js = [json.load(open(f)) for f in glob.glob(os.path.join(d, "gemma4rt*.json"))]
    if js:
        ok = all(j.get("peak_rss_within_budget", False) for j in js)
        target(f"E2B {name} peak RSS <= weights + KV cache + 10%",
               f"{max(j.get('peak_rss_bytes', 0) for j in js) / 2**20:.0f} of "
               f"{min(j.get('peak_rss_budget_bytes', 0) for j in js) / 2**20:.0f} MiB", ok)
sd = os.path.join(out, "depth", "summary.json")
if ran_depth and os.path.exists(sd):
    j = json.load(open(sd))
    summary["depth"] = j
    fmt_name = open(os.path.join(out, "depth", "format.txt")).read().strip()
    dep = j.get("depth", {})
    for depth, r in dep.get("depths", {}).items():
        ex, se, exse = r.get("excess"), r.get("ratio_2se"), r.get("excess_2se")
        pm = lambda x: "" if x is None else f" ± {x:.2f}"
        figure = (f"tg{N} {r['gemma4rt_ratio']:.3f}x{pm(se)} of d{dep.get('base')} (bandwidth-bound "
                  f"{r['predicted_ratio']:.3f}x, excess {'-' if ex is None else format(ex, '.2f')}{pm(exse)}; llama.cpp "
                  f"{r['llama.cpp_ratio']:.3f}x)")
        if r.get("met") is None:  # the excess's interval spans 1.0
            figure += ": inconclusive, the excess's two standard errors span 1.0 (more -r/--rounds, a deeper depth, or the op profile below)"
        target(f"E2B {fmt_name} decode at depth {depth} falls only by the KV reads (excess <= 1.0)", figure, r.get("met"))
        if r.get("bandwidth_fraction") is not None:
            target(f"E2B {fmt_name} decode at depth {depth} >= 80% of the bandwidth limit (weights + KV bytes)",
                   f"{100 * r['bandwidth_fraction']:.1f}%", r["bandwidth_fraction"] >= 0.8)
# The op profile (stage 7's --profile run): attention's growth past the smallest depth against the
# time its extra KV bytes take at the rate the weight-reading ops read their weights (the faster of
# the two tests' rates, so that a slow first test cannot shrink the KV reads' time).
pj, pl = os.path.join(out, "depth", "profile.json"), os.path.join(out, "depth", "profile.log")
if ran_depth and os.path.exists(pj) and os.path.exists(pl):
    ops, test = {}, None
    for line in open(pl):
        if line.startswith("gemma4rt: profile of "):
            test = line[len("gemma4rt: profile of "):].split(":")[0]
            ops[test] = {"attention": 0.0, "weights": 0.0, "all": 0.0,
                         "total": float(line.split(": ")[2].split()[0])}  # "X ms per token in ops"
            continue
        parts = line.split()
        share = next((i for i, x in enumerate(parts) if x.endswith("%")), None)
        if test is None or share is None or share < 3 or parts[0] == "op":
            continue
        ms, name, has_gbps = float(parts[share - 1]), " ".join(parts[:share - 2]), len(parts) > share + 3
        ops[test]["all"] += ms
        if name.startswith("Attention"):
            ops[test]["attention"] += ms
        elif has_gbps:
            ops[test]["weights"] += ms
    for t, o in ops.items():  # the rows must add up to the header's total, or the format changed
        if abs(o["all"] - o["total"]) > 0.02 * o["total"] + 0.01:
            print(f"compare-e2b: warning: profile of {t}: rows add up to {o['all']:.3f} ms, the header says "
                  f"{o['total']:.3f}: the op table's format may have changed", file=sys.stderr)
    fma, pf = None, os.path.join(out, "depth", "floor.txt")
    if os.path.exists(pf):
        mt = re.search(r"f32 multiply-adds ([0-9.]+) G/s", open(pf).read())
        fma = float(mt.group(1)) * 1e9 if mt else None
    res = {r["depth"]: r for r in json.load(open(pj))["results"] if r["n_gen"] == N}
    ds = sorted(res)
    name0 = lambda d: f"tg{N}" + (f" @ d{d}" if d else "")
    prof = {}
    if ds and name0(ds[0]) in ops:
        base, d0 = ops[name0(ds[0])], ds[0]
        for d in ds[1:]:
            if name0(d) not in ops:
                continue
            ms = min(base["weights"], ops[name0(d)]["weights"])
            rate = res[d0]["weight_bytes_per_token"] / ms if ms > 0 else None  # bytes per ms
            if not rate:
                continue
            extra_kv = res[d]["kv_bytes_per_token"] - res[d0]["kv_bytes_per_token"]
            growth = ops[name0(d)]["attention"] - base["attention"]
            ex = growth / (extra_kv / rate) if extra_kv > 0 else None
            prof[str(d)] = {"attention_ms": ops[name0(d)]["attention"], "attention_ms_base": base["attention"],
                            "extra_kv_bytes": extra_kv, "weights_gbps": rate / 1e6, "excess": ex}
            # The floor: 4 f32 multiply-adds per KV byte (f16 cache, 8 query heads per KV head) at this
            # machine's peak rate, against the same bytes at the weights' rate.
            floor = 4 * rate * 1e3 / fma if fma else None
            prof[str(d)]["f32_floor_excess"] = floor
            target(f"E2B {open(os.path.join(out, 'depth', 'format.txt')).read().strip()} attention at depth {d}: growth "
                   f"past d{d0} within its KV reads' time at the weights' rate (op profile, excess <= 1.0)",
                   f"attention {base['attention']:.3f} -> {ops[name0(d)]['attention']:.3f} ms/token for "
                   f"{extra_kv / 2**20:.1f} MiB more KV at {rate / 1e6:.1f} GB/s: excess "
                   f"{'-' if ex is None else format(ex, '.2f')}"
                   + ("" if floor is None else
                      f"; this machine's f32 multiply-adds ({fma / 1e9:.1f} G/s on these threads) put the f16 "
                      f"cache's floor at excess {floor:.2f}" + (" (out of reach on these cores)" if floor > 1 else "")),
                   None if ex is None else ex <= 1.0)
    summary["depth_profile"] = prof
summary["targets"] = [{"target": t, "figure": f, "met": ok} for t, f, ok in targets]
lines += ["", "## Targets (issue 5)", "", "| target | this run | met |", "|---|---|---|"]
lines += [f"| {t} | {f} | {'?' if ok is None else ('yes' if ok else '**NO**')} |" for t, f, ok in targets]
lines += ["", "Stage wall times:", ""]
lines += ["    " + l for l in open(os.path.join(out, "stages.tsv")).read().splitlines()]
lines += ["", "Files:", ""] + ["    " + l for l in open(os.path.join(out, "sizes.tsv")).read().splitlines()]
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print("\n".join(lines))
print(f"\n(summary.md, summary.json and the raw JSON in {out})")
PYEOF

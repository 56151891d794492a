#!/usr/bin/env python3
"""Generate tests/data/dequant_golden.json: ggml blocks and their dequantised f32 values.

Development-only tool. It needs `numpy` and the `gguf` Python package (0.19.0 was used), whose
`gguf.quants.dequantize` is the reference; it downloads nothing itself. Run from the repository
root after `scripts/fetch-default-model.sh`:

    python3 tools/make_dequant_golden.py [--model PATH] [--out tests/data/dequant_golden.json]

Cases (each: a few whole blocks as hex bytes, and their dequantised values as the hex bytes of
little-endian f32, so the C++ test can compare bit for bit):
  * Q8_0, Q5_0, Q4_K, Q6_K: REAL blocks from the default model (Gemma 3 270M Q4_K_M), taken from
    the start and the middle of one tensor of each type.
  * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16, F16: random data quantised with `gguf.quants.quantize`.
  * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K: random bytes (every bit pattern of the
    quantised fields is reachable), with the fp16 scale fields drawn from finite values.
    Q5_K has no quantiser in the package, so it is covered by these random blocks only.
  * F16, BF16: special values (+-0, subnormals, +-inf, quiet NaNs, extremes) as raw bits.
It also records the dequantised first row of the Q4_K tensor `blk.0.attn_output.weight` of the
default model (PyTorch shape [640, 1024]: 1024 values, 4 blocks) and the model's SHA-256.

The output is deterministic (fixed seed, sorted keys).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf.quants import dequantize, quantize

SEED = 20240611
REAL_TENSORS = {
    "Q8_0": "blk.0.attn_v.weight",
    "Q5_0": "blk.0.attn_q.weight",
    "Q4_K": "blk.0.attn_output.weight",
    "Q6_K": "blk.0.ffn_down.weight",
}
FIRST_ROW_TENSOR = "blk.0.attn_output.weight"


def default_model_path() -> str:
    env = os.environ.get("GEMMA4RT_DEFAULT_MODEL")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "..", "scripts", "fetch-default-model.sh")
    return subprocess.run(["bash", script], check=True, capture_output=True, text=True).stdout.strip()


def f32_hex(values: np.ndarray) -> str:
    return np.ascontiguousarray(values, dtype="<f4").tobytes().hex()


def case(qtype: QT, raw: np.ndarray, source: str) -> dict:
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    assert raw.size % block_bytes == 0, (qtype, raw.size)
    n = raw.size // block_bytes * block_elems
    values = dequantize(raw.reshape(1, -1), qtype).reshape(-1)
    assert values.dtype == np.float32 and values.size == n
    return {"type": qtype.name, "source": source, "n": int(n), "bytes": raw.tobytes().hex(),
            "f32": f32_hex(values)}


def finite_halves(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` random fp16 bit patterns that are finite (no inf/NaN), as uint8 pairs."""
    bits = rng.integers(0, 1 << 16, size=count, dtype=np.uint32)
    bits = np.where((bits & 0x7C00) == 0x7C00, bits & ~np.uint32(0x4000), bits)  # clear top exp bit
    return bits.astype("<u2").view(np.uint8)


# Byte offsets of the fp16 fields in each block format (the rest are integer fields).
HALF_FIELDS = {
    QT.Q8_0: [0], QT.Q4_0: [0], QT.Q5_0: [0], QT.Q4_1: [0, 2], QT.Q5_1: [0, 2],
    QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208],
}


def random_blocks(rng: np.random.Generator, qtype: QT, nblocks: int) -> np.ndarray:
    _, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(nblocks, block_bytes), dtype=np.uint8)
    for off in HALF_FIELDS[qtype]:
        raw[:, off:off + 2] = finite_halves(rng, nblocks).reshape(nblocks, 2)
    return raw


def real_blocks(reader: GGUFReader, name: str, qtype: QT, nblocks: int = 2) -> tuple[np.ndarray, str]:
    t = next(t for t in reader.tensors if t.name == name)
    assert t.tensor_type == qtype, (name, t.tensor_type)
    _, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    flat = np.asarray(t.data).reshape(-1).view(np.uint8)
    total = flat.size // block_bytes
    mid = total // 2
    picked = np.concatenate([flat[: nblocks * block_bytes],
                             flat[mid * block_bytes:(mid + nblocks) * block_bytes]])
    return picked, f"real: {name} blocks 0-{nblocks - 1} and {mid}-{mid + nblocks - 1}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="the default model GGUF (default: env GEMMA4RT_DEFAULT_MODEL "
                    "or what scripts/fetch-default-model.sh prints)")
    ap.add_argument("--out", default="tests/data/dequant_golden.json")
    args = ap.parse_args()
    model = args.model or default_model_path()

    with open(model, "rb") as f:
        sha = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 24), b""):
            sha.update(chunk)
    reader = GGUFReader(model)
    rng = np.random.default_rng(SEED)
    cases = []

    # Real blocks.
    for tname, name in REAL_TENSORS.items():
        qtype = QT[tname]
        raw, source = real_blocks(reader, name, qtype)
        cases.append(case(qtype, raw, source))

    # Random data through the package's quantisers (those it has).
    for qtype in (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.BF16, QT.F16):
        block_elems, _ = gguf.GGML_QUANT_SIZES[qtype]
        n = 64 if block_elems == 1 else 2 * block_elems
        data = (rng.standard_normal(n) * rng.choice([1e-3, 0.05, 1.0, 30.0], size=n)).astype(np.float32)
        data = data.reshape(1, n)
        q = quantize(data, qtype)
        cases.append(case(qtype, np.asarray(q).view(np.uint8), "random data quantised by gguf.quants.quantize"))

    # Random bytes for every block format.
    for qtype in (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        block_elems, _ = gguf.GGML_QUANT_SIZES[qtype]
        nblocks = 4 if block_elems == 32 else 3
        cases.append(case(qtype, random_blocks(rng, qtype, nblocks), "random bytes, finite fp16 scales"))

    # Special values of the plain 16-bit formats. (Quiet NaNs only: how a signalling NaN converts
    # is up to the hardware.)
    f16_bits = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,
                0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x3555, 0x0200]
    cases.append(case(QT.F16, np.array(f16_bits, dtype="<u2").view(np.uint8), "special values"))
    bf16_bits = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3F80, 0xBF80, 0x7F7F, 0xFF7F,
                 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x3EAB, 0x4049]
    cases.append(case(QT.BF16, np.array(bf16_bits, dtype="<u2").view(np.uint8), "special values"))

    # The first row of a real Q4_K tensor, as the GGUF test reads it.
    t = next(t for t in reader.tensors if t.name == FIRST_ROW_TENSOR)
    assert t.tensor_type == QT.Q4_K
    row = dequantize(np.asarray(t.data)[0:1], QT.Q4_K).reshape(-1)
    first_row = {"tensor": FIRST_ROW_TENSOR, "type": "Q4_K", "n": int(row.size), "f32": f32_hex(row)}

    out = {
        "about": "Written by tools/make_dequant_golden.py; do not edit. 'bytes' are raw ggml blocks, "
                 "'f32' the little-endian float32 bytes gguf.quants.dequantize returns for them.",
        "gguf_package_version": getattr(gguf, "__version__", None) or _pkg_version(),
        "numpy_version": np.__version__,
        "model_sha256": sha.hexdigest(),
        "cases": cases,
        "first_row": first_row,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes, {len(cases)} cases)", file=sys.stderr)
    return 0


def _pkg_version() -> str | None:
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())

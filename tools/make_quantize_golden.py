#!/usr/bin/env python3
"""Generate tests/data/quantize_golden.json: f32 rows and the bytes a quantiser must produce.

Development-only tool. Needs numpy, torch, the `gguf` Python package (0.19.0 used) and
`compressed-tensors` (0.20.1 used); downloads nothing. Run from the repository root:

    python3 tools/make_quantize_golden.py [--out tests/data/quantize_golden.json]

References:
  * Q8_0, Q4_0: `gguf.quants.quantize` (bit-exact with ggml's quantize_row_*_ref).
  * W4G32 (our block layout, src/tensor/dtype.h): compressed-tensors' PackedQuantizationCompressor
    .compress with symmetric int4 groups of 32 and the min-max scale bf16(max|x| / 7.5), its
    int32 words rearranged into W4G32 blocks (bf16 scale, then byte j = element j | element j+16 << 4,
    each stored as q + 8).
Rows: Gaussian at several scales, rows with exact rounding ties (x * id = k + 0.5), an all-zero
block, blocks whose largest magnitude is negative or repeated with both signs, tiny (subnormal
fp16 scale) and large values. Values and bytes are hex (little-endian) so the C++ test compares
bit for bit. Deterministic (fixed seed, sorted keys).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationScheme, QuantizationArgs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rows() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(20261129)
    out = []
    for s in (1e-3, 0.05, 1.0, 300.0):
        out.append((f"gauss{s:g}", (rng.standard_normal(128) * s).astype(np.float32)))
    # Ties: Q8_0 with amax 127 -> d = 1, id = 1, x = k + 0.5 rounds away from zero.
    t = np.concatenate([[127.0], np.arange(-15.5, 15.5, 1.0)]).astype(np.float32)
    out.append(("ties_q8", np.concatenate([t, -t, t * 0.5, t[::-1]]).astype(np.float32)))
    # Ties for Q4_0 (max -8 -> d = 1): x + 8.5 with x = k - 0.5; and for W4G32 (amax 7.5 -> s = 1).
    t4 = np.concatenate([[-8.0], np.arange(-7.5, 8.0, 0.5)[:31]]).astype(np.float32)
    tw = np.concatenate([[7.5], np.arange(-7.5, 8.0, 0.5)[:31]]).astype(np.float32)
    out.append(("ties_q4_w4", np.concatenate([t4, -t4, tw, -tw]).astype(np.float32)))
    z = np.zeros(32, np.float32)
    neg = rng.standard_normal(32).astype(np.float32)
    neg[5] = -10.0
    both = rng.standard_normal(32).astype(np.float32)
    both[3], both[20] = 6.0, -6.0
    out.append(("zero_negmax_bothsigns", np.concatenate([z, neg, both, -both]).astype(np.float32)))
    out.append(("tiny", (rng.standard_normal(64) * 1e-6).astype(np.float32)))
    out.append(("large", (rng.standard_normal(64) * 4e3).astype(np.float32)))
    return out


def w4g32(x: np.ndarray) -> bytes:
    w = torch.from_numpy(x.reshape(1, -1).copy())
    g = w.reshape(1, -1, 32)
    s = (g.abs().amax(-1) / 7.5).to(torch.bfloat16)
    s = torch.where(s == 0, torch.tensor(torch.finfo(torch.bfloat16).eps, dtype=torch.bfloat16), s)
    sch = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=32))
    packed = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": s}, sch)["weight_packed"]
    raw = packed.numpy().astype("<i4").tobytes()  # byte k: element 2k low nibble, 2k+1 high
    nib = []
    for b in raw:
        nib += [b & 15, b >> 4]
    out = bytearray()
    sbits = s.view(torch.int16).numpy().astype("<i2").reshape(-1)
    zero = (g.abs().amax(-1) == 0).numpy().reshape(-1)
    for blk in range(len(nib) // 32):
        e = nib[32 * blk: 32 * blk + 32]
        # An all-zero group: compressed-tensors replaces the zero scale by eps; ours stores 0 (the
        # int4 values are 0 either way, so the dequantised weights agree).
        out += (0 if zero[blk] else int(sbits[blk]) & 0xffff).to_bytes(2, "little")
        out += bytes(e[j] | (e[j + 16] << 4) for j in range(16))
    return bytes(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "quantize_golden.json"))
    args = ap.parse_args()
    cases = []
    for name, x in rows():
        assert x.dtype == np.float32 and x.size % 32 == 0
        for t, qt in (("Q8_0", QT.Q8_0), ("Q4_0", QT.Q4_0)):
            cases.append({"name": name, "type": t, "input": x.tobytes().hex(),
                          "bytes": quantize(x.reshape(1, -1), qt).tobytes().hex()})
        cases.append({"name": name, "type": "W4G32", "input": x.tobytes().hex(), "bytes": w4g32(x).hex()})
    with open(args.out, "w") as f:
        json.dump({"generator": "tools/make_quantize_golden.py", "cases": cases}, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{args.out}: {len(cases)} cases")


if __name__ == "__main__":
    main()

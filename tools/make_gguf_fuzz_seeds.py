#!/usr/bin/env python3
"""Write the seed corpus of the GGUF fuzz target: fuzz/corpus/gguf/seed-*.gguf.

Development-only tool. Needs `numpy` and the `gguf` Python package (0.19.0 was used); every file
is written by its `GGUFWriter`, so the seeds double as compatibility fixtures (gguf_test.cc opens
each seed-* file and expects it to load). Run from the repository root:

    python3 tools/make_gguf_fuzz_seeds.py [--out fuzz/corpus/gguf]

Seeds (all tiny; < 64 KB together):
  seed-meta.gguf        every metadata value type, arrays of numbers/strings/bools, nested arrays
  seed-tensors.gguf     one small tensor of each type the engine loads (F32, F16, BF16, Q8_0,
                        Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), up to 4 dimensions
  seed-align64-v2.gguf  general.alignment = 64, version field patched to 2 (same layout)
  seed-gemma3.gguf      Gemma 3-like metadata and tensor names with a 16-token vocabulary
Deterministic (fixed seed).
"""

from __future__ import annotations

import argparse
import os
import struct
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from gguf.quants import quantize

SEED = 1234


def write(path: str, arch: str, fill) -> None:
    w = gguf.GGUFWriter(path, arch)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def raw_blocks(rng: np.random.Generator, qtype: QT, rows: int, cols: int) -> np.ndarray:
    """Random bytes shaped as a quantised [rows, cols] tensor, fp16 scale fields kept finite."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    nblocks = rows * cols // block_elems
    raw = rng.integers(0, 256, size=(nblocks, block_bytes), dtype=np.uint8)
    halves = {QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208]}[qtype]
    for off in halves:
        raw[:, off:off + 2] = np.float16(rng.uniform(-0.1, 0.1, nblocks)).view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(rows, cols // block_elems * block_bytes)


def add_quantised(w, rng, name: str, qtype: QT, shape: tuple[int, ...]) -> None:
    if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        data = raw_blocks(rng, qtype, int(np.prod(shape[:-1])), shape[-1]).reshape(
            *shape[:-1], -1)
    else:
        data = quantize(rng.standard_normal(shape).astype(np.float32), qtype)
    w.add_tensor(name, data, raw_dtype=qtype)


def seed_meta(w) -> None:
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.125)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo")
    w.add_uint64("test.u64", 18000000000000000000)
    w.add_int64("test.i64", -9000000000000000000)
    w.add_float64("test.f64", 3.141592653589793)
    w.add_array("test.arr_str", ["a", "", "<bos>"])
    w.add_array("test.arr_int", [1, -2, 3])
    w.add_array("test.arr_float", [0.5, -1.5])
    w.add_array("test.arr_bool", [True, False, True])
    w.add_array("test.arr_nested", [["x", "yz"], ["w"]])
    w.add_array("test.arr_nested_int", [[1, 2], [3]])
    w.add_tensor("t.f32", np.arange(8, dtype=np.float32).reshape(2, 4))


def seed_tensors(w) -> None:
    rng = np.random.default_rng(SEED)
    w.add_tensor("t.f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("t.f16", rng.standard_normal((2, 1, 6)).astype(np.float16))
    w.add_tensor("t.bf16", quantize(rng.standard_normal((2, 8)).astype(np.float32), QT.BF16),
                 raw_dtype=QT.BF16)
    add_quantised(w, rng, "t.q8_0", QT.Q8_0, (2, 64))
    add_quantised(w, rng, "t.q4_0", QT.Q4_0, (1, 2, 32))
    add_quantised(w, rng, "t.q4_1", QT.Q4_1, (32,))
    add_quantised(w, rng, "t.q5_0", QT.Q5_0, (2, 32))
    add_quantised(w, rng, "t.q5_1", QT.Q5_1, (1, 1, 1, 32))
    add_quantised(w, rng, "t.q4_k", QT.Q4_K, (1, 256))
    add_quantised(w, rng, "t.q5_k", QT.Q5_K, (1, 256))
    add_quantised(w, rng, "t.q6_k", QT.Q6_K, (2, 256))


def seed_align64(w) -> None:
    w.add_custom_alignment(64)
    w.add_string("general.name", "aligned")
    w.add_tensor("a", np.arange(3, dtype=np.float32))
    w.add_tensor("b", np.arange(5, dtype=np.float16))


def seed_gemma3(w) -> None:
    rng = np.random.default_rng(SEED + 1)
    w.add_string("general.type", "model")
    w.add_string("general.name", "Gemma 3 seed")
    w.add_uint32("gemma3.context_length", 32768)
    w.add_uint32("gemma3.embedding_length", 64)
    w.add_uint32("gemma3.block_count", 1)
    w.add_uint32("gemma3.feed_forward_length", 256)
    w.add_uint32("gemma3.attention.head_count", 2)
    w.add_uint32("gemma3.attention.head_count_kv", 1)
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32("gemma3.attention.key_length", 32)
    w.add_uint32("gemma3.attention.value_length", 32)
    w.add_float32("gemma3.rope.freq_base", 1000000.0)
    w.add_uint32("gemma3.attention.sliding_window", 512)
    w.add_string("tokenizer.ggml.model", "llama")
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"tok{i}" for i in range(12)]
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.scores", [float(-i) for i in range(16)])
    w.add_key_value("tokenizer.ggml.token_type", [3, 3, 3, 2] + [1] * 12, VT.ARRAY, VT.INT32)
    w.add_uint32("tokenizer.ggml.bos_token_id", 2)
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_uint32("general.quantization_version", 2)
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    add_quantised(w, rng, "token_embd.weight", QT.Q8_0, (16, 64))
    add_quantised(w, rng, "blk.0.attn_q.weight", QT.Q5_0, (64, 64))
    add_quantised(w, rng, "blk.0.attn_output.weight", QT.Q4_K, (1, 256))
    add_quantised(w, rng, "blk.0.ffn_down.weight", QT.Q6_K, (1, 256))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="fuzz/corpus/gguf")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    write(os.path.join(args.out, "seed-meta.gguf"), "test", seed_meta)
    write(os.path.join(args.out, "seed-tensors.gguf"), "test", seed_tensors)
    p = os.path.join(args.out, "seed-align64-v2.gguf")
    write(p, "test", seed_align64)
    with open(p, "r+b") as f:  # version 2 has the same layout as 3
        f.seek(4)
        f.write(struct.pack("<I", 2))
    write(os.path.join(args.out, "seed-gemma3.gguf"), "gemma3", seed_gemma3)
    total = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out)
                if n.startswith("seed-"))
    print(f"wrote seeds to {args.out} ({total} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes a full-size synthetic Gemma 4 E2B checkpoint: random weights, real shapes and names.

    python3 tools/make_synthetic_e2b.py OUT_DIR [--shard-gib 4] [--seed 0] [--dry-run]
    python3 tools/make_synthetic_e2b.py DIR --check            # exit 0 iff DIR is a complete checkpoint
    python3 tools/make_synthetic_e2b.py DIR --tokenizer-only   # write only tokenizer.json + tokenizer_config.json

For performance work on the real E2B geometry without downloading Google's checkpoint (the
weights are random, so the model's outputs mean nothing). Layout: a Hugging Face directory with
config.json in Google's published schema (Gemma4ForConditionalGeneration, text_config with
global_head_dim / num_global_key_value_heads), generation_config.json, bf16 safetensors shards
model-0000N-of-0000M.safetensors and model.safetensors.index.json. Tensors and shapes follow
../shared/spec/gemma-architecture.md section 4.1 (H = 1536, P = 256, L = 35, prefix
model.language_model.), including the k_proj/v_proj/k_norm tensors that the KV-shared layers 15-34
carry but do not use. No vision/audio towers (a text engine skips them) and no duplicate lm_head
(tied). About 9.9 GB (9.2 GiB) on disk.

Memory: tensors are generated and written in chunks of at most 64 Mi elements (128 MiB of bf16),
so the script needs a few hundred MB of RAM whatever the checkpoint size. Only numpy is needed.

Tokenizer: the checkpoint has none (gemma4rt does not need one to bench). llama.cpp's converter
does: --tokenizer-only writes a minimal, deterministic tokenizer.json (HF BPE with byte fallback)
and tokenizer_config.json of exactly V = 262144 entries into DIR, so that the converter keeps all
262144 rows of embed_tokens (it truncates the table to len(vocab) + len(added_tokens)). It is the
512-token vocabulary of tools/convert_golden_to_gguf.py (specials, 256 byte tokens, ASCII, 8 merges)
padded with "<unusedN>" pieces; no Google file is used. bench/compare-e2b.sh writes it into a
staging directory beside symlinks to the shards.

--check compares DIR with the plan for the same --shard-gib: config.json, generation_config.json,
model.safetensors.index.json (every tensor mapped), each shard's safetensors header (names,
dtypes, shapes, offsets) and file size. It reads headers only, not the data.

Values: projection weights are bf16 with a random sign and mantissa and an exponent giving
magnitudes in [2^-7, 2^-3) (rms ~0.05; RMSNorm keeps activations in range); norm
weights are 1 + a small random term; layer_scalar is 1. Deterministic for a given --seed.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

H, P, L, V = 1536, 256, 35, 262144
NQ, NKV, D_SLIDING, D_FULL = 8, 1, 256, 512
I_NARROW, I_WIDE = 6144, 12288
WINDOW, KV_SHARED = 512, 20
FULL_LAYERS = {4, 9, 14, 19, 24, 29, 34}
PREFIX = "model.language_model."
CHUNK = 64 << 20  # elements per generated chunk


def tensors():
    """(name, shape, kind) for every text tensor, in checkpoint order. kind: 'w' weight, 'norm', 'scalar'."""
    out = [
        (PREFIX + "embed_tokens.weight", (V, H), "w"),
        (PREFIX + "embed_tokens_per_layer.weight", (V, L * P), "w"),
        (PREFIX + "per_layer_model_projection.weight", (L * P, H), "w"),
        (PREFIX + "per_layer_projection_norm.weight", (P,), "norm"),
        (PREFIX + "norm.weight", (H,), "norm"),
    ]
    for i in range(L):
        d = D_FULL if i in FULL_LAYERS else D_SLIDING
        inter = I_WIDE if i >= L - KV_SHARED else I_NARROW
        p = f"{PREFIX}layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm", "post_per_layer_input_norm"):
            out.append((p + n + ".weight", (H,), "norm"))
        out += [
            (p + "self_attn.q_proj.weight", (NQ * d, H), "w"),
            (p + "self_attn.q_norm.weight", (d,), "norm"),
            (p + "self_attn.k_proj.weight", (NKV * d, H), "w"),
            (p + "self_attn.v_proj.weight", (NKV * d, H), "w"),
            (p + "self_attn.k_norm.weight", (d,), "norm"),
            (p + "self_attn.o_proj.weight", (H, NQ * d), "w"),
            (p + "mlp.gate_proj.weight", (inter, H), "w"),
            (p + "mlp.up_proj.weight", (inter, H), "w"),
            (p + "mlp.down_proj.weight", (H, inter), "w"),
            (p + "per_layer_input_gate.weight", (P, H), "w"),
            (p + "per_layer_projection.weight", (H, P), "w"),
            (p + "layer_scalar", (1,), "scalar"),
        ]
    return out


def config():
    layer_types = ["full_attention" if i in FULL_LAYERS else "sliding_attention" for i in range(L)]
    text = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attention_k_eq_v": False,
        "bos_token_id": 2,
        "enable_moe_block": False,
        "eos_token_id": 1,
        "final_logit_softcapping": 30.0,
        "global_head_dim": D_FULL,
        "head_dim": D_SLIDING,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": H,
        "hidden_size_per_layer_input": P,
        "initializer_range": 0.02,
        "intermediate_size": I_NARROW,
        "layer_types": layer_types,
        "max_position_embeddings": 131072,
        "model_type": "gemma4_text",
        "moe_intermediate_size": None,
        "num_attention_heads": NQ,
        "num_experts": None,
        "num_global_key_value_heads": None,
        "num_hidden_layers": L,
        "num_key_value_heads": NKV,
        "num_kv_shared_layers": KV_SHARED,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": WINDOW,
        "tie_word_embeddings": True,
        "top_k_experts": None,
        "use_bidirectional_attention": None,
        "use_cache": True,
        "use_double_wide_mlp": True,
        "vocab_size": V,
        "vocab_size_per_layer_input": V,
    }
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "audio_token_id": 258881,
        "boa_token_id": 256000,
        "boi_token_id": 255999,
        "dtype": "bfloat16",
        "eoa_token_index": 258883,
        "eoi_token_id": 258882,
        "eos_token_id": [1, 106],
        "image_token_id": 258880,
        "initializer_range": 0.02,
        "model_type": "gemma4",
        "text_config": text,
        "tie_word_embeddings": True,
        "video_token_id": 258884,
        "_synthetic": "random weights from gemma4rt tools/make_synthetic_e2b.py; real E2B shapes and names",
    }


def plan_shards(specs, shard_bytes):
    """Greedy: tensors in order, a new shard when the next tensor would overflow (a tensor is never split)."""
    shards, cur, cur_bytes = [], [], 0
    for name, shape, kind in specs:
        nbytes = int(np.prod(shape)) * 2
        if cur and cur_bytes + nbytes > shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append((name, shape, kind))
        cur_bytes += nbytes
    if cur:
        shards.append(cur)
    return shards


def header_bytes(shard):
    header, off = {}, 0
    for name, shape, _ in shard:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    return len(raw).to_bytes(8, "little") + raw, off


def f32_to_bf16(x):
    """Round-to-nearest-even f32 -> bf16 bits (uint16)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def weight_chunk(rng, n):
    """n random bf16 weights: random sign, 7-bit mantissa and 2 low exponent bits, exponent field
    0x78..0x7B, so magnitudes in [2^-7, 2^-3) (rms ~0.05). Two in-place integer passes."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    bits &= np.uint16(0x81FF)
    bits |= np.uint16(0x3C00)
    return bits


def write_tensor(f, rng, shape, kind, progress):
    n = int(np.prod(shape))
    if kind == "scalar":
        f.write(f32_to_bf16(np.ones(n, np.float32)).tobytes())
    elif kind == "norm":
        f.write(f32_to_bf16(1.0 + 0.05 * rng.standard_normal(n, dtype=np.float32)).tobytes())
    else:
        for begin in range(0, n, CHUNK):
            m = min(CHUNK, n - begin)
            f.write(weight_chunk(rng, m).data)
            progress(2 * m)
        return
    progress(2 * n)


def tokenizer_files():
    """(tokenizer.json, tokenizer_config.json) dicts with exactly V entries (see the docstring)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import convert_golden_to_gguf as golden  # the 512-token vocabulary; stdlib-only at import

    tok = golden.tokenizer_json()
    pieces = golden.vocab_pieces()
    n_unused = sum(p.startswith("<unused") for p in pieces)
    pieces += [f"<unused{i}>" for i in range(n_unused, n_unused + V - len(pieces))]
    assert len(pieces) == V and len(set(pieces)) == V
    tok["model"]["vocab"] = {p: i for i, p in enumerate(pieces)}
    cfg = golden.tokenizer_config_json()
    cfg["model_max_length"] = 131072
    return tok, cfg


def write_tokenizer(out_dir):
    tok, cfg = tokenizer_files()
    os.makedirs(out_dir, exist_ok=True)
    for name, obj in (("tokenizer.json", tok), ("tokenizer_config.json", cfg)):
        with open(os.path.join(out_dir, name + ".tmp"), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False)
            f.write("\n")
        os.replace(os.path.join(out_dir, name + ".tmp"), os.path.join(out_dir, name))
    print(f"make_synthetic_e2b: wrote tokenizer.json ({V} tokens) and tokenizer_config.json to {out_dir}",
          file=sys.stderr)


def check(out_dir, shards):
    """List of problems (empty: DIR is a complete checkpoint as this script writes it)."""
    problems = []
    for name in ("config.json", "generation_config.json", "model.safetensors.index.json"):
        if not os.path.isfile(os.path.join(out_dir, name)):
            problems.append(f"{name} is missing")
    if problems:
        return problems
    with open(os.path.join(out_dir, "config.json")) as f:
        if json.load(f).get("text_config", {}).get("num_hidden_layers") != L:
            problems.append("config.json is not the E2B one")
    with open(os.path.join(out_dir, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        path = os.path.join(out_dir, fname)
        header, data_bytes = header_bytes(shard)
        if not os.path.isfile(path):
            problems.append(f"{fname} is missing")
            continue
        if os.path.getsize(path) != len(header) + data_bytes:
            problems.append(f"{fname} is {os.path.getsize(path)} bytes, want {len(header) + data_bytes}")
        with open(path, "rb") as f:
            if f.read(len(header)) != header:
                problems.append(f"{fname}: header differs from the plan")
        for name, _, _ in shard:
            if weight_map.get(name) != fname:
                problems.append(f"index: {name} -> {weight_map.get(name)}, want {fname}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="directory to create (must not be inside a git repository you care about)")
    ap.add_argument("--shard-gib", type=float, default=4.0, help="shard size limit in GiB (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="print the shard plan and sizes, write nothing")
    ap.add_argument("--check", action="store_true", help="validate an existing DIR (headers and sizes); exit 1 if incomplete")
    ap.add_argument("--tokenizer-only", action="store_true",
                    help="write only a minimal tokenizer.json + tokenizer_config.json (for llama.cpp's converter)")
    args = ap.parse_args()
    if args.tokenizer_only:
        write_tokenizer(args.out_dir)
        return

    specs = tensors()
    shards = plan_shards(specs, int(args.shard_gib * (1 << 30)))
    total = sum(int(np.prod(s)) * 2 for _, s, _ in specs)
    params = sum(int(np.prod(s)) for _, s, _ in specs)
    print(f"make_synthetic_e2b: {len(specs)} tensors, {params / 1e9:.3f} B parameters, {total / 1e9:.2f} GB bf16 "
          f"in {len(shards)} shards", file=sys.stderr)
    if args.check:
        problems = check(args.out_dir, shards)
        for p in problems:
            print(f"make_synthetic_e2b: {args.out_dir}: {p}", file=sys.stderr)
        if problems:
            sys.exit(1)
        print(f"make_synthetic_e2b: {args.out_dir} is complete", file=sys.stderr)
        return
    if args.dry_run:
        for k, sh in enumerate(shards):
            print(f"  shard {k + 1}: {len(sh)} tensors, {sum(int(np.prod(s)) * 2 for _, s, _ in sh) / 1e9:.2f} GB",
                  file=sys.stderr)
        return

    os.makedirs(args.out_dir, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(args.seed))
    weight_map, written, t0 = {}, [0], time.time()

    def progress(nbytes):
        written[0] += nbytes
        rate = written[0] / max(1e-9, time.time() - t0) / 1e6
        print(f"\rmake_synthetic_e2b: {written[0] / 1e9:6.2f} / {total / 1e9:.2f} GB ({rate:.0f} MB/s)",
              end="", file=sys.stderr, flush=True)

    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        path = os.path.join(args.out_dir, fname)
        header, data_bytes = header_bytes(shard)
        with open(path + ".tmp", "wb") as f:
            f.write(header)
            for name, shape, kind in shard:
                write_tensor(f, rng, shape, kind, progress)
                weight_map[name] = fname
            assert f.tell() == len(header) + data_bytes, (path, f.tell())
        os.replace(path + ".tmp", path)
    print(file=sys.stderr)
    index = {"metadata": {"total_parameters": params, "total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(args.out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config(), f, indent=2)
    with open(os.path.join(args.out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0}, f, indent=2)
    print(f"make_synthetic_e2b: wrote {args.out_dir} in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()

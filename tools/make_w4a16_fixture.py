#!/usr/bin/env python3
"""Make tiny compressed-tensors W4A16 checkpoints from golden fixtures, with reference logits.

Development-only tool. Needs torch, transformers (5.24.0 used), safetensors, numpy and the
`compressed-tensors` package (0.20.1 used; `pip install compressed-tensors`). Downloads nothing.
Run from the repository root:

    python3 tools/make_w4a16_fixture.py          # writes tests/golden/<fixture>-w4a16/

For each source fixture (tests/golden/gemma4-e2b-tiny with group size 32, gemma4-31b-tiny with
group size 64):
  * Every language-model attention/MLP projection X (q/k/v/o_proj, gate/up/down_proj, including the
    unused k/v of KV-shared layers) is quantised the way compressed-tensors' min-max observer does
    for symmetric int4 with groups of G: scale = bf16(max|w| over the group / 7.5) (computed in
    f32, then rounded to bf16, the scale dtype Google's checkpoints use), and the weight is packed
    by compressed-tensors' own PackedQuantizationCompressor.compress (q = clamp(round(w / scale),
    -8, 7), pack_to_int32). Stored: X.weight_packed I32 [out, in/8], X.weight_scale BF16
    [out, in/G], X.weight_shape I64 [2]. Everything else is copied as stored (F32).
  * config.json gains a compressed-tensors quantization_config (format pack-quantized; targets the
    attention and MLP projections by regex, ignores lm_head, the towers and the PLE projections).
  * Check: transformers' own compressed-tensors loader (from_pretrained of the written directory,
    with dtype=float32) gives the same logits; the difference is recorded in the metadata.
  * reference.safetensors: input_ids (the source fixture's), and `logits` F32 [T, V] computed by
    transformers (float32, eager) on the source model with each X.weight replaced by
    PackedQuantizationCompressor.decompress's output for the scales cast to f32 (= q * scale exactly,
    which is what transformers does when it loads such a checkpoint in float32).
    So the engine, which keeps the weights 4-bit, must reproduce these logits.
The script also checks that its own numpy quantiser gives the same int4 values as
compressed-tensors (the rule tensor/quantize.h implements for --quantize w4a16) and records the
max |logit| difference to the unquantised reference in the metadata.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden  # noqa: E402
from make_golden import load_reference, write_reference, save_safetensors_sorted  # noqa: E402

make_golden._ST_DTYPES.setdefault(torch.int32, "I32")  # weight_packed

from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationScheme, QuantizationArgs  # noqa: E402
import compressed_tensors  # noqa: E402
import transformers  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO, "tests", "golden")
LINEAR = re.compile(r"^(model\.(language_model\.)?layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj))\.weight$")
FIXTURES = [("gemma4-e2b-tiny", 32), ("gemma4-31b-tiny", 64)]


def scheme(group: int) -> QuantizationScheme:
    return QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group),
    )


def numpy_quantise(w: np.ndarray, group: int):
    g = w.reshape(w.shape[0], -1, group).astype(np.float32)
    amax = np.abs(g).max(axis=-1)
    s = torch.from_numpy(amax / np.float32(7.5)).to(torch.bfloat16)
    sf = s.float().numpy()[..., None]
    q = np.clip(np.round(g / sf), -8, 7).astype(np.int8)  # np.round: half to even
    return s, q.reshape(w.shape)


def make(src_name: str, group: int) -> None:
    src = os.path.join(GOLDEN, src_name)
    dst = os.path.join(GOLDEN, f"{src_name}-w4a16")
    os.makedirs(dst, exist_ok=True)
    with safe_open(os.path.join(src, "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    out, dequant = {}, {}
    sch = scheme(group)
    n_q = 0
    for name in sorted(tensors):
        t = tensors[name]
        m = LINEAR.match(name)
        if not m:
            out[name] = t
            continue
        x = m.group(1)
        s, q_np = numpy_quantise(t.numpy(), group)
        sd = PackedQuantizationCompressor.compress({"weight": t.float(), "weight_scale": s}, sch)
        # compressed-tensors' own int4 values must equal ours.
        from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
        q_ct = unpack_from_int32(sd["weight_packed"], 4, t.shape).numpy()
        assert np.array_equal(q_ct, q_np), f"{name}: numpy quantiser disagrees with compressed-tensors"
        # As transformers does for a float32 model: the bf16 scales cast to f32, then decompress
        # (q * scale in the scale's dtype, exact in f32).
        dq = PackedQuantizationCompressor.decompress(
            {"weight_packed": sd["weight_packed"], "weight_scale": s.float(), "weight_shape": sd["weight_shape"]}, sch)["weight"]
        assert dq.dtype == torch.float32
        dequant[name] = dq
        out[x + ".weight_packed"] = sd["weight_packed"].contiguous()
        out[x + ".weight_scale"] = s.contiguous()
        out[x + ".weight_shape"] = sd["weight_shape"].to(torch.int64)
        n_q += 1
    save_safetensors_sorted(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": [r"re:.*self_attn\.[qkvo]_proj$", r"re:.*mlp\.(gate|up|down)_proj$"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                        "group_size": group, "actorder": None, "dynamic": False, "observer": "minmax"},
            "input_activations": None, "output_activations": None, "format": "pack-quantized"}},
        "ignore": ["lm_head", "re:.*vision_tower.*", "re:.*audio_tower.*", "re:.*embed_vision.*", "re:.*embed_audio.*",
                   "re:.*per_layer_.*"],
        "sparsity_config": {},
        "kv_cache_scheme": None,
    }
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    shutil.copy(os.path.join(src, "generation_config.json"), dst)

    # Reference: transformers on the dequantised weights (f32 compute).
    ref = load_reference(os.path.join(src, "reference.safetensors"))
    ids = ref["input_ids"]
    arch = cfg["architectures"][0]
    cls = getattr(transformers, arch)
    model = cls.from_pretrained(src, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    sd = model.state_dict()
    with torch.no_grad():
        for name, w in dequant.items():
            if name in sd:
                sd[name].copy_(w)
        logits = model(input_ids=ids[None].long(), use_cache=True).logits[0].float().contiguous()
    # transformers' own compressed-tensors loader on the written directory must give the same logits.
    native = cls.from_pretrained(dst, dtype=torch.float32, attn_implementation="eager")
    native.eval()
    with torch.no_grad():
        native_logits = native(input_ids=ids[None].long(), use_cache=True).logits[0].float()
    native_diff = (native_logits - logits).abs().max().item()
    assert native_diff < 1e-3, f"transformers' compressed-tensors loader differs by {native_diff}"
    diff = (logits - ref["logits"]).abs().max().item()
    agree = (logits.argmax(-1) == ref["logits"].argmax(-1)).float().mean().item()
    write_reference(os.path.join(dst, "reference.safetensors"), {"input_ids": ids, "logits": logits}, {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "compressed_tensors_version": compressed_tensors.__version__,
        "source_fixture": src_name,
        "group_size": str(group),
        "quantized_linears": str(n_q),
        "compute": "float32, eager, use_cache=True; weights = compressed-tensors decompress with f32 scales (q * scale)",
        "max_abs_logit_diff_vs_unquantised": f"{diff:.6g}",
        "transformers_compressed_tensors_load_max_abs_diff": f"{native_diff:.6g}",
        "top1_agreement_vs_unquantised": f"{agree:.4f}",
    })
    print(f"{dst}: {n_q} linears quantised (G={group}); |logits - unquantised| max {diff:.4g}, top-1 agreement {agree:.3f}")


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    for name, group in FIXTURES:
        make(name, group)


if __name__ == "__main__":
    main()

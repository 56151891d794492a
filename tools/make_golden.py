#!/usr/bin/env python3
"""Generate tiny RANDOM Gemma 3 / Gemma 4 checkpoints and their reference outputs.

Development-only tool. It needs `torch`, `transformers` (5.24.0 was used), `safetensors` and
`numpy`; it downloads nothing. Run from the repository root:

    python3 tools/make_golden.py            # (re)writes every fixture under tests/golden/
    python3 tools/make_golden.py --only gemma3-tiny --out /tmp/golden

Each fixture directory holds what `save_pretrained` writes (config.json, generation_config.json,
model.safetensors or shards + model.safetensors.index.json) plus `reference.safetensors` with the
reference activations computed by Hugging Face transformers in float32, eager attention,
use_cache=True, for one prompt of T=40 token ids. See tests/golden/README.md.

The output is deterministic: every random draw uses an explicit torch.Generator, torch runs with a
single thread, and all writers (json, safetensors) produce ordered output.
"""

from __future__ import annotations

import argparse
import copy
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors import safe_open
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "tests", "golden")

T = 40  # prompt length (> 3x the sliding window of 8)
PROMPT_SEED = 1234
S = "sliding_attention"
F = "full_attention"

COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
    max_position_embeddings=128,
    num_attention_heads=4,
    head_dim=16,
    sliding_window=8,
)


# ---------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------


def gemma3_config() -> Gemma3TextConfig:
    return Gemma3TextConfig(
        **COMMON,
        num_hidden_layers=8,
        num_key_value_heads=2,
        # Irregular on purpose: an engine that derives the pattern (e.g. from the legacy
        # `_sliding_window_pattern: 6` that transformers still writes) instead of reading
        # `layer_types` gets layers 2/5/7 wrong.
        layer_types=[S, S, F, S, S, S, S, F],
        query_pre_attn_scalar=24,  # != head_dim 16: scale is 24^-0.5, not 16^-0.5
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        },
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
    )


def gemma4_e2b_text_kwargs() -> dict:
    return dict(
        **COMMON,
        num_hidden_layers=10,
        num_key_value_heads=1,  # MQA
        global_head_dim=32,
        layer_types=[S, S, S, S, F, S, S, S, S, F],
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=512,
        num_kv_shared_layers=4,  # layers 6..9 shared: 6,7,8 sliding (donor 5), 9 full (donor 4)
        use_double_wide_mlp=True,
        attention_k_eq_v=False,
        enable_moe_block=False,
        final_logit_softcapping=30.0,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
        },
    )


def gemma4_e2b_config() -> Gemma4Config:
    # Smallest towers that construct: only there so that the checkpoint holds tensors to skip.
    vision = dict(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
        head_dim=16, patch_size=4, position_embedding_size=16, pooling_kernel_size=2,
    )
    audio = dict(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[4, 4],
        output_proj_dims=16, conv_kernel_size=3, use_clipped_linears=True,
    )
    return Gemma4Config(text_config=gemma4_e2b_text_kwargs(), vision_config=vision, audio_config=audio)


def gemma4_31b_config() -> Gemma4TextConfig:
    return Gemma4TextConfig(
        **COMMON,
        num_hidden_layers=12,
        num_key_value_heads=2,
        num_global_key_value_heads=1,
        global_head_dim=32,
        layer_types=([S] * 5 + [F]) * 2,
        attention_k_eq_v=True,
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        enable_moe_block=False,
        final_logit_softcapping=30.0,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
        },
    )


def gemma4_26b_config() -> Gemma4TextConfig:
    kw = dict(COMMON)
    kw["intermediate_size"] = 48  # the dense ("shared") MLP next to the experts
    return Gemma4TextConfig(
        **kw,
        # 3:1 instead of the real 5:1 to keep the fixture under ~2 MB; still 2 full layers.
        num_hidden_layers=8,
        num_key_value_heads=2,
        num_global_key_value_heads=1,
        global_head_dim=32,
        layer_types=([S] * 3 + [F]) * 2,
        attention_k_eq_v=True,
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        enable_moe_block=True,
        num_experts=8,
        top_k_experts=2,
        moe_intermediate_size=24,
        final_logit_softcapping=30.0,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
        },
    )


# ---------------------------------------------------------------------------------------------
# Randomization
# ---------------------------------------------------------------------------------------------


def _normal(g, shape, std):
    return torch.randn(shape, generator=g, dtype=torch.float32) * std


def _uniform(g, shape, lo, hi):
    return torch.rand(shape, generator=g, dtype=torch.float32) * (hi - lo) + lo


def randomize_(model, family: str, seed: int, emb_std: float, ple_std: float = 0.25, router_std: float = 2.0,
               qk_norm_range=(0.25, 0.75)):
    """Overwrite every parameter and persistent buffer of `model` with deterministic random values.

    family: "gemma3" (norms are 1+w: w ~ U(-0.5, 0.5)) or "gemma4" (norms are w: w ~ U(0.5, 1.5)).
    """
    g = torch.Generator().manual_seed(seed)
    state_keys = set(model.state_dict().keys())
    params = dict(model.named_parameters())  # tied lm_head.weight is deduplicated away
    buffers = {n: b for n, b in model.named_buffers() if n in state_keys}
    touched = set()
    with torch.no_grad():
        for name, t in list(params.items()) + list(buffers.items()):
            shape = tuple(t.shape)
            tower = ".vision_tower." in f".{name}" or ".audio_tower." in f".{name}" or "embed_vision" in name or "embed_audio" in name
            leaf = name.rsplit(".", 1)[-1]
            if tower:
                # Vision/audio towers: only need to be present and finite; a text engine skips them.
                if leaf in ("input_min", "output_min"):
                    v = -_uniform(g, shape, 5.0, 10.0)
                elif leaf in ("input_max", "output_max"):
                    v = _uniform(g, shape, 5.0, 10.0)
                elif t.dim() <= 1 and leaf != "bias":
                    v = _uniform(g, shape, 0.5, 1.5)
                elif leaf == "bias":
                    v = _normal(g, shape, 0.1)
                else:
                    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
                    v = _normal(g, shape, 1.0 / max(fan_in, 1) ** 0.5)
            elif name.endswith("embed_tokens.weight"):
                v = _normal(g, shape, emb_std)
            elif name.endswith("embed_tokens_per_layer.weight"):
                v = _normal(g, shape, ple_std)
            elif leaf == "layer_scalar":
                v = _uniform(g, shape, 0.3, 1.0)
            elif name.endswith("router.scale") or name.endswith("router.per_expert_scale"):
                v = _uniform(g, shape, 0.5, 1.5)
            elif name.endswith("router.proj.weight"):
                v = _normal(g, shape, router_std)
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                v = _normal(g, shape, 1.0 / shape[-1] ** 0.5)  # [E, out, in]
            elif family == "gemma4" and (name.endswith("q_norm.weight") or name.endswith("k_norm.weight")):
                # Gemma 4 attention uses scaling 1.0: q/k norm weights in U(0.5, 1.5) make the
                # softmax nearly one-hot and the fixture chaotic (float64 vs float32 logits differ
                # by ~3e-3); U(0.25, 0.75) keeps scores O(1-2) and 1+w would still be far off.
                v = _uniform(g, shape, *qk_norm_range)
            elif "norm" in name and leaf == "weight" and t.dim() == 1:
                v = _uniform(g, shape, -0.5, 0.5) if family == "gemma3" else _uniform(g, shape, 0.5, 1.5)
            elif leaf == "weight" and t.dim() == 2:
                v = _normal(g, shape, 1.0 / shape[1] ** 0.5)  # nn.Linear [out, in]
            else:
                raise RuntimeError(f"randomize_: no rule for {name} {shape}")
            t.copy_(v)
            touched.add(name)
    # Everything the checkpoint stores must have been overwritten (lm_head.weight is tied).
    missing = sorted(k for k in state_keys if k not in touched and not k.endswith("lm_head.weight"))
    if missing:
        raise RuntimeError(f"randomize_: untouched state entries: {missing}")


def round_to_bf16_(model):
    with torch.no_grad():
        # Only what the checkpoint stores (parameters + persistent buffers such as layer_scalar).
        # Non-persistent buffers (RoPE inv_freq, ...) are recomputed in fp32 on load: leave them.
        for _, t in model.state_dict(keep_vars=True).items():
            if t.is_floating_point():
                t.data.copy_(t.data.to(torch.bfloat16).to(torch.float32))
        # The scaled word embeddings: HF multiplies by `embed_scale.to(weight.dtype)`, i.e. by
        # bf16(sqrt(H)) for a bf16 model. Make the scalar attribute agree with the rounded buffer.
        for m in model.modules():
            if hasattr(m, "scalar_embed_scale") and hasattr(m, "embed_scale"):
                m.embed_scale.copy_(m.embed_scale.to(torch.bfloat16).to(torch.float32))
                m.scalar_embed_scale = float(m.embed_scale.item())


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def text_model(model):
    inner = model.model
    return inner.language_model if hasattr(inner, "language_model") else inner


def text_config(model):
    return model.config.get_text_config()


def prompt_ids(vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(PROMPT_SEED)
    ids = torch.randint(4, vocab, (T,), generator=g, dtype=torch.int64)
    ids[0] = 2  # BOS
    return ids


def run_reference(model, ids: torch.Tensor, use_cache: bool = True) -> dict:
    """Run the model once and capture embeddings, per-layer inputs, layer outputs and logits."""
    tm = text_model(model)
    layers = tm.layers
    cap: dict = {"hidden": {}, "ple": {}}
    handles = []

    def pre_hook(idx):
        def fn(mod, args, kwargs):
            hs = args[0] if len(args) > 0 else kwargs["hidden_states"]
            if idx == 0:
                cap["embeddings"] = hs.detach().clone()
            pli = args[1] if len(args) > 1 else kwargs.get("per_layer_input")
            if pli is not None and torch.is_tensor(pli):
                cap["ple"][idx] = pli.detach().clone()
        return fn

    def post_hook(idx):
        def fn(mod, args, kwargs, out):
            hs = out[0] if isinstance(out, (tuple, list)) else out
            cap["hidden"][idx] = hs.detach().clone()
        return fn

    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(pre_hook(i), with_kwargs=True))
        handles.append(layer.register_forward_hook(post_hook(i), with_kwargs=True))

    def head_hook(mod, args, out):
        cap["precap_logits"] = out.detach().clone()

    handles.append(model.lm_head.register_forward_hook(head_hook))
    try:
        with torch.no_grad():
            out = model(input_ids=ids[None, :], use_cache=use_cache)
    finally:
        for h in handles:
            h.remove()
    cap["logits"] = out.logits.detach().clone()
    return cap


def to_tensors(ids, cap) -> dict:
    res = {"input_ids": ids.clone().contiguous()}
    res["embeddings"] = cap["embeddings"][0].float().contiguous()
    for i in sorted(cap["hidden"]):
        res[f"hidden.{i}"] = cap["hidden"][i][0].float().contiguous()
    if cap["ple"]:
        L = len(cap["hidden"])
        assert sorted(cap["ple"]) == list(range(L)), sorted(cap["ple"])
        res["ple"] = torch.stack([cap["ple"][i][0] for i in range(L)], dim=1).float().contiguous()  # [T, L, P]
    res["logits"] = cap["logits"][0].float().contiguous()
    return res


def max_diff(a: dict, b: dict) -> float:
    d = 0.0
    for k in a:
        if k == "input_ids":
            continue
        d = max(d, (a[k] - b[k]).abs().max().item())
    return d


def layer_report(model) -> list[dict]:
    """Per-layer facts read from transformers' own module attributes."""
    cfg = text_config(model)
    layers = text_model(model).layers
    store = {}
    for i, layer in enumerate(layers):
        at = getattr(layer, "self_attn")
        if getattr(at, "store_full_length_kv", False):
            store[at.layer_type] = i
    rows = []
    for i, layer in enumerate(layers):
        at = layer.self_attn
        n_kv = cfg.num_attention_heads // at.num_key_value_groups
        shared = bool(getattr(at, "is_kv_shared_layer", False))
        row = {
            "layer": i,
            "type": at.layer_type,
            "head_dim": at.head_dim,
            "num_kv_heads": n_kv,
            "scaling": at.scaling,
            "sliding_window": at.sliding_window,
            "kv_shared": shared,
            "donor": store[at.layer_type] if shared else None,
            "stores_kv_for_sharing": bool(getattr(at, "store_full_length_kv", False)),
            "has_v_proj": getattr(at, "v_proj", None) is not None,
            "k_eq_v": bool(getattr(at, "use_alternative_attention", False)),
            "mlp_intermediate": layer.mlp.intermediate_size,
            "moe": bool(getattr(layer, "enable_moe_block", False)),
        }
        rows.append(row)
    return rows


def moe_routing_report(model, ids) -> dict:
    """Top-k choices per layer/token and the smallest margin between the k-th and (k+1)-th prob."""
    cfg = text_config(model)
    if not getattr(cfg, "enable_moe_block", False):
        return {}
    k = cfg.top_k_experts
    probs = {}
    handles = []
    for i, layer in enumerate(text_model(model).layers):
        def fn(mod, args, out, i=i):
            probs[i] = out[0].detach().clone()  # router_probabilities [T, E]
        handles.append(layer.router.register_forward_hook(fn))
    with torch.no_grad():
        model(input_ids=ids[None, :], use_cache=True)
    for h in handles:
        h.remove()
    min_margin = 1.0
    distinct_sets = []
    expert_use = []
    for i in sorted(probs):
        p = probs[i]
        srt = torch.sort(p, dim=-1, descending=True).values
        min_margin = min(min_margin, (srt[:, k - 1] - srt[:, k]).min().item())
        idx = torch.topk(p, k, dim=-1).indices
        sets = {tuple(sorted(r.tolist())) for r in idx}
        distinct_sets.append(len(sets))
        expert_use.append(len(set(idx.flatten().tolist())))
    return {"min_topk_margin": min_margin, "distinct_topk_sets_per_layer": distinct_sets,
            "experts_used_per_layer": expert_use}


_ST_DTYPES = {torch.float32: "F32", torch.int64: "I64", torch.bfloat16: "BF16", torch.float16: "F16"}


def save_safetensors_sorted(tensors: dict, path: str, metadata: dict | None = None):
    """Write a .safetensors file byte-deterministically.

    safetensors' own writer serialises `__metadata__` from a hash map, so its key order (and thus
    the file bytes) changes from run to run. Here: header keys sorted, `__metadata__` first,
    tensors laid out in name order, header padded with spaces to a multiple of 8.
    """
    header = {}
    if metadata:
        header["__metadata__"] = {k: metadata[k] for k in sorted(metadata)}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for raw in blobs:
            f.write(raw)


def write_reference(path, tensors: dict, meta: dict):
    meta = {k: (v if isinstance(v, str) else json.dumps(v, sort_keys=True)) for k, v in meta.items()}
    save_safetensors_sorted(tensors, path, metadata=meta)


def load_reference(path) -> dict:
    out = {}
    with safe_open(path, "pt") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k)
    return out


def add_unused_shared_kv_tensors(model_dir: str, model, seed: int) -> list[str]:
    """Add k_proj/v_proj/k_norm for the KV-shared layers to model.safetensors.

    The released E2B/E4B checkpoints carry these tensors for the shared layers even though HF
    never uses them (transformers lists them in `_keys_to_ignore_on_load_unexpected`). This makes
    the fixture look like the real file, so an engine must skip them.
    """
    cfg = text_config(model)
    tm = text_model(model)
    prefix = "model.language_model." if hasattr(model.model, "language_model") else "model."
    path = os.path.join(model_dir, "model.safetensors")
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    g = torch.Generator().manual_seed(seed)
    added = []
    for i, layer in enumerate(tm.layers):
        at = layer.self_attn
        if not at.is_kv_shared_layer:
            continue
        n_kv = cfg.num_attention_heads // at.num_key_value_groups
        d = at.head_dim
        base = f"{prefix}layers.{i}.self_attn."
        tensors[base + "k_proj.weight"] = _normal(g, (n_kv * d, cfg.hidden_size), 1.0 / cfg.hidden_size ** 0.5)
        tensors[base + "v_proj.weight"] = _normal(g, (n_kv * d, cfg.hidden_size), 1.0 / cfg.hidden_size ** 0.5)
        tensors[base + "k_norm.weight"] = _uniform(g, (d,), 0.5, 1.5)
        added += [base + "k_proj.weight", base + "v_proj.weight", base + "k_norm.weight"]
    save_safetensors_sorted(tensors, path, metadata=meta)
    return added


def write_hub_schema_config(d: str) -> str:
    """config.hub-schema.json: config.json rewritten in the schema of Google's published files.

    transformers >= ~5.15 turns `global_head_dim` / `num_global_key_value_heads` into
    `per_layer_config` (keys zero-padded to equal width) when it builds a config, and writes only
    the latter. Google's checkpoints carry the former. Same weights, same model.
    """
    with open(os.path.join(d, "config.json")) as f:
        cj = json.load(f)
    tc = cj.get("text_config", cj)
    plc = {int(k): v for k, v in tc.pop("per_layer_config").items()}
    full = [i for i, t in enumerate(tc["layer_types"]) if t == F]
    assert sorted(plc) == full, (plc, full)
    hds = {v["head_dim"] for v in plc.values()}
    assert len(hds) == 1
    kvs = {v.get("num_key_value_heads") for v in plc.values()}
    assert len(kvs) == 1
    tc["global_head_dim"] = hds.pop()
    tc["num_global_key_value_heads"] = kvs.pop()  # None (null) when not k_eq_v, like E2B/E4B
    path = os.path.join(d, "config.hub-schema.json")
    with open(path, "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")
    return path


def build(model_cls, config, family, seed, emb_std):
    torch.manual_seed(seed)
    model = model_cls(config)
    model.set_attn_implementation("eager")
    if getattr(config.get_text_config(), "enable_moe_block", False):
        # transformers 5.24 defaults MoE experts to "grouped_mm"; the reference uses the plain
        # per-expert loop (same math, different summation order; grouped_mm is fp32-only).
        model.set_experts_implementation("eager")
    model.eval()
    randomize_(model, family, seed + 1, emb_std)
    return model


def reload(model_cls, d, dtype=torch.float32):
    kw = {}
    with open(os.path.join(d, "config.json")) as f:
        cj = json.load(f)
    if cj.get("enable_moe_block") or cj.get("text_config", {}).get("enable_moe_block"):
        kw["experts_implementation"] = "eager"
    m = model_cls.from_pretrained(d, dtype=dtype, attn_implementation="eager", **kw)
    m.eval()
    return m


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------

FIXTURES = {}


def fixture(name):
    def deco(fn):
        FIXTURES[name] = fn
        return fn
    return deco


def finish(name, out_dir, model, model_cls, description, extra_meta=None, saver=None, reload_dtype=torch.float32):
    d = os.path.join(out_dir, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    cfg = text_config(model)
    ids = prompt_ids(cfg.vocab_size)

    cap = run_reference(model, ids, use_cache=True)
    ref = to_tensors(ids, cap)
    precap = cap["precap_logits"][0]
    max_precap = precap.abs().max().item()

    # Self-consistency: logits = softcap(norm(hidden.last) @ E^T)
    tm = text_model(model)
    with torch.no_grad():
        y = tm.norm(ref[f"hidden.{cfg.num_hidden_layers - 1}"])
        lg = y @ tm.embed_tokens.weight.T
        if cfg.final_logit_softcapping is not None:
            c = cfg.final_logit_softcapping
            lg = torch.tanh(lg / c) * c
    selfcheck = (lg - ref["logits"]).abs().max().item()

    nocache = to_tensors(ids, run_reference(model, ids, use_cache=False))
    diff_nocache = max_diff(ref, nocache)
    diff_nocache_logits = (ref["logits"] - nocache["logits"]).abs().max().item()

    # Intrinsic float32 rounding sensitivity: the same model evaluated in float64.
    m64 = copy.deepcopy(model).to(torch.float64)
    r64 = to_tensors(ids, run_reference(m64, ids, use_cache=True))
    del m64
    diff_f64_logits = (r64["logits"] - ref["logits"]).abs().max().item()
    diff_f64_hidden = max((r64[k] - ref[k]).abs().max().item() / ref[k].abs().max().item()
                          for k in ref if k.startswith("hidden."))

    report = {"fixture": name, "float64_vs_reference_max_abs_diff_logits": diff_f64_logits,
              "float64_vs_reference_max_rel_diff_hidden": diff_f64_hidden, "max_abs_logit_before_softcap": max_precap, "selfcheck_logits_from_last_hidden": selfcheck,
              "use_cache_false_max_abs_diff_all": diff_nocache, "use_cache_false_max_abs_diff_logits": diff_nocache_logits}
    layers = layer_report(model)
    routing = moe_routing_report(model, ids)
    if routing:
        mg = copy.deepcopy(model)
        mg.set_experts_implementation("grouped_mm")
        rg = to_tensors(ids, run_reference(mg, ids, use_cache=True))
        del mg
        routing["grouped_mm_vs_eager_experts_max_abs_diff_logits"] = (rg["logits"] - ref["logits"]).abs().max().item()

    # Save the checkpoint.
    if saver is None:
        model.save_pretrained(d, safe_serialization=True)
    else:
        saver(model, d)
    added = []
    if extra_meta and extra_meta.pop("_add_unused_shared_kv", False):
        added = add_unused_shared_kv_tensors(d, model, seed=99)

    # Reload and check that the files alone reproduce the reference.
    re = reload(model_cls, d, reload_dtype)
    reref = to_tensors(ids, run_reference(re, ids, use_cache=True))
    diff_reload = max_diff(ref, reref)
    report["reload_max_abs_diff_all"] = diff_reload
    del re

    # Gemma 4: also write the config in the schema of Google's published checkpoints
    # (global_head_dim / num_global_key_value_heads instead of per_layer_config) and check that
    # transformers builds the same model from it.
    if text_config(model).model_type == "gemma4_text":
        hub = write_hub_schema_config(d)
        tmp = d + ".hubcheck"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for fn in os.listdir(d):
            if fn.endswith(".safetensors") and fn != "reference.safetensors" or fn.endswith(".index.json"):
                shutil.copy(os.path.join(d, fn), os.path.join(tmp, fn))
        shutil.copy(hub, os.path.join(tmp, "config.json"))
        rh = reload(model_cls, tmp, reload_dtype)
        diff_hub = max_diff(ref, to_tensors(ids, run_reference(rh, ids, use_cache=True)))
        del rh
        shutil.rmtree(tmp)
        report["hub_schema_config_max_abs_diff_all"] = diff_hub
        if diff_hub != 0.0:
            raise RuntimeError(f"{name}: config.hub-schema.json does not reproduce the reference ({diff_hub})")

    meta = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "model_class": model_cls.__name__,
        "description": description,
        "max_abs_logit_before_softcap": f"{max_precap:.6f}",
        "prompt_len": str(T),
        "prompt_seed": str(PROMPT_SEED),
        "compute": "float32, attn_implementation=eager, use_cache=True, no_grad, eval, single forward over the prompt",
        "layers": layers,
        "use_cache_false_max_abs_diff": f"{diff_nocache:.3e}",
        "reload_max_abs_diff": f"{diff_reload:.3e}",
        "float64_vs_reference_max_abs_diff_logits": f"{diff_f64_logits:.3e}",
        "float64_vs_reference_max_rel_diff_hidden": f"{diff_f64_hidden:.3e}",
    }
    if routing:
        meta["moe_routing"] = routing
    if added:
        meta["unused_tensors_added"] = added
    if extra_meta:
        meta.update(extra_meta)
    write_reference(os.path.join(d, "reference.safetensors"), ref, meta)
    for fn in os.listdir(d):
        os.chmod(os.path.join(d, fn), 0o644)
    report["layers"] = layers
    if routing:
        report["moe_routing"] = routing
    if added:
        report["unused_tensors_added"] = len(added)
    return report


@fixture("gemma3-tiny")
def make_gemma3(out_dir):
    model = build(Gemma3ForCausalLM, gemma3_config(), "gemma3", seed=300, emb_std=0.6)
    desc = ("Gemma3ForCausalLM, 8 layers, layer_types S,S,F,S,S,S,S,F (irregular), sliding_window 8, "
            "4 heads / 2 KV heads (GQA), head_dim 16, query_pre_attn_scalar 24 (scale 24^-0.5), "
            "RoPE: sliding default theta 1e4, full linear factor 8 theta 1e6; no softcaps; RMSNorm 1+w "
            "with random w in U(-0.5,0.5); tied embeddings, embed scale sqrt(64)=8.")
    return finish("gemma3-tiny", out_dir, model, Gemma3ForCausalLM, desc)


def build_e2b():
    return build(Gemma4ForConditionalGeneration, gemma4_e2b_config(), "gemma4", seed=400, emb_std=1.0)


E2B_DESC = ("Gemma4ForConditionalGeneration (text weights under model.language_model., plus tiny random "
            "vision_tower/audio_tower/embed_vision/embed_audio that a text engine must skip). E2B-like text: "
            "10 layers, sliding at 0-3,5-8, full at 4,9; window 8; 4 heads, 1 KV head (MQA); head_dim 16 "
            "sliding / 32 full (per_layer_config); PLE with hidden_size_per_layer_input 16, "
            "vocab_size_per_layer_input 512; num_kv_shared_layers 4: layers 6,7,8 (sliding) read layer 5's KV, "
            "layer 9 (full) reads layer 4's KV; use_double_wide_mlp: shared layers have intermediate 256; "
            "RoPE sliding default 1e4, full proportional 1e6 partial 0.25; final softcap 30; random layer_scalar.")


@fixture("gemma4-e2b-tiny")
def make_e2b(out_dir):
    model = build_e2b()
    desc = E2B_DESC + (" model.safetensors additionally holds UNUSED k_proj/v_proj/k_norm tensors for the "
                       "KV-shared layers 6-9 (as the released E2B/E4B files do); HF ignores them.")
    return finish("gemma4-e2b-tiny", out_dir, model, Gemma4ForConditionalGeneration, desc,
                  extra_meta={"_add_unused_shared_kv": True})


@fixture("gemma4-31b-tiny")
def make_31b(out_dir):
    model = build(Gemma4ForCausalLM, gemma4_31b_config(), "gemma4", seed=500, emb_std=1.0)
    desc = ("Gemma4ForCausalLM (prefix model.), 31B-like: 12 layers, 5:1 pattern (full at 5, 11), window 8, "
            "4 heads; sliding: 2 KV heads, head_dim 16, v_proj; full: attention_k_eq_v (no v_proj, V = raw "
            "k_proj output), 1 KV head (num_global_key_value_heads), head_dim 32; no PLE, no KV sharing; "
            "RoPE sliding default 1e4, full proportional 1e6 partial 0.25; final softcap 30; random layer_scalar.")
    return finish("gemma4-31b-tiny", out_dir, model, Gemma4ForCausalLM, desc)


@fixture("gemma4-26b-a4b-tiny")
def make_26b(out_dir):
    model = build(Gemma4ForCausalLM, gemma4_26b_config(), "gemma4", seed=690, emb_std=1.0)
    desc = ("Gemma4ForCausalLM (prefix model.), 26B-A4B-like MoE: 8 layers, 3:1 pattern (full at 3, 7), window 8, "
            "4 heads, sliding 2 KV heads / head_dim 16, full k_eq_v 1 KV head / head_dim 32; every layer has the "
            "dense MLP (intermediate 48) plus MoE (8 experts, top-2, moe_intermediate 24) with router "
            "scale/per_expert_scale random; RoPE as 31B; final softcap 30; random layer_scalar.")
    return finish("gemma4-26b-a4b-tiny", out_dir, model, Gemma4ForCausalLM, desc)


@fixture("gemma4-e2b-tiny-bf16-sharded")
def make_e2b_bf16(out_dir):
    model = build_e2b()
    round_to_bf16_(model)

    def saver(m, d):
        m16 = build_e2b()
        round_to_bf16_(m16)
        m16 = m16.to(torch.bfloat16)
        total = sum(t.numel() * t.element_size() for t in m16.state_dict().values())
        m16.save_pretrained(d, safe_serialization=True, max_shard_size=total // 2 + 16 * 1024)
        shards = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
        if len(shards) != 2 or not os.path.exists(os.path.join(d, "model.safetensors.index.json")):
            raise RuntimeError(f"expected 2 shards + index, got {shards}")

    desc = E2B_DESC + (" Same weights as gemma4-e2b-tiny rounded to bfloat16 (round-to-nearest-even), stored as BF16 "
                       "in 2 shards with model.safetensors.index.json (no extra unused tensors). The reference is "
                       "computed by HF in float32 from the bf16-rounded weights; the embed_scale buffers were "
                       "replaced by their bf16-rounded values (sqrt(64)=8 and sqrt(16)=4 are exact in bf16, so this "
                       "changes nothing here).")
    rep = finish("gemma4-e2b-tiny-bf16-sharded", out_dir, model, Gemma4ForConditionalGeneration, desc, saver=saver,
                 extra_meta={"weights_dtype": "bfloat16"})
    # Informative: a pure-bf16 HF run against the fp32 reference.
    d = os.path.join(out_dir, "gemma4-e2b-tiny-bf16-sharded")
    m16 = reload(Gemma4ForConditionalGeneration, d, torch.bfloat16)
    ids = prompt_ids(512)
    cap16 = run_reference(m16, ids, use_cache=True)
    ref = load_reference(os.path.join(d, "reference.safetensors"))
    rep["bf16_compute_vs_fp32_reference_max_abs_diff_logits"] = (cap16["logits"][0].float() - ref["logits"]).abs().max().item()
    return rep


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--only", action="append", choices=sorted(FIXTURES))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    os.makedirs(args.out, exist_ok=True)
    reports = []
    for name in args.only or list(FIXTURES):
        rep = FIXTURES[name](args.out)
        reports.append(rep)
        print(json.dumps(rep, indent=1, sort_keys=True, default=str))
        sys.stdout.flush()
    bad = [r["fixture"] for r in reports if r["reload_max_abs_diff_all"] != 0.0]
    if bad:
        print(f"ERROR: from_pretrained does not reproduce the reference for {bad}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Independent float64 NumPy forward pass over a golden fixture, checked against reference.safetensors.

Development-only. It reads nothing but the fixture's raw `config.json` and safetensors files (no
transformers), re-implements the Gemma 3 / Gemma 4 text decoder as documented in the
architecture spec, and reports the largest differences against the HF reference. It is
a cross-check of the fixtures and an executable summary of the math a C++ engine must match.

    python3 tools/golden_numpy_check.py tests/golden/gemma4-e2b-tiny [more dirs...]
    python3 tools/golden_numpy_check.py --hub-schema tests/golden/gemma4-*   # Google's config keys
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file


def load_weights(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    w = {}
    for f in files:
        w.update(load_raw(os.path.join(d, f)))
    return {k: v.astype(np.float64) for k, v in w.items()}


def load_raw(path):
    """Minimal safetensors reader (F32 and BF16; numpy has no bfloat16)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        raw = np.frombuffer(data[a:b], dtype=np.uint16 if v["dtype"] == "BF16" else np.uint8)
        if v["dtype"] == "BF16":
            arr = (raw.astype(np.uint32) << 16).view(np.float32)
        elif v["dtype"] == "F32":
            arr = np.frombuffer(data[a:b], dtype=np.float32)
        else:
            raise ValueError(v["dtype"])
        out[k] = arr.reshape(v["shape"])
    return out


def rms(x, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def rope(x, pos, inv_freq):
    # x [T, N, D]; rotate_half convention: pairs (j, j + D/2) rotated by pos * inv_freq[j]
    ang = pos[:, None] * inv_freq[None, :]  # [T, D/2]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def forward(d, config_name="config.json"):
    cfg = json.load(open(os.path.join(d, config_name)))
    tc = cfg.get("text_config", cfg)
    prefix = "model.language_model." if "text_config" in cfg else "model."
    g4 = tc["model_type"].startswith("gemma4")
    W = load_weights(d)
    ref = load_file(os.path.join(d, "reference.safetensors"))
    ids = ref["input_ids"]
    T = len(ids)
    H, L, Nq = tc["hidden_size"], tc["num_hidden_layers"], tc["num_attention_heads"]
    eps = tc["rms_norm_eps"]
    types = tc["layer_types"]
    pos = np.arange(T, dtype=np.float64)

    def norm(x, name):  # Gemma 4: x*w; Gemma 3: x*(1+w)
        w = W[name]
        return rms(x, eps) * (w if g4 else 1.0 + w)

    def lin(x, name):
        return x @ W[name].T

    def geom(i):
        t = types[i]
        hd, nkv = tc["head_dim"], tc["num_key_value_heads"]
        if g4 and t == "full_attention":
            # transformers zero-pads the keys to equal width ("05", "11"): parse them as integers
            plc = {int(k): v for k, v in (tc.get("per_layer_config") or {}).items()}.get(i)
            if plc is not None:
                hd = plc.get("head_dim", hd)
                nkv = plc.get("num_key_value_heads", nkv)
            else:  # Google's schema
                hd = tc.get("global_head_dim") or hd
                if tc.get("attention_k_eq_v") and tc.get("num_global_key_value_heads"):
                    nkv = tc["num_global_key_value_heads"]
        return hd, nkv

    def inv_freq(i, hd):
        rp = tc["rope_parameters"][types[i]]
        theta = rp["rope_theta"]
        if rp["rope_type"] == "proportional":
            n_rot = int(rp.get("partial_rotary_factor", 1.0) * hd // 2)
            f = np.zeros(hd // 2)
            f[:n_rot] = theta ** (-np.arange(0, 2 * n_rot, 2, dtype=np.float64) / hd)
            return f / rp.get("factor", 1.0)
        f = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        if rp["rope_type"] == "linear":
            f = f / rp["factor"]
        else:
            assert rp["rope_type"] == "default", rp
        return f

    # KV sharing
    n_shared = tc.get("num_kv_shared_layers", 0) if g4 else 0
    first_shared = L - n_shared
    donor = {}
    for i in range(first_shared, L):
        donor[i] = max(j for j in range(first_shared) if types[j] == types[i])

    x = W[prefix + "embed_tokens.weight"][ids] * math.sqrt(H)
    out = {"embeddings": x.copy()}
    ple = None
    P = tc.get("hidden_size_per_layer_input") or 0 if g4 else 0
    if P:
        tok = W[prefix + "embed_tokens_per_layer.weight"][ids] * math.sqrt(P)
        ctx = lin(x, prefix + "per_layer_model_projection.weight") * H ** -0.5
        ctx = norm(ctx.reshape(T, L, P), prefix + "per_layer_projection_norm.weight")
        ple = (ctx + tok.reshape(T, L, P)) * 2 ** -0.5
        out["ple"] = ple
    kv = {}
    q_idx = np.arange(T)[:, None]
    k_idx = np.arange(T)[None, :]
    for i in range(L):
        p = f"{prefix}layers.{i}."
        hd, nkv = geom(i)
        h = norm(x, p + "input_layernorm.weight")
        q = lin(h, p + "self_attn.q_proj.weight").reshape(T, Nq, hd)
        q = norm(q, p + "self_attn.q_norm.weight")
        fr = inv_freq(i, hd)
        q = rope(q, pos, fr)
        if i in donor:
            k, v = kv[donor[i]]
        else:
            kr = lin(h, p + "self_attn.k_proj.weight").reshape(T, nkv, hd)
            vname = p + "self_attn.v_proj.weight"
            vr = lin(h, vname).reshape(T, nkv, hd) if vname in W else kr  # k_eq_v: raw k
            k = rope(norm(kr, p + "self_attn.k_norm.weight"), pos, fr)
            v = rms(vr, eps) if g4 else vr
        kv[i] = (k, v)
        scale = 1.0 if g4 else tc["query_pre_attn_scalar"] ** -0.5
        mask = k_idx <= q_idx
        if types[i] == "sliding_attention":
            mask &= k_idx > q_idx - tc["sliding_window"]
        rep = Nq // nkv
        o = np.zeros((T, Nq, hd))
        for hq in range(Nq):
            s = q[:, hq, :] @ k[:, hq // rep, :].T * scale
            if not g4 and tc.get("attn_logit_softcapping"):
                c = tc["attn_logit_softcapping"]
                s = np.tanh(s / c) * c
            s = np.where(mask, s, -np.inf)
            o[:, hq, :] = softmax(s) @ v[:, hq // rep, :]
        a = lin(o.reshape(T, Nq * hd), p + "self_attn.o_proj.weight")
        x = x + norm(a, p + "post_attention_layernorm.weight")

        r = x
        hm = norm(r, p + "pre_feedforward_layernorm.weight")
        f = lin(gelu_tanh(lin(hm, p + "mlp.gate_proj.weight")) * lin(hm, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")
        if g4 and tc.get("enable_moe_block"):
            f1 = norm(f, p + "post_feedforward_layernorm_1.weight")
            z = rms(r, eps) * W[p + "router.scale"] * H ** -0.5
            probs = softmax(lin(z, p + "router.proj.weight"))
            K = tc["top_k_experts"]
            top = np.argsort(-probs, axis=-1, kind="stable")[:, :K]
            wts = np.take_along_axis(probs, top, -1)
            wts = wts / wts.sum(-1, keepdims=True) * W[p + "router.per_expert_scale"][top]
            y = norm(r, p + "pre_feedforward_layernorm_2.weight")
            gu, dn = W[p + "experts.gate_up_proj"], W[p + "experts.down_proj"]
            I = dn.shape[-1]
            f2 = np.zeros_like(r)
            for t in range(T):
                for j in range(K):
                    e = top[t, j]
                    g = gu[e] @ y[t]
                    f2[t] += wts[t, j] * (dn[e] @ (gelu_tanh(g[:I]) * g[I:]))
            f = f1 + norm(f2, p + "post_feedforward_layernorm_2.weight")
        x = r + norm(f, p + "post_feedforward_layernorm.weight")
        if P:
            g = gelu_tanh(lin(x, p + "per_layer_input_gate.weight")) * ple[:, i, :]
            x = x + norm(lin(g, p + "per_layer_projection.weight"), p + "post_per_layer_input_norm.weight")
        if g4:
            x = x * W[p + "layer_scalar"][0]
        out[f"hidden.{i}"] = x.copy()
    y = norm(x, prefix + "norm.weight")
    logits = y @ W[prefix + "embed_tokens.weight"].T
    if tc.get("final_logit_softcapping"):
        c = tc["final_logit_softcapping"]
        logits = np.tanh(logits / c) * c
    out["logits"] = logits
    return out, ref


def main():
    args = sys.argv[1:]
    config_name = "config.json"
    if args and args[0] == "--hub-schema":  # use config.hub-schema.json (Google's key names)
        config_name, args = "config.hub-schema.json", args[1:]
    ok = True
    for d in args:
        out, ref = forward(d, config_name)
        worst_rel = 0.0
        for k, v in out.items():
            r = ref[k].astype(np.float64)
            diff = np.abs(v - r).max()
            rel = diff / max(np.abs(r).max(), 1e-30)
            worst_rel = max(worst_rel, rel)
            print(f"{os.path.basename(d):32s} {k:12s} max|diff| {diff:.3e}  rel {rel:.3e}")
        top_same = (out["logits"].argmax(-1) == ref["logits"].argmax(-1)).all()
        print(f"{os.path.basename(d)}: worst rel {worst_rel:.3e}, argmax identical: {top_same}")
        ok &= bool(worst_rel < 1e-3 and top_same)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""transformers' logits for the real Gemma 3 270M GGUF (dequantised to f32 by transformers' own
GGUF loader, eager attention), along llama.cpp's greedy continuations from
tests/data/gemma3_270m_greedy.json. The reference for tests/greedy_llamacpp_test.cc: it shows
which engine a divergence from llama.cpp comes from. Dev-only: needs torch, transformers,
accelerate, gguf, and the model from scripts/fetch-default-model.sh.

Usage: python3 tools/make_hf_gguf_golden.py > tests/data/gemma3_270m_hf_logits.json
"""
import json
import os
import subprocess
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    path = subprocess.check_output(["bash", os.path.join(HERE, "..", "scripts", "fetch-default-model.sh")], text=True).strip()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32, attn_implementation="eager")
    model.eval()
    golden = json.load(open(os.path.join(HERE, "..", "tests", "data", "gemma3_270m_greedy.json")))
    cases = []
    for c in golden["cases"]:
        ids = c["prompt_ids"] + c["greedy_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        n = len(c["prompt_ids"])
        top2 = torch.topk(logits[n - 1:n - 1 + len(c["greedy_ids"])], 2, dim=-1)
        cases.append({"prompt": c["prompt"],
                      "top2_ids": top2.indices.tolist(),
                      "top2_logits": [[round(v, 5) for v in row] for row in top2.values.tolist()]})
    json.dump({"reference": f"transformers {transformers.__version__}, torch {torch.__version__}, f32, eager, "
                            "GGUF dequantised by transformers",
               "positions": "row i = prediction after prompt + greedy_ids[:i] of gemma3_270m_greedy.json",
               "cases": cases}, sys.stdout, indent=None, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()

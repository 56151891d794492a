#!/usr/bin/env python3
"""Greedy continuations of the real Gemma 3 270M Q4_K_M GGUF by llama.cpp (llama-cpp-python),
the reference for tests/greedy_llamacpp_test.cc. Dev-only: needs `pip install llama-cpp-python`
and the model from scripts/fetch-default-model.sh.

For each prompt we record llama.cpp's own tokenization (add_bos, special tokens parsed), the 64
greedy tokens, and at every step llama.cpp's top logit and the gap between its top two logits, so
that the test can measure how far the two engines' logits differ and tell a real divergence from a
near-tie.

Usage: python3 tools/make_llamacpp_golden.py [GGUF] > tests/data/gemma3_270m_greedy.json
"""
import json
import os
import subprocess
import sys

import numpy as np
import llama_cpp

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "Les mathématiques sont",
]
N = 64


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else subprocess.check_output(
        ["bash", os.path.join(os.path.dirname(__file__), "..", "scripts", "fetch-default-model.sh")], text=True).strip()
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=2, n_batch=512, logits_all=True, verbose=False)
    cases = []
    for text in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        out, gaps, tops = [], [], []
        for _ in range(N):
            lg = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            top2 = np.argsort(-lg)[:2]
            out.append(int(top2[0]))
            gaps.append(round(float(lg[top2[0]] - lg[top2[1]]), 6))
            tops.append(round(float(lg[top2[0]]), 5))
            llm.eval([out[-1]])
        cases.append({"prompt": text, "prompt_ids": ids, "greedy_ids": out, "top2_gap": gaps, "top_logit": tops,
                      "text": llm.detokenize(out).decode("utf-8", "replace")})
    json.dump({"reference": f"llama-cpp-python {llama_cpp.__version__} (vendored llama.cpp), CPU, n_threads=2",
               "model": os.path.basename(path), "cases": cases}, sys.stdout, indent=1, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()

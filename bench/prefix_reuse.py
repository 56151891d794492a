#!/usr/bin/env python3
"""Prefix reuse benchmark for `gemma4rt serve` (not a test): a multi-turn chat's last-turn time to
first token with and without reuse of the cached prefix.

One conversation of --turns turns (each user message about --user-words words; each answer the
model's greedy reply of --reply-tokens tokens, sent back as the assistant message of the next
turn) runs through /v1/chat/completions with cache_prompt true, then the same with cache_prompt
false. The last turn asks for one token: its wall time on the client is the time to first token
(queueing, prefill of the tokens not reused, one sampled token, HTTP on loopback). Each mode runs
--reps times on a fresh conversation prefix (the first user message names the repetition, so no
run reuses another's tokens); the median is printed with every turn's prompt and cached tokens
(usage.prompt_tokens_details.cached_tokens) of the first run.

  python3 bench/prefix_reuse.py [--bin build/gemma4rt] [-m MODEL] [-t THREADS] [--turns 10]
                                [--reply-tokens 32] [--user-words 60] [--reps 3]
  python3 bench/prefix_reuse.py --url http://127.0.0.1:8080     # a server already running

Standard library only. Without --url it starts `BIN serve -m MODEL --port P -t THREADS` on a free
loopback port and stops it at the end.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

WORDS = ("the river runs past an old mill where a miller keeps bread flour and tells stories of winters "
         "long ago when snow covered every road and the village waited for spring to open the mountain pass").split()


def post(url, body, timeout=600):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return out, time.perf_counter() - t0


def user_message(rep, turn, words):
    text = " ".join(WORDS[(turn * 7 + i) % len(WORDS)] for i in range(words))
    return f"Run {rep}, turn {turn + 1}: {text}"


def conversation(url, args, rep, cache_prompt):
    """Runs one conversation; returns (last turn's seconds, [(prompt_tokens, cached_tokens)] per turn)."""
    messages, turns = [], []
    for t in range(args.turns):
        messages.append({"role": "user", "content": user_message(rep, t, args.user_words)})
        last = t == args.turns - 1
        out, seconds = post(url, {"messages": messages, "max_tokens": 1 if last else args.reply_tokens,
                                  "temperature": 0, "ignore_eos": True, "cache_prompt": cache_prompt})
        usage = out["usage"]
        turns.append((usage["prompt_tokens"], usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)))
        messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
    return seconds, turns


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args):
    port = free_port()
    cmd = [args.bin, "serve", "--port", str(port), "--parallel", "1"]
    if args.model:
        cmd += ["-m", args.model]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{' '.join(cmd)} exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        time.sleep(0.5)
    proc.terminate()
    sys.exit("the server did not answer /health within 300 s")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (else one is started)")
    p.add_argument("--bin", default=os.environ.get("GEMMA4RT_BIN", "build/gemma4rt"))
    p.add_argument("-m", "--model", help="model for the started server (default: its default model)")
    p.add_argument("-t", "--threads", type=int, default=0)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--reply-tokens", type=int, default=32)
    p.add_argument("--user-words", type=int, default=60)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    proc, url = (None, args.url) if args.url else start_server(args)
    try:
        results = {}
        for cache_prompt in (True, False):
            times, first = [], None
            for rep in range(args.reps):
                seconds, turns = conversation(url, args, f"{rep}-{cache_prompt}", cache_prompt)
                times.append(seconds)
                first = first or turns
            results[cache_prompt] = (statistics.median(times), times, first)
    finally:
        if proc:
            proc.terminate()
            proc.wait()
    print(f"{args.turns}-turn chat, replies of {args.reply_tokens} tokens, user messages of ~{args.user_words} words, "
          f"{args.reps} runs per mode")
    for cache_prompt, (median, times, turns) in results.items():
        label = "with reuse   " if cache_prompt else "without reuse"
        print(f"  {label}: last-turn time to first token {median * 1000:.0f} ms (median; runs: "
              f"{', '.join(f'{t * 1000:.0f}' for t in times)} ms); last prompt {turns[-1][0]} tokens, "
              f"{turns[-1][1]} reused")
        print(f"    (prompt, cached) per turn: {' '.join(f'({a},{b})' for a, b in turns)}")
    with_reuse, without = results[True][0], results[False][0]
    print(f"  speed-up of the last turn's first token: {without / with_reuse:.1f}x")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Load benchmark for `gemma4rt serve` (not a test): N concurrent streaming clients on loopback.

Phase 1 measures one stream alone; phase 2 runs --concurrency clients that together send
--requests streaming completions (ignore_eos, so each generates exactly --max-tokens tokens). It
prints aggregate tokens/s, per-stream tokens/s and time to first token against the single-stream
figure, the error count (must be 0; exit status 1 otherwise) and the server's resident memory
(VmRSS from /proc/PID/status) before, at peak and after. Bounded: --timeout seconds overall.

  python bench/load.py --url http://127.0.0.1:8080 --pid SERVER_PID [--api-key KEY]
                       [--concurrency 32] [--requests 64] [--max-tokens 16] [--prompt-file F]
--prompt-file F: every other request of phase 2 sends 5000 characters of F (starting 50 x i
characters in, so the prompts differ) instead of a short prompt: long prefills mixed with decodes.
The server's peak is reported twice: sampled VmRSS (every 0.25 s) and VmHWM (the kernel's exact
high-water mark since the server started).
Needs httpx (scripts/bench-load.sh sets up a venv and a server).
"""

import argparse
import asyncio
import json
import statistics
import sys
import time

import httpx

PROMPTS = [
    "The history of the printing press begins",
    "Here is a short poem about the sea:",
    "def quicksort(items):",
    "The three most important things about cooking rice are",
    "Once upon a time, in a village by the mountains,",
    "A recipe for pancakes: first,",
    "The capital of Japan is",
    "Photosynthesis is the process by which",
]


def rss_kib(pid, field="VmRSS"):
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


async def one_stream(client, args, model, i):
    """One streaming completion. Returns dict(tokens, ttft, decode_tps, seconds) or raises."""
    body = {
        "model": model,
        "prompt": PROMPTS[i % len(PROMPTS)] if not (args.long_text and i >= 1000 and i % 2 == 0)
        else args.long_text[(50 * i) % max(1, len(args.long_text) - 5000):][:5000],
        "max_tokens": args.max_tokens,
        "temperature": 0.7,
        "seed": i,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = last = None
    usage = None
    done = False
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line:
                continue
            if not line.startswith("data: "):
                raise RuntimeError(f"not an SSE data line: {line[:80]!r}")
            data = line[6:]
            if data == "[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"error event: {chunk['error']}")
            now = time.perf_counter()
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                first = first or now
                last = now
            if chunk.get("usage"):
                usage = chunk["usage"]
    if not done or usage is None:
        raise RuntimeError("stream ended without usage and [DONE]")
    n = usage["completion_tokens"]
    t_end = time.perf_counter()
    decode = (n - 1) / (last - first) if first and last and last > first and n > 1 else 0.0
    return {"tokens": n, "ttft": (first or t_end) - t0, "decode_tps": decode, "seconds": t_end - t0}


async def run(args):
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency + 4)
    timeout = httpx.Timeout(args.timeout, connect=10)
    async with httpx.AsyncClient(base_url=args.url, headers=headers, limits=limits, timeout=timeout) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        rss_before = rss_kib(args.pid)

        # Phase 1: one stream alone (after one warm-up request).
        await one_stream(client, args, model, 0)
        single = [await one_stream(client, args, model, i) for i in range(2)]
        single_tps = statistics.mean(s["decode_tps"] for s in single)
        single_ttft = statistics.mean(s["ttft"] for s in single)

        # Phase 2: N clients, R requests in all.
        results, errors = [], []
        next_i = 0
        peak = rss_before or 0
        stop_sampling = asyncio.Event()

        async def sample_rss():
            nonlocal peak
            while not stop_sampling.is_set():
                v = rss_kib(args.pid)
                if v:
                    peak = max(peak, v)
                await asyncio.sleep(0.25)

        async def worker():
            nonlocal next_i
            while next_i < args.requests:
                i = next_i
                next_i += 1
                try:
                    results.append(await one_stream(client, args, model, 1000 + i))
                except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                    errors.append(f"request {i}: {type(e).__name__}: {e}")

        sampler = asyncio.create_task(sample_rss())
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(args.concurrency))), args.timeout)
        except asyncio.TimeoutError:
            errors.append(f"timed out after {args.timeout} s with {len(results)} of {args.requests} requests done")
        wall = time.perf_counter() - t0
        stop_sampling.set()
        await sampler
        await asyncio.sleep(0.5)
        rss_after = rss_kib(args.pid)

    total_tokens = sum(r["tokens"] for r in results)
    per_stream = [r["decode_tps"] for r in results if r["decode_tps"] > 0]
    ttfts = sorted(r["ttft"] for r in results)
    print(f"server {args.url}  model {model}")
    print(f"single stream: {single_tps:.2f} tokens/s decode, time to first token {single_ttft * 1000:.0f} ms")
    print(f"load: {args.concurrency} concurrent streaming clients, {len(results)}/{args.requests} requests of "
          f"{args.max_tokens} tokens in {wall:.1f} s")
    print(f"  aggregate: {total_tokens / wall:.2f} tokens/s ({total_tokens / wall / single_tps:.2f}x single stream)"
          if single_tps else f"  aggregate: {total_tokens / wall:.2f} tokens/s")
    if per_stream:
        print(f"  per stream: mean {statistics.mean(per_stream):.2f} tokens/s, min {min(per_stream):.2f}, "
              f"max {max(per_stream):.2f} (single alone: {single_tps:.2f})")
    if ttfts:
        print(f"  time to first token: p50 {ttfts[len(ttfts) // 2] * 1000:.0f} ms, "
              f"p90 {ttfts[int(len(ttfts) * 0.9)] * 1000:.0f} ms, max {ttfts[-1] * 1000:.0f} ms")
    print(f"  errors: {len(errors)}")
    for e in errors[:10]:
        print(f"    {e}")
    if rss_before:
        print(f"server VmRSS: before {rss_before / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB, "
              f"after {rss_after / 1024:.1f} MiB (delta {(rss_after - rss_before) / 1024:+.1f} MiB); "
              f"VmHWM {(rss_kib(args.pid, 'VmHWM') or 0) / 1024:.1f} MiB")
    return 0 if not errors and len(results) == args.requests else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--api-key", default="")
    p.add_argument("--pid", type=int, default=0, help="server process id, for VmRSS")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--timeout", type=float, default=900, help="seconds for the whole load phase")
    p.add_argument("--prompt-file", default="", help="long prompts for every other request (see above)")
    args = p.parse_args()
    args.long_text = ""
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            args.long_text = f.read()
        if not args.long_text:
            sys.exit(f"load.py: {args.prompt_file} is empty")
    if not args.url.startswith(("http://127.", "http://localhost", "http://[::1]")):
        sys.exit("load.py: loopback URLs only")
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()

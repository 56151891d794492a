// `gemma4rt bench`: llama-bench-style throughput measurement with the Engine directly.
//
//   gemma4rt bench [-m MODEL] [-t THREADS] [-p 512] [-n 128] [-d 0,1024,4096] [-r 3] [-ub 512] [--json]
//
// pp<P>: P random tokens prefilled in one Prefill call (chunked by -ub) after `depth` tokens are
// already in the KV cache, tokens/s. tg<N>: N single-token Decode steps after `depth` tokens,
// tokens/s. Each figure is the median of -r repetitions (after one warm-up). Also reported: peak
// resident memory (VmHWM, without the bandwidth tests' buffers: the process's peak counter is reset
// around them, which outside tools such as `/usr/bin/time -v` then see too), the machine's memory bandwidth
// measured in the same process (a multi-threaded memcpy, GB/s counting bytes read + written, and
// a read-only test; --bw-mib buffers, best of --bw-iterations passes) right after each tg
// repetition, and decode's fraction of the bandwidth limit, (weight bytes read per token + KV
// bytes read per token) / time per token / bandwidth, per repetition against the bandwidth
// measured after it, median. -p, -n and -d take comma-separated lists.
//
// --quantize q8_0|q4_0|w4a16 [--ple-bits 8|16] benchmarks the model quantised at load. --quality
// (with --quantize) first runs a fixed English text (or, when the model has no tokenizer, fixed
// pseudo-random token ids after BOS; at most --quality-tokens) through the model as stored and the
// quantised one, one all-logits prefill each, and reports the mean (and max) KL divergence
// KL(as stored || quantised) of the next-token distributions per position in nats, the fraction of
// positions whose top-1 token agrees, and both perplexities of the text's next tokens; also as
// "quality" in --json. With -p 0 -n 0 only the quality figures are produced.
#pragma once

namespace g4::cli {

// argv holds the arguments after "bench" (argv[0] is the first of them). Returns the exit code.
int BenchMain(int argc, char** argv);

}  // namespace g4::cli

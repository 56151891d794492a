// `gemma4rt bench`: see bench.h. Flag names follow llama-bench (-m -t -p -n -d -r -ub -o).
#include "backends/backend_flags.h"
#include "backends/cpu/kernels.h"
#include "cli/bench.h"
#include "cli/bench_internal.h"
#include "cli/bench_quality.h"
#include "cli/parse_error.h"
#include "cli/progress.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.h"
#include "base/thread_pool.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/kv_cache.h"
#include "tokenizer/tokenizer.h"

namespace g4::cli {

using namespace bench_internal;

namespace bench_internal {

int Fail(const Status& s) {
  std::fprintf(stderr, "gemma4rt: error: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace bench_internal

namespace {

// Every bound weight tensor once (the tied LM head is the embedding).
std::vector<const Tensor*> BoundTensors(const ModelWeights& w) {
  std::vector<const Tensor*> out;
  std::set<const Tensor*> seen;
  auto add = [&](const Tensor* t) {
    if (t && seen.insert(t).second) out.push_back(t);
  };
  for (const Tensor* t : {w.embed, w.lm_head, w.final_norm, w.ple_embed, w.ple_model_proj, w.ple_proj_norm}) add(t);
  for (const LayerWeights& l : w.layers)
    for (const Tensor* t : {l.input_norm, l.q_proj, l.k_proj, l.v_proj, l.q_norm, l.k_norm, l.o_proj, l.post_attn_norm,
                            l.pre_ffn_norm, l.gate_proj, l.up_proj, l.down_proj, l.post_ffn_norm, l.ple_gate, l.ple_proj,
                            l.ple_post_norm, l.router_proj, l.router_scale, l.per_expert_scale, l.experts_gate_up,
                            l.experts_down, l.pre_ffn_norm_2, l.post_ffn_norm_1, l.post_ffn_norm_2})
      add(t);
  return out;
}

// Weight bytes one decoded token reads: ModelWeights::total_bytes (tied head counted once), less
// the rows of lookup tables that are not read (an untied embedding table and the PLE table are
// read one row per token) and the experts not routed to (MoE reads top_k of num_experts).
size_t WeightBytesPerToken(const LoadedModel& m) {
  const ModelWeights& w = m.weights;
  const ModelConfig& c = m.config;
  double bytes = static_cast<double>(w.total_bytes);
  auto one_row_only = [&](const Tensor* t) {
    if (!t || t->shape.empty() || t->shape[0] <= 0) return;
    bytes -= static_cast<double>(t->nbytes) - static_cast<double>(t->nbytes) / t->shape[0];
  };
  if (w.embed && w.lm_head && w.embed != w.lm_head) one_row_only(w.embed);
  one_row_only(w.ple_embed);
  if (c.num_experts > 0 && c.top_k_experts > 0) {
    const double unused = 1.0 - static_cast<double>(c.top_k_experts) / c.num_experts;
    for (const LayerWeights& l : w.layers)
      for (const Tensor* t : {l.experts_gate_up, l.experts_down})
        if (t) bytes -= unused * static_cast<double>(t->nbytes);
  }
  return static_cast<size_t>(std::max(0.0, bytes));
}

// KV bytes one decode step reads when the sequence holds `context` positions after the step:
// every layer (KV-shared ones read their donor's cache) reads K and V (rows of KvHeadRowBytes: 4
// bytes an element f32, 2 f16 and bf16, 1 q8 plus its scale) of the positions it attends to.
size_t KvBytesRead(const ModelConfig& c, int64_t context, DType type) {
  size_t b = 0;
  for (const LayerPlan& lp : c.layers) {
    const int64_t n = lp.window ? std::min<int64_t>(lp.window, context) : context;
    b += 2 * static_cast<size_t>(n) * lp.num_kv_heads * KvHeadRowBytes(type, lp.head_dim);
  }
  return b;
}

}  // namespace

int BenchMain(int argc, char** argv) {

  CLI::App app{"gemma4rt bench: prompt-processing (pp) and generation (tg) throughput, llama-bench style"};
  std::string model = DefaultModelPath(), output = "md";
  int threads = 0;
  std::vector<int> n_prompt{512}, n_gen{128}, depths{0};
  int reps = 3, bw_mib = 1024, bw_iters = 5;
  std::vector<int> ubatches{512};
  uint64_t seed = 1234;
  bool json_flag = false, no_warmup = false, quality = false, f32_activations = false;
  std::string quantize;
  std::vector<std::string> cache_types{kDefaultCacheType};
  int ple_bits = 8, quality_tokens = 256;
  app.add_option("--quantize", quantize, "quantise an F32/F16/BF16 checkpoint at load: q8_0, q4_0 or w4a16")
      ->check(CLI::IsMember({"q8_0", "q4_0", "w4a16"}));
  bool mmap = false;
  app.add_flag("--mmap,!--no-mmap", mmap, kMmapFlagHelp);
  bool no_repack = false;
  app.add_flag("--no-repack", no_repack, kNoRepackFlagHelp);
  BackendOptions backend_choice;
  AddBackendFlags(&app, &backend_choice);
  app.add_option("--ple-bits", ple_bits, "with --quantize: bits of the embedding and PLE tables (8 = Q8_0, 16 = as stored)")
      ->check(CLI::IsMember({8, 16}));
  app.add_flag("--quality", quality, "compare the model as run (--quantize, int8 activations) with the model as stored "
               "in f32 activations on a fixed text: mean KL divergence, top-1 agreement, both perplexities");
  app.add_flag("--f32-activations", f32_activations, "multiply quantised and BF16 weights with f32 activations (transformers' "
               "arithmetic; slower) instead of int8 or bf16 ones");
  app.add_option("--quality-tokens", quality_tokens, "most tokens of the quality text")->check(CLI::Range(2, 1 << 16));
  std::vector<std::string> quality_cache;
  app.add_option("--quality-cache", quality_cache, "compare KV cache types (comma-separated, e.g. f16,bf16,q8) with an "
                 "f32 cache on --quality's text; runs alone (no pp/tg tests)")
      ->delimiter(',')->check(CLI::IsMember(kCacheTypeNames));
  app.add_option("-m,--model", model, "GGUF file or Hugging Face checkpoint directory (default: $GEMMA4RT_MODEL or the fetched Gemma 3 270M)");
  // llama-bench's -t takes a comma-separated list too, and so do its -ctk/-ctv: RunSweep.
  std::vector<int> thread_list;
  app.add_option("-t,--threads", thread_list, "CPU threads (0 = all cores, the default); a comma-separated list runs "
                 "the whole bench once per count, each in its own process (--json: an array of their objects)")
      ->delimiter(',')->check(CLI::Range(0, 1024));
  app.add_option("--cache-type", cache_types, std::string(kCacheTypeHelp) + "; a comma-separated list runs the whole "
                 "bench once per type, as -t lists do")
      ->delimiter(',')->check(CLI::IsMember(kCacheTypeNames));
  app.add_option("-p,--n-prompt", n_prompt, "prompt tokens per pp test, comma-separated list (0 = no pp test)")
      ->delimiter(',')->check(CLI::Range(0, 1 << 20));
  app.add_option("-n,--n-gen", n_gen, "generated tokens per tg test, comma-separated list (0 = no tg test)")
      ->delimiter(',')->check(CLI::Range(0, 1 << 20));
  app.add_option("-d,--depth,--n-depth", depths, "tokens already in the KV cache before measuring, comma-separated list "
                 "(clamped to the model's context)")->delimiter(',')->check(CLI::Range(0, 1 << 24));
  std::vector<int> batches{1};
  app.add_option("--decode-batch", batches, "sequences decoded together in each tg test (batched decode steps), "
                 "comma-separated list; tokens/s counts every sequence's tokens")
      ->delimiter(',')->check(CLI::Range(1, 4096));
  app.add_option("-r,--repetitions", reps, "repetitions of each test; the median is reported")->check(CLI::Range(1, 1000));
  app.add_option("--ubatch-size", ubatches, "prefill chunk in tokens (Engine prefill_chunk; -ub works too); a "
                 "comma-separated list runs the whole bench once per size, each in its own process")
      ->delimiter(',')->check(CLI::Range(1, 1 << 20));
  app.add_option("-o,--output", output, "output format: md (table) or json")->check(CLI::IsMember({"md", "json"}));
  app.add_flag("--json", json_flag, "same as -o json: one JSON object on stdout");
  app.add_option("--seed", seed, "seed of the random token ids");
  app.add_flag("--no-warmup", no_warmup, "skip the warm-up run");
  bool profile = false;
  app.add_flag("--profile", profile, "time every op and print after each test, on stderr, where its time went per op "
               "kind and step size");
  app.add_option("--bw-mib", bw_mib, "buffer size in MiB of the memory-bandwidth tests (copy and read) run after each tg "
                 "repetition (0 = skip)")->check(CLI::Range(0, 1 << 20));
  app.add_option("--bw-iterations", bw_iters, "passes of each bandwidth test (the best is kept)")->check(CLI::Range(1, 100));
  // llama-bench's two-letter short options are not CLI11 short options: rename them (-ub, and
  // -ctk/-ctv with llama.cpp's other cache-type spellings), leaving option values as given.
  std::vector<std::string> args{"gemma4rt bench"};
  args.insert(args.end(), argv, argv + argc);
  auto rewritten = RewriteLlamaSpellings(app, args, "-ub", "--ubatch-size", /*cache_type_lists=*/true);
  if (!rewritten.ok()) return FailUsage(rewritten.status());
  if (Status st = CheckLlamaBenchOnlyFlags(app, *rewritten); !st.ok()) return FailUsage(st);
  std::vector<char*> cargv;
  for (std::string& a : *rewritten) cargv.push_back(a.data());
  try {
    app.parse(static_cast<int>(cargv.size()), cargv.data());
  } catch (const CLI::ParseError& e) {
    return ExitOnParseError(app, e);
  }
  if (thread_list.size() > 1 || cache_types.size() > 1 || ubatches.size() > 1) {
    if (std::getenv(kSweepChildEnv) != nullptr)
      return Fail(Internal("a bench child of a -t, cache-type or -ub list asked for another list; refusing to fork again"));
    if (thread_list.empty()) thread_list.push_back(0);
    return RunSweep(app, *rewritten, thread_list, cache_types, ubatches, json_flag || output == "json");
  }
  const int ubatch = ubatches.empty() ? 512 : ubatches[0];
  if (!thread_list.empty()) threads = thread_list[0];
  const std::string cache_type = cache_types.empty() ? kDefaultCacheType : cache_types[0];
  threads = ResolveThreadCount(threads);
  const bool json = json_flag || output == "json";
  // The bandwidth tests run right after each tg repetition, so that each repetition's fraction is
  // taken against the bandwidth of the same moment (a VM's can move from minute to minute), when
  // their buffers can be left out of the peak RSS: VmHWM is read before each test
  // and reset after it. Where the reset is refused, they run once, after the tests.
  const size_t bw_bytes = static_cast<size_t>(bw_mib) << 20;
  if (const size_t avail = MemAvailableBytes(); bw_bytes > 0 && avail > 0 && 2 * bw_bytes > avail) {
    return Fail(InvalidArgument("--bw-mib " + std::to_string(bw_mib) + " needs two buffers of " + std::to_string(bw_mib) +
                                " MiB, more than the " + std::to_string(avail >> 20) +
                                " MiB of memory available (MemAvailable); 1024, the default, or 0 to skip"));
  }
  if (bw_mib > 0 && bw_mib < 256) {
    std::fprintf(stderr, "gemma4rt: note: --bw-mib %d: buffers this small are partly served from the caches, so the "
                 "bandwidth figures overstate memory's (256 or more measure memory)\n", bw_mib);
  }
  const bool bw_each_rep = bw_bytes > 0 && ResetPeakRss();
  size_t peak_rss_seen = 0;  // the largest VmHWM read before a reset

  auto dedupe = [](std::vector<int>& v) {
    std::vector<int> out;
    for (int x : v)
      if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
    v = out;
  };
  n_prompt.erase(std::remove(n_prompt.begin(), n_prompt.end(), 0), n_prompt.end());
  n_gen.erase(std::remove(n_gen.begin(), n_gen.end(), 0), n_gen.end());
  dedupe(n_prompt);
  dedupe(n_gen);
  if (n_prompt.empty() && n_gen.empty() && !quality && quality_cache.empty())
    return FailUsage(InvalidArgument("nothing to measure: -p and -n are both 0"));
  LoadOptions load_options;
  load_options.ple_bits = ple_bits;
  load_options.mmap = mmap;
  load_options.copy_progress = TerminalCopyProgress("gemma4rt");
  if (auto q = ParseQuantizeFlag(quantize); q.ok()) load_options.quantize = *q;
  else return FailUsage(q.status());
  backend_choice.f32_activations = f32_activations;
  load_options.pack_q4_0 = PackQ4_0For(backend_choice, no_repack);
  if (quality && !load_options.quantize && f32_activations)
    return FailUsage(InvalidArgument("--quality compares with the model as stored in f32 activations: give --quantize "
                                     "q8_0|q4_0|w4a16, or leave out --f32-activations to measure int8 activations alone"));
  if (quantize.empty()) quantize = f32_activations ? "none" : "none+int8-activations";

  if (!std::filesystem::exists(model))
    return Fail(NotFound("model '" + model + "' does not exist" +
                         (model == DefaultModelFile() ? " (run scripts/fetch-default-model.sh to get the default model)" : "")));
  if (!quality_cache.empty()) {
    std::vector<DType> types;
    for (const std::string& t : quality_cache) {
      auto type = ParseCacheType(t);
      if (!type.ok()) return Fail(type.status());
      types.push_back(*type);
    }
    auto results = MeasureCacheQuality(model, threads, ubatch, quality_tokens, types);
    if (!results.ok()) return Fail(results.status());
    nlohmann::json arr = nlohmann::json::array();
    for (size_t i = 0; i < types.size(); ++i) {
      const QualityResult& q = (*results)[i];
      if (json) {
        arr.push_back({{"cache_type", quality_cache[i]}, {"reference", "f32"}, {"positions", q.tokens},
                       {"tokens", q.token_source}, {"mean_kl", q.mean_kl}, {"max_kl", q.max_kl},
                       {"top1_agreement", q.top1_agreement}, {"perplexity_reference", q.ppl_ref},
                       {"perplexity_cache", q.ppl_quant}});
      } else {
        std::printf("cache quality (%s vs f32 cache, model as stored, f32 activations; %d positions of the fixed %s): "
                    "mean KL %.6g nats/token (max %.4g), top-1 agreement %.2f%%, perplexity %.4f -> %.4f\n",
                    quality_cache[i].c_str(), q.tokens, q.token_source == "text" ? "text" : "token ids", q.mean_kl,
                    q.max_kl, 100 * q.top1_agreement, q.ppl_ref, q.ppl_quant);
      }
    }
    if (json) std::printf("%s\n", nlohmann::json{{"model", model}, {"cache_quality", arr}}.dump(1).c_str());
    return 0;
  }
  std::optional<QualityResult> quality_result;
  // What the compared side is: the model quantised at load, or (no --quantize) only its activations.
  const char* quality_label = load_options.quantize ? "quantised" : "with int8 activations";
  if (quality) {
    auto qr = MeasureQuality(model, load_options, threads, ubatch, quality_tokens, f32_activations);
    if (!qr.ok()) return Fail(qr.status());
    quality_result = *qr;
    std::fprintf(stderr, "gemma4rt: bench quality (%s, %d positions of %s): mean KL %.6g nats, top-1 agreement %.4f, "
                 "perplexity %.4f as stored, %.4f %s\n", quantize.c_str(), qr->tokens, qr->token_source.c_str(),
                 qr->mean_kl, qr->top1_agreement, qr->ppl_ref, qr->ppl_quant, quality_label);
  }
  auto print_quality = [&] {
    if (!quality_result || json) return;
    const QualityResult& q = *quality_result;
    const std::string ple = quantize.rfind("none", 0) == 0 ? "" : ", ple-bits " + std::to_string(ple_bits);
    std::printf("quality (%s%s, vs as stored; %d positions of the fixed %s): mean KL %.6g nats/token (max %.4g), "
                "top-1 agreement %.2f%%, perplexity %.4f as stored -> %.4f %s\n",
                quantize.c_str(), ple.c_str(), q.tokens, q.token_source == "text" ? "text" : "token ids", q.mean_kl, q.max_kl,
                100 * q.top1_agreement, q.ppl_ref, q.ppl_quant, quality_label);
  };
  auto quality_json = [&]() -> nlohmann::json {
    if (!quality_result) return nullptr;
    const QualityResult& q = *quality_result;
    return {{"quantize", quantize}, {"ple_bits", ple_bits}, {"positions", q.tokens}, {"tokens", q.token_source},
            {"mean_kl", q.mean_kl}, {"max_kl", q.max_kl}, {"top1_agreement", q.top1_agreement},
            {"perplexity_reference", q.ppl_ref}, {"perplexity_quantized", q.ppl_quant}};
  };
  if (n_prompt.empty() && n_gen.empty()) {  // --quality only
    if (json) {
      nlohmann::json out;
      out["model"] = model;
      out["quality"] = quality_json();
      std::printf("%s\n", out.dump(1).c_str());
    } else {
      print_quality();
    }
    return 0;
  }
  auto loaded_or = LoadModel(model, load_options);
  if (!loaded_or.ok()) return Fail(loaded_or.status());
  std::unique_ptr<LoadedModel> loaded = std::move(loaded_or).value();
  const ModelConfig config = loaded->config;
  const auto kv_type_or = ParseCacheType(cache_type);
  if (!kv_type_or.ok()) return Fail(kv_type_or.status());
  const DType kv_type = *kv_type_or;

  // Context: the deepest test plus its longest run, within the model's positions.
  const int longest = std::max(n_prompt.empty() ? 0 : *std::max_element(n_prompt.begin(), n_prompt.end()),
                               n_gen.empty() ? 0 : *std::max_element(n_gen.begin(), n_gen.end()));
  if (longest > config.max_position)
    return Fail(InvalidArgument("a test of " + std::to_string(longest) + " tokens exceeds the model's context (" +
                                std::to_string(config.max_position) + " positions)"));
  std::vector<std::string> clamp_notes;
  const int depth_limit = config.max_position - longest;
  for (int& d : depths) {
    if (d > depth_limit) {
      clamp_notes.push_back("depth " + std::to_string(d) + " clamped to " + std::to_string(depth_limit) +
                            " (model context " + std::to_string(config.max_position) + ")");
      d = depth_limit;
    }
  }
  dedupe(depths);
  const int max_depth = *std::max_element(depths.begin(), depths.end());
  const int context = max_depth + longest;

  const std::string weights_dtype = WeightsDescription(*loaded);
  backend_choice.threads = threads;
  backend_choice.profile = profile;
  auto backend = MakeBackend(backend_choice);
  if (!backend.ok()) return Fail(backend.status());
  char policy[1024];
  std::snprintf(policy, sizeof policy, "%s weights=%s memory=%s kv=%s threads=%d context=%d",
                DevicePolicyFields(**backend, backend_choice).c_str(), weights_dtype.c_str(), WeightsMemory(*loaded),
                cache_type.c_str(), threads, context);
  std::fprintf(stderr, "gemma4rt: device policy: %s\n", policy);
  for (const std::string& n : clamp_notes) std::fprintf(stderr, "gemma4rt: bench: %s\n", n.c_str());

  // Model description, like llama-bench's "gemma3 270M Q4_K".
  const std::vector<const Tensor*> tensors = BoundTensors(loaded->weights);
  double n_params = 0;
  std::map<std::string, size_t> bytes_by_dtype;
  for (const Tensor* t : tensors) {
    n_params += static_cast<double>(t->numel());
    bytes_by_dtype[std::string(DTypeName(t->dtype))] += t->nbytes;
  }
  std::string main_dtype =
      std::max_element(bytes_by_dtype.begin(), bytes_by_dtype.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  if (loaded->gguf) main_dtype = GgufFileTypeName(loaded->gguf->GetInt("general.file_type", -1), main_dtype);
  char desc[128];
  std::snprintf(desc, sizeof desc, "%s %.0fM %s", config.family == ModelFamily::kGemma4 ? "gemma4" : "gemma3", n_params / 1e6,
                main_dtype.c_str());
  const size_t size_bytes = loaded->weights.total_bytes;
  const size_t weight_read = WeightBytesPerToken(*loaded);

  // Mapped weights (--mmap): read every page once so that no test pays for the first touch, with
  // progress on a terminal (no \r lines in logs); copied weights are in memory already.
  int last_pct = -1;
  const bool show_progress = size_bytes > (size_t{128} << 20) && !loaded->weights_copied && isatty(STDERR_FILENO);
  PrefaultWeights(*loaded, [&](double f) {
    const int pct = static_cast<int>(f * 100);
    if (!show_progress || pct == last_pct) return;
    last_pct = pct;
    std::fprintf(stderr, "\rgemma4rt: loading weights %3d%% of %.1f MiB", pct, size_bytes / 1048576.0);
    if (pct == 100) std::fprintf(stderr, "\n");
  });

  dedupe(batches);
  EngineOptions opts;
  opts.max_seqs = *std::max_element(batches.begin(), batches.end());
  opts.max_context = context;
  opts.prefill_chunk = ubatch;
  opts.kv_type = kv_type;
  auto engine_or = Engine::Create(std::move(loaded), std::move(*backend), opts);
  if (!engine_or.ok()) return Fail(engine_or.status());
  Engine& engine = **engine_or;

  const int vocab_limit = config.ple_dim > 0 ? std::min(config.vocab, config.ple_vocab) : config.vocab;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab_limit - 1);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = dist(rng);
    return t;
  };
  std::vector<float> logits;
  const int32_t seq = 0;
  auto fill = [&](int depth, int batch = 1) -> Status {  // sequences 0 .. batch-1
    for (int s = 0; s < batch; ++s) {
      engine.ResetSequence(s);
      if (depth == 0) continue;
      const std::vector<int32_t> t = random_tokens(depth);
      G4_RETURN_IF_ERROR(engine.Prefill(s, t, /*all_logits=*/false, &logits));
    }
    return OkStatus();
  };
  auto decode_steps = [&](int n, int batch = 1) -> Status {  // n steps of sequences 0 .. batch-1
    std::vector<int32_t> seqs(batch), toks(batch);
    for (int s = 0; s < batch; ++s) seqs[s] = s;
    for (int i = 0; i < n; ++i) {
      for (int32_t& t : toks) t = dist(rng);
      G4_RETURN_IF_ERROR(engine.Decode(seqs, toks, &logits));
    }
    return OkStatus();
  };

  // Warm-up: compiles every step shape the timed runs use (prefill chunks, one-token decode).
  if (!no_warmup) {
    for (int p : n_prompt) {
      Status st = fill(0);
      if (st.ok()) st = engine.Prefill(seq, random_tokens(p), false, &logits);
      if (!st.ok()) return Fail(st);
    }
    if (!n_gen.empty()) {
      // Two steps, or as many as the longest tg test when that is shorter (the context is sized
      // for the longest test: `-n 1` has room for one).
      const int warm = std::min(2, *std::max_element(n_gen.begin(), n_gen.end()));
      for (int b : batches) {
        Status st = fill(0, b);
        if (st.ok()) st = decode_steps(warm, b);
        if (!st.ok()) return Fail(st);
      }
    }
  }

  // As llama-bench: an n_ubatch column where the prefill chunk is not its default 512, type_k and
  // type_v columns where the cache is not its default f16.
  std::string extra_head, extra_sep, extra_cells;
  if (ubatch != 512) {
    char cell[32];
    std::snprintf(cell, sizeof cell, " %8d |", ubatch);
    extra_head += " n_ubatch |", extra_sep += " -------: |", extra_cells += cell;
  }
  if (cache_type != "f16") {
    char cells[64];
    std::snprintf(cells, sizeof cells, " %6s | %6s |", cache_type.c_str(), cache_type.c_str());
    extra_head += " type_k | type_v |", extra_sep += " -----: | -----: |", extra_cells += cells;
  }
  if (!json) {
    std::printf("| %-24s | %10s | %10s | %-7s | %7s |%s %16s | %20s |\n", "model", "size", "params", "backend", "threads",
                extra_head.c_str(), "test", "t/s (median)");
    std::printf("| %s | %s: | %s: | %s | %s: |%s %s: | %s: |\n", std::string(24, '-').c_str(), std::string(9, '-').c_str(),
                std::string(9, '-').c_str(), std::string(7, '-').c_str(), std::string(6, '-').c_str(),
                extra_sep.c_str(), std::string(15, '-').c_str(), std::string(19, '-').c_str());
    std::fflush(stdout);
  }

  std::vector<TestResult> results;
  std::string backend_column = backend_choice.backend;  // llama-bench's column: "CPU", "XLA", "CUDA"
  for (char& c : backend_column) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  auto report = [&](const TestResult& r) {
    if (json) {
      std::fprintf(stderr, "gemma4rt: bench %s: %.2f t/s (median of %zu)\n", TestName(r).c_str(), r.median_ts, r.samples_ts.size());
    } else {
      char ts[64];
      std::snprintf(ts, sizeof ts, "%.2f ± %.2f", r.median_ts, r.stddev_ts);  // "±" is 2 bytes, 1 column
      std::printf("| %-24s | %10s | %10s | %-7s | %7d |%s %16s | %21s |\n", desc, HumanBytes(static_cast<double>(size_bytes)).c_str(),
                  HumanCount(n_params).c_str(), backend_column.c_str(), threads, extra_cells.c_str(),
                  TestName(r).c_str(), ts);
      std::fflush(stdout);
    }
  };

  // --profile: the op times of the current test's timed steps only (not the depth fills).
  std::vector<OpProfile> profile_spent, profile_snap;
  auto profile_start = [&] {
    if (profile) profile_snap = engine.backend().Profile();
  };
  auto profile_stop = [&] {
    if (profile) AddProfileSince(profile_snap, engine.backend().Profile(), &profile_spent);
  };
  for (int depth : depths) {
    for (int p : n_prompt) {
      profile_spent.clear();
      TestResult r;
      r.test = "pp" + std::to_string(p);
      r.prompt = true;
      r.n = p;
      r.depth = depth;
      for (int rep = 0; rep < reps; ++rep) {
        Status st = fill(depth);
        if (!st.ok()) return Fail(st);
        const std::vector<int32_t> tokens = random_tokens(p);
        profile_start();
        const auto t0 = Clock::now();
        st = engine.Prefill(seq, tokens, /*all_logits=*/false, &logits);
        const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
        profile_stop();
        if (!st.ok()) return Fail(st);
        r.samples_ns.push_back(ns);
        r.samples_ts.push_back(p / (ns * 1e-9));
      }
      Summarize(&r);
      report(r);
      if (profile) PrintProfile(TestName(r), profile_spent, static_cast<double>(p) * reps);
      results.push_back(r);
    }
    for (int n : n_gen) for (int batch : batches) {
      profile_spent.clear();
      TestResult r;
      r.test = "tg" + std::to_string(n) + (batch > 1 ? "x" + std::to_string(batch) : "");
      r.prompt = false;
      r.n = n;
      r.depth = depth;
      r.batch = batch;
      for (int rep = 0; rep < reps; ++rep) {
        Status st = fill(depth, batch);
        if (!st.ok()) return Fail(st);
        profile_start();
        const auto t0 = Clock::now();
        st = decode_steps(n, batch);
        const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
        profile_stop();
        if (!st.ok()) return Fail(st);
        r.samples_ns.push_back(ns);
        r.samples_ts.push_back(static_cast<double>(n) * batch / (ns * 1e-9));
        if (bw_each_rep) {
          peak_rss_seen = std::max(peak_rss_seen, PeakRssBytes());
          r.bw_samples.push_back(MeasureBandwidth(bw_bytes, threads, bw_iters));
          ResetPeakRss();
        }
      }
      Summarize(&r);
      r.weight_bytes = weight_read / batch;  // one read of the weights per step, shared by its tokens
      double kv = 0;
      for (int i = 0; i < n; ++i) kv += static_cast<double>(KvBytesRead(config, static_cast<int64_t>(depth) + i + 1, kv_type));
      r.kv_bytes = static_cast<size_t>(kv / n);
      const double bytes_per_token = static_cast<double>(r.weight_bytes + r.kv_bytes);
      for (size_t i = 0; i < r.bw_samples.size(); ++i) {  // NaN (null in --json): the test could not run
        r.fraction_samples.push_back(BandwidthFraction(bytes_per_token, r.samples_ts[i], r.bw_samples[i].copy_gbps));
        r.read_fraction_samples.push_back(BandwidthFraction(bytes_per_token, r.samples_ts[i], r.bw_samples[i].read_gbps));
      }
      if (const double f = Median(r.fraction_samples); f > 0) {
        r.bandwidth_fraction = f;
        r.read_bandwidth_fraction = Median(r.read_fraction_samples);
      }
      report(r);
      if (profile) PrintProfile(TestName(r), profile_spent, static_cast<double>(n) * batch * reps);
      results.push_back(r);
    }
  }
  for (int s = 0; s < opts.max_seqs; ++s) engine.ResetSequence(s);

  // Peak memory of the benchmark itself, without the bandwidth tests' buffers, and the budget it is
  // held to: the weights as stored plus the KV cache this run allocated, plus 10%.
  const size_t peak_rss = std::max(peak_rss_seen, PeakRssBytes());
  const size_t kv_cache_bytes = engine.cache().bytes();
  const size_t rss_budget = static_cast<size_t>(static_cast<double>(size_bytes + kv_cache_bytes) * 1.1);
  // The machine's bandwidth: the median of the samples taken after the tg repetitions, or one
  // sample now (no tg test, or no VmHWM reset), against which every tg test's median is taken.
  std::vector<BandwidthSample> all_samples;
  for (const TestResult& r : results) all_samples.insert(all_samples.end(), r.bw_samples.begin(), r.bw_samples.end());
  const bool bw_at_end = bw_bytes > 0 && all_samples.empty();
  if (bw_at_end) all_samples.push_back(MeasureBandwidth(bw_bytes, threads, bw_iters));
  std::vector<double> copy_gbps, read_gbps;
  for (const BandwidthSample& b : all_samples) {
    copy_gbps.push_back(b.copy_gbps > 0 ? b.copy_gbps : NAN);
    read_gbps.push_back(b.read_gbps > 0 ? b.read_gbps : NAN);
  }
  const double bw_gbps = Median(copy_gbps), read_bw_gbps = Median(read_gbps);
  if (bw_at_end) {
    for (TestResult& r : results) {
      if (r.prompt || r.median_ts <= 0) continue;
      const double bytes_per_token = static_cast<double>(r.weight_bytes + r.kv_bytes);
      if (bw_gbps > 0) r.bandwidth_fraction = BandwidthFraction(bytes_per_token, r.median_ts, bw_gbps);
      if (read_bw_gbps > 0) r.read_bandwidth_fraction = BandwidthFraction(bytes_per_token, r.median_ts, read_bw_gbps);
    }
  }

  // The headline fraction: the first tg test at depth 0, else the first tg test.
  const TestResult* tg0 = nullptr;
  for (const TestResult& r : results)
    if (!r.prompt && (!tg0 || (tg0->depth != 0 && r.depth == 0))) tg0 = &r;

  if (json) {
    nlohmann::json out;
    out["model"] = model;
    out["model_desc"] = desc;
    out["size_bytes"] = size_bytes;
    out["n_params"] = static_cast<int64_t>(n_params);
    out["backend"] = backend_choice.backend;
    out["device_policy"] = policy;
    out["threads"] = threads;
    out["ubatch"] = ubatch;
    out["n_ubatch"] = ubatch;  // llama-bench's names
    out["cache_type"] = cache_type;
    out["type_k"] = cache_type;
    out["type_v"] = cache_type;
    out["repetitions"] = reps;
    out["seed"] = seed;
    out["context"] = context;
    out["results"] = nlohmann::json::array();
    out["depths"] = nlohmann::json::object();
    for (const TestResult& r : results) {
      nlohmann::json j;
      j["test"] = r.test;
      j["depth"] = r.depth;
      j["n_prompt"] = r.prompt ? r.n : 0;
      j["n_gen"] = r.prompt ? 0 : r.n;
      j["batch"] = r.prompt ? 1 : r.batch;
      j["tokens_per_second"] = r.median_ts;
      j["avg_ts"] = r.avg_ts;
      j["stddev_ts"] = r.stddev_ts;
      j["samples_ts"] = r.samples_ts;
      j["samples_ns"] = r.samples_ns;
      if (!r.prompt) {
        j["weight_bytes_per_token"] = r.weight_bytes;
        j["kv_bytes_per_token"] = r.kv_bytes;
        j["bandwidth_fraction"] = r.bandwidth_fraction >= 0 ? nlohmann::json(r.bandwidth_fraction) : nlohmann::json(nullptr);
        j["read_bandwidth_fraction"] =
            r.read_bandwidth_fraction >= 0 ? nlohmann::json(r.read_bandwidth_fraction) : nlohmann::json(nullptr);
        if (!r.bw_samples.empty()) {
          std::vector<double> c, rd;
          for (const BandwidthSample& b : r.bw_samples) {
            c.push_back(b.copy_gbps);
            rd.push_back(b.read_gbps);
          }
          j["bandwidth_gbps_samples"] = c;
          j["read_bandwidth_gbps_samples"] = rd;
          j["bandwidth_fraction_samples"] = r.fraction_samples;
          j["read_bandwidth_fraction_samples"] = r.read_fraction_samples;
        }
      }
      out["results"].push_back(j);
      out["depths"][std::to_string(r.depth)][r.test] = r.median_ts;
      if (r.depth == 0) out[r.test] = r.median_ts;
    }
    out["peak_rss_bytes"] = peak_rss;
    out["weights_bytes"] = size_bytes;
    out["kv_cache_bytes"] = kv_cache_bytes;
    out["peak_rss_budget_bytes"] = rss_budget;
    out["peak_rss_within_budget"] = peak_rss > 0 && peak_rss <= rss_budget;
    // null where the tests did not run (--bw-mib 0), as the fractions.
    const auto gbps_json = [](double g) { return g > 0 ? nlohmann::json(g) : nlohmann::json(nullptr); };
    out["bandwidth_gbps"] = gbps_json(bw_gbps);
    // How a bandwidth figure was measured.
    const char* when = all_samples.empty() ? "not run" : bw_at_end ? "once, after the tests" : "after each tg repetition";
    const auto test_json = [&](const char* method) -> nlohmann::json {
      return {{"method", method}, {"buffer_bytes", bw_bytes}, {"threads", threads}, {"iterations", bw_iters},
              {"samples", all_samples.size()}, {"when", when}, {"figure", "median of the samples, each the best pass"}};
    };
    out["bandwidth_test"] = test_json("memcpy, (read + written bytes) / best time");
    out["bandwidth_fraction"] = tg0 && tg0->bandwidth_fraction >= 0 ? nlohmann::json(tg0->bandwidth_fraction) : nlohmann::json(nullptr);
    out["read_bandwidth_gbps"] = gbps_json(read_bw_gbps);
    out["read_bandwidth_test"] = test_json("sum of 64-bit words, prefetched 4 KiB ahead, bytes read / best time");
    out["read_bandwidth_fraction"] = tg0 && tg0->read_bandwidth_fraction >= 0
                                         ? nlohmann::json(tg0->read_bandwidth_fraction)
                                         : nlohmann::json(nullptr);
    if (!clamp_notes.empty()) out["notes"] = clamp_notes;
    if (quality_result) out["quality"] = quality_json();
    std::printf("%s\n", out.dump(1).c_str());
  } else {
    std::printf("\npeak RSS %s (VmHWM); weights %s + KV cache %s (context %d) + 10%% = %s: %s",
                HumanBytes(static_cast<double>(peak_rss)).c_str(), HumanBytes(static_cast<double>(size_bytes)).c_str(),
                HumanBytes(static_cast<double>(kv_cache_bytes)).c_str(), context,
                HumanBytes(static_cast<double>(rss_budget)).c_str(),
                peak_rss == 0 ? "not measured" : peak_rss <= rss_budget ? "within" : "OVER");
    if (bw_gbps > 0) {
      std::printf("; memcpy bandwidth %.2f GB/s (%d thread%s, %s buffers, read + written bytes", bw_gbps, threads,
                  threads == 1 ? "" : "s", HumanBytes(static_cast<double>(bw_bytes)).c_str());
      if (all_samples.size() > 1) std::printf("; median of %zu tests, one after each tg repetition", all_samples.size());
      std::printf(")");
    }
    if (read_bw_gbps > 0) std::printf("; read bandwidth %.2f GB/s (same threads and buffers)", read_bw_gbps);
    std::printf("\n");
    for (const TestResult& r : results) {
      if (r.prompt) continue;
      std::printf("%s: %.2f MiB read per token (weights %.2f + KV %.2f)", TestName(r).c_str(),
                  (r.weight_bytes + r.kv_bytes) / 1048576.0, r.weight_bytes / 1048576.0, r.kv_bytes / 1048576.0);
      if (r.bandwidth_fraction >= 0) std::printf(", %.1f%% of the bandwidth limit", 100 * r.bandwidth_fraction);
      if (r.read_bandwidth_fraction >= 0) std::printf(" (%.1f%% of the read bandwidth)", 100 * r.read_bandwidth_fraction);
      if (r.bw_samples.size() > 1) std::printf(", each repetition against the bandwidth measured right after it, median");
      std::printf("\n");
    }
    print_quality();
  }
  return 0;
}

}  // namespace g4::cli

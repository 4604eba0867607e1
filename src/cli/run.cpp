// `tandem run --model DIR --prompt TEXT [--chat] [--max-tokens N] [--temperature T] [--top-p P]
// [--seed S]`: generates from one prompt on the CPU forward pass and streams the text to stdout.
// A direct single-sequence loop over DsV4Model (no server, no engine): the quickest way to see a
// checkpoint talk and a reference for what the engine must produce at temperature 0.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "model/model.h"
#include "text/encoding_dsv4.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

struct RunArgs {
  std::string model_dir, prompt;
  bool chat = false;
  int max_tokens = 128;
  double temperature = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  int threads = 0;
};

int32_t sample(const float* logits, int64_t V, double temperature, double top_p, std::mt19937_64& rng,
               std::vector<std::pair<double, int32_t>>& scratch) {
  if (temperature <= 0.0) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  double mx = -INFINITY;
  for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(logits[v]) / temperature);
  scratch.resize(V);
  double sum = 0.0;
  for (int64_t v = 0; v < V; ++v) {
    const double p = std::exp(static_cast<double>(logits[v]) / temperature - mx);
    scratch[v] = {p, static_cast<int32_t>(v)};
    sum += p;
  }
  std::sort(scratch.begin(), scratch.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  // nucleus: the smallest prefix whose mass reaches top_p (at least one token)
  double kept = 0.0;
  size_t n = 0;
  while (n < scratch.size() && (n == 0 || kept < top_p * sum)) kept += scratch[n++].first;
  std::uniform_real_distribution<double> uni(0.0, kept);
  double u = uni(rng), cum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cum += scratch[i].first;
    if (u < cum) return scratch[i].second;
  }
  return scratch[n - 1].second;
}

Status run(const RunArgs& a) {
  if (a.max_tokens < 0) return invalid_argument("--max-tokens must be >= 0");
  if (a.temperature < 0) return invalid_argument("--temperature must be >= 0");
  if (a.top_p <= 0 || a.top_p > 1) return invalid_argument("--top-p must be in (0, 1]");
  TANDEM_ASSIGN_OR_RETURN(auto tok, Tokenizer::from_file(a.model_dir + "/tokenizer.json"));
  std::string text = a.prompt;
  if (a.chat) {
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    msgs.push_back({{"role", "user"}, {"content", a.prompt}});
    TANDEM_ASSIGN_OR_RETURN(text, encode_messages(msgs, nlohmann::ordered_json(), EncodeOptions()));
  }
  std::vector<int32_t> ids = tok->encode(text);
  ModelOptions opt;
  opt.max_slots = 1;
  opt.load_draft = false;
  opt.num_threads = a.threads;
  const int64_t total = static_cast<int64_t>(ids.size()) + a.max_tokens + 1;
  opt.num_blocks = static_cast<int>((total + 255) / 256 + 1);
  opt.max_tokens_per_step = std::max<int>(1, static_cast<int>(ids.size()) + 1);
  TANDEM_ASSIGN_OR_RETURN(auto model, DsV4Model::load(a.model_dir, opt));
  if (!a.chat && (ids.empty() || ids[0] != model->config().bos_token_id))
    ids.insert(ids.begin(), static_cast<int32_t>(model->config().bos_token_id));
  if (static_cast<int64_t>(ids.size()) > opt.max_tokens_per_step) opt.max_tokens_per_step = ids.size();
  const int64_t V = model->vocab_size();
  for (int32_t id : ids)
    if (id < 0 || id >= V) return invalid_argument("prompt token id {} is outside the model's vocabulary {}", id, V);

  std::vector<int32_t> table(opt.num_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::mt19937_64 rng(a.seed);
  std::vector<std::pair<double, int32_t>> scratch;
  IncrementalDecoder dec(*tok, /*skip_special=*/true);
  StepOutput out;
  const auto t0 = std::chrono::steady_clock::now();
  StepBatch b;
  b.seqs.push_back({0, 0, ids, table, LogitsMode::kLast, false});
  TANDEM_RETURN_IF_ERROR(model->forward(b, out));
  const auto t1 = std::chrono::steady_clock::now();
  int generated = 0;
  int64_t pos = static_cast<int64_t>(ids.size());
  int32_t next = 0;
  for (; generated < a.max_tokens; ++generated) {
    next = sample(out.logits.data(), V, a.temperature, a.top_p, rng, scratch);
    if (next == model->config().eos_token_id) break;
    std::string piece = dec.push(next);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (generated + 1 == a.max_tokens) {
      ++generated;
      break;
    }
    StepBatch d;
    d.seqs.push_back({0, pos, std::span<const int32_t>(&next, 1), table, LogitsMode::kLast, false});
    TANDEM_RETURN_IF_ERROR(model->forward(d, out));
    ++pos;
  }
  std::string rest = dec.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::printf("\n");
  const auto t2 = std::chrono::steady_clock::now();
  const double pre = std::chrono::duration<double>(t1 - t0).count();
  const double gen = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "[tandem run] prompt %zu tokens in %.2f s (%.1f tok/s); generated %d tokens in %.2f s (%.1f tok/s)\n",
               ids.size(), pre, ids.size() / std::max(pre, 1e-9), generated, gen, generated / std::max(gen, 1e-9));
  return Status();
}

int run_main(int argc, char** argv) {
  CLI::App app{"Generate text from one prompt on the CPU forward pass (streams to stdout)."};
  RunArgs a;
  app.add_option("--model", a.model_dir, "model directory")->required();
  app.add_option("--prompt", a.prompt, "prompt text")->required();
  app.add_flag("--chat", a.chat, "wrap the prompt as one user turn of the DeepSeek-V4 chat format");
  app.add_option("--max-tokens", a.max_tokens, "tokens to generate (default 128)");
  app.add_option("--temperature", a.temperature, "sampling temperature, 0 = greedy (default 1.0)");
  app.add_option("--top-p", a.top_p, "nucleus sampling mass (default 1.0)");
  app.add_option("--seed", a.seed, "sampling seed (default 0)");
  app.add_option("--threads", a.threads, "CPU threads (0 = all)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  Status st = run(a);
  if (!st.ok()) {
    std::fprintf(stderr, "tandem run: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem

TANDEM_REGISTER_COMMAND(run, "run", "generate text from a prompt on the CPU", tandem::run_main);

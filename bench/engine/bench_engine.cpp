// Engine benchmark: output tok/s and draft acceptance for no-spec / fixed-K / threshold / auto at
// concurrency 1 and 8, on the fake model with simulated step costs (a "bandwidth-bound" profile
// where a forward costs about the same for 1 or 48 tokens, like a GPU decode step, and a
// "compute-bound" profile where each token costs a lot, where speculation should not pay and
// `auto` should back off), then the trained built-in checkpoint (data/builtin) on the CPU model.
// Every arm must produce the same greedy outputs (checked: benchmark hygiene).
// Prints a table and writes bench/results/engine-<date>.json.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_results.h"
#include "common/log.h"
#include "engine/dsv4_runner.h"
#include "engine/engine_core.h"
#include "engine/fake_model.h"

using namespace tandem;

namespace {

struct Profile {
  std::string name;
  double fixed_us, per_token_us, draft_fixed_us, draft_per_seq_us;
};

struct Arm {
  std::string name;
  std::string mode;  // "" = no speculation
};

struct Row {
  std::string profile, arm;
  int concurrency;
  int64_t tokens;
  double wall_s, tok_s, acceptance_rate, mean_acceptance_length, drafted_per_step;
  int64_t steps;
  uint64_t output_hash;
};

std::vector<int32_t> prompt_for(int i) {
  std::vector<int32_t> p;
  for (int k = 0; k < 32 + (i * 13) % 64; ++k) p.push_back(static_cast<int32_t>(5 + fake_mix(i, k) % 57));
  return p;
}

Row run(const Profile& prof, const Arm& arm, int concurrency, int num_requests, int max_tokens) {
  FakeModelConfig fc;
  fc.vocab_size = 64;
  fc.draft_agree = 0.75;
  fc.forward_fixed_us = prof.fixed_us;
  fc.forward_per_token_us = prof.per_token_us;
  fc.draft_fixed_us = prof.draft_fixed_us;
  fc.draft_per_seq_us = prof.draft_per_seq_us;
  EngineConfig ec;
  ec.max_num_seqs = concurrency;
  ec.max_num_batched_tokens = 512;
  ec.block_size = 64;
  if (!arm.mode.empty()) {
    ec.speculative.method = "dspark";
    ec.speculative.num_speculative_tokens = 5;
    ec.speculative.verify_mode = parse_verify_mode(arm.mode).value();
    ec.speculative.confidence_threshold = 0.5;
  }
  CoreOptions o;
  o.check_integrity_each_step = false;
  o.log_startup = false;
  auto core_r = EngineCore::create(std::make_unique<FakeModelRunner>(fc), ec, o);
  if (!core_r.ok()) {
    std::fprintf(stderr, "%s\n", core_r.status().to_string().c_str());
    std::exit(1);
  }
  auto core = std::move(core_r).value();
  std::map<std::string, std::vector<int32_t>> outputs;
  int next = 0;
  auto top_up = [&] {
    while (next < num_requests && core->num_running() + core->num_waiting() < concurrency) {
      Request r;
      r.request_id = "r" + std::to_string(next);
      r.prompt_tokens = prompt_for(next);
      r.sampling.temperature = 0;
      r.sampling.max_tokens = max_tokens;
      r.sampling.ignore_eos = true;
      Status st = core->add_request(std::move(r), [&](const RequestEvent& ev) {
        auto& v = outputs[ev.request_id];
        v.insert(v.end(), ev.tokens.begin(), ev.tokens.end());
      });
      if (!st.ok()) std::exit(1);
      ++next;
    }
  };
  auto t0 = std::chrono::steady_clock::now();
  top_up();
  int64_t steps = 0;
  while (core->has_work()) {
    Status st = core->step();
    if (!st.ok()) {
      std::fprintf(stderr, "step failed: %s\n", st.to_string().c_str());
      std::exit(1);
    }
    ++steps;
    top_up();
  }
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EngineMetrics m = core->metrics(true);
  uint64_t h = 0;
  int64_t tokens = 0;
  for (auto& [id, v] : outputs) {
    for (int32_t t : v) h = fake_mix(h, static_cast<uint64_t>(t));
    tokens += static_cast<int64_t>(v.size());
  }
  Row row;
  row.profile = prof.name;
  row.arm = arm.name;
  row.concurrency = concurrency;
  row.tokens = tokens;
  row.wall_s = wall;
  row.tok_s = tokens / wall;
  row.steps = steps;
  row.acceptance_rate = m.spec_decode_num_draft_tokens_total
                            ? double(m.spec_decode_num_accepted_tokens_total) / m.spec_decode_num_draft_tokens_total
                            : 0.0;
  row.mean_acceptance_length =
      m.spec_decode_num_drafts_total ? 1.0 + double(m.spec_decode_num_accepted_tokens_total) / m.spec_decode_num_drafts_total
                                     : 1.0;
  row.drafted_per_step = steps ? double(m.spec_decode_num_draft_tokens_total) / steps : 0.0;
  row.output_hash = h;
  return row;
}

// The trained built-in checkpoint (data/builtin, CPU DsV4Model): counting prompts in chat format,
// where its DSpark draft is strong. Greedy outputs must agree across arms here too.
Row run_real(const std::string& dir, const Arm& arm, int concurrency, int num_requests, int max_tokens) {
  EngineConfig ec;
  ec.model_dir = dir;
  ec.max_num_seqs = concurrency;
  ec.max_num_batched_tokens = 512;
  ec.block_size = 128;
  ec.max_model_len = 1024;
  ec.num_threads = 1;
  if (!arm.mode.empty()) {
    ec.speculative.method = "dspark";
    ec.speculative.num_speculative_tokens = 5;
    ec.speculative.verify_mode = parse_verify_mode(arm.mode).value();
    ec.speculative.confidence_threshold = 0.5;
  }
  auto runner = create_dsv4_runner(ec);
  if (!runner.ok()) {
    std::fprintf(stderr, "%s\n", runner.status().to_string().c_str());
    std::exit(1);
  }
  CoreOptions o;
  o.check_integrity_each_step = false;
  o.log_startup = false;
  auto core_r = EngineCore::create(std::move(runner).value(), ec, o);
  if (!core_r.ok()) {
    std::fprintf(stderr, "%s\n", core_r.status().to_string().c_str());
    std::exit(1);
  }
  auto core = std::move(core_r).value();
  std::map<std::string, std::vector<int32_t>> outputs;
  for (int i = 0; i < num_requests; ++i) {
    Request r;
    r.request_id = "r" + std::to_string(i);
    std::string text = "<｜begin▁of▁sentence｜><｜User｜>Count from " + std::to_string(1 + 37 * i) + " to " +
                       std::to_string(151 + 37 * i) + ".<｜Assistant｜></think>";
    r.prompt_tokens = core->tokenizer().encode(text);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    Status st = core->add_request(std::move(r), [&](const RequestEvent& ev) {
      auto& v = outputs[ev.request_id];
      v.insert(v.end(), ev.tokens.begin(), ev.tokens.end());
    });
    if (!st.ok()) std::exit(1);
  }
  auto t0 = std::chrono::steady_clock::now();
  int64_t steps = 0;
  while (core->has_work()) {
    Status st = core->step();
    if (!st.ok()) {
      std::fprintf(stderr, "step failed: %s\n", st.to_string().c_str());
      std::exit(1);
    }
    ++steps;
  }
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EngineMetrics m = core->metrics(true);
  Row row;
  row.profile = "builtin-cpu";
  row.arm = arm.name;
  row.concurrency = concurrency;
  row.tokens = 0;
  uint64_t h = 0;
  for (auto& [id, v] : outputs) {
    for (int32_t t : v) h = fake_mix(h, static_cast<uint64_t>(t));
    row.tokens += static_cast<int64_t>(v.size());
  }
  row.wall_s = wall;
  row.tok_s = row.tokens / wall;
  row.steps = steps;
  row.acceptance_rate = m.spec_decode_num_draft_tokens_total
                            ? double(m.spec_decode_num_accepted_tokens_total) / m.spec_decode_num_draft_tokens_total
                            : 0.0;
  row.mean_acceptance_length =
      m.spec_decode_num_drafts_total ? 1.0 + double(m.spec_decode_num_accepted_tokens_total) / m.spec_decode_num_drafts_total
                                     : 1.0;
  row.drafted_per_step = steps ? double(m.spec_decode_num_draft_tokens_total) / steps : 0.0;
  row.output_hash = h;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  set_log_level(LogLevel::kWarn);
  int num_requests = argc > 1 ? std::atoi(argv[1]) : 16;
  int max_tokens = argc > 2 ? std::atoi(argv[2]) : 128;
  std::vector<Profile> profiles = {
      {"bandwidth-bound", 2000, 5, 300, 20},   // GPU-like: a step costs ~ the same for 1..48 tokens
      {"compute-bound", 100, 300, 100, 20},    // every token costs: verifying rejected drafts wastes time
  };
  std::vector<Arm> arms = {{"no-spec", ""}, {"fixed-K5", "fixed"}, {"threshold-0.5", "threshold"}, {"auto", "auto"}};
  std::vector<Row> rows;
  std::printf("%-16s %-14s %4s %8s %9s %8s %6s %8s %7s\n", "profile", "arm", "conc", "tokens", "tok/s", "accept",
              "MAL", "draft/st", "steps");
  bool same_outputs = true;
  for (const auto& prof : profiles) {
    for (int conc : {1, 8}) {
      uint64_t ref_hash = 0;
      for (size_t a = 0; a < arms.size(); ++a) {
        int n = conc == 1 ? num_requests / 2 : num_requests;
        Row r = run(prof, arms[a], conc, n, max_tokens);
        if (a == 0) ref_hash = r.output_hash;
        else if (r.output_hash != ref_hash) same_outputs = false;
        std::printf("%-16s %-14s %4d %8lld %9.1f %8.3f %6.2f %8.2f %7lld\n", r.profile.c_str(), r.arm.c_str(),
                    r.concurrency, static_cast<long long>(r.tokens), r.tok_s, r.acceptance_rate,
                    r.mean_acceptance_length, r.drafted_per_step, static_cast<long long>(r.steps));
        rows.push_back(r);
      }
    }
  }
  // Real model (optional): the trained built-in checkpoint, if present.
  std::string builtin = std::string(TANDEM_SOURCE_DIR) + "/data/builtin";
  bool have_builtin = std::getenv("TANDEM_BENCH_NO_MODEL") == nullptr &&
                      std::ifstream(builtin + "/config.json").good();
  if (have_builtin) {
    for (int conc : {1, 4}) {
      uint64_t ref_hash = 0;
      for (size_t a = 0; a < arms.size(); ++a) {
        Row r = run_real(builtin, arms[a], conc, conc == 1 ? 2 : 4, 64);
        if (a == 0) ref_hash = r.output_hash;
        else if (r.output_hash != ref_hash) same_outputs = false;
        std::printf("%-16s %-14s %4d %8lld %9.1f %8.3f %6.2f %8.2f %7lld\n", r.profile.c_str(), r.arm.c_str(),
                    r.concurrency, static_cast<long long>(r.tokens), r.tok_s, r.acceptance_rate,
                    r.mean_acceptance_length, r.drafted_per_step, static_cast<long long>(r.steps));
        rows.push_back(r);
      }
    }
  }
  std::printf("outputs identical across arms: %s\n", same_outputs ? "yes" : "NO");

  nlohmann::json j = bench::run_info();
  j["benchmark"] = "engine";
  j["model"] = "fake (vocab 64, draft agreement 0.75, simulated step costs); builtin-cpu = data/builtin "
               "(35M target + DSpark draft) on the CPU DsV4Model, 1 thread, counting prompts, 64 tokens";
  j["requests"] = num_requests;
  j["max_tokens"] = max_tokens;
  j["outputs_identical_across_arms"] = same_outputs;
  for (const auto& p : profiles)
    j["profiles"][p.name] = {{"forward_fixed_us", p.fixed_us},
                             {"forward_per_token_us", p.per_token_us},
                             {"draft_fixed_us", p.draft_fixed_us},
                             {"draft_per_seq_us", p.draft_per_seq_us}};
  for (const auto& r : rows)
    j["results"].push_back({{"profile", r.profile},
                            {"arm", r.arm},
                            {"concurrency", r.concurrency},
                            {"output_tokens", r.tokens},
                            {"wall_s", r.wall_s},
                            {"tok_s", r.tok_s},
                            {"acceptance_rate", r.acceptance_rate},
                            {"mean_acceptance_length", r.mean_acceptance_length},
                            {"draft_tokens_per_step", r.drafted_per_step},
                            {"steps", r.steps}});
  bench::write_result(j, bench::result_path("engine"));
  return same_outputs ? 0 : 1;
}

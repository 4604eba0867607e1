// EchoEngine: a deterministic stand-in implementing the Engine interface (engine.h) with a byte-level
// tokenizer, for protocol tests and `tandem serve --model echo:` (no weights). It replies
// "Echo: <last user text>", reasons first in thinking mode, emits DSML tool calls when the user
// text says `call NAME {json}`, and under a TokenConstraint samples among the allowed tokens. The
// server never depends on it: it only sees the Engine interface.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "text/tokenizer.h"

namespace tandem::server {

// ids 0..kNumSpecial-1: DeepSeek-V4 protocol tokens (BOS 0, EOS 1, ...); then one token per byte.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int kNumSpecial = 16;
  ByteTokenizer();
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  std::string token_bytes(int32_t id) const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  bool is_special(int32_t id) const override { return id >= 0 && id < kNumSpecial; }
  int64_t vocab_size() const override { return kNumSpecial + 256; }

 private:
  std::vector<std::string> specials_;
};

struct EchoEngineOptions {
  int step_delay_ms = 2;       // wall time per engine step
  int tokens_per_step = 1;
  int max_num_seqs = 64;       // running at once
  int max_waiting = 1024;      // queued beyond that: submit() -> kResourceExhausted
  int64_t max_model_len = 4096;
  int block_size = 16;         // fake KV blocks, for the leak counter
  int64_t kv_blocks = 1 << 16;
  int prefill_steps = 0;       // extra steps before the first token
  // Leave special tokens (</think>, ｜DSML｜, ...) out of RequestEvent::text, as an engine that
  // detokenizes with skip_special does; the server must still see them (it splices them back).
  bool skip_special_in_text = false;
};

class EchoEngine final : public Engine {
 public:
  explicit EchoEngine(EchoEngineOptions options = {});
  ~EchoEngine() override;

  const ModelInfo& model_info() const override { return info_; }
  const Tokenizer& tokenizer() const override { return tokenizer_; }
  Status submit(Request request, EventCallback on_event) override;
  void cancel(const std::string& request_id) override;
  EngineMetrics metrics() override;
  bool healthy() const override { return !stopped_; }
  void shutdown(double deadline_s) override;

  // Test hooks.
  int64_t submitted_count() const { return submitted_; }
  int64_t cancelled_count() const { return cancelled_; }
  int64_t active_count();

 private:
  struct Seq {
    Request req;
    EventCallback cb;
    std::vector<int32_t> script;   // tokens to emit (unconstrained)
    size_t pos = 0;
    std::vector<int32_t> generated;
    std::string text;              // emitted text (for stop strings)
    std::string utf8_pending;
    bool cancel = false;
    int prefill_left = 0;
    int64_t blocks = 0;
    std::mt19937_64 rng;
    double t_submit = 0, t_last = 0;
    bool first = true;
    bool prompt_lp_sent = false;   // SamplingParams::prompt_logprobs: on the first event after prefill
  };
  void loop();
  bool step_one(Seq& s, RequestEvent& ev, double now);
  std::vector<int32_t> make_script(const Request& r) const;
  int32_t pick_constrained(Seq& s);

  EchoEngineOptions opt_;
  ByteTokenizer tokenizer_;
  ModelInfo info_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;
  std::map<std::string, bool> cancel_requests_;
  bool accepting_ = true;
  std::atomic<bool> stopped_{false};
  std::thread thread_;
  EngineMetrics m_;
  int64_t blocks_used_ = 0;
  std::atomic<int64_t> submitted_{0}, cancelled_{0};
};

}  // namespace tandem::server

// EchoEngine: scripted replies, one step loop thread, fake KV block accounting, vLLM-style counters.
#include "server/echo_engine.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

#include "text/dsml.h"

namespace tandem::server {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Length of the longest prefix of `s` that is complete UTF-8 (a trailing partial character is held).
size_t complete_utf8_prefix(const std::string& s) {
  size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    return back < need ? n - back : n;
  }
  return n;
}

}  // namespace

// ---- ByteTokenizer ----
ByteTokenizer::ByteTokenizer() {
  specials_ = {std::string(dsv4::kBos), std::string(dsv4::kEos), std::string(dsv4::kUser),
               std::string(dsv4::kAssistant), std::string(dsv4::kThinkStart), std::string(dsv4::kThinkEnd),
               std::string(dsv4::kDsml), std::string(dsv4::kLatestReminder)};
  while (static_cast<int>(specials_.size()) < kNumSpecial) specials_.push_back("<｜unused" + std::to_string(specials_.size()) + "｜>");
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    bool matched = false;
    for (size_t k = 0; k < specials_.size(); ++k) {
      if (text.substr(i, specials_[k].size()) == specials_[k]) {
        ids.push_back(static_cast<int32_t>(k));
        i += specials_[k].size();
        matched = true;
        break;
      }
    }
    if (!matched) ids.push_back(kNumSpecial + static_cast<unsigned char>(text[i++]));
  }
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (is_special(id) && skip_special) continue;
    out += token_bytes(id);
  }
  return out;
}

std::string ByteTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  if (id < kNumSpecial) return specials_[id];
  return std::string(1, static_cast<char>(id - kNumSpecial));
}

std::optional<int32_t> ByteTokenizer::token_to_id(std::string_view token) const {
  for (size_t k = 0; k < specials_.size(); ++k)
    if (specials_[k] == token) return static_cast<int32_t>(k);
  if (token.size() == 1) return kNumSpecial + static_cast<unsigned char>(token[0]);
  return std::nullopt;
}

// ---- EchoEngine ----
EchoEngine::EchoEngine(EchoEngineOptions options) : opt_(options) {
  info_.model_dir = "echo:";
  info_.vocab_size = tokenizer_.vocab_size();
  info_.max_model_len = opt_.max_model_len;
  info_.kv_capacity_tokens = opt_.kv_blocks * opt_.block_size;
  info_.eos_token_id = 1;
  info_.device = "cpu";
  m_.kv_blocks_total = opt_.kv_blocks;
  m_.kv_blocks_free = opt_.kv_blocks;
  m_.spec_decode_num_accepted_tokens_per_pos_total.assign(3, 0);
  thread_ = std::thread([this] { loop(); });
}

EchoEngine::~EchoEngine() {
  shutdown(0.0);
  if (thread_.joinable()) thread_.join();
}

std::vector<int32_t> EchoEngine::make_script(const Request& r) const {
  std::string prompt = tokenizer_.decode(r.prompt_tokens);
  std::string user = prompt;
  bool thinking = false;
  auto u = prompt.rfind(dsv4::kUser);
  if (u != std::string::npos) {
    user = prompt.substr(u + dsv4::kUser.size());
    auto a = user.find(dsv4::kAssistant);
    if (a != std::string::npos) {
      thinking = user.compare(a + dsv4::kAssistant.size(), dsv4::kThinkStart.size(), dsv4::kThinkStart) == 0;
      user = user.substr(0, a);
    }
  } else if (user.size() > 64) {
    user = user.substr(user.size() - 64);
  }
  std::string reply;
  if (thinking) reply += "Thinking about: " + user + std::string(dsv4::kThinkEnd);
  if (user.rfind("call ", 0) == 0 && u != std::string::npos) {
    // "call NAME {json} && call NAME2 {json}" -> one DSML block with one invoke per call.
    std::string block = "\n\n<｜DSML｜tool_calls>\n";
    size_t pos = 0;
    while (pos < user.size()) {
      size_t end = user.find(" && ", pos);
      std::string one = user.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
      pos = end == std::string::npos ? user.size() : end + 4;
      if (one.rfind("call ", 0) != 0) continue;
      one = one.substr(5);
      auto sp = one.find(' ');
      std::string name = one.substr(0, sp);
      auto args = nlohmann::ordered_json::parse(sp == std::string::npos ? "{}" : one.substr(sp + 1), nullptr, false);
      block += "<｜DSML｜invoke name=\"" + name + "\">\n";
      if (args.is_object()) {
        for (auto it = args.begin(); it != args.end(); ++it) {
          bool is_str = it.value().is_string();
          block += "<｜DSML｜parameter name=\"" + it.key() + "\" string=\"" + (is_str ? "true" : "false") + "\">";
          block += is_str ? it.value().get<std::string>() : python_json_dumps(it.value());
          block += "</｜DSML｜parameter>\n";
        }
      }
      block += "</｜DSML｜invoke>\n";
    }
    block += "</｜DSML｜tool_calls>";
    reply += block;
  } else {
    reply += "Echo: " + user;
  }
  auto ids = tokenizer_.encode(reply);
  ids.push_back(info_.eos_token_id);
  return ids;
}

int32_t EchoEngine::pick_constrained(Seq& s) {
  std::vector<bool> allowed(static_cast<size_t>(info_.vocab_size), false);
  s.req.constraint->allowed_tokens(allowed);
  if (s.req.constraint->is_complete() && allowed[info_.eos_token_id]) return info_.eos_token_id;
  std::vector<int32_t> cand;
  std::vector<double> w;
  for (int32_t id = 0; id < info_.vocab_size; ++id) {
    if (!allowed[id] || id == info_.eos_token_id) continue;
    std::string b = tokenizer_.token_bytes(id);
    double weight = 1.0;
    if (b == "\"" || b == "}" || b == "]") weight = 40.0;
    else if (b == " " || b == "\n" || b == "\t" || b == "\r") weight = 0.05;
    else if (static_cast<unsigned char>(b[0]) >= 0x80) weight = 0.02;
    cand.push_back(id);
    w.push_back(weight);
  }
  if (cand.empty()) return info_.eos_token_id;
  std::discrete_distribution<size_t> d(w.begin(), w.end());
  return cand[d(s.rng)];
}

Status EchoEngine::submit(Request request, EventCallback on_event) {
  if (request.prompt_tokens.empty()) return invalid_argument("empty prompt");
  for (int32_t t : request.prompt_tokens)
    if (t < 0 || t >= info_.vocab_size) return invalid_argument("prompt token id {} out of range [0, {})", t, info_.vocab_size);
  if (static_cast<int64_t>(request.prompt_tokens.size()) > info_.max_model_len)
    return make_error(StatusCode::kOutOfRange, "prompt has {} tokens, more than max_model_len {}",
                      request.prompt_tokens.size(), info_.max_model_len);
  auto s = std::make_unique<Seq>();
  s->script = make_script(request);
  s->rng.seed(request.sampling.seed.value_or(0x5eed) ^ 0x9e3779b97f4a7c15ull);
  s->t_submit = s->t_last = now_s();
  s->prefill_left = opt_.prefill_steps;
  s->req = std::move(request);
  s->cb = std::move(on_event);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!accepting_) return Status(StatusCode::kUnavailable, "engine is shutting down");
    if (static_cast<int>(waiting_.size()) >= opt_.max_waiting)
      return Status(StatusCode::kResourceExhausted, "request queue is full");
    waiting_.push_back(std::move(s));
    ++submitted_;
  }
  cv_.notify_all();
  return Status();
}

void EchoEngine::cancel(const std::string& request_id) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& s : waiting_)
    if (s->req.request_id == request_id) s->cancel = true;
  for (auto& s : running_)
    if (s->req.request_id == request_id) s->cancel = true;
}

int64_t EchoEngine::active_count() {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int64_t>(waiting_.size() + running_.size());
}

EngineMetrics EchoEngine::metrics() {
  std::lock_guard<std::mutex> lk(mu_);
  EngineMetrics out = m_;
  out.num_requests_running = static_cast<int64_t>(running_.size());
  out.num_requests_waiting = static_cast<int64_t>(waiting_.size());
  out.kv_blocks_free = opt_.kv_blocks - blocks_used_;
  out.kv_cache_usage_perc = static_cast<double>(blocks_used_) / static_cast<double>(opt_.kv_blocks);
  // Integrity: blocks held must equal the sum over live sequences.
  int64_t owned = 0;
  for (auto& s : running_) owned += s->blocks;
  out.kv_blocks_leaked = blocks_used_ - owned;
  m_.ttft_s.clear();
  m_.itl_s.clear();
  m_.e2e_s.clear();
  return out;
}

void EchoEngine::shutdown(double deadline_s) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    accepting_ = false;
  }
  double end = now_s() + deadline_s;
  while (now_s() < end && active_count() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& s : waiting_) s->cancel = true;
    for (auto& s : running_) s->cancel = true;
  }
  // Let the loop deliver the cancellations, then stop it.
  for (int i = 0; i < 2000 && active_count() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stopped_ = true;
  cv_.notify_all();
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

// Advances one sequence by one step; returns true when it finished (ev is its final event).
bool EchoEngine::step_one(Seq& s, RequestEvent& ev, double now) {
  ev.request_id = s.req.request_id;
  auto finish = [&](FinishReason r) {
    ev.finish = r;
    ev.text += s.utf8_pending;  // flush held bytes
    s.utf8_pending.clear();
    ev.usage.prompt_tokens = static_cast<int64_t>(s.req.prompt_tokens.size());
    ev.usage.completion_tokens = static_cast<int64_t>(s.generated.size());
    m_.e2e_s.push_back(now - s.t_submit);
    if (r == FinishReason::kStop || r == FinishReason::kLength) ++m_.request_success_total;
    return true;
  };
  if (s.cancel) return finish(FinishReason::kCancelled);
  if (s.req.timeout_s > 0 && now - s.t_submit >= s.req.timeout_s) return finish(FinishReason::kTimeout);
  if (s.prefill_left > 0) {
    --s.prefill_left;
    return false;
  }
  const auto& sp = s.req.sampling;
  if (sp.prompt_logprobs >= 0 && !s.prompt_lp_sent) {
    // Scripted prompt log-probabilities (as the engine lays them out): token i > 0 at -0.5 - i/8,
    // rank 1 + i % 3, alternatives the next ids at falling values.
    s.prompt_lp_sent = true;
    const auto& p = s.req.prompt_tokens;
    for (size_t i = 1; i < p.size(); ++i) {
      TokenLogprob lp;
      lp.token = p[i];
      lp.logprob = -0.5f - static_cast<float>(i) / 8.0f;
      lp.rank = 1 + static_cast<int32_t>(i % 3);
      for (int a = 0; a < sp.prompt_logprobs; ++a)
        lp.top.emplace_back(static_cast<int32_t>((p[i] + 1 + a) % info_.vocab_size), -0.25f * static_cast<float>(a + 1));
      ev.prompt_logprobs.push_back(std::move(lp));
    }
  }
  for (int k = 0; k < opt_.tokens_per_step; ++k) {
    if (static_cast<int>(s.generated.size()) >= sp.max_tokens) return finish(FinishReason::kLength);
    if (static_cast<int64_t>(s.req.prompt_tokens.size() + s.generated.size()) >= info_.max_model_len)
      return finish(FinishReason::kLength);
    int32_t tok;
    if (s.req.constraint) tok = pick_constrained(s);
    else if (s.pos < s.script.size()) tok = s.script[s.pos++];
    else tok = ByteTokenizer::kNumSpecial + '.';
    if (tok == info_.eos_token_id && sp.ignore_eos && !s.req.constraint) tok = ByteTokenizer::kNumSpecial + ' ';
    if (tok == info_.eos_token_id) return finish(FinishReason::kStop);
    if (std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), tok) != sp.stop_token_ids.end())
      return finish(FinishReason::kStop);
    if (s.req.constraint) s.req.constraint->accept_token(tok);
    s.generated.push_back(tok);
    ++m_.generation_tokens_total;
    if (s.first) {
      ev.ttft_s = now - s.t_submit;
      m_.ttft_s.push_back(ev.ttft_s);
      s.first = false;
    } else {
      m_.itl_s.push_back(now - s.t_last);
    }
    s.t_last = now;
    if ((s.req.prompt_tokens.size() + s.generated.size()) % opt_.block_size == 1) {
      ++s.blocks;
      ++blocks_used_;
    }
    ev.tokens.push_back(tok);
    if (sp.logprobs >= 0) {
      TokenLogprob lp;
      lp.token = tok;
      lp.logprob = -0.25f;
      for (int a = 0; a < sp.logprobs; ++a)
        lp.top.emplace_back(a == 0 ? tok : static_cast<int32_t>((tok + a) % info_.vocab_size), a == 0 ? -0.25f : -2.0f * a);
      ev.logprobs.push_back(std::move(lp));
    }
    // Text with stop strings: hold back any suffix that may start a stop string.
    std::string piece = opt_.skip_special_in_text && tokenizer_.is_special(tok) ? "" : tokenizer_.token_bytes(tok);
    std::string full = s.utf8_pending + piece;
    for (const auto& stop : sp.stop) {
      auto at = (s.text + full).find(stop);
      if (at != std::string::npos && at + stop.size() > s.text.size()) {
        std::string all = s.text + full;
        ev.text += all.substr(s.text.size(), at - std::min(at, s.text.size()));
        s.utf8_pending.clear();
        return finish(FinishReason::kStop);
      }
    }
    size_t hold = 0;
    for (const auto& stop : sp.stop)
      for (size_t l = std::min(stop.size() - 1, full.size()); l > hold; --l)
        if (full.compare(full.size() - l, l, stop, 0, l) == 0) { hold = l; break; }
    size_t emit = complete_utf8_prefix(full.substr(0, full.size() - hold));
    ev.text += full.substr(0, emit);
    s.text += full.substr(0, emit);
    s.utf8_pending = full.substr(emit);
  }
  return false;
}

void EchoEngine::loop() {
  while (!stopped_) {
    std::vector<std::pair<EventCallback, RequestEvent>> out;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(opt_.step_delay_ms),
                   [&] { return stopped_.load(); });
      if (stopped_) break;
      double now = now_s();
      // Cancelled waiting requests finish without running.
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if ((*it)->cancel) {
          RequestEvent ev;
          step_one(**it, ev, now);
          ++cancelled_;
          out.emplace_back((*it)->cb, std::move(ev));
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
      while (!waiting_.empty() && static_cast<int>(running_.size()) < opt_.max_num_seqs) {
        auto s = std::move(waiting_.front());
        waiting_.pop_front();
        s->blocks = (static_cast<int64_t>(s->req.prompt_tokens.size()) + opt_.block_size - 1) / opt_.block_size;
        blocks_used_ += s->blocks;
        m_.prompt_tokens_total += static_cast<int64_t>(s->req.prompt_tokens.size());
        m_.prefix_cache_queries_total += static_cast<int64_t>(s->req.prompt_tokens.size());
        running_.push_back(std::move(s));
      }
      for (auto it = running_.begin(); it != running_.end();) {
        RequestEvent ev;
        bool done = step_one(**it, ev, now);
        if (done) {
          blocks_used_ -= (*it)->blocks;
          (*it)->blocks = 0;
          if (ev.finish == FinishReason::kCancelled) ++cancelled_;
          out.emplace_back((*it)->cb, std::move(ev));
          it = running_.erase(it);
        } else {
          if (!ev.tokens.empty() || !ev.text.empty() || !ev.prompt_logprobs.empty()) out.emplace_back((*it)->cb, std::move(ev));
          ++it;
        }
      }
    }
    for (auto& [cb, ev] : out) cb(ev);
  }
}

}  // namespace tandem::server

// FakeModelRunner / FakeTokenizer: see fake_model.h.
#include "engine/fake_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/ranges.h>

#include "common/check.h"

namespace tandem {

uint64_t fake_mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
double fake_u01(uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }

namespace {
void spin_us(double us) {
  if (us <= 0) return;
  auto end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(us * 1000));
  while (std::chrono::steady_clock::now() < end) {
  }
}
const char* kWords[] = {" ", "a", "e", "i", "o", "u", "n", "s", "t", "r", "l", "th", "er", "in",
                        " and", " the", ".", ",", "ing", "x", "y", "z", "\n", "on", "at", "en"};
constexpr uint64_t kAgreeKey = 0xA11CE;
constexpr uint64_t kConfKey = 0xC0FF;
constexpr uint64_t kAltKey = 0xA17;
constexpr uint64_t kDraftNoiseKey = 0xD0153;
constexpr uint64_t kDraftSampleKey = 0xD5A3;
}  // namespace

// ---------------- tokenizer ----------------
FakeTokenizer::FakeTokenizer(int64_t vocab_size) {
  TANDEM_CHECK(vocab_size >= 8);
  pieces_.resize(vocab_size);
  pieces_[0] = "<s>";
  pieces_[1] = "</s>";
  pieces_[2] = "\xC3";      // first byte of U+00E9
  pieces_[3] = "\xA9";      // its continuation byte
  pieces_[4] = "\xC3\xA9";  // whole
  for (int64_t i = 5; i < vocab_size - 1; ++i) {
    pieces_[i] = kWords[(i - 5) % (sizeof(kWords) / sizeof(kWords[0]))];
    if (i - 5 >= static_cast<int64_t>(sizeof(kWords) / sizeof(kWords[0])))
      pieces_[i] += std::to_string(i);  // keep pieces distinct
  }
  pieces_[vocab_size - 1] = "<noise>";
}
bool FakeTokenizer::is_special(int32_t id) const {
  return id == 0 || id == 1 || id == static_cast<int32_t>(pieces_.size()) - 1;
}
std::string FakeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(pieces_.size())) return "";
  return pieces_[id];
}
std::optional<int32_t> FakeTokenizer::token_to_id(std::string_view token) const {
  for (size_t i = 0; i < pieces_.size(); ++i)
    if (pieces_[i] == token) return static_cast<int32_t>(i);
  return std::nullopt;
}
std::string FakeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string s;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    s += token_bytes(id);
  }
  return s;
}
std::vector<int32_t> FakeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    int32_t best = -1;
    size_t best_len = 0;
    for (size_t id = 0; id < pieces_.size(); ++id) {
      const std::string& p = pieces_[id];
      if (p.size() > best_len && text.compare(i, p.size(), p) == 0) {
        best = static_cast<int32_t>(id);
        best_len = p.size();
      }
    }
    if (best < 0) {  // unknown byte: skip it
      ++i;
      continue;
    }
    ids.push_back(best);
    i += best_len;
  }
  return ids;
}

// ---------------- model ----------------
FakeModelRunner::FakeModelRunner(FakeModelConfig config)
    : config_(std::move(config)), tokenizer_(config_.vocab_size) {}

Status FakeModelRunner::check_kv_cache_dtype(const std::string& dtype) const {
  for (const auto& d : config_.kv_dtypes)
    if (d == dtype) return Status();
  return make_error(StatusCode::kInvalidArgument,
                    "kv_cache_dtype '{}' is not supported by the fake model (supported: {})", dtype,
                    fmt::join(config_.kv_dtypes, ", "));
}

int64_t FakeModelRunner::kv_bytes_per_block(int block_size, const std::string& dtype) const {
  int64_t per_token = dtype == "bf16" ? 64 : dtype == "fp8" ? 32 : 16;
  return per_token * block_size;
}

int64_t FakeModelRunner::slot_state_bytes() const { return sizeof(SlotState); }

Status FakeModelRunner::allocate(const RunnerAllocation& alloc) {
  alloc_ = alloc;
  slots_.assign(alloc.max_slots, SlotState{});
  snapshots_.assign(static_cast<size_t>(std::max(alloc.num_snapshots, 0)), SlotState{});
  snap_saved_.assign(snapshots_.size(), 0);
  pool_.assign(static_cast<size_t>(alloc.num_blocks) * alloc.block_size, -1);
  scratch_.resize(config_.vocab_size);
  sampling_.init(config_.vocab_size, eos_token_id(), noise_token_id(), alloc.max_slots);
  return Status();
}

uint64_t FakeModelRunner::acc_at(const SlotState& s, int64_t p) const {
  if (p < 0) return 0x5EED;
  return s.acc[p % kRing];
}

void FakeModelRunner::logits_from_acc(uint64_t acc, float* out) const {
  for (int64_t v = 0; v < config_.vocab_size; ++v)
    out[v] = static_cast<float>(config_.logit_scale * fake_u01(fake_mix(acc, static_cast<uint64_t>(v))));
  out[1] -= static_cast<float>(config_.eos_logit_penalty);
  // The noise id gets the top raw logit on purpose: an engine that forgets to mask it fails at once.
  out[config_.vocab_size - 1] = static_cast<float>(config_.logit_scale + 1.0);
}

int32_t FakeModelRunner::greedy_from_acc(uint64_t acc) const {
  std::vector<float>& l = const_cast<std::vector<float>&>(scratch_);
  if (l.size() < static_cast<size_t>(config_.vocab_size)) l.resize(config_.vocab_size);
  logits_from_acc(acc, l.data());
  int32_t best = 0;
  for (int64_t v = 1; v < config_.vocab_size - 1; ++v)
    if (l[v] > l[best]) best = static_cast<int32_t>(v);
  return best;
}

void FakeModelRunner::reference_logits(const std::vector<int32_t>& tokens, std::vector<float>& logits) const {
  uint64_t acc = 0x5EED;
  for (size_t p = 0; p < tokens.size(); ++p) acc = fake_mix(fake_mix(acc, static_cast<uint64_t>(tokens[p])), p);
  logits.resize(config_.vocab_size);
  logits_from_acc(acc, logits.data());
}

Status FakeModelRunner::forward(std::span<const RunnerSeq> batch, const StepSamples* samples, RunnerOutput& out) {
  ++forward_calls_;
  // Sequences that start over: reset, then the prefix-cache snapshot (which stands for the
  // draft's context window too).
  for (const auto& s : batch) {
    if (s.slot < 0 || s.slot >= static_cast<int>(slots_.size()))
      return make_error(StatusCode::kInternal, "fake model: bad slot {}", s.slot);
    if (s.reset && s.restore >= 0 && (static_cast<size_t>(s.restore) >= snapshots_.size() || !snap_saved_[s.restore]))
      return make_error(StatusCode::kInternal, "fake model: snapshot {} of {} was never saved", s.restore,
                        snapshots_.size());
  }
  last_.clear();
  for (const auto& s : batch) {
    last_.push_back({s.slot, s.start_pos});
    if (!s.reset) continue;
    slots_[s.slot] = SlotState{};
    sampling_.clear_q(s.slot);
    if (s.restore < 0) continue;
    slots_[s.slot] = snapshots_[s.restore];
    slots_[s.slot].draft_len = slots_[s.slot].len;
  }
  int64_t rows = 0, ntok = 0, tap_rows = 0;
  for (const auto& s : batch) {
    if (s.sample_rows < 0 || s.sample_rows > static_cast<int>(s.tokens.size()))
      return make_error(StatusCode::kInternal, "fake model: {} sampled rows of {} tokens", s.sample_rows,
                        s.tokens.size());
    rows += s.sample_rows;
    tap_rows += s.collect_taps ? static_cast<int64_t>(s.tokens.size()) : 0;
    ntok += static_cast<int64_t>(s.tokens.size());
  }
  forward_tokens_ += ntok;
  if (rows > max_sample_rows())
    return make_error(StatusCode::kInternal, "fake model: {} sampled rows in a step > max {}", rows, max_sample_rows());
  if (ntok > alloc_.max_tokens_per_step)
    return make_error(StatusCode::kInternal, "fake model: {} tokens in a step > max {}", ntok,
                      alloc_.max_tokens_per_step);
  logits_.resize(static_cast<size_t>(rows * config_.vocab_size));
  logits_first_row_.clear();
  taps_first_row_.clear();
  taps_.resize(static_cast<size_t>(tap_rows * 2));
  int64_t row = 0, trow = 0;
  const int bs = alloc_.block_size;
  for (const auto& s : batch) {
    if (s.slot < 0 || s.slot >= static_cast<int>(slots_.size()))
      return make_error(StatusCode::kInternal, "fake model: bad slot {}", s.slot);
    SlotState& st = slots_[s.slot];
    if (s.start_pos != st.len)
      return make_error(StatusCode::kInternal, "fake model: slot {} start_pos {} != cached length {}",
                        s.slot, s.start_pos, st.len);
    int64_t end = s.start_pos + static_cast<int64_t>(s.tokens.size());
    if (static_cast<int64_t>(s.block_table.size()) * bs < end)
      return make_error(StatusCode::kInternal, "fake model: slot {} block table covers {} < {}", s.slot,
                        s.block_table.size() * bs, end);
    logits_first_row_.push_back(row);
    taps_first_row_.push_back(s.collect_taps ? trow : -1);
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      int64_t p = s.start_pos + static_cast<int64_t>(i);
      // Cross-check what the block table says was written at the two previous positions.
      for (int64_t back = 1; back <= 2; ++back) {
        int64_t q = p - back;
        if (q < 0 || st.len - q > kRing || q >= st.len) continue;
        int32_t blk = s.block_table[q / bs];
        if (blk < 0 || blk >= alloc_.num_blocks)
          return make_error(StatusCode::kInternal, "fake model: block id {} out of range", blk);
        int32_t got = pool_[static_cast<size_t>(blk) * bs + q % bs];
        if (got != st.token[q % kRing])
          return make_error(StatusCode::kInternal,
                            "fake model: slot {} position {} reads token {} from block {} but history has {}",
                            s.slot, q, got, blk, st.token[q % kRing]);
      }
      int32_t blk = s.block_table[p / bs];
      if (blk < 0 || blk >= alloc_.num_blocks)
        return make_error(StatusCode::kInternal, "fake model: block id {} out of range", blk);
      pool_[static_cast<size_t>(blk) * bs + p % bs] = s.tokens[i];
      uint64_t acc = fake_mix(fake_mix(acc_at(st, p - 1), static_cast<uint64_t>(s.tokens[i])), p);
      st.acc[p % kRing] = acc;
      st.token[p % kRing] = s.tokens[i];
      st.len = p + 1;
      bool want = i + static_cast<size_t>(s.sample_rows) >= s.tokens.size();
      if (want) {
        logits_from_acc(acc, logits_.data() + row * config_.vocab_size);
        ++row;
      }
      if (s.collect_taps) {
        taps_[trow * 2] = static_cast<float>(s.tokens[i]);
        taps_[trow * 2 + 1] = static_cast<float>(p);
        ++trow;
      }
    }
  }
  spin_us(config_.forward_fixed_us + config_.forward_per_token_us * static_cast<double>(ntok));
  out.samples.clear();
  if (!samples) return Status();
  return sampling_.run(batch, *samples, logits_first_row_, logits_.data(), out);
}

Status FakeModelRunner::commit(std::span<const SlotCommit> commits) {
  for (const SlotCommit& c : commits) {
    if (c.batch_index < 0 || static_cast<size_t>(c.batch_index) >= last_.size() || last_[c.batch_index].first != c.slot)
      return make_error(StatusCode::kInternal, "fake model: slot {} is not batch entry {} of the last step", c.slot,
                        c.batch_index);
    SlotState& st = slots_[c.slot];
    if (c.length > st.len || st.len - c.length > alloc_.max_verify_tokens)
      return make_error(StatusCode::kInternal, "fake model: slot {} of length {} cannot keep {}", c.slot, st.len,
                        c.length);
    st.len = c.length;
    st.draft_len = std::min(st.draft_len, c.length);
    if (c.context_rows > 0 && config_.has_draft) insert_context(c, last_[c.batch_index].second);
    if (c.snapshot >= 0) {
      if (static_cast<size_t>(c.snapshot) >= snapshots_.size())
        return make_error(StatusCode::kInternal, "fake model: snapshot {} of {}", c.snapshot, snapshots_.size());
      snapshots_[c.snapshot] = st;
      snap_saved_[c.snapshot] = 1;
      ++snapshots_saved_;
    }
  }
  return Status();
}

void FakeModelRunner::insert_context(const SlotCommit& c, int64_t start_pos) {
  SlotState& st = slots_[c.slot];
  if (start_pos != st.draft_len || c.batch_index >= static_cast<int>(taps_first_row_.size()) ||
      taps_first_row_[c.batch_index] < 0) {
    ++draft_context_errors_;
    return;
  }
  const float* taps = taps_.data() + taps_first_row_[c.batch_index] * 2;
  for (int64_t r = 0; r < c.context_rows; ++r) {
    int64_t p = start_pos + r;
    bool in_ring = st.len - p <= kRing;  // older tokens are no longer in the history ring
    if (static_cast<int64_t>(taps[r * 2 + 1]) != p || p >= st.len ||
        (in_ring && static_cast<int32_t>(taps[r * 2]) != st.token[p % kRing])) {
      ++draft_context_errors_;
      return;
    }
  }
  st.draft_len = start_pos + c.context_rows;
}

Status FakeModelRunner::draft_propose(std::span<const DraftQuery> reqs, std::vector<DraftProposal>& out) {
  // K from the engine when it gave one (as the real draft does), else the whole block.
  const int K = alloc_.num_draft_tokens > 0 ? std::min(alloc_.num_draft_tokens, config_.num_draft_tokens)
                                            : config_.num_draft_tokens;
  const int64_t V = config_.vocab_size;
  out.resize(reqs.size());
  std::vector<float> l(V);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const DraftQuery& r = reqs[i];
    const SlotState& st = slots_[r.slot];
    if (st.len != r.anchor_pos || st.draft_len != r.anchor_pos) ++draft_context_errors_;
    DraftProposal& d = out[i];
    d.tokens.assign(K, 0);
    d.confidence.assign(K, 0.f);
    d.sampled = !is_greedy(r.temperature);
    float* qs = nullptr;
    if (d.sampled) {
      qs = sampling_.store_q(r.slot, K);
      std::fill(qs, qs + static_cast<int64_t>(K) * V, 0.f);
    } else {
      sampling_.clear_q(r.slot);
    }
    uint64_t acc = acc_at(st, r.anchor_pos - 1);
    int32_t prev = r.anchor_token;
    for (int k = 0; k < K; ++k) {
      int64_t pos = r.anchor_pos + k;  // position of `prev`; the draft predicts pos + 1
      acc = fake_mix(fake_mix(acc, static_cast<uint64_t>(prev)), pos);
      bool agree = fake_u01(fake_mix(acc, kAgreeKey)) < config_.draft_agree;
      double c = fake_u01(fake_mix(acc, kConfKey));
      d.confidence[k] = static_cast<float>(agree ? 0.55 + 0.45 * c : 0.6 * c);
      if (!d.sampled) {
        int32_t g = greedy_from_acc(acc);
        int32_t x = g;
        if (!agree) {
          x = static_cast<int32_t>(2 + fake_mix(acc, kAltKey) % static_cast<uint64_t>(V - 3));
          if (x == g) x = (x == V - 2) ? 2 : x + 1;
        }
        d.tokens[k] = x;
        prev = x;
      } else {
        logits_from_acc(acc, l.data());
        double sigma = (1.0 - config_.draft_agree) * 6.0;
        double mx = -1e30;
        for (int64_t v = 0; v < V; ++v) {
          l[v] = static_cast<float>((l[v] + sigma * (fake_u01(fake_mix(fake_mix(acc, kDraftNoiseKey), v)) - 0.5)) /
                                    r.temperature);
          if (v != V - 1) mx = std::max(mx, static_cast<double>(l[v]));
        }
        float* q = qs + static_cast<size_t>(k) * V;
        double sum = 0;
        for (int64_t v = 0; v < V - 1; ++v) {
          q[v] = static_cast<float>(std::exp(l[v] - mx));
          sum += q[v];
        }
        q[V - 1] = 0.f;
        double u = fake_u01(fake_mix(fake_mix(r.seed, static_cast<uint64_t>(pos + 1)), kDraftSampleKey)) * sum;
        int32_t x = static_cast<int32_t>(V - 2);
        double cum = 0;
        for (int64_t v = 0; v < V - 1; ++v) {
          cum += q[v];
          if (u < cum) {
            x = static_cast<int32_t>(v);
            break;
          }
        }
        for (int64_t v = 0; v < V; ++v) q[v] = static_cast<float>(q[v] / sum);
        d.tokens[k] = x;
        prev = x;
      }
    }
  }
  spin_us(config_.draft_fixed_us + config_.draft_per_seq_us * static_cast<double>(reqs.size()));
  return Status();
}

}  // namespace tandem

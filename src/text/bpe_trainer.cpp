// Byte-level BPE trainer and tokenizer.json writer (see bpe_trainer.h).
#include "text/bpe_trainer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <queue>
#include <set>
#include <unordered_map>

#include "common/check.h"
#include "text/pretokenizer.h"
#include "text/unicode.h"

namespace tandem {

namespace {

const char* const kBos = "<｜begin▁of▁sentence｜>";
const char* const kEos = "<｜end▁of▁sentence｜>";
const char* const kPad = "<｜▁pad▁｜>";

}  // namespace

std::vector<TrainerAddedToken> deepseek_v4_added_tokens(int32_t base) {
  std::vector<TrainerAddedToken> out;
  out.push_back({kBos, 0, true, false});
  out.push_back({kEos, 1, true, false});
  out.push_back({kPad, 2, true, false});
  // Named slots (offset from base -> content).
  const std::map<int32_t, const char*> named = {
      {800, "<｜fim▁hole｜>"}, {801, "<｜fim▁begin｜>"}, {802, "<｜fim▁end｜>"},
      {803, "<｜User｜>"}, {804, "<｜Assistant｜>"}, {805, "<|EOT|>"},
      {806, "<｜tool▁calls▁begin｜>"}, {807, "<｜tool▁calls▁end｜>"},
      {808, "<｜tool▁call▁begin｜>"}, {809, "<｜tool▁call▁end｜>"},
      {810, "<｜tool▁outputs▁begin｜>"}, {811, "<｜tool▁outputs▁end｜>"},
      {812, "<｜tool▁output▁begin｜>"}, {813, "<｜tool▁output▁end｜>"}, {814, "<｜tool▁sep｜>"},
      {815, "<｜search▁begin｜>"}, {816, "<｜search▁end｜>"}, {817, "<｜search｜>"},
      {818, "<｜extracted_url｜>"}, {819, "<｜end_of_query｜>"}, {820, "<｜task｜>"},
      {821, "<think>"}, {822, "</think>"}, {823, "<｜answer｜>"}, {824, "<｜political｜>"},
      {825, "｜DSML｜"}, {826, "<｜entity｜>"}, {827, "<｜safety｜>"},
      {828, "<｜latest_reminder｜>"}, {829, "<｜action｜>"}, {830, "<｜query｜>"},
      {831, "<｜authority｜>"}, {832, "<｜domain｜>"}, {833, "<｜begin▁sys｜>"},
      {834, "<｜end▁sys｜>"}, {835, "<｜begin▁of▁repo▁name｜>"}, {836, "<｜title｜>"},
      {837, "<｜end▁of▁repo▁name｜>"}, {838, "<｜begin▁of▁file▁name｜>"},
      {839, "<｜end▁of▁file▁name｜>"}, {840, "<｜begin▁of▁file｜>"}, {841, "<｜end▁of▁file｜>"},
      {842, "<｜rl_image_pad｜>"}, {843, "<｜rl_image_start｜>"}, {844, "<｜polygon｜>"},
      {845, "<｜read_url｜>"}, {846, "<｜/polygon｜>"}, {847, "<｜point｜>"},
      {848, "<｜/point｜>"}, {849, "<｜box｜>"}, {850, "<｜/box｜>"}, {851, "<｜ref｜>"},
      {852, "<｜/ref｜>"}, {1264, "<｜image2｜>"}, {1265, "<｜/table>｜"},
      {1266, "<｜table｜>"}, {1267, "<｜/td｜>"}, {1268, "<｜td｜>"}, {1269, "<｜/tr｜>"},
      {1270, "<｜tr｜>"}, {1279, "<｜image｜>"}};
  int mm_span = 21;
  for (int32_t k = 0; k < kNumDeepSeekExtraAddedTokens; ++k) {
    TrainerAddedToken t;
    t.id = base + k;
    if (k < 800) {
      t.content = "<｜place▁holder▁no▁" + std::to_string(k) + "｜>";
      t.special = true;  // includes the DSpark noise token (offset 799)
    } else if (auto it = named.find(k); it != named.end()) {
      t.content = it->second;
      if (k <= 814) {
        // Flags as in the real V3/V4 file: chat/tool tokens are normalized, not special
        // (decode with skip_special keeps them); <|EOT|> is both.
        t.normalized = true;
        t.special = k == 805;
      } else {
        t.special = k == 1279;  // tokens new in V4: not normalized; <｜image｜> is special
      }
    } else {
      char buf[48];  // vision span placeholders
      std::snprintf(buf, sizeof(buf), "<|place_holder_mm_span_%04d|>", mm_span++);
      t.content = buf;
    }
    out.push_back(std::move(t));
  }
  return out;
}

namespace {

struct PairHash {
  size_t operator()(uint64_t k) const { return size_t(k * 0x9E3779B97F4A7C15ull >> 17); }
};

inline uint64_t pair_key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

}  // namespace

std::string train_bpe_tokenizer_json(const std::string& corpus, int vocab_size,
                                     const BpeTrainOptions& options) {
  // 1. Pieces with counts, as the tokenizer will see them (no added-token extraction).
  auto pre = text::PreTokenizer::deepseek_v4();
  TANDEM_CHECK(pre.ok());
  std::string clean = text::utf8_lossy(corpus);
  std::vector<text::Piece> pieces;
  (*pre)->split(clean, &pieces);
  std::map<std::string_view, int64_t> counts;  // ordered: deterministic word order
  for (const auto& p : pieces) ++counts[std::string_view(clean).substr(p.offset, p.length)];

  // 2. Base vocab: bos/eos/pad, then the 256 bytes in byte-level code point order (as the real
  // file: '!' is id 3).
  std::vector<std::string> vocab = {kBos, kEos, kPad};
  std::vector<std::pair<char32_t, int>> by_cp;
  const auto& b2u = text::byte_to_unicode();
  for (int b = 0; b < 256; ++b) by_cp.push_back({b2u[b], b});
  std::sort(by_cp.begin(), by_cp.end());
  int32_t byte_id[256];
  for (auto [cp, b] : by_cp) {
    byte_id[b] = int32_t(vocab.size());
    std::string s;
    text::append_utf8(s, cp);
    vocab.push_back(s);
  }

  std::vector<Word> words;
  words.reserve(counts.size());
  for (const auto& [w, c] : counts) {
    Word word{{}, c};
    for (unsigned char b : w) word.symbols.push_back(byte_id[b]);
    words.push_back(std::move(word));
  }

  // 3. Pair statistics and the words each pair occurs in.
  std::unordered_map<uint64_t, int64_t, PairHash> pair_count;
  std::unordered_map<uint64_t, std::set<int32_t>, PairHash> where;
  for (int32_t wi = 0; wi < int32_t(words.size()); ++wi) {
    const auto& s = words[wi].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      uint64_t k = pair_key(s[i], s[i + 1]);
      pair_count[k] += words[wi].count;
      where[k].insert(wi);
    }
  }
  // Max count first; ties broken by the smaller pair key, so the result never depends on hashing.
  using Entry = std::pair<int64_t, uint64_t>;
  auto cmp = [](const Entry& x, const Entry& y) {
    return x.first != y.first ? x.first < y.first : x.second > y.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> queue(cmp);
  for (const auto& [k, c] : pair_count) queue.push({c, k});

  std::vector<std::pair<int32_t, int32_t>> merges;
  std::unordered_map<std::string, int32_t> vocab_index;
  for (int32_t i = 0; i < int32_t(vocab.size()); ++i) vocab_index[vocab[i]] = i;
  while (int(vocab.size()) < vocab_size && !queue.empty()) {
    auto [c, k] = queue.top();
    queue.pop();
    auto it = pair_count.find(k);
    int64_t current = it == pair_count.end() ? 0 : it->second;
    if (current != c) {
      if (current > 0) queue.push({current, k});
      continue;
    }
    if (c < options.min_frequency) break;
    int32_t a = int32_t(k >> 32), b = int32_t(k & 0xFFFFFFFFu);
    std::string merged = vocab[a] + vocab[b];
    int32_t new_id;
    if (auto vi = vocab_index.find(merged); vi != vocab_index.end()) {
      new_id = vi->second;  // the same string reached by another split: reuse it
    } else {
      new_id = int32_t(vocab.size());
      vocab.push_back(merged);
      vocab_index[merged] = new_id;
    }
    merges.push_back({a, b});
    std::set<int32_t> affected = std::move(where[k]);
    where.erase(k);
    std::map<uint64_t, int64_t> delta;
    for (int32_t wi : affected) {
      auto& s = words[wi].symbols;
      int64_t wc = words[wi].count;
      std::vector<int32_t> out;
      out.reserve(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          out.push_back(new_id);
          ++i;
        } else {
          out.push_back(s[i]);
        }
      }
      for (size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= wc;
      for (size_t i = 0; i + 1 < out.size(); ++i) {
        uint64_t nk = pair_key(out[i], out[i + 1]);
        delta[nk] += wc;
        where[nk].insert(wi);
      }
      s = std::move(out);
    }
    for (const auto& [pk, d] : delta) {
      if (d == 0) continue;
      int64_t& pc = pair_count[pk];
      pc += d;
      if (d > 0) queue.push({pc, pk});
      if (pc <= 0) pair_count.erase(pk);
    }
    pair_count.erase(k);
  }

  // 4. tokenizer.json (HF format 1.0).
  using ojson = nlohmann::ordered_json;
  int32_t base = int32_t(vocab.size());
  std::vector<TrainerAddedToken> added;
  if (options.deepseek_added) {
    added = deepseek_v4_added_tokens(base);
  } else {
    added = {{kBos, 0, true, false}, {kEos, 1, true, false}, {kPad, 2, true, false}};
  }
  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  ojson at = ojson::array();
  for (const auto& t : added) {
    ojson e;
    e["id"] = t.id;
    e["content"] = t.content;
    e["single_word"] = false;
    e["lstrip"] = false;
    e["rstrip"] = false;
    e["normalized"] = t.normalized;
    e["special"] = t.special;
    at.push_back(e);
  }
  j["added_tokens"] = at;
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", ojson::array()}};
  ojson pts = ojson::array();
  for (const auto& p : text::deepseek_v4_split_patterns())
    pts.push_back({{"type", "Split"},
                   {"pattern", {{"Regex", p}}},
                   {"behavior", "Isolated"},
                   {"invert", false}});
  pts.push_back({{"type", "ByteLevel"},
                 {"add_prefix_space", false},
                 {"trim_offsets", true},
                 {"use_regex", false}});
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", pts}};
  j["post_processor"] = {{"type", "ByteLevel"},
                         {"add_prefix_space", true},
                         {"trim_offsets", false},
                         {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", true},
                  {"use_regex", true}};
  ojson model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = false;
  ojson v = ojson::object();
  for (int32_t i = 0; i < base; ++i) v[vocab[i]] = i;
  model["vocab"] = v;
  ojson m = ojson::array();
  for (auto [a, b] : merges) m.push_back(vocab[a] + " " + vocab[b]);
  model["merges"] = m;
  j["model"] = model;
  return j.dump(1) + "\n";
}

std::string train_tiny_tokenizer_json(uint64_t seed) {
  return train_bpe_tokenizer_json(generate_tiny_corpus(seed), kTinyBaseVocabSize);
}

}  // namespace tandem

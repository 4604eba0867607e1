// Byte-level BPE tokenizer read from an HF tokenizer.json (see tokenizer.h). Encoding follows the
// HF `tokenizers` pipeline step by step so ids match it exactly:
//   added tokens (two passes: normalized=false on the raw text, then normalized=true in the gaps;
//   leftmost-longest, lstrip/rstrip/single_word) -> Split regexes (pretokenizer.h) -> bytes ->
//   BPE merges with HF's heap order (lowest rank, then leftmost; stale entries checked by new id).
#include "text/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_map>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/check.h"
#include "common/log.h"
#include "text/pretokenizer.h"
#include "text/unicode.h"

namespace tandem {

namespace {

using json = nlohmann::json;

// ---- merge table: (left id, right id) -> (rank, merged id), open addressing -------------------
class PairMap {
 public:
  struct Value {
    int32_t rank;
    int32_t new_id;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, {0, 0});
    mask_ = cap - 1;
  }
  void insert_or_assign(int32_t a, int32_t b, Value v) {
    uint64_t k = key(a, b);
    size_t i = slot(k);
    while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & mask_;
    keys_[i] = k;
    values_[i] = v;
  }
  const Value* find(int32_t a, int32_t b) const {
    uint64_t k = key(a, b);
    size_t i = slot(k);
    while (true) {
      if (keys_[i] == k) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }
  size_t slot(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t mask_ = 0;
};

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Byte trie over added-token contents; leftmost-longest matching like aho-corasick's
// MatchKind::LeftmostLongest (at the first position where any token matches, the longest wins).
class TokenTrie {
 public:
  TokenTrie() { nodes_.emplace_back(); }
  void add(std::string_view s, int32_t token_index) {
    int32_t n = 0;
    for (unsigned char c : s) {
      int32_t child = find_child(n, c);
      if (child < 0) {
        child = int32_t(nodes_.size());
        nodes_.emplace_back();
        nodes_[n].children.push_back({c, child});
      }
      n = child;
    }
    if (nodes_[n].token < 0) nodes_[n].token = token_index;
    if (!s.empty()) first_byte_[static_cast<unsigned char>(s[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // Finds the leftmost-longest match in text[from..]; returns false if none.
  bool find(std::string_view text, size_t from, size_t* start, size_t* end, int32_t* token) const {
    for (size_t i = from; i < text.size(); ++i) {
      if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
      int32_t n = 0, best = -1;
      size_t best_end = 0;
      for (size_t j = i; j < text.size(); ++j) {
        n = find_child(n, static_cast<unsigned char>(text[j]));
        if (n < 0) break;
        if (nodes_[n].token >= 0) {
          best = nodes_[n].token;
          best_end = j + 1;
        }
      }
      if (best >= 0) {
        *start = i;
        *end = best_end;
        *token = best;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;
  };
  int32_t find_child(int32_t n, unsigned char c) const {
    for (const auto& [b, child] : nodes_[n].children)
      if (b == c) return child;
    return -1;
  }
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
  bool empty_ = true;
};

// Rust regex \w (Unicode): Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(std::string_view s, size_t i) {
  static pcre2_code* re = [] {
    int err;
    PCRE2_SIZE off;
    const char* pat = R"([\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])";
    return pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &off, nullptr);
  }();
  TANDEM_CHECK(re != nullptr);
  thread_local pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  return pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), i, PCRE2_NO_UTF_CHECK,
                     md, nullptr) >= 0;
}

// Start of the last character of s[..end] (end > 0).
size_t prev_char_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

// A segment of the input after added-token extraction: either an added token or plain text.
struct Segment {
  int32_t token_id;  // -1 for text
  size_t begin, end;
};

class BpeTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& text);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  std::string token_bytes(int32_t id) const override {
    return id >= 0 && size_t(id) < id_bytes_.size() ? id_bytes_[id] : std::string();
  }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end())
      return added_[it->second].id;
    if (auto it = vocab_.find(token); it != vocab_.end()) return it->second;
    return std::nullopt;
  }
  bool is_special(int32_t id) const override {
    return id >= 0 && size_t(id) < special_.size() && special_[id];
  }
  int64_t vocab_size() const override { return int64_t(id_bytes_.size()); }

 private:
  void split_added(std::string_view text, const TokenTrie& trie, size_t begin, size_t end,
                   std::vector<Segment>* out) const;
  void bpe(std::string_view piece, std::vector<int32_t>* out) const;

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // byte-level spelling -> id; string_view lookups without copies
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, size_t> added_by_content_;
  std::vector<int32_t> added_index_by_id_;  // id -> index in added_, or -1
  std::vector<std::string> id_bytes_;       // decoded bytes per id ("" for holes)
  std::vector<uint8_t> special_;
  std::vector<uint8_t> has_id_;
  int32_t byte_id_[256];
  PairMap merges_;
  bool ignore_merges_ = false;
  TokenTrie raw_trie_, normalized_trie_;
  std::unique_ptr<text::PreTokenizer> pre_;
};

// ---- loading ---------------------------------------------------------------------------------

Status check_null_or(const json& obj, const char* key, const char* what) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status();
  if (it->is_string() && it->get<std::string>().empty()) return Status();
  return invalid_argument("tokenizer.json: model.{} = {} is not supported ({})", key, it->dump(),
                          what);
}

bool flag(const json& obj, const char* key, bool dflt) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : dflt;
}

// Collects the Split regexes of a pre_tokenizer tree; ByteLevel must come last.
Status collect_pre_tokenizer(const json& node, std::vector<std::string>* patterns,
                             std::vector<bool>* literal, bool* byte_level) {
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string())
    return invalid_argument("tokenizer.json: pre_tokenizer entry without a type: {}",
                            node.dump().substr(0, 200));
  std::string type = node["type"];
  if (*byte_level)
    return invalid_argument("tokenizer.json: pre_tokenizer '{}' after ByteLevel is not supported",
                            type);
  if (type == "Sequence") {
    if (!node.contains("pretokenizers") || !node["pretokenizers"].is_array())
      return invalid_argument("tokenizer.json: pre_tokenizer Sequence without 'pretokenizers'");
    for (const auto& child : node["pretokenizers"])
      TANDEM_RETURN_IF_ERROR(collect_pre_tokenizer(child, patterns, literal, byte_level));
    return Status();
  }
  if (type == "Split") {
    std::string behavior = node.value("behavior", "");
    if (behavior != "Isolated")
      return invalid_argument("tokenizer.json: Split behavior '{}' is not supported (Isolated only)",
                              behavior);
    if (flag(node, "invert", false))
      return invalid_argument("tokenizer.json: Split with invert=true is not supported");
    const json& pat = node.value("pattern", json());
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      patterns->push_back(pat["Regex"]);
      literal->push_back(false);
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      patterns->push_back(pat["String"]);
      literal->push_back(true);
    } else {
      return invalid_argument("tokenizer.json: Split pattern must be {{\"Regex\"|\"String\": ...}}");
    }
    return Status();
  }
  if (type == "ByteLevel") {
    if (flag(node, "add_prefix_space", false))
      return invalid_argument("tokenizer.json: ByteLevel add_prefix_space=true is not supported");
    if (flag(node, "use_regex", true)) {
      patterns->push_back(text::gpt2_split_pattern());
      literal->push_back(false);
    }
    *byte_level = true;
    return Status();
  }
  return invalid_argument("tokenizer.json: pre_tokenizer type '{}' is not supported", type);
}

Status check_decoder(const json& node) {
  if (node.is_null()) return invalid_argument("tokenizer.json: decoder is null (ByteLevel expected)");
  std::string type = node.is_object() ? node.value("type", "") : "";
  if (type == "ByteLevel") return Status();
  if (type == "Sequence" && node.contains("decoders") && node["decoders"].is_array() &&
      node["decoders"].size() == 1)
    return check_decoder(node["decoders"][0]);
  return invalid_argument("tokenizer.json: decoder '{}' is not supported (ByteLevel only)",
                          node.dump().substr(0, 200));
}

Status check_normalizer(const json& node) {
  if (node.is_null()) return Status();
  if (node.is_object() && node.value("type", "") == "Sequence" && node.contains("normalizers") &&
      node["normalizers"].is_array() && node["normalizers"].empty())
    return Status();
  return invalid_argument("tokenizer.json: normalizer {} is not supported (none or empty Sequence)",
                          node.dump().substr(0, 200));
}

Result<std::unique_ptr<Tokenizer>> BpeTokenizer::load(const std::string& text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object())
    return invalid_argument("tokenizer.json: not a JSON object");
  auto tok = std::make_unique<BpeTokenizer>();
  try {
    if (!doc.contains("model") || !doc["model"].is_object())
      return invalid_argument("tokenizer.json: missing 'model'");
    const json& model = doc["model"];
    std::string type = model.value("type", "BPE");
    if (type != "BPE")
      return invalid_argument("tokenizer.json: model.type '{}' is not supported (BPE only)", type);
    if (model.contains("dropout") && !model["dropout"].is_null() &&
        !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
      return invalid_argument("tokenizer.json: model.dropout is not supported");
    TANDEM_RETURN_IF_ERROR(check_null_or(model, "unk_token", "byte-level BPE needs no unk"));
    TANDEM_RETURN_IF_ERROR(check_null_or(model, "continuing_subword_prefix", "unsupported"));
    TANDEM_RETURN_IF_ERROR(check_null_or(model, "end_of_word_suffix", "unsupported"));
    if (flag(model, "byte_fallback", false))
      return invalid_argument("tokenizer.json: model.byte_fallback=true is not supported");
    tok->ignore_merges_ = flag(model, "ignore_merges", false);
    TANDEM_RETURN_IF_ERROR(check_normalizer(doc.value("normalizer", json())));
    TANDEM_RETURN_IF_ERROR(check_decoder(doc.value("decoder", json())));

    // Vocabulary.
    if (!model.contains("vocab") || !model["vocab"].is_object())
      return invalid_argument("tokenizer.json: model.vocab must be an object");
    int64_t max_id = -1;
    tok->vocab_.reserve(model["vocab"].size() * 2);
    for (const auto& [spelled, idv] : model["vocab"].items()) {
      if (!idv.is_number_integer() || idv.get<int64_t>() < 0 || idv.get<int64_t>() > INT32_MAX - 1)
        return invalid_argument("tokenizer.json: vocab['{}'] has a bad id {}", spelled, idv.dump());
      int32_t id = idv.get<int32_t>();
      tok->vocab_[spelled] = id;
      max_id = std::max<int64_t>(max_id, id);
    }

    // Added tokens.
    const json& added = doc.value("added_tokens", json::array());
    if (!added.is_array()) return invalid_argument("tokenizer.json: added_tokens must be an array");
    int64_t added_max = -1;
    for (size_t i = 0; i < added.size(); ++i) {
      const json& a = added[i];
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string() || a["id"].get<int64_t>() < 0 ||
          a["id"].get<int64_t>() > INT32_MAX - 1)
        return invalid_argument("tokenizer.json: added_tokens[{}] needs an integer id and content",
                                i);
      AddedToken t;
      t.content = a["content"];
      // HF ignores the stored id: a content already in the model vocab keeps that id, any other
      // gets the next id after the vocab / the previous added tokens (AddedVocabulary::add_tokens).
      // Files HF wrote agree with this; for others, follow HF and say so.
      if (auto vit = tok->vocab_.find(t.content); vit != tok->vocab_.end()) {
        t.id = vit->second;
      } else {
        int64_t n_vocab = int64_t(tok->vocab_.size());
        t.id = int32_t(added_max < 0 ? n_vocab
                                     : (added_max >= n_vocab || n_vocab == 0 ? added_max + 1 : n_vocab));
      }
      added_max = std::max<int64_t>(added_max, t.id);
      if (t.id != a["id"].get<int64_t>())
        TLOG_WARN("tokenizer", "added token '{}' is stored with id {} but gets id {} (as in HF)",
                  t.content, a["id"].get<int64_t>(), t.id);
      if (t.content.empty())
        return invalid_argument("tokenizer.json: added_tokens[{}] has empty content", i);
      if (!text::is_valid_utf8(t.content))
        return invalid_argument("tokenizer.json: added_tokens[{}] is not UTF-8", i);
      t.single_word = flag(a, "single_word", false);
      t.lstrip = flag(a, "lstrip", false);
      t.rstrip = flag(a, "rstrip", false);
      t.normalized = flag(a, "normalized", true);
      t.special = flag(a, "special", false);
      max_id = std::max<int64_t>(max_id, t.id);
      if (tok->added_by_content_.count(t.content))
        return invalid_argument("tokenizer.json: added token '{}' appears twice", t.content);
      tok->added_by_content_[t.content] = tok->added_.size();
      tok->added_.push_back(std::move(t));
    }
    size_t n = size_t(max_id + 1);
    tok->id_bytes_.assign(n, std::string());
    tok->special_.assign(n, 0);
    tok->has_id_.assign(n, 0);
    tok->added_index_by_id_.assign(n, -1);
    for (const auto& [spelled, id] : tok->vocab_) {
      tok->has_id_[id] = 1;
      std::string bytes;
      tok->id_bytes_[id] = text::byte_level_to_bytes(spelled, &bytes) ? bytes : spelled;
    }
    for (size_t i = 0; i < tok->added_.size(); ++i) {
      const AddedToken& t = tok->added_[i];
      if (tok->added_index_by_id_[t.id] >= 0)
        return invalid_argument("tokenizer.json: two added tokens share id {}", t.id);
      tok->added_index_by_id_[t.id] = int32_t(i);
      tok->has_id_[t.id] = 1;
      tok->special_[t.id] = t.special;
      std::string bytes;
      tok->id_bytes_[t.id] = text::byte_level_to_bytes(t.content, &bytes) ? bytes : t.content;
      (t.normalized ? tok->normalized_trie_ : tok->raw_trie_).add(t.content, int32_t(i));
    }

    // Single-byte tokens.
    const auto& b2u = text::byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
      std::string s;
      text::append_utf8(s, b2u[b]);
      auto it = tok->vocab_.find(s);
      tok->byte_id_[b] = it == tok->vocab_.end() ? -1 : it->second;
    }

    // Merges: "a b" strings or [a, b] pairs; rank = position, later duplicates win (as in HF).
    if (!model.contains("merges") || !model["merges"].is_array())
      return invalid_argument("tokenizer.json: model.merges must be an array");
    const json& merges = model["merges"];
    tok->merges_.reserve(merges.size());
    std::string ab;
    for (size_t r = 0; r < merges.size(); ++r) {
      const json& m = merges[r];
      std::string_view a, b;
      if (m.is_string()) {
        std::string_view s = m.get_ref<const std::string&>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          return invalid_argument("tokenizer.json: merges[{}] '{}' is not 'a b'", r, s);
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get_ref<const std::string&>();
        b = m[1].get_ref<const std::string&>();
      } else {
        return invalid_argument("tokenizer.json: merges[{}] is neither 'a b' nor [a, b]", r);
      }
      ab.assign(a);
      ab.append(b);
      auto ia = tok->vocab_.find(a), ib = tok->vocab_.find(b), iab = tok->vocab_.find(ab);
      if (ia == tok->vocab_.end() || ib == tok->vocab_.end() || iab == tok->vocab_.end())
        return invalid_argument("tokenizer.json: merges[{}] ('{}', '{}') uses a token missing from "
                                "the vocab", r, a, b);
      tok->merges_.insert_or_assign(ia->second, ib->second, {int32_t(r), iab->second});
    }

    // Pre-tokenizer.
    std::vector<std::string> patterns;
    std::vector<bool> literal;
    bool byte_level = false;
    const json& pre = doc.value("pre_tokenizer", json());
    if (pre.is_null())
      return invalid_argument("tokenizer.json: pre_tokenizer is null (ByteLevel expected)");
    TANDEM_RETURN_IF_ERROR(collect_pre_tokenizer(pre, &patterns, &literal, &byte_level));
    if (!byte_level)
      return invalid_argument("tokenizer.json: pre_tokenizer has no ByteLevel step");
    auto pt = text::PreTokenizer::create(patterns, literal);
    if (!pt.ok()) return pt.status().with_context("tokenizer.json pre_tokenizer");
    tok->pre_ = std::move(pt.value());
  } catch (const json::exception& e) {
    return invalid_argument("tokenizer.json: {}", e.what());
  }
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

// ---- encoding --------------------------------------------------------------------------------

void BpeTokenizer::split_added(std::string_view text, const TokenTrie& trie, size_t begin,
                               size_t end, std::vector<Segment>* out) const {
  std::string_view sub = text.substr(0, end);
  size_t start_offset = begin, pos = begin, ms, me;
  int32_t ti;
  while (!trie.empty() && trie.find(sub, pos, &ms, &me, &ti)) {
    pos = me;
    const AddedToken& t = added_[ti];
    size_t start = ms, stop = me;
    if (t.single_word) {
      bool start_space = start == begin || !is_word_char(sub, prev_char_start(sub, start));
      bool stop_space = stop == end || !is_word_char(sub, stop);
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > begin) {
        size_t p = prev_char_start(sub, s);
        char32_t cp;
        if (!text::decode_utf8(sub, p, &cp) || !text::is_unicode_whitespace(cp)) break;
        s = p;
      }
      start = std::max(s, start_offset);
    }
    if (t.rstrip) {
      char32_t cp;
      size_t k;
      while (stop < end && (k = text::decode_utf8(sub, stop, &cp)) && text::is_unicode_whitespace(cp))
        stop += k;
    }
    if (start_offset < start) out->push_back({-1, start_offset, start});
    out->push_back({t.id, start, stop});
    start_offset = stop;
  }
  if (start_offset < end) out->push_back({-1, start_offset, end});
}

void BpeTokenizer::bpe(std::string_view piece, std::vector<int32_t>* out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(text::bytes_to_byte_level(piece));
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t c, prev, next, len;
  };
  struct Merge {
    int32_t pos, rank, new_id;
  };
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Merge> heap;
  sym.clear();
  heap.clear();
  for (unsigned char b : piece) {
    int32_t id = byte_id_[b];
    if (id < 0) continue;  // HF drops characters missing from the vocab when there is no unk
    int32_t i = int32_t(sym.size());
    sym.push_back({id, i - 1, i + 1, 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  // Max-heap comparator whose top is the lowest (rank, pos), as HF's Merge ordering.
  auto cmp = [](const Merge& x, const Merge& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i)
    if (const auto* m = merges_.find(sym[i].c, sym[i + 1].c))
      heap.push_back({int32_t(i), m->rank, m->new_id});
  std::make_heap(heap.begin(), heap.end(), cmp);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    Merge top = heap.back();
    heap.pop_back();
    Symbol& cur = sym[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    int32_t next_pos = cur.next;
    const auto* m = merges_.find(cur.c, sym[next_pos].c);
    if (!m || m->new_id != top.new_id) continue;  // expired entry
    cur.c = top.new_id;
    cur.len += sym[next_pos].len;
    cur.next = sym[next_pos].next;
    sym[next_pos].len = 0;
    if (cur.next >= 0) sym[cur.next].prev = top.pos;
    if (cur.prev >= 0)
      if (const auto* pm = merges_.find(sym[cur.prev].c, cur.c)) {
        heap.push_back({cur.prev, pm->rank, pm->new_id});
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    if (cur.next >= 0)
      if (const auto* nm = merges_.find(cur.c, sym[cur.next].c)) {
        heap.push_back({top.pos, nm->rank, nm->new_id});
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
  }
  for (int32_t i = 0; i >= 0 && i < int32_t(sym.size()); i = sym[i].next) out->push_back(sym[i].c);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view input) const {
  std::vector<int32_t> ids;
  if (input.empty()) return ids;
  // HF only ever sees valid UTF-8 (Python str); repair anything else the same way Python would
  // have to before calling it.
  std::string repaired;
  std::string_view text = input;
  if (!text::is_valid_utf8(input)) {
    repaired = text::utf8_lossy(input);
    text = repaired;
  }
  ids.reserve(text.size() / 3 + 8);

  std::vector<Segment> first, segments;
  split_added(text, raw_trie_, 0, text.size(), &first);
  for (const Segment& s : first) {
    if (s.token_id >= 0)
      segments.push_back(s);
    else
      split_added(text, normalized_trie_, s.begin, s.end, &segments);
  }

  // Per-call piece cache: most pieces of a long text repeat.
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;
  std::vector<int32_t> cached_ids;
  std::vector<text::Piece> pieces;
  for (const Segment& s : segments) {
    if (s.token_id >= 0) {
      ids.push_back(s.token_id);
      continue;
    }
    pieces.clear();
    std::string_view seg = text.substr(s.begin, s.end - s.begin);
    pre_->split(seg, &pieces);
    for (const text::Piece& p : pieces) {
      std::string_view piece = seg.substr(p.offset, p.length);
      if (piece.size() == 1 && byte_id_[static_cast<unsigned char>(piece[0])] >= 0) {
        ids.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
        continue;
      }
      auto [it, inserted] = cache.try_emplace(piece, 0u, 0u);
      if (inserted) {
        size_t before = cached_ids.size();
        bpe(piece, &cached_ids);
        it->second = {uint32_t(before), uint32_t(cached_ids.size() - before)};
      }
      ids.insert(ids.end(), cached_ids.begin() + it->second.first,
                 cached_ids.begin() + it->second.first + it->second.second);
    }
  }
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= id_bytes_.size() || !has_id_[id]) continue;
    if (skip_special && special_[id]) continue;
    bytes += id_bytes_[id];
  }
  return text::utf8_lossy(bytes);
}

std::string read_file(const std::string& path, Status* st) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *st = not_found("cannot open tokenizer file '{}'", path);
    return {};
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(const std::string& tokenizer_json_text) {
  return BpeTokenizer::load(tokenizer_json_text);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_file(const std::string& path) {
  Status st;
  std::string text = read_file(path, &st);
  if (!st.ok()) return st;
  auto r = BpeTokenizer::load(text);
  if (!r.ok()) return r.status().with_context(path);
  return r;
}

// ---- streaming detokenizer -------------------------------------------------------------------

std::string IncrementalDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    char32_t cp;
    size_t n = text::decode_utf8(pending_, i, &cp);
    if (n) {
      out.append(pending_, i, n);
      i += n;
    } else if (text::is_incomplete_utf8_prefix(pending_, i)) {
      break;  // wait for the rest of this character
    } else {
      text::append_utf8(out, text::kReplacementChar);
      i += text::invalid_subpart_length(pending_, i);
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out = text::utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace tandem

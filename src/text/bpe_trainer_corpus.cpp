// The tiny tokenizer's training text, generated (not fetched, not stored): a deterministic mix of
// English prose, Python, JSON, numbers and counting, chat/markdown, CJK, kana, Korean, emoji (with
// ZWJ sequences and flags), other scripts, combining marks and varied whitespace. Part of
// bpe_trainer.h; kept apart so the trainer file stays about training.
#include <cstdint>
#include <string>
#include <vector>

#include "text/bpe_trainer.h"

namespace tandem {

namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed ^ 0x7A6E64656D5F7431ull) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int below(int n) { return int(next() % uint64_t(n)); }
  template <typename T>
  const T& pick(const std::vector<T>& v) { return v[size_t(below(int(v.size())))]; }
  bool chance(int percent) { return below(100) < percent; }

 private:
  uint64_t s_;
};

using Words = std::vector<std::string>;

const Words kNouns = {"model", "token", "server", "request", "cache", "layer", "expert", "river",
                      "mountain", "city", "garden", "window", "letter", "engine", "student",
                      "teacher", "book", "question", "answer", "market", "system", "network",
                      "memory", "process", "function", "value", "number", "library", "friend",
                      "morning", "evening", "story", "house", "table", "computer", "language",
                      "weather", "music", "problem", "result", "draft", "batch", "kernel"};
const Words kAdjs = {"quick", "small", "large", "bright", "quiet", "careful", "simple", "strange",
                     "green", "ancient", "modern", "fast", "slow", "happy", "useful", "empty",
                     "full", "hidden", "open", "final", "first", "last", "new", "old", "good"};
const Words kVerbs = {"reads", "writes", "builds", "finds", "sends", "holds", "moves", "checks",
                      "opens", "closes", "follows", "carries", "changes", "returns", "computes",
                      "predicts", "shows", "loads", "stores", "counts", "explains", "answers"};
const Words kPreps = {"in", "on", "under", "near", "behind", "across", "with", "without",
                      "before", "after", "through", "into", "from", "over"};
const Words kNames = {"Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry",
                      "Isabel", "Jack", "Mei", "Ravi", "Sofia", "Yuki", "Omar", "Zoe"};
const Words kOpeners = {"However, ", "Meanwhile, ", "In fact, ", "Of course, ", "Later, ",
                        "Surprisingly, ", "", "", "", "Then ", "Still, ", "Yesterday "};
const Words kIdents = {"count", "total", "items", "result", "index", "name", "value", "data",
                       "tokens", "scores", "buffer", "offset", "length", "config", "path", "key"};
const Words kKeys = {"id", "name", "type", "value", "items", "enabled", "count", "tags", "price",
                     "created_at", "user", "role", "content", "model", "temperature", "max_tokens"};
const Words kCjk = {"我们", "今天", "天气", "很好", "学习", "中文", "模型", "数据", "时间", "问题",
                    "世界", "你好", "朋友", "工作", "电脑", "语言", "城市", "历史", "文化", "生活",
                    "这个", "那个", "可以", "没有", "非常", "重要", "开始", "结束", "东西", "知道"};
const Words kKana = {"こんにちは", "ありがとう", "すし", "カタカナ", "ひらがな", "コンピュータ",
                     "トークン", "です", "ます", "ラーメン", "ゲーム", "とても", "きれい", "ニュース"};
const Words kHangul = {"안녕하세요", "감사합니다", "한국어", "컴퓨터", "학교", "사랑", "오늘"};
const Words kOther = {"Καλημέρα", "κόσμε", "Привет", "мир", "спасибо", "مرحبا", "شكرا",
                      "नमस्ते", "धन्यवाद", "café", "naïve", "résumé", "Straße", "Ærø", "señor",
                      "cafe\u0301", "n\u0303o", "ﬁle", "İstanbul", "Łódź", "שלום"};
const Words kEmoji = {"😀", "😂", "🎉", "🚀", "🌍", "❤️", "👍🏽", "🇯🇵", "🇺🇸",
                      "👨‍👩‍👧‍👦", "👩‍💻", "🏳️‍🌈", "✨", "🔥", "🤖", "☕", "🙏", "✅"};

std::string sentence(Rng& r) {
  std::string s = r.pick(kOpeners);
  std::string subj = r.chance(30) ? r.pick(kNames) : "the " + r.pick(kAdjs) + " " + r.pick(kNouns);
  if (s.empty() || s.back() == ' ') {
    if (s.empty() && !subj.empty() && subj[0] >= 'a' && subj[0] <= 'z') subj[0] = char(subj[0] - 32);
  }
  s += subj + " " + r.pick(kVerbs) + " the " + r.pick(kNouns);
  if (r.chance(60)) s += " " + r.pick(kPreps) + " the " + r.pick(kAdjs) + " " + r.pick(kNouns);
  if (r.chance(20)) s += ", and it's " + r.pick(kAdjs);
  if (r.chance(10)) s += " (about " + std::to_string(r.below(1000)) + " times)";
  switch (r.below(8)) {
    case 0: return s + "?";
    case 1: return s + "!";
    case 2: return "\"" + s + ",\" " + r.pick(kNames) + " said.";
    default: return s + ".";
  }
}

void prose(Rng& r, std::string& out) {
  int n = 3 + r.below(6);
  for (int i = 0; i < n; ++i) out += (i ? " " : "") + sentence(r);
  out += r.chance(10) ? "\r\n\r\n" : "\n\n";
}

void python(Rng& r, std::string& out) {
  const std::string f = r.pick(kIdents) + "_" + r.pick(kIdents);
  const std::string a = r.pick(kIdents), b = r.pick(kIdents);
  out += "def " + f + "(" + a + ", " + b + "=None):\n";
  out += "    \"\"\"Return the " + r.pick(kAdjs) + " " + r.pick(kNouns) + ".\"\"\"\n";
  out += "    if " + b + " is None:\n        " + b + " = []\n";
  out += "    for i in range(" + std::to_string(r.below(100)) + "):\n";
  out += "        " + b + ".append(" + a + "[i] * " + std::to_string(r.below(10)) + ")\n";
  if (r.chance(50)) out += "        # " + sentence(r) + "\n";
  if (r.chance(30)) out += "\tprint(f\"{" + a + "!r}: {len(" + b + ")}\")\n";
  out += "    return {\"" + a + "\": " + a + ", \"" + b + "\": " + b + "}\n\n";
  if (r.chance(40)) {
    out += "class " + std::string(1, char('A' + r.below(26))) + r.pick(kNouns) + ":\n";
    out += "    def __init__(self, " + a + "):\n        self." + a + " = " + a + "\n\n";
    out += "    def __repr__(self):\n        return f\"<{self." + a + "}>\"\n\n";
  }
  if (r.chance(30)) out += ">>> " + f + "([1, 2, 3])\n{'" + a + "': [1, 2, 3]}\n\n";
}

void json_value(Rng& r, std::string& out, int depth, bool pretty, int indent) {
  auto nl = [&](int ind) {
    if (pretty) out += "\n" + std::string(size_t(ind), ' ');
  };
  int kind = depth > 2 ? r.below(5) : r.below(7);
  switch (kind) {
    case 0: out += std::to_string(r.below(100000) - 500); break;
    case 1: out += std::to_string(r.below(1000)) + "." + std::to_string(r.below(1000)); break;
    case 2: out += "\"" + r.pick(kNouns) + " " + r.pick(kAdjs) + "\""; break;
    case 3: out += r.chance(50) ? "true" : (r.chance(50) ? "false" : "null"); break;
    case 4: out += "\"" + r.pick(kCjk) + r.pick(kEmoji) + "\""; break;
    case 5: {
      out += "[";
      int n = 1 + r.below(4);
      for (int i = 0; i < n; ++i) {
        if (i) out += pretty ? "," : ", ";
        nl(indent + 2);
        json_value(r, out, depth + 1, pretty, indent + 2);
      }
      nl(indent);
      out += "]";
      break;
    }
    default: {
      out += "{";
      int n = 1 + r.below(4);
      for (int i = 0; i < n; ++i) {
        if (i) out += pretty ? "," : ", ";
        nl(indent + 2);
        out += "\"" + r.pick(kKeys) + "\": ";
        json_value(r, out, depth + 1, pretty, indent + 2);
      }
      nl(indent);
      out += "}";
    }
  }
}

void numbers(Rng& r, std::string& out) {
  switch (r.below(6)) {
    case 0: {  // counting
      int start = r.below(50), n = 10 + r.below(60);
      const char* sep = r.chance(50) ? ", " : (r.chance(50) ? "\n" : " ");
      for (int i = 0; i < n; ++i) out += (i ? sep : "") + std::to_string(start + i);
      out += "\n\n";
      break;
    }
    case 1: {  // arithmetic
      for (int i = 0; i < 8; ++i) {
        int a = r.below(100), b = r.below(100);
        out += std::to_string(a) + " x " + std::to_string(b) + " = " + std::to_string(a * b) +
               "; " + std::to_string(a) + " + " + std::to_string(b) + " = " +
               std::to_string(a + b) + "\n";
      }
      out += "\n";
      break;
    }
    case 2: {  // dates, times, big numbers
      out += "On " + std::to_string(1990 + r.below(40)) + "-" + std::to_string(10 + r.below(3)) +
             "-" + std::to_string(10 + r.below(19)) + " at " + std::to_string(r.below(24)) + ":" +
             std::to_string(10 + r.below(50)) + ", the total was $" +
             std::to_string(r.next() % 100000000) + "." + std::to_string(10 + r.below(90)) +
             " (" + std::to_string(r.below(100)) + "%).\n\n";
      break;
    }
    case 3: {  // ordered list
      for (int i = 1; i <= 3 + r.below(5); ++i) out += std::to_string(i) + ". " + sentence(r) + "\n";
      out += "\n";
      break;
    }
    case 4: {  // table
      out += "| name | count | score |\n|------|------:|------:|\n";
      for (int i = 0; i < 4; ++i)
        out += "| " + r.pick(kNames) + " | " + std::to_string(r.below(500)) + " | 0." +
               std::to_string(r.below(1000)) + " |\n";
      out += "\n";
      break;
    }
    default: {
      out += "pi = 3.14159265358979, e = 2.71828182845904, 1e-6, 0x" +
             std::to_string(r.below(9999)) + "FF, -" + std::to_string(r.next() % 1000000000) +
             "\n\n";
    }
  }
}

void cjk(Rng& r, std::string& out) {
  int n = 4 + r.below(10);
  for (int i = 0; i < n; ++i) {
    out += r.pick(kCjk);
    if (r.chance(25)) out += r.chance(50) ? "，" : "。";
    if (r.chance(5)) out += std::to_string(r.below(2030));
  }
  out += r.chance(50) ? "！\n" : "？\n";
  if (r.chance(60)) {
    for (int i = 0; i < 3 + r.below(5); ++i) out += r.pick(kKana) + (r.chance(30) ? "、" : "");
    out += "。\n";
  }
  if (r.chance(30)) out += r.pick(kHangul) + " " + r.pick(kHangul) + ".\n";
  out += "\n";
}

void misc(Rng& r, std::string& out) {
  switch (r.below(5)) {
    case 0:
      for (int i = 0; i < 6; ++i) out += r.pick(kOther) + (r.chance(40) ? r.pick(kEmoji) : "") + " ";
      out += "\n\n";
      break;
    case 1:
      out += "User: " + sentence(r) + " " + r.pick(kEmoji) + "\nAssistant: " + sentence(r) +
             "\n\n";
      break;
    case 2:
      out += "## " + r.pick(kAdjs) + " " + r.pick(kNouns) + "\n\n- " + sentence(r) + "\n- **" +
             r.pick(kNouns) + "**: `" + r.pick(kIdents) + "()`\n\n```python\nx = " +
             std::to_string(r.below(100)) + "\n```\n\n";
      break;
    case 3:
      out += "<tool_result>{\"" + r.pick(kKeys) + "\": " + std::to_string(r.below(100)) +
             "}</tool_result>\n\n";
      break;
    default:
      out += "    \t  " + r.pick(kNouns) + "  \t\n   \n" + r.pick(kNouns) + "...!!!??? ;;\n" +
             "---\n***\n" + "http://example.com/" + r.pick(kIdents) + "?q=" +
             std::to_string(r.below(999)) + "&lang=en\n\n";
  }
}

// Pseudo-words from syllables with a skewed (Zipf-like) frequency, so larger vocabularies keep
// finding pairs worth merging.
class Lexicon {
 public:
  explicit Lexicon(Rng& r) {
    const Words onsets = {"b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r",
                          "s", "t", "v", "w", "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr",
                          "sh", "sl", "st", "th", "tr", ""};
    const Words nuclei = {"a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou", "y", "io"};
    const Words codas = {"", "", "", "n", "r", "s", "t", "l", "m", "ng", "ck", "st", "nd", "x"};
    for (int i = 0; i < 6000; ++i) {
      std::string w;
      int syll = 1 + r.below(4);
      for (int k = 0; k < syll; ++k) w += r.pick(onsets) + r.pick(nuclei) + r.pick(codas);
      words_.push_back(w);
    }
  }
  const std::string& word(Rng& r) const {
    double u = double(r.next() >> 11) / double(1ull << 53);
    return words_[size_t(u * u * u * double(words_.size()))];
  }

 private:
  Words words_;
};

void lexicon_prose(Rng& r, const Lexicon& lex, std::string& out) {
  int n = 20 + r.below(60);
  for (int i = 0; i < n; ++i) {
    std::string w = lex.word(r);
    if (i == 0 || r.chance(8)) w[0] = char(w[0] - 32);
    out += w;
    out += r.chance(10) ? ", " : (r.chance(8) ? ". " : " ");
  }
  out += ".\n\n";
}

}  // namespace

std::string generate_tiny_corpus(uint64_t seed, size_t target_bytes) {
  Rng r(seed);
  Lexicon lex(r);
  std::string out;
  out.reserve(target_bytes + 4096);
  while (out.size() < target_bytes) {
    int k = r.below(100);
    if (k < 20) {
      prose(r, out);
    } else if (k < 35) {
      lexicon_prose(r, lex, out);
    } else if (k < 52) {
      python(r, out);
    } else if (k < 64) {
      bool pretty = r.chance(50);
      json_value(r, out, 0, pretty, 0);
      out += "\n\n";
    } else if (k < 78) {
      numbers(r, out);
    } else if (k < 90) {
      cjk(r, out);
    } else {
      misc(r, out);
    }
  }
  return out;
}

}  // namespace tandem

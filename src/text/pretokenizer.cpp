// Pre-tokenizer over PCRE2 (see pretokenizer.h).
#include "text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/check.h"

namespace tandem::text {

const std::vector<std::string>& deepseek_v4_split_patterns() {
  static const std::vector<std::string> kPatterns = {
      R"re(\p{N}{1,3})re",
      // CJK unified ideographs U+4E00..U+9FA5, hiragana U+3040..U+309F, katakana U+30A0..U+30FF.
      "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
      R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
  };
  return kPatterns;
}

const std::string& gpt2_split_pattern() {
  static const std::string kPattern =
      R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re";
  return kPattern;
}

namespace {
// Oniguruma's Unicode \s: U+0009..U+000D, U+0085 and the Z categories (Zs, Zl, Zp).
constexpr const char* kOnigSpaceItems = R"(\t-\r\x{85}\p{Z})";
}  // namespace

Result<std::string> onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t class_start = 0;  // index in p of the first char after '[' (and '^')
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) return invalid_argument("regex '{}' ends with a backslash", p);
      char e = p[i + 1];
      if (e == 's') {
        out += in_class ? std::string(kOnigSpaceItems) : "[" + std::string(kOnigSpaceItems) + "]";
      } else if (e == 'S') {
        if (in_class)
          return invalid_argument("regex '{}': \\S inside a character class is not supported", p);
        out += "[^" + std::string(kOnigSpaceItems) + "]";
      } else if (e == 'u') {
        if (i + 6 > p.size())
          return invalid_argument("regex '{}': truncated \\u escape", p);
        std::string hex(p.substr(i + 2, 4));
        if (hex.size() != 4 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
          return invalid_argument("regex '{}': bad \\u escape", p);
        out += "\\x{" + hex + "}";
        i += 4;
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < p.size() && p[i + 1] == '^') {
        out.push_back('^');
        ++i;
      }
      class_start = i + 1;
      continue;
    }
    if (in_class && c == ']' && i != class_start) {
      in_class = false;
      out.push_back(c);
      continue;
    }
    if (in_class && c == '[' && !(i + 1 < p.size() && p[i + 1] == ':'))
      return invalid_argument("regex '{}': nested character classes are not supported", p);
    out.push_back(c);
  }
  if (in_class) return invalid_argument("regex '{}': unterminated character class", p);
  return out;
}

struct PreTokenizer::Rule {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Rule() {
    if (code) pcre2_code_free(code);
  }
};

PreTokenizer::~PreTokenizer() = default;

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::create(const std::vector<std::string>& patterns,
                                                           const std::vector<bool>& literal) {
  std::unique_ptr<PreTokenizer> pt(new PreTokenizer());
  for (size_t i = 0; i < patterns.size(); ++i) {
    bool lit = i < literal.size() && literal[i];
    std::string pat = patterns[i];
    if (!lit) {
      auto translated = onig_to_pcre2(patterns[i]);
      if (!translated.ok()) return translated.status();
      pat = std::move(translated.value());
    }
    int err = 0;
    PCRE2_SIZE err_off = 0;
    uint32_t options = PCRE2_UTF | PCRE2_UCP | (lit ? PCRE2_LITERAL : 0);
    auto rule = std::make_unique<Rule>();
    rule->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), options, &err,
                               &err_off, nullptr);
    if (!rule->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return invalid_argument("pre-tokenizer regex '{}' does not compile at offset {}: {}",
                              patterns[i], size_t(err_off), reinterpret_cast<const char*>(msg));
    }
    rule->jit = pcre2_jit_compile(rule->code, PCRE2_JIT_COMPLETE) == 0;
    pt->rules_.push_back(std::move(rule));
  }
  return pt;
}

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::deepseek_v4() {
  return create(deepseek_v4_split_patterns());
}

namespace {

// Per-thread PCRE2 scratch: one match block and a JIT stack large enough for long pieces.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    TANDEM_CHECK(data && context && stack);
    pcre2_jit_stack_assign(context, nullptr, stack);
    // Whitespace runs cost backtracking steps linear in their length (\s*[\r\n]+ fails, then
    // \s+(?!\S) gives one back); the default limit (10M) would stop a 10 MB run mid-way, where
    // HF's Oniguruma has no limit. The work stays linear, so lift the limit.
    pcre2_set_match_limit(context, UINT32_MAX);
    pcre2_set_depth_limit(context, UINT32_MAX);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

void PreTokenizer::split(std::string_view text, std::vector<Piece>* out) const {
  if (text.empty()) return;
  MatchScratch& ms = scratch();
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.data);
  thread_local std::vector<Piece> cur, next;
  cur.clear();
  cur.push_back({0, uint32_t(text.size())});
  for (const auto& rule : rules_) {
    next.clear();
    for (const Piece& p : cur) {
      auto subject = reinterpret_cast<PCRE2_SPTR>(text.data() + p.offset);
      PCRE2_SIZE len = p.length, start = 0, done = 0;
      while (start < len) {
        int rc = rule->jit ? pcre2_jit_match(rule->code, subject, len, start, 0, ms.data, ms.context)
                           : pcre2_match(rule->code, subject, len, start, PCRE2_NO_UTF_CHECK,
                                         ms.data, ms.context);
        if (rc < 0) break;  // no match, or an engine limit: the rest stays one piece
        PCRE2_SIZE ms0 = ov[0], me = ov[1];
        if (me == ms0) {  // empty match: skip one character (no empty pieces in Isolated)
          start = ms0 + 1;
          while (start < len && (subject[start] & 0xC0) == 0x80) ++start;
          continue;
        }
        if (ms0 > done) next.push_back({uint32_t(p.offset + done), uint32_t(ms0 - done)});
        next.push_back({uint32_t(p.offset + ms0), uint32_t(me - ms0)});
        done = start = me;
      }
      if (done < len) next.push_back({uint32_t(p.offset + done), uint32_t(len - done)});
    }
    std::swap(cur, next);
  }
  out->insert(out->end(), cur.begin(), cur.end());
}

}  // namespace tandem::text

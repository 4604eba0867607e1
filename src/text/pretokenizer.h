// Pre-tokenizer: a Sequence of HF `Split` rules (behavior Isolated), each a regex in Oniguruma
// syntax as written in tokenizer.json, compiled with PCRE2 (UTF + UCP + JIT). Every rule splits
// every piece the previous rules produced; a regex sees one piece as its whole subject, so
// lookaheads such as \s+(?!\S) stop at the piece's end, exactly as in HF `tokenizers`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tandem::text {

// One piece of the input: [offset, offset + length) in bytes.
struct Piece {
  uint32_t offset;
  uint32_t length;
};

// DeepSeek-V3/V4 pre-tokenizer regexes, in the syntax tokenizer.json stores them.
const std::vector<std::string>& deepseek_v4_split_patterns();
// The pattern ByteLevel(use_regex=true) splits with (GPT-2).
const std::string& gpt2_split_pattern();

// Rewrites an Oniguruma pattern for PCRE2 so both mean the same: \s and \S become Oniguruma's
// Unicode whitespace set (PCRE2's UCP \s lacks U+0085), \uHHHH becomes \x{HHHH}.
Result<std::string> onig_to_pcre2(std::string_view pattern);

class PreTokenizer {
 public:
  // `regexes` in Oniguruma syntax; `literal[i]` marks HF's {"String": ...} patterns.
  static Result<std::unique_ptr<PreTokenizer>> create(const std::vector<std::string>& patterns,
                                                      const std::vector<bool>& literal = {});
  static Result<std::unique_ptr<PreTokenizer>> deepseek_v4();
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the pieces of `text` (valid UTF-8) to *out, in order, covering all of it. A regex
  // engine failure (e.g. JIT stack exhausted on pathological input) leaves that piece unsplit.
  void split(std::string_view text, std::vector<Piece>* out) const;
  size_t num_rules() const { return rules_.size(); }

 private:
  struct Rule;
  PreTokenizer() = default;
  std::vector<std::unique_ptr<Rule>> rules_;
};

}  // namespace tandem::text

// Tokenizer: HF tokenizer.json (byte-level BPE with DeepSeek's pre-tokenizer splits, added and
// special tokens). encode/decode with exact parity to the HF `tokenizers` library, plus an
// incremental detokenizer that only emits complete UTF-8 for streaming.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tandem {

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> from_file(const std::string& tokenizer_json_path);
  static Result<std::unique_ptr<Tokenizer>> from_json(const std::string& tokenizer_json_text);
  virtual ~Tokenizer() = default;

  // Special/added tokens written inline in `text` (e.g. "<｜User｜>") map to their ids, as HF does.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Concatenated bytes of the tokens (special tokens included unless skip_special).
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  virtual std::string token_bytes(int32_t id) const = 0;  // raw bytes of one token
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual int64_t vocab_size() const = 0;                 // highest id + 1
};

// Streaming detokenizer: feed token ids one by one; returns the text that became complete UTF-8.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string flush();  // whatever is left (invalid UTF-8 replaced by U+FFFD)

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace tandem

// Tiny tokenizer trainer: byte-level BPE trained on text with DeepSeek-V4's pre-tokenizer, written
// out as a complete HF tokenizer.json (loadable by Tokenizer and by the HF `tokenizers` library),
// with DeepSeek-V4's added/special token layout. Used by `make-tiny` for tiny test checkpoints.
// Everything is deterministic: the same inputs give byte-identical JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct TrainerAddedToken {
  std::string content;
  int32_t id = 0;
  bool special = true;
  bool normalized = false;
};

// Ids as in the real DeepSeek-V4 tokenizer.json: bos 0, eos 1, pad 2 (these three also sit in the
// base vocab), byte tokens from 3, and 1,280 more added tokens at base_vocab_size + k, where the
// real file has them at 128000 + k (so <｜User｜> is base+803, the DSpark noise token base+799,
// <think> base+821, ...). Contents and flags of the placeholders (special, not normalized), the
// V3-era chat/tool tokens 800..814 (normalized, not special; <|EOT|> special) and the protocol
// tokens are as in the real files; which V4 token sits in the other slots is a guess.
std::vector<TrainerAddedToken> deepseek_v4_added_tokens(int32_t base_vocab_size);

// Offsets (added to base_vocab_size) of protocol tokens; equal to the real id - 128000.
inline constexpr int32_t kDspNoiseTokenOffset = 799;
inline constexpr int32_t kUserTokenOffset = 803;
inline constexpr int32_t kAssistantTokenOffset = 804;
inline constexpr int32_t kThinkStartTokenOffset = 821;
inline constexpr int32_t kThinkEndTokenOffset = 822;
inline constexpr int32_t kDsmlTokenOffset = 825;
inline constexpr int32_t kLatestReminderTokenOffset = 828;
inline constexpr int32_t kNumDeepSeekExtraAddedTokens = 1280;

struct BpeTrainOptions {
  int min_frequency = 2;     // stop merging when the best pair occurs fewer times
  bool deepseek_added = true;  // append deepseek_v4_added_tokens(); else only bos/eos/pad
};

// Trains byte-level BPE on `corpus` until the base vocab (bos/eos/pad + 256 bytes + merges) has
// `vocab_size` entries (or no pair reaches min_frequency) and returns the tokenizer.json text.
std::string train_bpe_tokenizer_json(const std::string& corpus, int vocab_size,
                                     const BpeTrainOptions& options = {});

// The built-in training text: English prose, Python, JSON, numbers and counting, CJK, kana,
// emoji, other scripts, varied whitespace. Deterministic in `seed`; ~`target_bytes` long.
std::string generate_tiny_corpus(uint64_t seed, size_t target_bytes = 300 * 1024);

inline constexpr int kTinyBaseVocabSize = 2000;
// train_bpe_tokenizer_json(generate_tiny_corpus(seed), kTinyBaseVocabSize): 3,280 ids in all.
std::string train_tiny_tokenizer_json(uint64_t seed);

}  // namespace tandem

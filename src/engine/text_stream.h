// TextStream: a request's output text as it streams. Token bytes are joined into complete UTF-8
// (a character split across tokens waits for its last byte); stop strings are searched across
// token boundaries, and text that could still turn into a stop string is held back until it
// cannot. Special tokens are left out of the text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace tandem {

class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop);
  // Adds a token; appends text that is now final to `out`. Returns true when a stop string
  // completed: `out` then ends just before it and the stream is over.
  bool push(int32_t token, std::string& out);
  // End of output (not by stop string): releases held text; bad UTF-8 becomes U+FFFD.
  void finish(std::string& out);
  const std::string& matched_stop() const { return matched_; }

 private:
  IncrementalDecoder decoder_;  // token bytes -> complete UTF-8 (text/tokenizer.h)
  std::vector<std::string> stop_;
  size_t max_stop_ = 0;
  std::string held_;   // complete text that may be the start of a stop string
  std::string matched_;
  bool done_ = false;
};

}  // namespace tandem

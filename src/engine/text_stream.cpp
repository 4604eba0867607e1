// TextStream: see text_stream.h.
#include "engine/text_stream.h"

#include <algorithm>

namespace tandem {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop)
    : decoder_(tokenizer, /*skip_special=*/true) {
  for (auto& s : stop)
    if (!s.empty()) stop_.push_back(std::move(s));
  for (const auto& s : stop_) max_stop_ = std::max(max_stop_, s.size());
}

bool TextStream::push(int32_t token, std::string& out) {
  if (done_) return true;
  std::string text = decoder_.push(token);  // complete UTF-8 only; specials skipped
  if (text.empty()) return false;
  if (stop_.empty()) {
    out += text;
    return false;
  }
  held_ += text;
  // Earliest stop string occurrence in held_ (everything before held_ was already cleared).
  size_t best = std::string::npos;
  for (const auto& s : stop_) {
    size_t pos = held_.find(s);
    if (pos != std::string::npos && pos < best) {
      best = pos;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    out.append(held_, 0, best);
    held_.clear();
    done_ = true;
    return true;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stop_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  out.append(held_, 0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return false;
}

void TextStream::finish(std::string& out) {
  if (done_) return;
  out += held_;
  held_.clear();
  out += decoder_.flush();  // an unfinished character becomes U+FFFD
  done_ = true;
}

}  // namespace tandem

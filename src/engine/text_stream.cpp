// TextStream: see text_stream.h.
#include "engine/text_stream.h"

#include <algorithm>

#include "text/tokenizer.h"

namespace tandem {

size_t complete_utf8_prefix(const std::string& s) {
  // Look at most 3 bytes back for the lead byte of an unfinished sequence.
  size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for its lead
    size_t need = (c & 0x80) == 0 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return back < need ? n - back : n;
  }
  return n;  // only continuation bytes: invalid, let them through
}

namespace {
// Replaces invalid UTF-8 with U+FFFD.
std::string sanitize_utf8(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t need = (c & 0x80) == 0 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    bool ok = need > 0 && i + need <= s.size();
    for (size_t k = 1; ok && k < need; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok) {
      out.append(s, i, need);
      i += need;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}
}  // namespace

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop) : tokenizer_(tokenizer) {
  for (auto& s : stop)
    if (!s.empty()) stop_.push_back(std::move(s));
  for (const auto& s : stop_) max_stop_ = std::max(max_stop_, s.size());
}

bool TextStream::push(int32_t token, std::string& out) {
  if (done_) return true;
  if (tokenizer_.is_special(token)) return false;
  bytes_ += tokenizer_.token_bytes(token);
  size_t complete = complete_utf8_prefix(bytes_);
  if (complete == 0) return false;
  std::string text = sanitize_utf8(bytes_.substr(0, complete));
  bytes_.erase(0, complete);
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
    bytes_.clear();
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
  if (!bytes_.empty()) out += sanitize_utf8(bytes_);
  bytes_.clear();
  done_ = true;
}

}  // namespace tandem

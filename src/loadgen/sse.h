// Client side of an OpenAI-style streamed chat completion: splits the SSE byte stream into events
// (bytes arrive in arbitrary pieces) and reads one chat.completion.chunk. Nothing here does I/O, so
// the HTTP client (client.cpp) and the tests feed it the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::loadgen {

// Incremental "text/event-stream" splitter: feed() any number of bytes; on_data receives the data
// of every complete event (multi-line data joined by '\n'); comments and other fields are skipped.
class SseSplitter {
 public:
  explicit SseSplitter(std::function<void(const std::string&)> on_data) : on_data_(std::move(on_data)) {}
  void feed(std::string_view bytes);
  // Bytes held back because no line end has arrived yet (a stream cut mid-event leaves some).
  size_t pending_bytes() const { return line_.size() + data_.size(); }

 private:
  void line(std::string_view l);
  std::function<void(const std::string&)> on_data_;
  std::string line_, data_;
  bool has_data_ = false;
};

// What one event's data says.
struct ChatChunk {
  bool done = false;             // "[DONE]"
  std::string error;             // an {"error": ...} object sent inside the stream, or unparsable JSON
  std::string text;              // delta content + reasoning (what the tokens decoded to)
  bool carries_tokens = false;   // non-empty content, reasoning or a tool-call delta
  std::string finish_reason;     // "" until the choice finishes
  bool has_usage = false;        // a non-null usage object (stream_options.include_usage)
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

ChatChunk parse_chat_chunk(const std::string& data);

}  // namespace tandem::loadgen

// HTTP side of the serving benchmark: the target's address, GETs (/v1/models, /metrics) and one
// streamed chat completion timed chunk by chunk. Works against any OpenAI-compatible server.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem::loadgen {

// "http://host:port[/prefix][/v1]" -> scheme://host:port and the path prefix (a trailing "/v1" is
// dropped, so both spellings of an OpenAI base URL work). https:// needs httplib built with OpenSSL.
struct Endpoint {
  std::string scheme_host_port;
  std::string path_prefix;  // "" or "/something", no trailing slash
};
Result<Endpoint> parse_base_url(const std::string& url);
bool https_supported();

struct ClientOptions {
  std::string api_key;            // sent as "Authorization: Bearer <key>" when set
  double connect_timeout_s = 10;
  double read_timeout_s = 600;    // longest silence allowed inside a response
};

struct HttpReply {
  int status = 0;
  std::string body;
};

// GET prefix+path. A transport failure (refused, timeout, TLS) is a kUnavailable Status naming the
// URL; any HTTP status is a reply.
Result<HttpReply> http_get(const Endpoint& ep, const ClientOptions& o, const std::string& path);

struct ChatRequest {
  std::string model, user;
  int max_tokens = 0;
  double temperature = 0;
};

// One streamed request, as the client saw it. Times are seconds on the run's clock.
struct RequestRecord {
  int stream = 0;                  // concurrency slot that sent it
  double start_s = 0;              // when it was sent
  bool ok = false;                 // HTTP 200, a finish_reason, "[DONE]", no error in the stream
  std::string error;               // why not
  int http_status = 0;
  double ttft_s = -1;              // send -> first token-bearing chunk
  double e2e_s = 0;                // send -> end of stream
  double decode_s = 0;             // first -> last token-bearing chunk
  int64_t token_chunks = 0;        // chunks carrying content, reasoning or tool-call text
  std::vector<double> itl_s;       // gaps between consecutive token-bearing chunks
  bool usage_present = false;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  std::string finish_reason;
  std::string text;                // content + reasoning, for the workload checks
  std::string token_check;         // "" when the counts agree, else what disagrees
};

using Clock = std::chrono::steady_clock;
RequestRecord stream_chat(const Endpoint& ep, const ClientOptions& o, const ChatRequest& req, Clock::time_point epoch);

// The cross-check of the server's usage against what the client saw: "" when consistent. A chunk
// carries at least one token, so completion_tokens >= token_chunks (speculative decoding and
// detokenizer hold-back put several tokens in one chunk, so fewer chunks than tokens is fine).
std::string check_token_counts(const RequestRecord& r, int max_tokens);

}  // namespace tandem::loadgen

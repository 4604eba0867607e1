// cpp-httplib client for the serving benchmark: one connection per request (as concurrent clients
// of a public endpoint behave), SSE timed as bytes arrive.
#include "loadgen/client.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "loadgen/sse.h"

namespace tandem::loadgen {

bool https_supported() {
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  return true;
#else
  return false;
#endif
}

Result<Endpoint> parse_base_url(const std::string& url) {
  std::string scheme;
  size_t after = 0;
  if (url.rfind("http://", 0) == 0) {
    scheme = "http";
    after = 7;
  } else if (url.rfind("https://", 0) == 0) {
    scheme = "https";
    after = 8;
    if (!https_supported())
      return invalid_argument("--base-url {}: this build's cpp-httplib has no OpenSSL support (https)", url);
  } else {
    return invalid_argument("--base-url '{}': expected http://HOST:PORT or https://HOST[:PORT]", url);
  }
  size_t slash = url.find('/', after);
  std::string host = url.substr(after, slash == std::string::npos ? std::string::npos : slash - after);
  if (host.empty()) return invalid_argument("--base-url '{}': no host", url);
  Endpoint ep;
  ep.scheme_host_port = scheme + "://" + host;
  ep.path_prefix = slash == std::string::npos ? "" : url.substr(slash);
  while (!ep.path_prefix.empty() && ep.path_prefix.back() == '/') ep.path_prefix.pop_back();
  if (ep.path_prefix.size() >= 3 && ep.path_prefix.compare(ep.path_prefix.size() - 3, 3, "/v1") == 0)
    ep.path_prefix.resize(ep.path_prefix.size() - 3);
  return ep;
}

namespace {
std::unique_ptr<httplib::Client> make_client(const Endpoint& ep, const ClientOptions& o) {
  auto c = std::make_unique<httplib::Client>(ep.scheme_host_port);
  auto secs = [](double s) {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(s));
  };
  c->set_connection_timeout(secs(o.connect_timeout_s));
  c->set_read_timeout(secs(o.read_timeout_s));
  c->set_write_timeout(secs(o.connect_timeout_s));
  return c;
}

httplib::Headers headers(const ClientOptions& o) {
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  return h;
}

double since(Clock::time_point epoch) { return std::chrono::duration<double>(Clock::now() - epoch).count(); }

std::string short_body(const std::string& body) {
  // OpenAI-style error bodies say it best in error.message.
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const auto& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  if (j.is_object() && j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
  return body.substr(0, 300);
}
}  // namespace

Result<HttpReply> http_get(const Endpoint& ep, const ClientOptions& o, const std::string& path) {
  auto c = make_client(ep, o);
  auto res = c->Get(ep.path_prefix + path, headers(o));
  if (!res)
    return make_error(StatusCode::kUnavailable, "GET {}{}{}: {} error (is the server running at --base-url?)",
                      ep.scheme_host_port, ep.path_prefix, path, httplib::to_string(res.error()));
  return HttpReply{res->status, res->body};
}

RequestRecord stream_chat(const Endpoint& ep, const ClientOptions& o, const ChatRequest& req, Clock::time_point epoch) {
  RequestRecord r;
  nlohmann::json body = {{"model", req.model},
                         {"messages", nlohmann::json::array({{{"role", "user"}, {"content", req.user}}})},
                         {"max_tokens", req.max_tokens},
                         {"temperature", req.temperature},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
  auto c = make_client(ep, o);
  bool done = false;
  double last_chunk_s = -1;
  std::string error_body;
  SseSplitter sse([&](const std::string& data) {
    ChatChunk ch = parse_chat_chunk(data);
    const double now = since(epoch);
    if (ch.done) {
      done = true;
      return;
    }
    if (!ch.error.empty() && r.error.empty()) r.error = "error in stream: " + ch.error;
    if (ch.carries_tokens) {
      if (r.token_chunks == 0) r.ttft_s = now - r.start_s;
      else r.itl_s.push_back(now - last_chunk_s);
      last_chunk_s = now;
      ++r.token_chunks;
      r.decode_s = now - r.start_s - r.ttft_s;
      r.text += ch.text;
    }
    if (!ch.finish_reason.empty()) r.finish_reason = ch.finish_reason;
    if (ch.has_usage) {
      r.usage_present = true;
      r.prompt_tokens = ch.prompt_tokens;
      r.completion_tokens = ch.completion_tokens;
      r.cached_tokens = ch.cached_tokens;
    }
  });

  httplib::Request hr;
  hr.method = "POST";
  hr.path = ep.path_prefix + "/v1/chat/completions";
  hr.headers = headers(o);
  hr.headers.emplace("Accept", "text/event-stream");
  hr.body = body.dump();
  hr.set_header("Content-Type", "application/json");
  hr.response_handler = [&](const httplib::Response& res) {
    r.http_status = res.status;
    return true;
  };
  hr.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (r.http_status == 200) sse.feed(std::string_view(data, n));
    else if (error_body.size() < 4096) error_body.append(data, n);
    return true;
  };
  r.start_s = since(epoch);
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = c->send(hr, res, err);
  r.e2e_s = since(epoch) - r.start_s;
  if (!sent) {
    if (r.error.empty()) {
      r.error = std::string("transport error: ") + httplib::to_string(err);
      if (r.token_chunks > 0) r.error += " after " + std::to_string(r.token_chunks) + " token chunks, before [DONE]";
    }
    if (r.http_status == 0) r.http_status = res.status > 0 ? res.status : 0;
  } else if (r.http_status != 200) {
    r.error = "HTTP " + std::to_string(r.http_status) + ": " + short_body(error_body.empty() ? res.body : error_body);
  } else if (r.error.empty() && !done) {
    r.error = "stream ended without [DONE]";
  } else if (r.error.empty() && r.finish_reason.empty()) {
    r.error = "no finish_reason in the stream";
  }
  r.ok = r.error.empty();
  if (r.ok) r.token_check = check_token_counts(r, req.max_tokens);
  return r;
}

std::string check_token_counts(const RequestRecord& r, int max_tokens) {
  if (!r.usage_present) return "no usage in the stream (stream_options.include_usage ignored)";
  if (r.completion_tokens < r.token_chunks)
    return "completion_tokens " + std::to_string(r.completion_tokens) + " < " + std::to_string(r.token_chunks) +
           " token-bearing chunks";
  if (max_tokens > 0 && r.completion_tokens > max_tokens)
    return "completion_tokens " + std::to_string(r.completion_tokens) + " > max_tokens " + std::to_string(max_tokens);
  if (max_tokens > 0 && r.finish_reason == "length" && r.completion_tokens != max_tokens)
    return "finish_reason length at " + std::to_string(r.completion_tokens) + " of max_tokens " +
           std::to_string(max_tokens);
  return "";
}

}  // namespace tandem::loadgen

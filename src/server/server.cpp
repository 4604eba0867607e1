// HttpServer: cpp-httplib routes over the Engine interface. One handler thread per connection; a
// generation registers a Channel that the engine's callback fills and the handler drains (SSE for
// stream=true, one JSON body otherwise). A client that goes away (seen by a ConnectionProbe on its
// socket, or a failed SSE write) has its request cancelled within about kDisconnectPoll seconds.
#include "server/server.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <random>

#include "common/log.h"
#include "common/version.h"
#include "server/api_error.h"
#include "server/connection_probe.h"
#include "server/openai_request.h"
#include "server/prompt.h"
#include "text/dsml.h"
#include "text/json_schema_grammar.h"
#include "text/tokenizer.h"

namespace tandem::server {
namespace {

using json = nlohmann::json;

// How often a waiting handler checks that its client is still there.
constexpr double kDisconnectPoll = 0.25;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string random_suffix(size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kAlpha = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += kAlpha[rng() % 62];
  return s;
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  res.set_content(api_error_body(e), "application/json");
}

// How the output text of a choice becomes an OpenAI message.
enum class OutputMode {
  kCompletionText,  // /v1/completions: text as is
  kChat,            // reasoning split + DSML tool-call parsing
  kJson,            // response_format json: content is the constrained JSON
  kNamedTool,       // tool_choice {function}: the text is that call's arguments
  kRequiredTool,    // tool_choice required: the text is [{"name":..,"parameters":{..}}, ...]
};

struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int, RequestEvent>> events;
};

struct ToolCallOut {
  std::string id, name, arguments;
};

struct ChoiceOut {
  int index = 0;
  OutputMode mode = OutputMode::kChat;
  std::unique_ptr<DsmlStreamParser> parser;
  std::string forced_name;
  bool started = false;
  bool reasoning_open = false;
  bool single_tool_call = false;  // parallel_tool_calls: false keeps only the first call
  std::string raw;            // all text (kRequiredTool parses it at the end)
  std::string content, reasoning;
  std::vector<ToolCallOut> tool_calls;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  Usage usage;
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;
  json logprobs = json::array();  // chat: content entries; completions: built at the end
  std::vector<TokenLogprob> raw_logprobs;
  std::vector<TokenLogprob> prompt_lp;  // the engine's prompt entries (tokens 1..), when asked for
  int prompt = 0;                       // its prompt in Generation::prompts (completions: one of a batch)
  bool echoed = false;                  // streaming echo: the prompt's frame was sent

  // The engine may detokenize with skip_special, which drops the protocol tokens the output parser
  // needs (</think>, ｜DSML｜). Rebuild the text with them: walk the event's tokens, taking each
  // ordinary token's bytes from ev.text (bytes the engine still holds back, for UTF-8 or a possible
  // stop string, arrive in a later event: `held_bytes`) and inserting each protocol token's text
  // unless ev.text already has it at that point.
  const Tokenizer* tok = nullptr;
  int64_t held_bytes = 0;
  std::string with_protocol_tokens(const RequestEvent& ev) {
    if (!tok || mode != OutputMode::kChat) return ev.text;
    const std::string& text = ev.text;
    std::string out;
    size_t pos = std::min<size_t>(static_cast<size_t>(held_bytes), text.size());
    out.append(text, 0, pos);
    held_bytes -= static_cast<int64_t>(pos);
    for (int32_t t : ev.tokens) {
      std::string b = tok->token_bytes(t);
      bool protocol = tok->is_special(t) && (b == dsv4::kThinkEnd || b == dsv4::kThinkStart || b == dsv4::kDsml);
      if (protocol && text.compare(pos, b.size(), b) != 0) {
        out += b;
        continue;
      }
      if (tok->is_special(t) && !protocol && text.compare(pos, b.size(), b) != 0) continue;  // skipped special
      size_t take = std::min(b.size(), text.size() - pos);
      out.append(text, pos, take);
      pos += take;
      held_bytes += static_cast<int64_t>(b.size() - take);
    }
    if (pos < text.size()) out.append(text, pos, std::string::npos);  // e.g. U+FFFD replacements
    return out;
  }

  std::vector<DsmlDelta> feed(const RequestEvent& ev_in) {
    std::vector<DsmlDelta> out;
    RequestEvent ev_copy;
    const RequestEvent* evp = &ev_in;
    if (tok && mode == OutputMode::kChat) {
      ev_copy.text = with_protocol_tokens(ev_in);
      ev_copy.tokens = ev_in.tokens;
      evp = &ev_copy;
    }
    const RequestEvent& ev = *evp;
    completion_tokens += static_cast<int64_t>(ev.tokens.size());
    raw += ev.text;
    switch (mode) {
      case OutputMode::kCompletionText:
      case OutputMode::kJson:
        if (!ev.text.empty()) out.push_back({DsmlDeltaKind::kContent, ev.text});
        break;
      case OutputMode::kNamedTool:
        if (!started) {
          started = true;
          DsmlDelta d;
          d.kind = DsmlDeltaKind::kToolCallStart;
          d.tool_index = 0;
          d.id = "call_" + random_suffix(24);
          d.name = forced_name;
          out.push_back(d);
        }
        if (!ev.text.empty()) {
          DsmlDelta d;
          d.kind = DsmlDeltaKind::kToolCallArgs;
          d.tool_index = 0;
          d.text = ev.text;
          out.push_back(d);
        }
        break;
      case OutputMode::kRequiredTool:
        break;
      case OutputMode::kChat: {
        // Tokens up to and including the one that closes the reasoning block count as reasoning.
        if (reasoning_open) {
          reasoning_tokens += static_cast<int64_t>(ev.tokens.size());
          if (raw.find(dsv4::kThinkEnd) != std::string::npos) reasoning_open = false;
        }
        out = parser->push(ev.text);
        break;
      }
    }
    apply(out);
    return out;
  }

  std::vector<DsmlDelta> finish_output() {
    std::vector<DsmlDelta> out;
    if (mode == OutputMode::kChat) {
      out = parser->finish();
    } else if (mode == OutputMode::kRequiredTool) {
      json arr = json::parse(raw, nullptr, false);
      if (arr.is_array()) {
        int i = 0;
        for (const auto& c : arr) {
          if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) continue;
          DsmlDelta s;
          s.kind = DsmlDeltaKind::kToolCallStart;
          s.tool_index = i;
          s.id = "call_" + random_suffix(24);
          s.name = c["name"].get<std::string>();
          out.push_back(s);
          DsmlDelta a;
          a.kind = DsmlDeltaKind::kToolCallArgs;
          a.tool_index = i;
          a.text = dump_json(c.contains("parameters") ? c["parameters"] : json::object());
          out.push_back(a);
          ++i;
        }
      } else if (!raw.empty()) {
        out.push_back({DsmlDeltaKind::kContent, raw});  // truncated: hand back what there is
      }
    }
    apply(out);
    return out;
  }

  // Drops calls after the first when the request asked for at most one.
  void limit_calls(std::vector<DsmlDelta>& ds) const {
    if (!single_tool_call) return;
    std::erase_if(ds, [](const DsmlDelta& d) {
      return (d.kind == DsmlDeltaKind::kToolCallStart || d.kind == DsmlDeltaKind::kToolCallArgs) && d.tool_index > 0;
    });
  }

  void apply(std::vector<DsmlDelta>& ds) {
    limit_calls(ds);
    for (const auto& d : ds) {
      switch (d.kind) {
        case DsmlDeltaKind::kReasoning: reasoning += d.text; break;
        case DsmlDeltaKind::kContent: content += d.text; break;
        case DsmlDeltaKind::kToolCallStart: tool_calls.push_back({d.id, d.name, ""}); break;
        case DsmlDeltaKind::kToolCallArgs:
          if (d.tool_index >= 0 && d.tool_index < static_cast<int>(tool_calls.size())) tool_calls[d.tool_index].arguments += d.text;
          break;
      }
    }
  }

  const char* finish_reason() const {
    switch (finish) {
      case FinishReason::kStop: return tool_calls.empty() ? "stop" : "tool_calls";
      case FinishReason::kLength: return "length";
      case FinishReason::kCancelled: return "abort";
      case FinishReason::kTimeout: return "timeout";
      case FinishReason::kError: return "error";
      default: return "stop";
    }
  }
};

json token_logprob_entry(const Tokenizer& tok, int32_t id, float lp) {
  std::string b = tok.token_bytes(id);
  json bytes = json::array();
  for (unsigned char c : b) bytes.push_back(static_cast<int>(c));
  return json{{"token", b}, {"logprob", lp}, {"bytes", bytes}};
}

json usage_json(int64_t prompt, int64_t completion, int64_t cached, int64_t reasoning) {
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached}}},
              {"completion_tokens_details", {{"reasoning_tokens", reasoning}}}};
}

}  // namespace

// One client request: n engine requests feeding one channel.
// The most prompt log-probability entries (prompt tokens x (alternatives + 1), over the choices)
// one response may carry.
constexpr int64_t kMaxPromptLogprobEntries = int64_t{1} << 21;

struct Generation {
  Engine* engine = nullptr;
  const Tokenizer* tok = nullptr;
  ParsedRequest req;
  std::string id;
  std::string model_name;
  int64_t created = 0;
  int64_t prompt_tokens = 0;  // over the batch's prompts
  // The prompts the choices answer (chat: one; completions: one or a batch): ids and, for echo, text.
  std::vector<std::vector<int32_t>> prompt_ids;
  std::vector<std::string> prompt_texts;
  std::vector<std::string> engine_ids;
  std::shared_ptr<Channel> ch = std::make_shared<Channel>();
  std::vector<ChoiceOut> choices;
  int finished = 0;
  bool sent_role = false;
  bool done_sent = false;
  double last_write = 0;
  std::atomic<int64_t>* in_flight = nullptr;
  bool counted = false;

  double t_start = now_s();

  ~Generation() {
    if (!counted) return;
    --*in_flight;
    int64_t completion = 0;
    std::string reasons;
    for (const auto& c : choices) {
      completion += c.completion_tokens;
      if (!reasons.empty()) reasons += ",";
      reasons += c.finish == FinishReason::kNone ? "disconnected" : c.finish_reason();
    }
    TLOG_INFO("server", "{} {} prompt {} completion {} finish {} {:.3f} s", id, req.stream ? "stream" : "unary",
              prompt_tokens, completion, reasons, now_s() - t_start);
  }
  bool chat() const { return req.endpoint == Endpoint::kChatCompletions; }

  void cancel_unfinished() {
    for (size_t i = 0; i < choices.size(); ++i)
      if (choices[i].finish == FinishReason::kNone) engine->cancel(engine_ids[i]);
  }

  // Pops available events (waiting up to timeout); false when none arrived.
  bool take(std::deque<std::pair<int, RequestEvent>>& out, double timeout_s) {
    std::unique_lock<std::mutex> lk(ch->mu);
    ch->cv.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return !ch->events.empty(); });
    if (ch->events.empty()) return false;
    out.swap(ch->events);
    return true;
  }

  void record_logprobs(ChoiceOut& c, const RequestEvent& ev) {
    if (!req.logprobs) return;
    for (const auto& lp : ev.logprobs) {
      c.raw_logprobs.push_back(lp);
      if (chat()) {
        json e = token_logprob_entry(*tok, lp.token, lp.logprob);
        json top = json::array();
        for (const auto& [t, l] : lp.top) top.push_back(token_logprob_entry(*tok, t, l));
        e["top_logprobs"] = top;
        c.logprobs.push_back(e);
      }
    }
  }

  // Bytes of the choice's prompt tokens: where an echoed completion's own text offsets start.
  size_t echo_bytes(const ChoiceOut& c) const {
    size_t n = 0;
    for (int32_t t : prompt_ids[c.prompt]) n += tok->token_bytes(t).size();
    return n;
  }

  // The legacy completions logprobs of `lps`, text offsets from text_offset0; with `echo`, the
  // prompt's tokens come first (offsets from 0): the first one without a log-probability (it has no
  // context), then the engine's entries with the request's top n.
  json completion_logprobs(const std::vector<TokenLogprob>& lps, size_t text_offset0, const ChoiceOut* echo = nullptr) const {
    json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
    size_t off = echo ? 0 : text_offset0;
    if (echo) {
      const std::vector<int32_t>& ids = prompt_ids[echo->prompt];
      for (size_t i = 0; i < ids.size(); ++i) {
        std::string b = tok->token_bytes(ids[i]);
        const TokenLogprob* p = i > 0 && i - 1 < echo->prompt_lp.size() ? &echo->prompt_lp[i - 1] : nullptr;
        tokens.push_back(b);
        token_lps.push_back(p ? json(p->logprob) : json(nullptr));
        json top = p ? json::object() : json(nullptr);
        if (p)
          for (size_t k = 0; k < p->top.size() && k < static_cast<size_t>(req.top_logprobs); ++k)
            top[tok->token_bytes(p->top[k].first)] = p->top[k].second;
        tops.push_back(top);
        offsets.push_back(off);
        off += b.size();
      }
    }
    for (const auto& lp : lps) {
      std::string b = tok->token_bytes(lp.token);
      tokens.push_back(b);
      token_lps.push_back(lp.logprob);
      json top = json::object();
      for (const auto& [t, l] : lp.top) top[tok->token_bytes(t)] = l;
      tops.push_back(top);
      offsets.push_back(off);
      off += b.size();
    }
    return json{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  // vLLM's prompt_logprobs: null for the first prompt token, then per token a map from token id
  // to {logprob, rank, decoded_token} holding the prompt token and its top n alternatives.
  json vllm_prompt_logprobs(const ChoiceOut& c) const {
    json out = json::array();
    for (size_t i = 0; i < prompt_ids[c.prompt].size(); ++i) {
      const TokenLogprob* p = i > 0 && i - 1 < c.prompt_lp.size() ? &c.prompt_lp[i - 1] : nullptr;
      if (!p) {
        out.push_back(nullptr);
        continue;
      }
      json d = json::object();
      auto put = [&](int32_t id, float lp, int32_t rank) {
        d[std::to_string(id)] = json{{"logprob", lp}, {"rank", rank}, {"decoded_token", tok->token_bytes(id)}};
      };
      const size_t n = std::min(p->top.size(), static_cast<size_t>(std::max(req.prompt_logprobs, 0)));
      for (size_t k = 0; k < n; ++k) {
        int32_t rank = 1;  // every id above a listed one is listed before it
        for (size_t j = 0; j < k; ++j) rank += p->top[j].second > p->top[k].second ? 1 : 0;
        put(p->top[k].first, p->top[k].second, rank);
      }
      put(p->token, p->logprob, p->rank);
      out.push_back(d);
    }
    return out;
  }

  json chunk_base() const {
    return json{{"id", id}, {"object", chat() ? "chat.completion.chunk" : "text_completion"}, {"created", created}, {"model", model_name}};
  }

  // SSE frames for one choice's deltas (+ its finish).
  void stream_frames(ChoiceOut& c, const std::vector<DsmlDelta>& deltas, const json& lp_chunk, std::string& out) {
    auto emit = [&](json choice) {
      json chunk = chunk_base();
      chunk["choices"] = json::array({choice});
      if (req.include_usage) chunk["usage"] = nullptr;
      out += "data: " + dump_json(chunk) + "\n\n";
    };
    if (!chat()) {
      std::string text;
      for (const auto& d : deltas) text += d.text;
      if (!text.empty() || !lp_chunk.is_null())
        emit(json{{"index", c.index}, {"text", text}, {"logprobs", lp_chunk}, {"finish_reason", nullptr}});
      return;
    }
    bool lp_attached = false;
    for (const auto& d : deltas) {
      json delta;
      switch (d.kind) {
        case DsmlDeltaKind::kReasoning: delta = {{"reasoning_content", d.text}}; break;
        case DsmlDeltaKind::kContent: delta = {{"content", d.text}}; break;
        case DsmlDeltaKind::kToolCallStart:
          delta = {{"tool_calls", json::array({json{{"index", d.tool_index}, {"id", d.id}, {"type", "function"},
                                                     {"function", {{"name", d.name}, {"arguments", ""}}}}})}};
          break;
        case DsmlDeltaKind::kToolCallArgs:
          delta = {{"tool_calls", json::array({json{{"index", d.tool_index}, {"function", {{"arguments", d.text}}}}})}};
          break;
      }
      json lp = nullptr;
      if (!lp_attached && !lp_chunk.is_null() && d.kind == DsmlDeltaKind::kContent) {
        lp = lp_chunk;
        lp_attached = true;
      }
      emit(json{{"index", c.index}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", nullptr}});
    }
    if (!lp_attached && !lp_chunk.is_null())
      emit(json{{"index", c.index}, {"delta", json::object()}, {"logprobs", lp_chunk}, {"finish_reason", nullptr}});
  }

  std::string finish_frame(const ChoiceOut& c) {
    json chunk = chunk_base();
    json choice = chat() ? json{{"index", c.index}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", c.finish_reason()}}
                         : json{{"index", c.index}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", c.finish_reason()}};
    chunk["choices"] = json::array({choice});
    if (req.include_usage) chunk["usage"] = nullptr;
    return "data: " + dump_json(chunk) + "\n\n";
  }

  json total_usage() const {
    int64_t completion = 0, cached = 0, reasoning = 0;
    for (const auto& c : choices) {
      completion += c.completion_tokens;
      cached = std::max(cached, c.usage.cached_tokens);
      reasoning += c.reasoning_tokens;
    }
    return usage_json(prompt_tokens, completion, cached, reasoning);
  }

  // The first chunk of each choice carries the role (sent at once, before any token exists).
  void role_frames(std::string& sse) {
    if (sent_role || !chat()) return;
    for (auto& c : choices) {
      json chunk = chunk_base();
      chunk["choices"] = json::array({json{{"index", c.index}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                           {"logprobs", nullptr}, {"finish_reason", nullptr}}});
      if (req.include_usage) chunk["usage"] = nullptr;
      sse += "data: " + dump_json(chunk) + "\n\n";
    }
    sent_role = true;
  }

  // Consumes events; appends SSE text when streaming. Returns true when every choice finished.
  bool process(std::deque<std::pair<int, RequestEvent>>& events, std::string* sse) {
    for (auto& [idx, ev] : events) {
      ChoiceOut& c = choices[idx];
      if (c.finish != FinishReason::kNone) continue;
      size_t lp_before = c.raw_logprobs.size();
      size_t text_before = c.content.size();
      if (!ev.prompt_logprobs.empty()) c.prompt_lp = ev.prompt_logprobs;
      record_logprobs(c, ev);
      auto deltas = c.feed(ev);
      if (ev.finish != FinishReason::kNone) {
        auto tail = c.finish_output();
        deltas.insert(deltas.end(), tail.begin(), tail.end());
        c.finish = ev.finish;
        c.error = ev.error;
        c.usage = ev.usage;
        if (ev.usage.completion_tokens > 0) c.completion_tokens = ev.usage.completion_tokens;
        ++finished;
      }
      if (sse) {
        json lp_chunk = nullptr;
        if (req.logprobs && c.raw_logprobs.size() > lp_before) {
          if (chat()) {
            json content = json::array();
            for (size_t i = lp_before; i < c.logprobs.size(); ++i) content.push_back(c.logprobs[i]);
            lp_chunk = json{{"content", content}};
          } else {
            std::vector<TokenLogprob> part(c.raw_logprobs.begin() + lp_before, c.raw_logprobs.end());
            lp_chunk = completion_logprobs(part, text_before + (req.echo ? echo_bytes(c) : 0));
          }
        }
        role_frames(*sse);
        if (!chat() && req.echo && !c.echoed) {  // the prompt first, with its log-probabilities
          c.echoed = true;
          json chunk = chunk_base();
          json lp = req.logprobs ? completion_logprobs({}, 0, &c) : json(nullptr);
          chunk["choices"] = json::array({json{{"index", c.index}, {"text", prompt_texts[c.prompt]}, {"logprobs", lp},
                                               {"finish_reason", nullptr}}});
          if (req.include_usage) chunk["usage"] = nullptr;
          *sse += "data: " + dump_json(chunk) + "\n\n";
        }
        stream_frames(c, deltas, lp_chunk, *sse);
        if (c.finish != FinishReason::kNone) *sse += finish_frame(c);
      }
    }
    events.clear();
    bool all = finished == static_cast<int>(choices.size());
    if (all && sse && !done_sent) {
      if (req.include_usage) {
        json chunk = chunk_base();
        chunk["choices"] = json::array();
        chunk["usage"] = total_usage();
        *sse += "data: " + dump_json(chunk) + "\n\n";
      }
      *sse += "data: [DONE]\n\n";
      done_sent = true;
    }
    return all;
  }

  json final_body() const {
    json out_choices = json::array();
    for (const auto& c : choices) {
      if (chat()) {
        json msg = {{"role", "assistant"}};
        msg["content"] = (c.content.empty() && !c.tool_calls.empty()) ? json(nullptr) : json(c.content);
        if (!c.reasoning.empty() || req.thinking) msg["reasoning_content"] = c.reasoning.empty() ? json(nullptr) : json(c.reasoning);
        if (!c.tool_calls.empty()) {
          json tcs = json::array();
          for (const auto& t : c.tool_calls)
            tcs.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
          msg["tool_calls"] = tcs;
        }
        json lp = req.logprobs ? json{{"content", c.logprobs}} : json(nullptr);
        out_choices.push_back({{"index", c.index}, {"message", msg}, {"logprobs", lp}, {"finish_reason", c.finish_reason()}});
      } else {
        std::string text = req.echo ? prompt_texts[c.prompt] + c.content : c.content;
        json lp = req.logprobs ? completion_logprobs(c.raw_logprobs, 0, req.echo ? &c : nullptr) : json(nullptr);
        json choice = {{"index", c.index}, {"text", text}, {"logprobs", lp}, {"finish_reason", c.finish_reason()}};
        if (req.prompt_logprobs >= 0) choice["prompt_logprobs"] = vllm_prompt_logprobs(c);
        out_choices.push_back(choice);
      }
    }
    json body = {{"id", id}, {"object", chat() ? "chat.completion" : "text_completion"}, {"created", created},
                 {"model", model_name}, {"choices", out_choices}, {"usage", total_usage()}};
    if (chat() && req.prompt_logprobs >= 0 && !choices.empty()) body["prompt_logprobs"] = vllm_prompt_logprobs(choices[0]);
    return body;
  }
};

// The token ids a chat request runs: its messages and tools through the DeepSeek-V4 encoder.
Result<std::vector<int32_t>> chat_prompt_ids(const ParsedRequest& r, const Tokenizer& tok) {
  PromptOptions po;
  po.thinking = r.thinking;
  po.reasoning_effort = r.reasoning_effort;
  po.include_tools = r.tool_choice != ToolChoice::kNone;
  auto text = render_chat_prompt(r.ordered_messages, r.ordered_tools, po);
  if (!text.ok()) return text.status();
  return tok.encode(*text);
}

ApiError unauthorized_error() {
  ApiError e;
  e.http_status = 401;
  e.type = "invalid_request_error";
  e.code = "invalid_api_key";
  e.message = "Incorrect or missing API key (send 'Authorization: Bearer <key>').";
  return e;
}

struct HttpServer::Impl {
  static bool authorized(HttpServer& s, const httplib::Request& req) {
    if (s.config_.api_key.empty()) return true;
    std::string h = req.get_header_value("Authorization");
    std::string want = "Bearer " + s.config_.api_key;
    if (h.size() != want.size()) return false;
    unsigned diff = 0;
    for (size_t i = 0; i < h.size(); ++i) diff |= static_cast<unsigned char>(h[i] ^ want[i]);
    return diff == 0;
  }

  static std::shared_ptr<const json_grammar::TokenTrie> trie(HttpServer& s, const Tokenizer& tok) {
    std::lock_guard<std::mutex> lk(s.trie_mu_);
    if (!s.trie_) s.trie_ = json_grammar::TokenTrie::from_tokenizer(tok);
    return s.trie_;
  }

  // Validates, renders and submits; on success fills `gen`. Errors are returned as ApiError.
  // The engine to serve a request with, or the 503 while loading or draining.
  static Engine* serving_engine(HttpServer& s, ApiError& error) {
    Engine* engine = s.engine_.load();
    if (!s.draining_ && engine) return engine;
    error = error_from_status(Status(StatusCode::kUnavailable, s.draining_ ? "server is shutting down" : "model is loading"));
    return nullptr;
  }
  // A request's "model" (empty: absent) is one of the served names, or a 404.
  static std::optional<ApiError> unknown_model(const HttpServer& s, const std::string& model) {
    const auto& names = s.config_.served_model_names;
    if (model.empty() || std::find(names.begin(), names.end(), model) != names.end()) return std::nullopt;
    return not_found_error(fmt::format("The model `{}` does not exist.", model), "model");
  }

  static std::optional<ApiError> prepare(HttpServer& s, Endpoint ep, const std::string& body, Generation& gen) {
    ApiError unavailable;
    Engine* engine = serving_engine(s, unavailable);
    if (!engine) return unavailable;
    auto parsed = parse_openai_request(ep, body);
    if (!parsed.ok()) return parsed.error;
    ParsedRequest& r = *parsed.request;
    if (auto e = unknown_model(s, r.model)) return e;
    const auto& names = s.config_.served_model_names;
    gen.model_name = r.model.empty() ? names.front() : r.model;
    gen.engine = engine;
    const Tokenizer& tok = engine->tokenizer();
    gen.tok = &tok;
    const ModelInfo& info = engine->model_info();

    // Output mode and grammar.
    OutputMode mode = ep == Endpoint::kCompletions ? OutputMode::kCompletionText : OutputMode::kChat;
    std::shared_ptr<const json_grammar::Grammar> grammar;
    if (r.response_format == ResponseFormat::kJsonObject) {
      grammar = json_grammar::any_object(s.config_.json_whitespace);
      if (mode == OutputMode::kChat) mode = OutputMode::kJson;
    } else if (r.response_format == ResponseFormat::kJsonSchema) {
      auto g = json_grammar::compile(r.json_schema, s.config_.json_whitespace);
      if (!g.ok()) return bad_request("invalid 'response_format.json_schema.schema': " + g.status().message(), "response_format");
      grammar = *g;
      if (mode == OutputMode::kChat) mode = OutputMode::kJson;
    }
    std::string forced_name;
    if (mode == OutputMode::kChat && r.tool_choice == ToolChoice::kNamed) {
      for (const auto& t : r.tools)
        if (t["function"]["name"] == r.tool_choice_name) {
          auto g = json_grammar::compile(t["function"]["parameters"], s.config_.json_whitespace);
          if (!g.ok()) return bad_request(fmt::format("invalid parameters schema of tool '{}': {}", r.tool_choice_name, g.status().message()), "tools");
          grammar = *g;
        }
      mode = OutputMode::kNamedTool;
      forced_name = r.tool_choice_name;
    } else if (mode == OutputMode::kChat && r.tool_choice == ToolChoice::kRequired) {
      const json schema = required_tool_calls_schema(r);
      auto g = json_grammar::compile(schema, s.config_.json_whitespace);
      if (!g.ok()) return bad_request("invalid tool parameters schema: " + g.status().message(), "tools");
      grammar = *g;
      mode = OutputMode::kRequiredTool;
    }

    // Prompts: chat has one; completions one or a batch, each run n times.
    std::vector<std::vector<int32_t>>& prompts = gen.prompt_ids;
    if (ep == Endpoint::kChatCompletions) {
      auto ids = chat_prompt_ids(r, tok);
      if (!ids.ok()) return error_from_status(ids.status());
      prompts.push_back(std::move(ids).value());
      gen.prompt_texts.emplace_back();
    } else {
      for (CompletionPrompt& p : r.prompts) {
        if (p.is_ids) {
          for (int32_t t : p.ids)
            if (t >= info.vocab_size)
              return bad_request(fmt::format("prompt token id {} is out of range [0, {})", t, info.vocab_size), "prompt");
          gen.prompt_texts.push_back(tok.decode(p.ids));
          prompts.push_back(std::move(p.ids));
        } else {
          prompts.push_back(tok.encode(p.text));
          gen.prompt_texts.push_back(std::move(p.text));
        }
      }
    }
    const int64_t max_len = info.max_model_len;
    int64_t total_prompt = 0, lp_entries = 0;
    std::vector<int> max_tokens;  // per prompt
    for (const std::vector<int32_t>& ids : prompts) {
      const int64_t plen = static_cast<int64_t>(ids.size());
      total_prompt += plen;
      if (r.sampling.prompt_logprobs >= 0) lp_entries += static_cast<int64_t>(r.n) * plen * (r.sampling.prompt_logprobs + 1);
      if (max_len > 0 && plen >= max_len)
        return bad_request(fmt::format("This model's maximum context length is {} tokens. However, your request has {} input tokens. "
                                       "Please reduce the length of the input messages.", max_len, plen),
                           ep == Endpoint::kChatCompletions ? "messages" : "prompt");
      max_tokens.push_back(r.sampling.max_tokens);
      if (max_len > 0) {
        if (r.max_tokens_set && plen + r.sampling.max_tokens > max_len)
          return bad_request(fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                         "({} in the input, {} in the completion). Please reduce the length of the input or completion.",
                                         max_len, plen + r.sampling.max_tokens, plen, r.sampling.max_tokens), "max_tokens");
        if (!r.max_tokens_set) max_tokens.back() = static_cast<int>(std::min<int64_t>(max_len - plen, INT32_MAX));
      }
    }
    // Prompt log-probabilities are held and sent whole: bounded so one request cannot ask for
    // gigabytes of response (a 1M-token prompt with one alternative fits).
    if (lp_entries > kMaxPromptLogprobEntries)
      return bad_request(fmt::format("prompt log-probabilities for {} prompt tokens with {} alternatives{} are {} "
                                     "entries, more than the {} a response may hold: ask for fewer alternatives or "
                                     "send a shorter prompt",
                                     total_prompt, r.sampling.prompt_logprobs,
                                     r.n > 1 ? fmt::format(" for {} choices", r.n) : "", lp_entries, kMaxPromptLogprobEntries),
                         r.prompt_logprobs >= 0 ? "prompt_logprobs" : "logprobs");
    if (!r.temperature_set && s.config_.default_temperature) r.sampling.temperature = *s.config_.default_temperature;
    if (!r.top_p_set && s.config_.default_top_p) r.sampling.top_p = *s.config_.default_top_p;
    if (!r.top_k_set && s.config_.default_top_k) r.sampling.top_k = *s.config_.default_top_k;

    // Admission.
    if (s.in_flight_.load() >= s.config_.max_pending_requests) {
      ApiError e = error_from_status(Status(StatusCode::kResourceExhausted,
                                            fmt::format("too many requests in flight ({}); retry later", s.config_.max_pending_requests)));
      return e;
    }
    ++s.in_flight_;
    gen.in_flight = &s.in_flight_;
    gen.counted = true;

    uint64_t serial = s.next_id_++;
    gen.id = (ep == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-") + random_suffix(16) + std::to_string(serial);
    gen.created = static_cast<int64_t>(std::time(nullptr));
    gen.prompt_tokens = total_prompt;
    const int nchoices = static_cast<int>(prompts.size()) * r.n;  // choice k: prompt k / n, sample k % n
    gen.choices.resize(static_cast<size_t>(nchoices));
    std::shared_ptr<const json_grammar::TokenTrie> tr;
    if (grammar) tr = trie(s, tok);
    for (int i = 0; i < nchoices; ++i) {
      ChoiceOut& c = gen.choices[i];
      c.index = i;
      c.prompt = i / r.n;
      c.mode = mode;
      c.forced_name = forced_name;
      c.reasoning_open = r.thinking && mode == OutputMode::kChat;
      c.single_tool_call = !r.parallel_tool_calls;
      c.tok = &tok;
      if (mode == OutputMode::kChat) {
        DsmlParserOptions po;
        po.thinking = r.thinking;
        c.parser = std::make_unique<DsmlStreamParser>(po);
      }
    }
    gen.req = std::move(r);
    for (int i = 0; i < nchoices; ++i) {
      Request er;
      er.request_id = gen.id + "-" + std::to_string(i);
      er.prompt_tokens = prompts[i / gen.req.n];
      er.sampling = gen.req.sampling;
      er.sampling.max_tokens = max_tokens[i / gen.req.n];
      er.timeout_s = s.config_.request_timeout_s;
      if (gen.req.request_timeout_s > 0 && (er.timeout_s <= 0 || gen.req.request_timeout_s < er.timeout_s))
        er.timeout_s = gen.req.request_timeout_s;
      if (er.sampling.seed && i % gen.req.n > 0) er.sampling.seed = *er.sampling.seed + static_cast<uint64_t>(i % gen.req.n);
      if (grammar) er.constraint = std::make_shared<json_grammar::JsonSchemaConstraint>(grammar, tr, info.eos_token_id);
      gen.engine_ids.push_back(er.request_id);
      std::weak_ptr<Channel> wch = gen.ch;
      Status st = engine->submit(std::move(er), [wch, i](const RequestEvent& ev) {
        auto ch = wch.lock();
        if (!ch) return;
        {
          std::lock_guard<std::mutex> lk(ch->mu);
          ch->events.emplace_back(i, ev);
        }
        ch->cv.notify_one();
      });
      if (!st.ok()) {
        for (int k = 0; k < i; ++k) engine->cancel(gen.engine_ids[k]);
        gen.engine_ids.resize(i);
        return error_from_status(st);
      }
    }
    return std::nullopt;
  }

  // A rejected request leaves one line in the log (who, where, why), like a served one.
  static void reject(HttpServer& s, const httplib::Request& req, httplib::Response& res, const ApiError& e) {
    s.metrics_.count_request_error();
    TLOG_INFO("server", "rejected {} {} from {}:{}: {} {}", req.method, req.path, req.remote_addr, req.remote_port,
              e.http_status, e.message);
    send_error(res, e);
  }

  // vLLM's tokenizer endpoints (lm-evaluation-harness's remote tokenizer uses them): the ids the
  // completions endpoint runs for a prompt (the tokenizer adds no special tokens), or the ids the
  // chat endpoint runs for messages (tools, thinking and reasoning effort as there); and back.
  static void tokenize(HttpServer& s, const httplib::Request& req, httplib::Response& res, bool detokenize) {
    if (!authorized(s, req)) return reject(s, req, res, unauthorized_error());
    ApiError unavailable;
    Engine* engine = serving_engine(s, unavailable);
    if (!engine) return reject(s, req, res, unavailable);
    const Tokenizer& tok = engine->tokenizer();
    const ModelInfo& info = engine->model_info();
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object())
      return reject(s, req, res, bad_request("request body must be a JSON object", ""));
    if (body.contains("model") && !body["model"].is_null()) {
      if (!body["model"].is_string()) return reject(s, req, res, bad_request("'model' must be a string", "model"));
      if (auto e = unknown_model(s, body["model"].get<std::string>())) return reject(s, req, res, *e);
    }
    if (detokenize) {
      const json& t = body.contains("tokens") ? body["tokens"] : json();
      if (!t.is_array()) return reject(s, req, res, bad_request("'tokens' (an array of token ids) is required", "tokens"));
      std::vector<int32_t> ids;
      for (const auto& x : t) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= info.vocab_size)
          return reject(s, req, res,
                        bad_request(fmt::format("'tokens' must hold token ids in [0, {})", info.vocab_size), "tokens"));
        ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
      }
      res.set_content(dump_json(json{{"prompt", tok.decode(ids)}}), "application/json");
      return;
    }
    for (const char* key : {"add_special_tokens", "return_token_strs", "add_generation_prompt"})
      if (body.contains(key) && !body[key].is_null() && !body[key].is_boolean())
        return reject(s, req, res, bad_request(fmt::format("'{}' must be a boolean", key), key));
    auto flag = [&body](const char* key, bool absent) {
      return body.contains(key) && body[key].is_boolean() ? body[key].get<bool>() : absent;
    };
    if (!flag("add_generation_prompt", true))
      return reject(s, req, res,
                    bad_request("'add_generation_prompt': false is not supported (a chat prompt ends with the assistant "
                                "prefix, as /v1/chat/completions runs it)",
                                "add_generation_prompt"));
    std::vector<int32_t> ids;
    if (body.contains("messages")) {
      auto parsed = parse_openai_request(Endpoint::kChatCompletions, req.body);
      if (!parsed.ok()) return reject(s, req, res, parsed.error);
      auto r = chat_prompt_ids(*parsed.request, tok);
      if (!r.ok()) return reject(s, req, res, error_from_status(r.status()));
      ids = std::move(r).value();
    } else if (body.contains("prompt") && body["prompt"].is_string()) {
      ids = tok.encode(body["prompt"].get<std::string>());
    } else {
      return reject(s, req, res, bad_request("'prompt' (a string) or 'messages' is required", "prompt"));
    }
    json out = {{"count", ids.size()}, {"max_model_len", info.max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
    if (flag("return_token_strs", false)) {
      json strs = json::array();
      for (int32_t id : ids) strs.push_back(tok.token_bytes(id));
      out["token_strs"] = strs;
    }
    res.set_content(dump_json(out), "application/json");
  }

  static void generate(HttpServer& s, Endpoint ep, const httplib::Request& req, httplib::Response& res) {
    if (!authorized(s, req)) return reject(s, req, res, unauthorized_error());
    if (req.body.empty()) {
      return reject(s, req, res,
                    bad_request("the request body is empty: send a JSON object (Content-Type: application/json)", ""));
    }
    auto gen = std::make_shared<Generation>();
    if (auto err = prepare(s, ep, req.body, *gen)) return reject(s, req, res, *err);
    auto conn = std::make_shared<ConnectionProbe>(ConnectionProbe::find(req.remote_addr, req.remote_port, req.local_port));
    if (!gen->req.stream) {
      // Non-streaming: wait for every choice here, on the connection's thread, watching the
      // client: when it goes, cancel (the engine frees blocks and slot at its next step) and stop.
      std::deque<std::pair<int, RequestEvent>> events;
      while (true) {
        gen->take(events, kDisconnectPoll);
        if (gen->process(events, nullptr)) break;
        if (conn->peer_closed()) {
          gen->cancel_unfinished();
          return;
        }
      }
      for (const auto& c : gen->choices) {
        if (c.finish == FinishReason::kError) {
          ApiError e;
          e.http_status = 500;
          e.type = "internal_error";
          e.message = "generation failed: " + c.error;
          s.metrics_.count_request_error();
          return send_error(res, e);
        }
      }
      res.set_content(dump_json(gen->final_body()), "application/json");
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    double probe = s.config_.idle_probe_s;
    gen->last_write = now_s();
    res.set_chunked_content_provider(
        "text/event-stream",
        [gen, probe, conn](size_t, httplib::DataSink& sink) -> bool {
          if (conn->peer_closed()) {  // gone before a write could fail
            gen->cancel_unfinished();
            return false;
          }
          std::deque<std::pair<int, RequestEvent>> events;
          std::string sse;
          gen->role_frames(sse);
          bool got = gen->take(events, std::min(probe, 0.1));
          bool all = got ? gen->process(events, &sse) : false;
          if (!got && now_s() - gen->last_write >= probe) sse = ": keep-alive\n\n";  // detects a gone client
          if (!sse.empty()) {
            if (!sink.write(sse.data(), sse.size())) {
              gen->cancel_unfinished();
              return false;
            }
            gen->last_write = now_s();
          }
          if (all) sink.done();
          return true;
        },
        [gen](bool success) {
          if (!success || gen->finished < static_cast<int>(gen->choices.size())) gen->cancel_unfinished();
        });
  }

  static void routes(HttpServer& s) {
    httplib::Server& h = *s.http_;
    h.Get("/health", [&s](const httplib::Request&, httplib::Response& res) {
      Engine* e = s.engine_.load();
      if (s.draining_ || !e || !e->healthy()) {
        res.status = 503;
        res.set_content(s.draining_ ? "draining" : (!e ? "loading" : "unhealthy"), "text/plain");
        return;
      }
      res.status = 200;
    });
    h.Get("/version", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(dump_json(json{{"version", version_string()}}), "application/json");
    });
    h.Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
      Engine* e = s.engine_.load();
      EngineMetrics m = e ? e->metrics() : EngineMetrics{};
      res.set_content(s.metrics_.render(m, s.config_.served_model_names.front(), s.in_flight_.load()),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
    h.Get("/v1/models", [&s](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(s, req)) {
        ApiError e;
        e.http_status = 401;
        e.code = "invalid_api_key";
        e.message = "Incorrect or missing API key (send 'Authorization: Bearer <key>').";
        return send_error(res, e);
      }
      Engine* e = s.engine_.load();
      json data = json::array();
      for (const auto& n : s.config_.served_model_names) {
        json m = {{"id", n}, {"object", "model"}, {"created", 0}, {"owned_by", "tandem"}, {"root", n}};
        if (e) m["max_model_len"] = e->model_info().max_model_len;
        data.push_back(m);
      }
      res.set_content(dump_json(json{{"object", "list"}, {"data", data}}), "application/json");
    });
    h.Post("/v1/chat/completions", [&s](const httplib::Request& req, httplib::Response& res) {
      generate(s, Endpoint::kChatCompletions, req, res);
    });
    h.Post("/v1/completions", [&s](const httplib::Request& req, httplib::Response& res) {
      generate(s, Endpoint::kCompletions, req, res);
    });
    h.Post("/tokenize", [&s](const httplib::Request& req, httplib::Response& res) { tokenize(s, req, res, false); });
    h.Post("/detokenize", [&s](const httplib::Request& req, httplib::Response& res) { tokenize(s, req, res, true); });
    h.Get("/tokenizer_info", [&s](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(s, req)) return reject(s, req, res, unauthorized_error());
      Engine* e = s.engine_.load();
      if (!e) return reject(s, req, res, error_from_status(Status(StatusCode::kUnavailable, "model is loading")));
      const Tokenizer& tok = e->tokenizer();
      const ModelInfo& info = e->model_info();
      const std::string eos = tok.token_bytes(info.eos_token_id);
      const auto bos = tok.token_to_id(dsv4::kBos);
      // No chat_template: the prompt format is the DeepSeek-V4 encoder's (src/text/encoding_dsv4.h),
      // not a Jinja template; /tokenize with "messages" renders it.
      res.set_content(dump_json(json{{"tokenizer_class", "tandem"},
                                     {"eos_token", eos},
                                     {"bos_token", bos ? json(tok.token_bytes(*bos)) : json(nullptr)},
                                     {"pad_token", eos},
                                     {"model_max_length", info.max_model_len},
                                     {"vocab_size", info.vocab_size}}),
                      "application/json");
    });
    // The generation routes answer other methods with 405 (and Allow: POST), not 404.
    for (const char* path : {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"}) {
      auto not_allowed = [path](const httplib::Request& req, httplib::Response& res) {
        res.status = 405;
        res.set_header("Allow", "POST");
        ApiError e;
        e.http_status = 405;
        e.message = fmt::format("method {} is not allowed on {}; use POST", req.method, path);
        res.set_content(api_error_body(e), "application/json");
        TLOG_INFO("server", "rejected {} {} from {}:{}: 405", req.method, req.path, req.remote_addr, req.remote_port);
      };
      h.Get(path, not_allowed);
      h.Put(path, not_allowed);
      h.Delete(path, not_allowed);
      h.Patch(path, not_allowed);
    }
    // Unknown routes and httplib's own rejections (bad HTTP, 413) get an OpenAI error body too,
    // and every error leaves a line in the log.
    h.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (res.body.empty()) {
        ApiError e;
        e.http_status = res.status;
        if (res.status == 404) { e.type = "not_found_error"; e.message = fmt::format("no route {} {}", req.method, req.path); }
        else if (res.status == 413) e.message = "request body too large";
        else if (res.status == 405) e.message = "method not allowed";
        else if (res.status == 400)
          e.message = "malformed HTTP request (a POST needs a Content-Length or chunked body holding a JSON object)";
        else e.message = fmt::format("HTTP error {}", res.status);
        res.set_content(api_error_body(e), "application/json");
        // (Handlers that fill the body log their own rejections.)
        TLOG_INFO("server", "rejected {} {} from {}:{}: {} {}", req.method.empty() ? "-" : req.method,
                  req.path.empty() ? "-" : req.path, req.remote_addr, req.remote_port, res.status, e.message);
      }
    });
    h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
      ApiError e;
      e.http_status = 500;
      e.type = "internal_error";
      e.message = "internal error";
      res.status = 500;
      res.set_content(api_error_body(e), "application/json");
    });
  }
};

HttpServer::HttpServer(ServerConfig config) : config_(std::move(config)), http_(std::make_unique<httplib::Server>()) {
  if (config_.served_model_names.empty()) config_.served_model_names.push_back("tandem");
  int threads = config_.http_threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(static_cast<size_t>(config_.max_body_bytes));
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  http_->set_keep_alive_timeout(30);
  http_->set_keep_alive_max_count(1000);
  Impl::routes(*this);
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::set_engine(Engine* engine) { engine_ = engine; }

Status HttpServer::bind(const std::string& host, int port) {
  if (port == 0) {
    int p = http_->bind_to_any_port(host.c_str());
    if (p <= 0) return make_error(StatusCode::kUnavailable, "cannot bind {}:0", host);
    port_ = p;
  } else {
    if (!http_->bind_to_port(host.c_str(), port))
      return make_error(StatusCode::kUnavailable, "cannot bind {}:{} (address in use or not local?)", host, port);
    port_ = port;
  }
  return Status();
}

void HttpServer::serve() { http_->listen_after_bind(); }

Status HttpServer::start() {
  thread_ = std::thread([this] { serve(); });
  // The socket is already bound and listening; wait until the accept loop runs.
  for (int i = 0; i < 2000 && !http_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return Status();
}

void HttpServer::begin_drain() { draining_ = true; }

void HttpServer::stop() {
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tandem::server

// In-process HTTP tests: every endpoint and error case over loopback against the FakeEngine.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "server/fake_engine.h"  // tests/server/fake_engine.h

namespace tandem::server::testing {
namespace {

using json = nlohmann::json;

json post_json(httplib::Client& c, const std::string& path, const json& body, int* status = nullptr,
               httplib::Headers headers = {}) {
  auto r = c.Post(path.c_str(), headers, body.dump(), "application/json");
  EXPECT_TRUE(r) << "no response for " << path;
  if (!r) return json();
  if (status) *status = r->status;
  auto j = json::parse(r->body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r->body;
  return j;
}

// Splits an SSE body into its data payloads; checks the framing on the way.
std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated SSE event at " << pos;
    if (end == std::string::npos) break;
    std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind(":", 0) == 0) continue;  // comment
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    out.push_back(ev.substr(6));
  }
  return out;
}

// A streamed completion's text (every chunk's, in order) and finish reason.
struct CompletionStream {
  std::string text, finish;
};
CompletionStream completion_stream(const std::vector<std::string>& data) {
  CompletionStream out;
  for (const auto& d : data) {
    if (d == "[DONE]") break;
    auto j = json::parse(d);
    EXPECT_EQ(j["object"], "text_completion");
    out.text += j["choices"][0]["text"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) out.finish = j["choices"][0]["finish_reason"];
  }
  return out;
}

json chat(const std::string& text) { return json{{"model", "tandem"}, {"messages", {{{"role", "user"}, {"content", text}}}}}; }

TEST(Server, HealthVersionModels) {
  ServerHarness h;
  auto c = h.client();
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = c.Get("/version");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["version"], "0.1.0");
  r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  auto j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][0]["id"], "tandem");
  EXPECT_EQ(j["data"][1]["id"], "alias");
}

TEST(Server, HealthIs503WhileLoadingAndDraining) {
  ServerHarness h({}, {}, /*attach=*/false);
  auto c = h.client();
  EXPECT_EQ(c.Get("/health")->status, 503);
  int status = 0;
  auto j = post_json(c, "/v1/chat/completions", chat("x"), &status);
  EXPECT_EQ(status, 503);
  h.server->set_engine(h.engine.get());
  EXPECT_EQ(c.Get("/health")->status, 200);
  h.server->begin_drain();
  EXPECT_EQ(c.Get("/health")->status, 503);
  j = post_json(c, "/v1/chat/completions", chat("x"), &status);
  EXPECT_EQ(status, 503);
  EXPECT_EQ(j["error"]["type"], "service_unavailable");
}

TEST(Server, ChatCompletion) {
  ServerHarness h;
  auto c = h.client();
  int status = 0;
  auto j = post_json(c, "/v1/chat/completions", chat("hello world"), &status);
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "tandem");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Echo: hello world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const auto& u = j["usage"];
  EXPECT_GT(u["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(u["completion_tokens"].get<int>(), static_cast<int>(std::string("Echo: hello world").size()));
  EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
  EXPECT_TRUE(u["prompt_tokens_details"].contains("cached_tokens"));
  EXPECT_TRUE(u["completion_tokens_details"].contains("reasoning_tokens"));
  // Alias name and no model at all are accepted.
  auto j2 = chat("a");
  j2["model"] = "alias";
  post_json(c, "/v1/chat/completions", j2, &status);
  EXPECT_EQ(status, 200);
  j2.erase("model");
  auto j3 = post_json(c, "/v1/chat/completions", j2, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(j3["model"], "tandem");
}

TEST(Server, ContentPartsAndMultiTurn) {
  ServerHarness h;
  auto c = h.client();
  json body = {{"messages", {{{"role", "system"}, {"content", "be brief"}},
                             {{"role", "user"}, {"content", "first"}},
                             {{"role", "assistant"}, {"content", "ok"}},
                             {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "second "}}, {{"type", "text"}, {"text", "part"}}}}}}}};
  int status = 0;
  auto j = post_json(c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << j.dump();
  std::string content = j["choices"][0]["message"]["content"];
  EXPECT_EQ(content.rfind("Echo: second ", 0), 0u) << content;
  EXPECT_NE(content.find("part"), std::string::npos);
}

TEST(Server, Completions) {
  ServerHarness h;
  auto c = h.client();
  int status = 0;
  auto j = post_json(c, "/v1/completions", {{"model", "tandem"}, {"prompt", "abc"}, {"max_tokens", 4}}, &status);
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "Echo");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  j = post_json(c, "/v1/completions", {{"prompt", "abc"}, {"max_tokens", 2}, {"echo", true}}, &status);
  EXPECT_EQ(j["choices"][0]["text"], "abcEc");
  // Token-id prompts; out-of-vocabulary ids are a 400.
  j = post_json(c, "/v1/completions", {{"prompt", {16 + 'h', 16 + 'i'}}, {"max_tokens", 3}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 2);
  j = post_json(c, "/v1/completions", {{"prompt", {999999}}}, &status);
  EXPECT_EQ(status, 400);
}

// The legacy completions API's echo + logprobs (what lm-evaluation-harness's loglikelihood tasks
// send): the prompt's tokens lead the logprobs, the first without a value (no context), the rest
// with the engine's prompt log-probabilities; max_tokens 0 scores the prompt alone.
TEST(Server, EchoWithLogprobsScoresThePrompt) {
  ServerHarness h;
  auto c = h.client();
  int status = 0;
  auto j = post_json(c, "/v1/completions", {{"prompt", "abcd"}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}}, &status);
  ASSERT_EQ(status, 200) << j.dump();
  const json& ch = j["choices"][0];
  EXPECT_EQ(ch["text"], "abcdEc");
  const json& lp = ch["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"a", "b", "c", "d", "E", "c"}));
  EXPECT_EQ(lp["text_offset"], json({0, 1, 2, 3, 4, 5}));
  ASSERT_EQ(lp["token_logprobs"].size(), 6u);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (int i = 1; i < 4; ++i) {  // the scripted engine: token i at -0.5 - i/8, one alternative
    EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), -0.5f - i / 8.0f) << i;
    EXPECT_EQ(lp["top_logprobs"][i].size(), 1u) << i;
  }
  EXPECT_FLOAT_EQ(lp["token_logprobs"][4].get<float>(), -0.25f);
  EXPECT_FALSE(ch.contains("prompt_logprobs"));  // vLLM's field only when asked for

  // The prompt alone: max_tokens 0 with echo (with or without logprobs); without echo it is a 400.
  j = post_json(c, "/v1/completions", {{"prompt", "abcd"}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 0}}, &status);
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["text"], "abcd");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(), 4u);
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][1], json::object());
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 4);
  j = post_json(c, "/v1/completions", {{"prompt", "abcd"}, {"max_tokens", 0}, {"echo", true}}, &status);
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["text"], "abcd");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  j = post_json(c, "/v1/completions", {{"prompt", "abcd"}, {"max_tokens", 0}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  json no_output = chat("x");
  no_output["max_tokens"] = 0;
  j = post_json(c, "/v1/chat/completions", no_output, &status);
  EXPECT_EQ(status, 400);

  // lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs 1, max_tokens 1; it
  // sums token_logprobs[ctxlen:-1] and compares each with its top_logprobs' maximum.
  const std::vector<int> ids = {16 + 'x', 16 + 'y', 16 + 'z', 16 + 'w', 16 + 'v'};
  j = post_json(c, "/v1/completions",
                {{"prompt", {ids}}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 1}, {"temperature", 0}, {"seed", 1234}},
                &status);
  ASSERT_EQ(status, 200) << j.dump();
  const json& l = j["choices"][0]["logprobs"];
  ASSERT_EQ(l["token_logprobs"].size(), ids.size() + 1);
  ASSERT_EQ(l["top_logprobs"].size(), ids.size() + 1);
  for (size_t i = 2; i < ids.size(); ++i) {  // ctxlen 2: the continuation's tokens
    EXPECT_TRUE(l["token_logprobs"][i].is_number()) << i;
    EXPECT_TRUE(l["top_logprobs"][i].is_object()) << i;
  }
}

// vLLM's prompt_logprobs: per prompt token (the first null) a map from token id to {logprob, rank,
// decoded_token} with the token and its top n; chat puts it beside the choices. Not with streaming.
TEST(Server, PromptLogprobsAsVllmLaysThemOut) {
  ServerHarness h;
  auto c = h.client();
  int status = 0;
  auto j = post_json(c, "/v1/completions", {{"prompt", "abc"}, {"max_tokens", 1}, {"prompt_logprobs", 2}}, &status);
  ASSERT_EQ(status, 200) << j.dump();
  const json& pl = j["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), 3u);
  EXPECT_TRUE(pl[0].is_null());
  for (int i = 1; i < 3; ++i) {
    const int32_t tok = 16 + "abc"[i];
    ASSERT_TRUE(pl[i].is_object()) << i;
    EXPECT_EQ(pl[i].size(), 3u) << pl[i].dump();  // the token and two alternatives
    const json& e = pl[i][std::to_string(tok)];
    EXPECT_FLOAT_EQ(e["logprob"].get<float>(), -0.5f - i / 8.0f);
    EXPECT_EQ(e["rank"], 1 + i % 3);
    EXPECT_EQ(e["decoded_token"], std::string(1, "abc"[i]));
    EXPECT_EQ(pl[i][std::to_string(tok + 1)]["rank"], 1);
    EXPECT_EQ(pl[i][std::to_string(tok + 2)]["rank"], 2);
  }
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  json body = chat("hi");
  body["prompt_logprobs"] = 0;
  body["max_tokens"] = 0;
  j = post_json(c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << j.dump();
  ASSERT_TRUE(j["prompt_logprobs"].is_array());
  EXPECT_EQ(j["prompt_logprobs"].size(), j["usage"]["prompt_tokens"].get<size_t>());
  EXPECT_EQ(j["prompt_logprobs"][1].size(), 1u);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "");
  body["stream"] = true;
  j = post_json(c, "/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "prompt_logprobs");
  j = post_json(c, "/v1/completions", {{"prompt", "abc"}, {"prompt_logprobs", 21}}, &status);
  EXPECT_EQ(status, 400);
  // Bounded: prompt tokens x (alternatives + 1) x choices <= 2^21 entries.
  FakeEngineOptions eo;
  eo.max_model_len = 1 << 20;
  ServerHarness big(eo);
  auto c2 = big.client();
  const std::string long_prompt(100000, 'a');
  j = post_json(c2, "/v1/completions", {{"prompt", long_prompt}, {"max_tokens", 1}, {"prompt_logprobs", 20}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "prompt_logprobs");
  j = post_json(c2, "/v1/completions", {{"prompt", long_prompt}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 1}, {"n", 11}},
                &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "logprobs");
  j = post_json(c2, "/v1/completions", {{"prompt", long_prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}}, &status);
  EXPECT_EQ(status, 200) << j.dump().substr(0, 300);
}

// Streaming with echo: the prompt comes first in its own chunk (with its logprobs when asked for),
// then the completion, whose text offsets continue after the prompt.
TEST(Server, StreamingEchoSendsThePromptFirst) {
  ServerHarness h;
  auto c = h.client();
  auto r = c.Post("/v1/completions",
                  json{{"prompt", "xyz"}, {"stream", true}, {"max_tokens", 3}, {"echo", true}, {"logprobs", 1}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  auto data = sse_data(r->body);
  ASSERT_GE(data.size(), 3u);
  auto first = json::parse(data[0]);
  EXPECT_EQ(first["choices"][0]["text"], "xyz");
  EXPECT_EQ(first["choices"][0]["logprobs"]["tokens"], json({"x", "y", "z"}));
  EXPECT_TRUE(first["choices"][0]["logprobs"]["token_logprobs"][0].is_null());
  std::string text;
  std::vector<int> offsets;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    auto j = json::parse(data[i]);
    text += j["choices"][0]["text"].get<std::string>();
    if (j["choices"][0]["logprobs"].is_object())
      for (const auto& o : j["choices"][0]["logprobs"]["text_offset"]) offsets.push_back(o.get<int>());
  }
  EXPECT_EQ(text, "xyzEch");
  EXPECT_EQ(offsets, std::vector<int>({0, 1, 2, 3, 4, 5}));
  // max_tokens 0: the prompt, then the finish.
  r = c.Post("/v1/completions", json{{"prompt", "xyz"}, {"stream", true}, {"max_tokens", 0}, {"echo", true}}.dump(),
             "application/json");
  ASSERT_TRUE(r);
  const CompletionStream only = completion_stream(sse_data(r->body));
  EXPECT_EQ(only.text, "xyz");
  EXPECT_EQ(only.finish, "length");
}

// A batch of prompts (lm-evaluation-harness with --batch_size > 1 sends one): choice k answers
// prompt k / n (its k % n-th sample), each with its own echo and prompt log-probabilities; usage
// counts every prompt.
TEST(Server, BatchedCompletionPrompts) {
  ServerHarness h;
  auto c = h.client();
  int status = 0;
  auto j = post_json(c, "/v1/completions",
                     {{"prompt", {"ab", "xyz"}}, {"n", 2}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}}, &status);
  ASSERT_EQ(status, 200) << j.dump();
  ASSERT_EQ(j["choices"].size(), 4u);
  for (int k = 0; k < 4; ++k) {
    const json& ch = j["choices"][k];
    EXPECT_EQ(ch["index"], k);
    const std::string prompt = k < 2 ? "ab" : "xyz";
    EXPECT_EQ(ch["text"], prompt + "Ec") << k;
    EXPECT_EQ(ch["logprobs"]["tokens"].size(), prompt.size() + 2) << k;
    EXPECT_TRUE(ch["logprobs"]["token_logprobs"][0].is_null());
    EXPECT_EQ(ch["logprobs"]["text_offset"].back(), static_cast<int>(prompt.size()) + 1);
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  // Token-id batches, streamed: every index appears and finishes.
  auto r = c.Post("/v1/completions",
                  json{{"prompt", {{16 + 'a'}, {16 + 'b', 16 + 'c'}, {16 + 'd'}}}, {"stream", true}, {"max_tokens", 3}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  std::map<int, std::string> text;
  int finishes = 0;
  for (const auto& d : sse_data(r->body)) {
    if (d == "[DONE]") break;
    auto cj = json::parse(d);
    text[cj["choices"][0]["index"]] += cj["choices"][0]["text"].get<std::string>();
    if (!cj["choices"][0]["finish_reason"].is_null()) ++finishes;
  }
  EXPECT_EQ(finishes, 3);
  EXPECT_EQ(text.size(), 3u);
  for (const auto& [k, t] : text) EXPECT_EQ(t, "Ech") << k;
  // Each prompt is checked against the context length.
  FakeEngineOptions eo;
  eo.max_model_len = 8;
  ServerHarness small(eo);
  auto sc = small.client();
  j = post_json(sc, "/v1/completions", {{"prompt", {"ab", "0123456789"}}, {"max_tokens", 1}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "prompt");
}

// vLLM's tokenizer endpoints (lm-evaluation-harness's remote tokenizer): /tokenize gives the ids
// the completions endpoint runs for a prompt and the chat endpoint for messages, /detokenize turns
// ids back into text, /tokenizer_info names the special tokens; bad input is a 400.
TEST(Server, TokenizeDetokenizeAndTokenizerInfo) {
  ServerHarness h;
  auto c = h.client();
  int status = 0;
  auto j = post_json(c, "/tokenize", {{"prompt", "hey"}, {"add_special_tokens", false}, {"return_token_strs", true}}, &status);
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["tokens"], json({16 + 'h', 16 + 'e', 16 + 'y'}));
  EXPECT_EQ(j["count"], 3);
  EXPECT_EQ(j["max_model_len"], 4096);
  EXPECT_EQ(j["token_strs"], json({"h", "e", "y"}));
  // The same ids a completion's usage counts.
  auto comp = post_json(c, "/v1/completions", {{"prompt", "hey"}, {"max_tokens", 1}}, &status);
  EXPECT_EQ(comp["usage"]["prompt_tokens"], j["count"]);
  // Messages: the ids the chat endpoint runs (its usage counts them).
  json body = chat("count to three");
  auto t = post_json(c, "/tokenize", body, &status);
  ASSERT_EQ(status, 200) << t.dump();
  auto r = post_json(c, "/v1/chat/completions", body, &status);
  EXPECT_EQ(r["usage"]["prompt_tokens"], t["count"]);
  EXPECT_TRUE(t["token_strs"].is_null());
  auto d = post_json(c, "/detokenize", {{"tokens", j["tokens"]}}, &status);
  ASSERT_EQ(status, 200) << d.dump();
  EXPECT_EQ(d["prompt"], "hey");
  auto info = c.Get("/tokenizer_info");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->status, 200);
  auto ij = json::parse(info->body);
  EXPECT_TRUE(ij.contains("eos_token"));
  EXPECT_TRUE(ij["eos_token"].is_string());
  // Bad input.
  post_json(c, "/tokenize", json::object(), &status);
  EXPECT_EQ(status, 400);
  post_json(c, "/tokenize", {{"prompt", 5}}, &status);
  EXPECT_EQ(status, 400);
  post_json(c, "/tokenize", {{"prompt", "x"}, {"model", "nope"}}, &status);
  EXPECT_EQ(status, 404);
  post_json(c, "/tokenize", {{"prompt", "x"}, {"return_token_strs", "yes"}}, &status);
  EXPECT_EQ(status, 400);
  post_json(c, "/tokenize", {{"prompt", "x"}, {"add_special_tokens", nullptr}}, &status);
  EXPECT_EQ(status, 200);
  post_json(c, "/tokenize", {{"messages", "x"}}, &status);
  EXPECT_EQ(status, 400);
  body["add_generation_prompt"] = false;
  post_json(c, "/tokenize", body, &status);
  EXPECT_EQ(status, 400);
  post_json(c, "/detokenize", {{"tokens", {1, 999999}}}, &status);
  EXPECT_EQ(status, 400);
  post_json(c, "/detokenize", {{"tokens", "abc"}}, &status);
  EXPECT_EQ(status, 400);
  auto raw = c.Post("/tokenize", "not json", "application/json");
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->status, 400);
  auto get = c.Get("/tokenize");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  // With an API key they need it, as /v1/* does.
  ServerConfig cfg;
  cfg.api_key = "k";
  ServerHarness keyed({}, cfg);
  auto kc = keyed.client();
  post_json(kc, "/tokenize", {{"prompt", "x"}}, &status);
  EXPECT_EQ(status, 401);
  post_json(kc, "/tokenize", {{"prompt", "x"}}, &status, {{"Authorization", "Bearer k"}});
  EXPECT_EQ(status, 200);
}

TEST(Server, StreamingChatFramingAndUsage) {
  ServerHarness h;
  auto c = h.client();
  json body = chat("stream me");
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  auto data = sse_data(r->body);
  ASSERT_GE(data.size(), 4u);
  EXPECT_EQ(data.back(), "[DONE]");
  std::string content;
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    auto j = json::parse(data[i]);
    EXPECT_EQ(j["object"], "chat.completion.chunk");
    EXPECT_TRUE(j.contains("usage"));  // null until the last chunk, as OpenAI sends it
    if (i == 0) {
      EXPECT_EQ(j["choices"][0]["delta"]["role"], "assistant");
    }
    if (j["choices"].empty()) {
      usage = j["usage"];
      continue;
    }
    EXPECT_TRUE(finish.empty()) << "chunk after finish_reason";
    const auto& ch = j["choices"][0];
    if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(content, "Echo: stream me");
  EXPECT_EQ(finish, "stop");
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["completion_tokens"], static_cast<int>(content.size()));
  EXPECT_EQ(usage["total_tokens"], usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
}

TEST(Server, StreamingCompletions) {
  ServerHarness h;
  auto c = h.client();
  auto r = c.Post("/v1/completions", json{{"prompt", "xyz"}, {"stream", true}, {"max_tokens", 5}}.dump(), "application/json");
  ASSERT_TRUE(r);
  auto data = sse_data(r->body);
  ASSERT_FALSE(data.empty());
  EXPECT_EQ(data.back(), "[DONE]");
  const CompletionStream got = completion_stream(data);
  EXPECT_EQ(got.text, "Echo:");
  EXPECT_EQ(got.finish, "length");
}

TEST(Server, ReasoningContent) {
  ServerHarness h;
  auto c = h.client();
  json body = chat("why");
  body["chat_template_kwargs"] = {{"thinking", true}};
  int status = 0;
  auto j = post_json(c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "Thinking about: why");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Echo: why");
  EXPECT_EQ(j["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int>(),
            static_cast<int>(std::string("Thinking about: why").size()) + 1);
  // Streaming: reasoning deltas then content deltas.
  body["stream"] = true;
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  std::string reasoning, content;
  for (const auto& d : sse_data(r->body)) {
    if (d == "[DONE]") break;
    auto cj = json::parse(d);
    const auto& delta = cj["choices"][0]["delta"];
    if (delta.contains("reasoning_content")) {
      EXPECT_TRUE(content.empty()) << "reasoning after content";
      reasoning += delta["reasoning_content"].get<std::string>();
    }
    if (delta.contains("content")) content += delta["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "Thinking about: why");
  EXPECT_EQ(content, "Echo: why");
  // reasoning_effort alone turns thinking on.
  body.erase("stream");
  body.erase("chat_template_kwargs");
  body["reasoning_effort"] = "high";
  j = post_json(c, "/v1/chat/completions", body, &status);
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "Thinking about: why");
}

json weather_tools() {
  return json::array({{{"type", "function"},
                       {"function", {{"name", "get_weather"},
                                     {"description", "Weather for a city"},
                                     {"parameters", {{"type", "object"},
                                                     {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}},
                                                     {"required", {"city", "days"}},
                                                     {"additionalProperties", false}}}}}}});
}

TEST(Server, ToolCallsRoundTrip) {
  ServerHarness h;
  auto c = h.client();
  json body = chat(R"(call get_weather {"city": "Paris", "days": 3})");
  body["tools"] = weather_tools();
  int status = 0;
  auto j = post_json(c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << j.dump();
  const json msg = j["choices"][0]["message"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(msg["content"].is_null());
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  const json tc = msg["tool_calls"][0];
  EXPECT_EQ(tc["type"], "function");
  EXPECT_EQ(tc["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(tc["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(tc["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}, {"days", 3}}));

  // Streaming: index/id/name first, then argument fragments that concatenate to the same string.
  body["stream"] = true;
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  std::string args, name, id, finish;
  for (const auto& d : sse_data(r->body)) {
    if (d == "[DONE]") break;
    auto cj = json::parse(d);
    const auto& ch = cj["choices"][0];
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    if (!ch["delta"].contains("tool_calls")) continue;
    const auto& t = ch["delta"]["tool_calls"][0];
    EXPECT_EQ(t["index"], 0);
    if (t.contains("id")) {
      EXPECT_TRUE(id.empty());
      id = t["id"];
      name = t["function"]["name"];
    }
    args += t["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(json::parse(args), json({{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(finish, "tool_calls");

  // Parallel calls.
  body = chat(R"(call get_weather {"city": "A", "days": 1} && call get_weather {"city": "B", "days": 2})");
  body["tools"] = weather_tools();
  j = post_json(c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(json::parse(j["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"].get<std::string>())["city"], "B");
  body["parallel_tool_calls"] = false;  // at most one call comes back
  j = post_json(c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(json::parse(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>())["city"], "A");

  // Tool results go back in; the model answers with content.
  body = {{"tools", weather_tools()},
          {"messages", {{{"role", "user"}, {"content", "weather?"}},
                        {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", msg["tool_calls"]}},
                        {{"role", "tool"}, {"tool_call_id", tc["id"]}, {"content", "sunny"}}}}};
  j = post_json(c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_NE(j["choices"][0]["message"]["content"].get<std::string>().find("sunny"), std::string::npos);
}

bool matches_weather(const json& a) {
  return a.is_object() && a.size() == 2 && a.contains("city") && a["city"].is_string() && a.contains("days") &&
         a["days"].is_number_integer();
}

TEST(Server, ForcedToolChoiceIsGrammarConstrained) {
  ServerHarness h;
  auto c = h.client();
  for (int seed = 0; seed < 5; ++seed) {
    json body = chat("anything");
    body["tools"] = weather_tools();
    body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
    body["seed"] = seed;
    int status = 0;
    auto j = post_json(c, "/v1/chat/completions", body, &status);
    ASSERT_EQ(status, 200) << j.dump();
    const auto& tcs = j["choices"][0]["message"]["tool_calls"];
    ASSERT_EQ(tcs.size(), 1u) << j.dump();
    EXPECT_EQ(tcs[0]["function"]["name"], "get_weather");
    auto args = json::parse(tcs[0]["function"]["arguments"].get<std::string>(), nullptr, false);
    EXPECT_TRUE(matches_weather(args)) << tcs[0]["function"]["arguments"];
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");

    body["tool_choice"] = "required";
    body["parallel_tool_calls"] = false;
    j = post_json(c, "/v1/chat/completions", body, &status);
    ASSERT_EQ(status, 200) << j.dump();
    const auto& tcs2 = j["choices"][0]["message"]["tool_calls"];
    ASSERT_EQ(tcs2.size(), 1u) << j.dump();
    EXPECT_TRUE(matches_weather(json::parse(tcs2[0]["function"]["arguments"].get<std::string>()))) << j.dump();
  }
}

// tool_choice "required" wraps every tool's parameters in one schema; a tool's own $refs (pydantic
// writes "$defs" and "#/$defs/NAME"; "#" is its parameters' root) still resolve inside it, the same
// as with the tool named.
TEST(Server, RequiredToolChoiceKeepsEachToolsRefs) {
  ServerHarness h;
  auto c = h.client();
  const json item = {{"type", "object"},
                     {"properties", {{"sku", {{"type", "string"}}}, {"qty", {{"type", "integer"}}}}},
                     {"required", {"sku", "qty"}},
                     {"additionalProperties", false}};
  const json order = {{"$defs", {{"Item", item}}},
                      {"type", "object"},
                      {"properties", {{"items", {{"type", "array"}, {"items", {{"$ref", "#/$defs/Item"}}}, {"maxItems", 2}}}}},
                      {"required", {"items"}},
                      {"additionalProperties", false}};
  // A second tool with its own "Item" (another shape) and a recursive "#".
  const json tree = {{"definitions", {{"Item", {{"type", "integer"}}}}},
                     {"type", "object"},
                     {"properties", {{"v", {{"$ref", "#/definitions/Item"}}}, {"kids", {{"type", "array"}, {"items", {{"$ref", "#"}}}, {"maxItems", 1}}}}},
                     {"required", {"v"}},
                     {"additionalProperties", false}};
  json tools = json::array({{{"type", "function"}, {"function", {{"name", "order"}, {"parameters", order}}}},
                            {{"type", "function"}, {"function", {{"name", "tree"}, {"parameters", tree}}}}});
  for (int seed = 0; seed < 4; ++seed) {
    json body = chat("anything");
    body["tools"] = tools;
    body["tool_choice"] = "required";
    body["seed"] = seed;
    int status = 0;
    auto j = post_json(c, "/v1/chat/completions", body, &status);
    ASSERT_EQ(status, 200) << j.dump();
    const auto& tcs = j["choices"][0]["message"]["tool_calls"];
    ASSERT_GE(tcs.size(), 1u) << j.dump();
    for (const auto& tc : tcs) {
      auto args = json::parse(tc["function"]["arguments"].get<std::string>(), nullptr, false);
      ASSERT_TRUE(args.is_object()) << tc.dump();
      if (tc["function"]["name"] == "order") {
        ASSERT_TRUE(args["items"].is_array()) << args.dump();
        for (const auto& it : args["items"]) EXPECT_TRUE(it["sku"].is_string() && it["qty"].is_number_integer()) << args.dump();
      } else {
        EXPECT_EQ(tc["function"]["name"], "tree");
        EXPECT_TRUE(args["v"].is_number_integer()) << args.dump();
      }
    }
  }
}

TEST(Server, JsonSchemaResponseFormat) {
  ServerHarness h;
  auto c = h.client();
  json schema = {{"type", "object"},
                 {"properties", {{"name", {{"type", "string"}, {"maxLength", 12}}},
                                 {"age", {{"type", "integer"}}},
                                 {"tags", {{"type", "array"}, {"items", {{"enum", {"x", "y"}}}}, {"maxItems", 3}}}}},
                 {"required", {"name", "age", "tags"}},
                 {"additionalProperties", false}};
  for (int seed = 0; seed < 8; ++seed) {
    json body = chat("give json");
    body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", schema}}}};
    body["seed"] = seed;
    int status = 0;
    auto j = post_json(c, "/v1/chat/completions", body, &status);
    ASSERT_EQ(status, 200) << j.dump();
    ASSERT_EQ(j["choices"][0]["finish_reason"], "stop") << j.dump();
    auto out = json::parse(j["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(out.is_object()) << j.dump();
    EXPECT_EQ(out.size(), 3u);
    EXPECT_TRUE(out["name"].is_string());
    EXPECT_LE(out["name"].get<std::string>().size(), 12u * 4);
    EXPECT_TRUE(out["age"].is_number_integer());
    ASSERT_TRUE(out["tags"].is_array());
    EXPECT_LE(out["tags"].size(), 3u);
    for (const auto& t : out["tags"]) EXPECT_TRUE(t == "x" || t == "y");
  }
  json body = chat("give json");
  body["response_format"] = {{"type", "json_object"}};
  int status = 0;
  auto j = post_json(c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200);
  EXPECT_TRUE(json::parse(j["choices"][0]["message"]["content"].get<std::string>(), nullptr, false).is_object());
}

TEST(Server, SamplingParamsStopNAndLogprobs) {
  ServerHarness h;
  auto c = h.client();
  json body = chat("one two three");
  body["stop"] = {"two"};
  int status = 0;
  auto j = post_json(c, "/v1/chat/completions", body, &status);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Echo: one ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  body = chat("abc");
  body["n"] = 3;
  body["max_completion_tokens"] = 3;
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  j = post_json(c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << j.dump();
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["content"], "Ech");
    const auto& lp = j["choices"][i]["logprobs"]["content"];
    ASSERT_EQ(lp.size(), 3u);
    EXPECT_EQ(lp[0]["token"], "E");
    EXPECT_EQ(lp[0]["top_logprobs"].size(), 2u);
    EXPECT_EQ(lp[0]["bytes"], json::array({'E'}));
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 9);

  // Streaming with n=2: both indices appear and both finish.
  body["stream"] = true;
  body["n"] = 2;
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  std::map<int, std::string> text;
  int finishes = 0;
  for (const auto& d : sse_data(r->body)) {
    if (d == "[DONE]") break;
    auto cj = json::parse(d);
    const auto& ch = cj["choices"][0];
    if (ch["delta"].contains("content")) text[ch["index"]] += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) ++finishes;
  }
  EXPECT_EQ(text[0], "Ech");
  EXPECT_EQ(text[1], "Ech");
  EXPECT_EQ(finishes, 2);

  // ignore_eos keeps generating to max_tokens.
  body = chat("a");
  body["ignore_eos"] = true;
  body["max_tokens"] = 20;
  j = post_json(c, "/v1/chat/completions", body, &status);
  EXPECT_EQ(j["usage"]["completion_tokens"], 20);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

struct ErrorCase {
  const char* name;
  std::string path;
  std::string body;
  int status;
  const char* param;
};

TEST(Server, ErrorObjects) {
  EchoEngineOptions eo;
  eo.max_model_len = 64;
  ServerHarness h(eo);
  auto c = h.client();
  std::vector<ErrorCase> cases = {
      {"malformed json", "/v1/chat/completions", "{\"messages\": [", 400, nullptr},
      {"not an object", "/v1/chat/completions", "[1,2]", 400, nullptr},
      {"no messages", "/v1/chat/completions", "{}", 400, "messages"},
      {"bad role", "/v1/chat/completions", R"({"messages":[{"role":"robot","content":"x"}]})", 400, "messages[0].role"},
      {"bad temperature", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":5})", 400, "temperature"},
      {"bad n", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"n":0})", 400, "n"},
      {"bad max_tokens type", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"a"})", 400, "max_tokens"},
      {"unknown model", "/v1/chat/completions", R"({"model":"gpt-9","messages":[{"role":"user","content":"x"}]})", 404, "model"},
      {"bad schema", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"string","pattern":"^a$"}}}})",
       400, "response_format"},
      {"bad response_format", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}})", 400,
       "response_format.type"},
      {"named tool missing", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"nope"}}})", 400, "tool_choice"},
      {"image part", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", 400, "messages[0].content[0].type"},
      {"prompt too long", "/v1/completions", json{{"prompt", std::string(100, 'a')}}.dump(), 400, "prompt"},
      {"max_tokens over context", "/v1/completions", R"({"prompt":"abc","max_tokens":100})", 400, "max_tokens"},
      {"mixed prompt batch", "/v1/completions", R"({"prompt":["a",[1]]})", 400, "prompt"},
  };
  for (const auto& ec : cases) {
    auto r = c.Post(ec.path.c_str(), ec.body, "application/json");
    ASSERT_TRUE(r) << ec.name;
    EXPECT_EQ(r->status, ec.status) << ec.name << ": " << r->body;
    auto j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << ec.name << ": " << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
    if (ec.param) {
      EXPECT_EQ(j["error"]["param"], ec.param) << ec.name;
    }
  }
  // Context overflow names both numbers.
  auto r = c.Post("/v1/completions", json{{"prompt", std::string(100, 'a')}}.dump(), "application/json");
  std::string msg = json::parse(r->body)["error"]["message"];
  EXPECT_NE(msg.find("64"), std::string::npos) << msg;
  EXPECT_NE(msg.find("100"), std::string::npos) << msg;
  // Unknown route.
  r = c.Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(json::parse(r->body, nullptr, false).contains("error"));
}

TEST(Server, ApiKey) {
  ServerConfig cfg;
  cfg.api_key = "sekret";
  ServerHarness h({}, cfg);
  auto c = h.client();
  int status = 0;
  auto j = post_json(c, "/v1/chat/completions", chat("x"), &status);
  EXPECT_EQ(status, 401);
  EXPECT_EQ(j["error"]["code"], "invalid_api_key");
  post_json(c, "/v1/chat/completions", chat("x"), &status, {{"Authorization", "Bearer wrong!"}});
  EXPECT_EQ(status, 401);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  post_json(c, "/v1/chat/completions", chat("x"), &status, {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(status, 200);
  // Health and metrics stay open (probes, scrapers).
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_EQ(c.Get("/metrics")->status, 200);
}

TEST(Server, BodyTooLarge) {
  ServerConfig cfg;
  cfg.max_body_bytes = 4096;
  ServerHarness h({}, cfg);
  auto c = h.client();
  auto r = c.Post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", std::string(10000, 'x')}}}}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_TRUE(json::parse(r->body, nullptr, false).contains("error")) << r->body;
}

TEST(Server, QueueFullIs429WithRetryAfter) {
  EchoEngineOptions eo;
  eo.step_delay_ms = 20;
  eo.max_num_seqs = 1;
  eo.max_waiting = 8;
  ServerConfig cfg;
  cfg.max_pending_requests = 2;
  ServerHarness h(eo, cfg);
  // Two slow streams occupy the server; the third request is refused.
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int i = 0; i < 2; ++i) {
    ts.emplace_back([&] {
      auto c = h.client();
      json body = chat("slow");
      body["max_tokens"] = 30;
      body["ignore_eos"] = true;
      auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
      if (r && r->status == 200) ++ok;
    });
  }
  while (h.server->in_flight() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto c = h.client();
  auto r = c.Post("/v1/chat/completions", chat("x").dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "rate_limit_error");
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 2);
}

int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(Server, ClientDisconnectCancelsStream) {
  EchoEngineOptions eo;
  eo.step_delay_ms = 5;
  ServerConfig cfg;
  cfg.idle_probe_s = 0.05;
  ServerHarness h(eo, cfg);
  int fd = raw_connect(h.port);
  ASSERT_GE(fd, 0);
  json body = chat("long");
  body["stream"] = true;
  body["ignore_eos"] = true;
  body["max_tokens"] = 3000;
  std::string b = body.dump();
  std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(b.size()) + "\r\n\r\n" + b;
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  char buf[512];
  ssize_t got = read(fd, buf, sizeof(buf) - 1);  // headers + first events arrive
  ASSERT_GT(got, 0);
  buf[got] = 0;
  ASSERT_NE(std::string(buf).find("200 OK"), std::string::npos) << buf;
  for (int i = 0; i < 1000 && h.engine->active_count() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(h.engine->active_count(), 1);
  close(fd);
  for (int i = 0; i < 400 && h.engine->active_count() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(h.engine->active_count(), 0);
  EXPECT_EQ(h.engine->cancelled_count(), 1);
  for (int i = 0; i < 400 && h.server->in_flight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(h.server->in_flight(), 0);
}

// A non-streaming request whose client goes away is cancelled within about a second (it used to
// run to its end): the engine frees it and the server's in-flight count drops.
TEST(Server, ClientDisconnectCancelsNonStreaming) {
  EchoEngineOptions eo;
  eo.step_delay_ms = 5;
  ServerHarness h(eo);
  int fd = raw_connect(h.port);
  ASSERT_GE(fd, 0);
  json body = chat("long");
  body["ignore_eos"] = true;
  body["max_tokens"] = 3000;  // ~15 s of steps
  std::string b = body.dump();
  std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(b.size()) + "\r\n\r\n" + b;
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  for (int i = 0; i < 1000 && h.engine->active_count() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(h.engine->active_count(), 1);
  close(fd);
  for (int i = 0; i < 400 && h.engine->active_count() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(h.engine->active_count(), 0) << "still running 2 s after the client left";
  EXPECT_EQ(h.engine->cancelled_count(), 1);
  for (int i = 0; i < 400 && h.server->in_flight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(h.server->in_flight(), 0);
}

// Deadlines: the request's "request_timeout" or the server's --request-timeout ends a request
// with finish_reason "timeout" (streamed or not), keeping what was generated.
TEST(Server, RequestTimeoutEndsWithTimeoutFinishReason) {
  EchoEngineOptions eo;
  eo.step_delay_ms = 5;
  ServerHarness h(eo);
  auto c = h.client();
  json body = chat("long");
  body["ignore_eos"] = true;
  body["max_tokens"] = 3000;
  body["request_timeout"] = 0.2;
  int status = 0;
  json j = post_json(c, "/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "timeout") << j.dump();
  EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 0);
  EXPECT_LT(j["usage"]["completion_tokens"].get<int>(), 3000);
  body["request_timeout"] = -1;
  post_json(c, "/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 400);

  ServerConfig cfg;
  cfg.request_timeout_s = 0.2;
  ServerHarness d(eo, cfg);
  auto dc = d.client();
  body.erase("request_timeout");
  body["stream"] = true;
  auto r = dc.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  bool saw_timeout = false;
  for (const auto& data : sse_data(r->body)) {
    if (data == "[DONE]") continue;
    auto ch = json::parse(data);
    if (!ch["choices"].empty() && ch["choices"][0]["finish_reason"] == "timeout") saw_timeout = true;
  }
  EXPECT_TRUE(saw_timeout) << r->body.substr(0, 400);
}

// An empty POST body gets a message saying so; other methods on a POST route get 405 (with
// Allow), not 404; every rejection leaves a line in the log.
TEST(Server, EmptyBodyWrongMethodAndRejectionLog) {
  ServerHarness h;
  auto c = h.client();
  ::testing::internal::CaptureStderr();
  auto r = c.Post("/v1/chat/completions", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  std::string msg = json::parse(r->body)["error"]["message"];
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  r = c.Get("/v1/chat/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  EXPECT_TRUE(json::parse(r->body, nullptr, false).contains("error"));
  r = c.Get("/v1/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  r = c.Post("/v1/chat/completions", R"({"messages":[{"role":"robot","content":"x"}]})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("rejected POST /v1/chat/completions"), std::string::npos) << log;
  EXPECT_NE(log.find("rejected GET /v1/chat/completions"), std::string::npos) << log;
  EXPECT_NE(log.find("messages[0].role"), std::string::npos) << log;
}

TEST(Server, MalformedHttpNeverCrashes) {
  ServerHarness h;
  const std::vector<std::string> junk = {
      "GARBAGE\r\n\r\n",
      "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
      "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
      "POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      std::string("GET /health HTTP/1.1\r\nX: \0\x01\xff\r\n\r\n", 36),
      "POST /v1/completions HTTP/1.1\r\nContent-Length: 10\r\n\r\n{\"pro",  // truncated body, then close
      std::string(10000, 'A') + "\r\n\r\n",
  };
  for (const auto& j : junk) {
    int fd = raw_connect(h.port);
    ASSERT_GE(fd, 0);
    (void)!write(fd, j.data(), j.size());
    shutdown(fd, SHUT_WR);
    char buf[4096];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    close(fd);
  }
  auto c = h.client();
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(Server, MetricsExposition) {
  ServerHarness h;
  auto c = h.client();
  for (int i = 0; i < 3; ++i) post_json(c, "/v1/chat/completions", chat("m"));
  auto r = c.Get("/metrics");
  ASSERT_TRUE(r);
  const std::string& t = r->body;
  for (const char* name : {"vllm:num_requests_running{model_name=\"tandem\"}", "vllm:num_requests_waiting", "vllm:prompt_tokens_total",
                           "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                           "vllm:time_to_first_token_seconds_count{model_name=\"tandem\"} 3", "vllm:inter_token_latency_seconds_sum",
                           "vllm:e2e_request_latency_seconds_count{model_name=\"tandem\"} 3", "vllm:kv_cache_usage_perc",
                           "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:spec_decode_num_drafts_total",
                           "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
                           "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"tandem\",position=\"0\"}",
                           "tandem:kv_blocks_leaked{model_name=\"tandem\"} 0", "# TYPE vllm:time_to_first_token_seconds histogram",
                           "# TYPE tandem:engine_steps_total counter", "tandem:engine_forward_seconds_total",
                           "tandem:engine_between_steps_seconds_total"}) {
    EXPECT_NE(t.find(name), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace tandem::server::testing

namespace tandem::server::testing {
namespace {

TEST(Server, DrainLetsInFlightStreamsFinish) {
  EchoEngineOptions eo;
  eo.step_delay_ms = 5;
  ServerHarness h(eo);
  std::string body;
  std::thread t([&] {
    auto c = h.client();
    json req = chat("drain");
    req["stream"] = true;
    req["max_tokens"] = 40;
    req["ignore_eos"] = true;
    auto r = c.Post("/v1/chat/completions", req.dump(), "application/json");
    if (r) body = r->body;
  });
  for (int i = 0; i < 1000 && h.engine->active_count() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  h.server->begin_drain();
  auto c = h.client();
  EXPECT_EQ(c.Get("/health")->status, 503);
  EXPECT_EQ(c.Post("/v1/chat/completions", chat("late").dump(), "application/json")->status, 503);
  h.engine->shutdown(10.0);  // in-flight request finishes within the deadline
  t.join();
  auto data = sse_data(body);
  ASSERT_FALSE(data.empty());
  EXPECT_EQ(data.back(), "[DONE]");
  EXPECT_NE(body.find("\"finish_reason\":\"length\""), std::string::npos);
}

TEST(Server, ShutdownDeadlineAbortsStreams) {
  EchoEngineOptions eo;
  eo.step_delay_ms = 5;
  ServerHarness h(eo);
  std::string body;
  std::thread t([&] {
    auto c = h.client();
    json req = chat("forever");
    req["stream"] = true;
    req["max_tokens"] = 3000;
    req["ignore_eos"] = true;
    auto r = c.Post("/v1/chat/completions", req.dump(), "application/json");
    if (r) body = r->body;
  });
  for (int i = 0; i < 1000 && h.engine->active_count() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  h.server->begin_drain();
  h.engine->shutdown(0.05);
  t.join();
  auto data = sse_data(body);
  ASSERT_FALSE(data.empty());
  EXPECT_EQ(data.back(), "[DONE]");
  EXPECT_NE(body.find("\"finish_reason\":\"abort\""), std::string::npos);
  EXPECT_EQ(h.engine->active_count(), 0);
}

}  // namespace
}  // namespace tandem::server::testing

namespace tandem::server::testing {
namespace {

// An engine that detokenizes with skip_special drops </think> and ｜DSML｜ from the event text;
// reasoning and tool calls must still come out right (the server splices the tokens back).
TEST(Server, ProtocolTokensRestoredWhenEngineSkipsSpecials) {
  EchoEngineOptions eo;
  eo.skip_special_in_text = true;
  eo.tokens_per_step = 3;  // several tokens per event, as with speculative decoding
  ServerHarness h(eo);
  auto c = h.client();
  json body = chat("why");
  body["chat_template_kwargs"] = {{"thinking", true}};
  int status = 0;
  auto j = post_json(c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "Thinking about: why");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Echo: why");

  body = chat(R"(call get_weather {"city": "Rome", "days": 2})");
  body["tools"] = weather_tools();
  for (bool stream : {false, true}) {
    body["stream"] = stream;
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    std::string args, name;
    if (!stream) {
      auto rj = json::parse(r->body);
      ASSERT_EQ(rj["choices"][0]["message"]["tool_calls"].size(), 1u) << r->body;
      name = rj["choices"][0]["message"]["tool_calls"][0]["function"]["name"];
      args = rj["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"];
    } else {
      for (const auto& d : sse_data(r->body)) {
        if (d == "[DONE]") break;
        auto cj = json::parse(d);
        if (!cj["choices"][0]["delta"].contains("tool_calls")) continue;
        const auto& t = cj["choices"][0]["delta"]["tool_calls"][0];
        if (t.contains("id")) name = t["function"]["name"];
        args += t["function"]["arguments"].get<std::string>();
      }
    }
    EXPECT_EQ(name, "get_weather") << stream;
    EXPECT_EQ(json::parse(args), json({{"city", "Rome"}, {"days", 2}})) << stream;
  }
}

}  // namespace
}  // namespace tandem::server::testing

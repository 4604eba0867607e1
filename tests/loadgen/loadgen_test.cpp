// `tandem bench` client pieces (SSE splitting, chunk and Prometheus parsing, checks, statistics,
// SVG) and the whole sweep against an in-process fake server that misbehaves on purpose: errors,
// cut streams, missing or wrong usage, lying counters, a refused key, nothing listening.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <thread>

#include "loadgen/client.h"
#include "loadgen/prometheus.h"
#include "loadgen/runner.h"
#include "loadgen/sse.h"
#include "loadgen/stats.h"
#include "loadgen/svg.h"
#include "loadgen/workloads.h"

namespace tandem::loadgen {
namespace {

using json = nlohmann::json;

TEST(BenchSse, SplitsEventsFedInPieces) {
  std::vector<std::string> got;
  SseSplitter s([&](const std::string& d) { got.push_back(d); });
  const std::string stream = ": keep-alive\r\n\r\ndata: {\"a\":1}\r\n\r\ndata:x\ndata: y\n\nevent: e\ndata: [DONE]\n\ndata: tail";
  for (char c : stream) s.feed(std::string_view(&c, 1));  // worst case: one byte at a time
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], "{\"a\":1}");
  EXPECT_EQ(got[1], "x\ny");
  EXPECT_EQ(got[2], "[DONE]");
  EXPECT_GT(s.pending_bytes(), 0u);  // the unterminated last event is not delivered
}

TEST(BenchSse, ReadsChunks) {
  auto c = parse_chat_chunk(R"({"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}],"usage":null})");
  EXPECT_TRUE(c.carries_tokens);
  EXPECT_EQ(c.text, "Hi");
  EXPECT_FALSE(c.has_usage);
  c = parse_chat_chunk(R"({"choices":[{"delta":{"reasoning_content":"think"}}]})");
  EXPECT_TRUE(c.carries_tokens);
  c = parse_chat_chunk(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})");
  EXPECT_FALSE(c.carries_tokens);  // the role chunk carries no token
  c = parse_chat_chunk(R"({"choices":[{"delta":{},"finish_reason":"length"}]})");
  EXPECT_EQ(c.finish_reason, "length");
  c = parse_chat_chunk(
      R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":3}}})");
  EXPECT_TRUE(c.has_usage);
  EXPECT_EQ(c.prompt_tokens, 7);
  EXPECT_EQ(c.completion_tokens, 5);
  EXPECT_EQ(c.cached_tokens, 3);
  EXPECT_TRUE(parse_chat_chunk("[DONE]").done);
  EXPECT_EQ(parse_chat_chunk(R"({"error":{"message":"boom"}})").error, "boom");
  EXPECT_FALSE(parse_chat_chunk("{not json").error.empty());
}

TEST(BenchPrometheus, SumsLabelSetsAndSkipsJunk) {
  const std::string text =
      "# HELP vllm:generation_tokens_total x\n# TYPE vllm:generation_tokens_total counter\n"
      "vllm:generation_tokens_total{model_name=\"a}b\\\"c\"} 10\n"
      "vllm:generation_tokens_total{model_name=\"d\"} 5 1700000000000\n"
      "vllm:request_success_total{finished_reason=\"stop\"} 2\nvllm:request_success_total{finished_reason=\"length\"} 1\n"
      "garbage line without value\nllamacpp:tokens_predicted_total 3.5e+02\n";
  auto m = parse_prometheus(text);
  EXPECT_DOUBLE_EQ(m["vllm:generation_tokens_total"], 15);
  EXPECT_DOUBLE_EQ(m["vllm:request_success_total"], 3);
  EXPECT_DOUBLE_EQ(m["llamacpp:tokens_predicted_total"], 350);
  EXPECT_EQ(m.count("garbage"), 0u);

  auto after = m;
  after["vllm:generation_tokens_total"] = 40;
  after["vllm:spec_decode_num_draft_tokens_total"] = 50;  // absent before: starts at zero
  after["vllm:spec_decode_num_accepted_tokens_total"] = 20;
  ServerCounters d = counter_deltas(m, after);
  ASSERT_TRUE(d.generation_tokens);
  EXPECT_DOUBLE_EQ(*d.generation_tokens, 25);
  EXPECT_DOUBLE_EQ(*d.spec_draft_tokens, 50);
  EXPECT_DOUBLE_EQ(*d.spec_accepted_tokens, 20);
  EXPECT_FALSE(d.spec_drafts);
  EXPECT_FALSE(d.prompt_tokens);

  // Tandem's engine-thread counters travel as raw deltas; other tandem gauges do not.
  m["tandem:engine_forward_seconds_total"] = 1.5;
  after["tandem:engine_forward_seconds_total"] = 2.25;
  after["tandem:engine_steps_total"] = 7;
  after["tandem:kv_blocks_free"] = 3;
  d = counter_deltas(m, after);
  EXPECT_DOUBLE_EQ(d.raw.at("tandem:engine_forward_seconds_total"), 0.75);
  EXPECT_DOUBLE_EQ(d.raw.at("tandem:engine_steps_total"), 7);
  EXPECT_EQ(d.raw.count("tandem:kv_blocks_free"), 0u);
}

TEST(BenchWorkloads, CountCheck) {
  std::string all;
  for (int i = 1; i <= 300; ++i) all += std::to_string(i) + (i < 300 ? ", " : ".");
  EXPECT_EQ(check_count(all, 300, "stop"), CountCheck::kExact);
  EXPECT_EQ(check_count("Sure, counting from 1 to 300:\n" + all + "\nDone.", 300, "stop"), CountCheck::kExact);
  EXPECT_EQ(check_count("1, 2, 3, 4", 300, "length"), CountCheck::kTruncated);
  EXPECT_EQ(check_count("1, 2, 3, 4", 300, "stop"), CountCheck::kWrong);   // stopped early on its own
  EXPECT_EQ(check_count("1, 2, 4, 5", 300, "length"), CountCheck::kWrong);  // skipped a number
  EXPECT_EQ(check_count("Echo: Count from 1 to 300.", 300, "stop"), CountCheck::kWrong);
  EXPECT_EQ(check_count("no numbers", 300, "length"), CountCheck::kWrong);
  EXPECT_EQ(count_dataclasses("@dataclass\nclass A: ...\n@dataclass(frozen=True)\nclass B: ..."), 2);
}

TEST(BenchWorkloads, LongPromptIsUniquePerRequestAndSized) {
  const Workload& w = all_workloads().back();
  ASSERT_EQ(w.kind, WorkloadKind::kLongPrompt);
  const std::string a = user_message(w, "n-1", 500), b = user_message(w, "n-2", 500);
  EXPECT_NE(a, b);
  EXPECT_NE(a.substr(0, 12), b.substr(0, 12));  // differs from the start: no shared cached prefix
  EXPECT_EQ(a.substr(a.find("notes.")), b.substr(b.find("notes.")));
  EXPECT_GT(user_message(w, "n", 2000).size(), 3 * a.size());
  EXPECT_FALSE(select_workloads("count,bogus").ok());
  EXPECT_EQ(select_workloads("prose,count")->size(), 2u);
}

TEST(BenchClient, BaseUrl) {
  auto e = parse_base_url("http://127.0.0.1:8000/v1/");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->scheme_host_port, "http://127.0.0.1:8000");
  EXPECT_EQ(e->path_prefix, "");
  e = parse_base_url("http://host:1/proxy/v1");
  EXPECT_EQ(e->path_prefix, "/proxy");
  EXPECT_FALSE(parse_base_url("ftp://x").ok());
  EXPECT_FALSE(parse_base_url("http://").ok());
  EXPECT_EQ(parse_base_url("https://example.com").ok(), https_supported());
}

TEST(BenchClient, TokenCountCheck) {
  RequestRecord r;
  r.ok = true;
  r.token_chunks = 4;
  r.usage_present = true;
  r.completion_tokens = 10;  // several tokens per chunk (speculative decoding): consistent
  r.finish_reason = "stop";
  EXPECT_EQ(check_token_counts(r, 16), "");
  r.completion_tokens = 3;
  EXPECT_NE(check_token_counts(r, 16), "");
  r.completion_tokens = 17;
  EXPECT_NE(check_token_counts(r, 16), "");
  r.completion_tokens = 12;
  r.finish_reason = "length";
  EXPECT_NE(check_token_counts(r, 16), "");
  r.completion_tokens = 16;
  EXPECT_EQ(check_token_counts(r, 16), "");
  r.usage_present = false;
  EXPECT_NE(check_token_counts(r, 16), "");
}

TEST(BenchStats, QuantilesAndSpread) {
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({1, 2, 3, 4}), 2.5);
  EXPECT_DOUBLE_EQ(quantile({0, 10}, 0.9), 9);
  EXPECT_TRUE(std::isnan(median({})));
  json s = spread({10, 12, 8});
  EXPECT_DOUBLE_EQ(s["median"].get<double>(), 10);
  EXPECT_DOUBLE_EQ(s["spread_pct"].get<double>(), 40);
  EXPECT_TRUE(spread({}).is_null());
}

// ---- the whole sweep against a fake server ----

// Behaviour by requested model name: "good" 3 chunks of 1 token; "multi" 2 chunks carrying 5 tokens
// (speculative decoding); "nousage"; "overcount" (usage 1, 3 chunks); "cut" (no [DONE]);
// "midstream" (error object inside the stream); anything else 404. /metrics counts generation
// tokens, overstated by 1 per request when `lie` is set.
class FakeServer {
 public:
  FakeServer(bool metrics = true, bool lie = false, bool want_key = false) {
    srv_.Get("/v1/models", [=](const httplib::Request& req, httplib::Response& res) {
      if (want_key && req.get_header_value("Authorization") != "Bearer k") {
        res.status = 401;
        res.set_content(R"({"error":{"message":"bad key"}})", "application/json");
        return;
      }
      res.set_content(R"({"object":"list","data":[{"id":"good"},{"id":"multi"}]})", "application/json");
    });
    if (metrics)
      srv_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content("vllm:generation_tokens_total{model_name=\"x\"} " + std::to_string(generated_.load()) + "\n",
                        "text/plain");
      });
    srv_.Post("/v1/chat/completions", [this, lie](const httplib::Request& req, httplib::Response& res) {
      auto body = json::parse(req.body);
      const std::string model = body["model"];
      if (model != "good" && model != "multi" && model != "nousage" && model != "overcount" && model != "cut" &&
          model != "midstream") {
        res.status = 404;
        res.set_content(R"({"error":{"message":"The model `)" + model + R"(` does not exist."}})", "application/json");
        return;
      }
      if (!body.value("stream", false) || !body["stream_options"].value("include_usage", false)) {
        res.status = 400;
        return;
      }
      const int tokens = model == "multi" ? 5 : model == "overcount" ? 1 : 3;
      generated_ += tokens + (lie ? 1 : 0);
      res.set_chunked_content_provider("text/event-stream", [model, tokens](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& j) {
          std::string s = "data: " + j.dump() + "\n\n";
          sink.write(s.data(), s.size());
        };
        const int chunks = model == "multi" ? 2 : 3;
        for (int i = 0; i < chunks; ++i) {
          send({{"choices", {{{"index", 0}, {"delta", {{"content", std::to_string(i + 1) + ", "}}}}}}});
          if (model == "midstream" && i == 1) send({{"error", {{"message", "engine fell over"}}}});
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        if (model == "cut") return false;  // connection dropped mid-stream
        send({{"choices", {{{"index", 0}, {"delta", json::object()}, {"finish_reason", "stop"}}}}});
        if (model != "nousage")
          send({{"choices", json::array()}, {"usage", {{"prompt_tokens", 9}, {"completion_tokens", tokens}}}});
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
      });
    });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    while (!srv_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeServer() { stop(); }
  void stop() {
    srv_.stop();
    if (thread_.joinable()) thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }

 private:
  httplib::Server srv_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int64_t> generated_{0};
};

BenchOptions options(const std::string& url, const std::string& model) {
  BenchOptions o;
  o.base_url = url;
  o.model = model;
  o.workloads = *select_workloads("count,long-prompt");
  o.concurrency = {1, 3};
  o.repeats = 2;
  o.stagger_s = 0.005;
  o.long_prompt_words = 50;
  o.warmup = 1;
  o.timeout_s = 20;
  o.client_commit = "test";
  return o;
}

json run(const BenchOptions& o) {
  auto r = run_benchmark(o, [](const std::string&) {});
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : json();
}

TEST(BenchSweep, CleanRunHasEveryFieldAndNoProblems) {
  FakeServer s;
  json rep = run(options(s.url(), "good"));
  for (const char* k : {"date", "client_commit", "target", "settings", "runs", "summary", "totals", "warmup", "definitions"})
    EXPECT_TRUE(rep.contains(k)) << k;
  EXPECT_EQ(rep["target"]["base_url"], s.url());
  EXPECT_EQ(rep["target"]["model"], "good");
  EXPECT_TRUE(rep["target"]["metrics_available"].get<bool>());
  EXPECT_EQ(rep["warmup"].size(), 1u);
  ASSERT_EQ(rep["runs"].size(), 8u);  // 2 workloads x 2 concurrencies x 2 repeats
  ASSERT_EQ(rep["summary"].size(), 4u);
  for (const auto& r : rep["runs"]) {
    EXPECT_EQ(r["requests"].get<int>(), r["concurrency"].get<int>());
    EXPECT_EQ(r["request_records"].size(), r["requests"].get<size_t>());
    EXPECT_EQ(r["failed"], 0);
    EXPECT_EQ(r["inconsistent_token_counts"], 0);
    EXPECT_EQ(r["completion_tokens"].get<int>(), 3 * r["concurrency"].get<int>());
    EXPECT_DOUBLE_EQ(r["server"]["generation_tokens"].get<double>(), r["completion_tokens"].get<double>());
    EXPECT_FALSE(r.contains("counter_mismatch"));
    EXPECT_GT(r["aggregate_tok_s"].get<double>(), 0);
    EXPECT_EQ(r["itl_s"]["n"].get<int>(), 2 * r["concurrency"].get<int>());
  }
  // Stream i starts i * stagger after the first.
  const auto& recs = rep["runs"][2]["request_records"];
  ASSERT_EQ(recs.size(), 3u);
  for (const auto& rec : recs) EXPECT_GE(rec["start_s"].get<double>(), 0.005 * rec["stream"].get<int>() - 1e-4);
  const Tally t = tally(rep);
  EXPECT_EQ(t.requests, 2 * (2 * (1 + 3)));
  EXPECT_EQ(t.failed + t.inconsistent + t.counter_mismatches, 0);
  EXPECT_EQ(rep["summary"][1]["aggregate_tok_s"]["n"], 2);
}

TEST(BenchSweep, SeveralTokensPerChunkIsConsistent) {
  FakeServer s;
  json rep = run(options(s.url(), "multi"));
  const Tally t = tally(rep);
  EXPECT_EQ(t.failed + t.inconsistent + t.counter_mismatches, 0);
  EXPECT_DOUBLE_EQ(rep["runs"][0]["tokens_per_chunk"].get<double>(), 2.5);
}

TEST(BenchSweep, FailuresAreCountedNotDropped) {
  FakeServer s;
  for (const std::string model : {"no-such-model", "cut", "midstream"}) {
    json rep = run(options(s.url(), model));
    const Tally t = tally(rep);
    EXPECT_EQ(t.requests, 16) << model;
    EXPECT_EQ(t.failed, 16) << model;
    const auto& rec = rep["runs"][0]["request_records"][0];
    EXPECT_FALSE(rec["ok"].get<bool>());
    const std::string err = rec["error"];
    if (model == "no-such-model") {
      EXPECT_FALSE(rep["target"]["model_listed"].get<bool>());
      EXPECT_EQ(rec["http_status"], 404);
      EXPECT_NE(err.find("does not exist"), std::string::npos) << err;
    } else if (model == "cut") {
      EXPECT_NE(err.find("[DONE]"), std::string::npos) << err;
    } else {
      EXPECT_NE(err.find("engine fell over"), std::string::npos) << err;
    }
    EXPECT_EQ(rep["summary"][0]["failed"], 2);  // concurrency 1 x 2 repeats
  }
}

TEST(BenchSweep, InconsistentTokenCountsAreCounted) {
  FakeServer s;
  for (const std::string model : {"nousage", "overcount"}) {
    auto o = options(s.url(), model);
    o.repeats = 1;  // "nousage" runs also disagree with the counters, and each re-reads them after 1 s
    json rep = run(o);
    const Tally t = tally(rep);
    EXPECT_EQ(t.failed, 0) << model;
    EXPECT_EQ(t.inconsistent, 8) << model;
    EXPECT_TRUE(rep["runs"][0]["request_records"][0].contains("token_check")) << model;
  }
}

TEST(BenchSweep, ServerCounterMismatchIsReported) {
  FakeServer s(/*metrics=*/true, /*lie=*/true);
  auto o = options(s.url(), "good");
  o.workloads = *select_workloads("count");
  o.concurrency = {2};
  o.repeats = 1;
  json rep = run(o);
  EXPECT_EQ(tally(rep).counter_mismatches, 1);
  EXPECT_NE(rep["runs"][0]["counter_mismatch"].get<std::string>().find("vs client"), std::string::npos);
}

TEST(BenchSweep, NoMetricsEndpoint) {
  FakeServer s(/*metrics=*/false);
  auto o = options(s.url(), "good");
  o.concurrency = {1};
  o.repeats = 1;
  json rep = run(o);
  EXPECT_FALSE(rep["target"]["metrics_available"].get<bool>());
  EXPECT_TRUE(rep["runs"][0]["server"].is_null());
  EXPECT_EQ(tally(rep).failed, 0);
}

TEST(BenchSweep, UnreachableOrRefusedIsAClearError) {
  std::string url;
  {
    FakeServer s;
    url = s.url();
  }  // stopped: nothing listens on that port now
  auto r = run_benchmark(options(url, "good"), [](const std::string&) {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("is the server running"), std::string::npos) << r.status().message();

  FakeServer keyed(true, false, /*want_key=*/true);
  r = run_benchmark(options(keyed.url(), "good"), [](const std::string&) {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  auto o = options(keyed.url(), "good");
  o.api_key = "k";
  o.concurrency = {1};
  o.repeats = 1;
  EXPECT_EQ(tally(run(o)).failed, 0);

  o.repeats = 0;
  EXPECT_FALSE(run_benchmark(o, [](const std::string&) {}).ok());
}

TEST(BenchSvg, DrawsEverySeriesAndEscapesText) {
  FakeServer s;
  auto o = options(s.url(), "good");
  o.notes = "load <high> & shared";
  json rep = run(o);
  const std::string svg = render_svg(rep);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("load &lt;high&gt; &amp; shared"), std::string::npos);
  EXPECT_EQ(svg.find("<high>"), std::string::npos);
  size_t lines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1)) ++lines;
  EXPECT_EQ(lines, 6u);  // 2 workloads x (aggregate, per-stream, TTFT)
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

}  // namespace
}  // namespace tandem::loadgen

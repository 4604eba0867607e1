// The sampler inside the step's graph (CudaModel::forward_sample on a model whose decode and verify
// graphs were captured with the sampler): its results equal, bit for bit, the separate sampling
// launch over the same logits (seeded temperature / top-k / top-p draws, penalties, grammar masks,
// drafts verified, logprobs); the tokens equal those of an eager model that samples separately;
// rows that do not fit the graph's layout fall back to the separate launch with the same results;
// nothing is instantiated or allocated while it runs; and the logits rows a step reports
// (last_logits_rows) are the ones planned before it (step_logits_rows), padded graph steps and
// mixed eager steps alike. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/model_options.h"
#include "cuda/require_gpu.h"
#include "kernels/cuda/cuda_util.h"
#include "model/cuda/cuda_model.h"
#include "model/run_helpers.h"
#include "model/tiny_weights.h"

namespace tandem {
namespace {

using testing::model_options;
using testing::tiny_config;
using testing::tiny_weights;
using testing::tokens;

// One result's fields, bit for bit (floats compared as bits), as text for the first mismatch.
std::string result_difference(const SampleRowResult& a, const SampleRowResult& b) {
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  char buf[240];
  if (a.accepted != b.accepted || a.token != b.token || bits(a.token_logprob) != bits(b.token_logprob) ||
      a.num_top != b.num_top) {
    std::snprintf(buf, sizeof buf, "accepted %d/%d token %d/%d logprob %.9g/%.9g num_top %d/%d", a.accepted,
                  b.accepted, a.token, b.token, a.token_logprob, b.token_logprob, a.num_top, b.num_top);
    return buf;
  }
  for (int k = 0; k < a.num_top && k < kMaxTopLogprobs; ++k)
    if (a.top_ids[k] != b.top_ids[k] || bits(a.top_logprobs[k]) != bits(b.top_logprobs[k])) {
      std::snprintf(buf, sizeof buf, "top %d: id %d/%d logprob %.9g/%.9g", k, a.top_ids[k], b.top_ids[k],
                    a.top_logprobs[k], b.top_logprobs[k]);
      return buf;
    }
  return "";
}

struct Models {
  ModelConfig cfg = tiny_config(true);
  testing::TinyWeights tw = tiny_weights(cfg, 7);
  std::unique_ptr<CudaModel> graph, eager;
  Models() {
    for (int graphs : {4, 0}) {
      CudaModelOptions co;
      co.model = model_options();
      co.max_graph_batch = graphs;
      auto g = CudaModel::from_tensors(cfg, tw.ptrs(), co);
      EXPECT_TRUE(g.ok()) << g.status().to_string();
      if (g.ok()) (graphs ? graph : eager) = std::move(g).value();
    }
  }
};

// The arrays a step's rows index: penalties and grammar masks on some rows.
struct RowArrays {
  std::vector<SampleRow> rows;
  std::vector<int32_t> prompt_ids, counts;
  std::vector<uint32_t> masks;
};

// One row per logits row of a step of `ns` sequences x `per` rows (row k samples logits row k),
// seeded draws of every kind; verify rows carry the sequence's next token as their draft.
RowArrays step_rows(int ns, int per, int step, int64_t V, const std::vector<std::vector<int32_t>>& seqs,
                    const std::vector<int64_t>& pos) {
  RowArrays a;
  const int64_t W = (V + 31) / 32;
  for (int s = 0; s < ns; ++s)
    for (int j = 0; j < per; ++j) {
      SampleRow r;
      const int k = s * per + j;
      r.logits_row = k;
      r.temperature = (k + step) % 4 == 0 ? 0.0 : 0.8;
      r.top_p = k % 3 == 1 ? 0.9 : 1.0;
      r.top_k = k % 5 == 2 ? 40 : 0;
      r.min_p = k % 7 == 3 ? 0.05 : 0.0;
      r.seed = 100 + s;
      r.position = pos[s] + j + 1;
      r.top_logprobs = k % 2 ? 3 : -1;
      if (per > 1 && j + 1 < per) r.draft = seqs[s][static_cast<size_t>(pos[s] + j + 1)];
      if (k % 3 == 0) {  // penalties: the prompt's ids and two (token, count) pairs
        r.repetition_penalty = 1.1;
        r.frequency_penalty = 0.3;
        r.presence_penalty = 0.2;
        r.prompt_begin = static_cast<int32_t>(a.prompt_ids.size());
        for (int32_t t : {3, 17, 42, 99}) a.prompt_ids.push_back(t);
        r.prompt_count = 4;
        r.counts_begin = static_cast<int32_t>(a.counts.size() / 2);
        for (int32_t t : {5, 2, 64, 1}) a.counts.push_back(t);
        r.counts_count = 2;
      }
      if (k % 4 == 1) {  // a grammar mask allowing every other id block
        r.mask_row = static_cast<int32_t>(a.masks.size() / W);
        for (int64_t w = 0; w < W; ++w) a.masks.push_back(w % 2 ? 0xFFFFFFFFu : 0x0F0F0F0Fu);
      }
      a.rows.push_back(r);
    }
  return a;
}

TEST(CudaSamplerGraph, InGraphSamplingEqualsTheSeparateLaunchAndTheEagerModel) {
  TANDEM_REQUIRE_GPU();
  Models mm;
  ASSERT_TRUE(mm.graph && mm.eager);
  CudaModel& g = *mm.graph;
  CudaModel& e = *mm.eager;
  const int captured = g.capture_graphs(/*taps=*/false, /*sampler=*/true);
  EXPECT_GT(captured, 0);
  const int64_t V = g.vocab_size(), W = (V + 31) / 32;
  std::vector<std::vector<int32_t>> seqs = {tokens(300, 91), tokens(300, 92), tokens(300, 93)};
  std::vector<std::vector<int32_t>> tables = {testing::table_for(0), testing::table_for(1), testing::table_for(2)};
  for (CudaModel* m : {&g, &e}) {
    StepBatch b;
    for (int s = 0; s < 3; ++s) {
      m->reset(s);
      b.seqs.push_back({s, 0, std::span<const int32_t>(seqs[s].data(), 100 + 10 * s), tables[s], LogitsMode::kLast, false});
    }
    ASSERT_TRUE(m->forward(b, nullptr).ok());
  }
  const auto before = g.graph_stats();
  int rows_total = 0, in_graph_vs_separate_bad = 0, graph_vs_eager_bad = 0;
  std::string first_bad;
  for (int step = 0; step < 16; ++step) {
    const int n = step % 4 == 3 ? 6 : 1;  // decode steps and verify steps of 6: graph replays
    const int per = n;
    StepBatch b;
    std::vector<int64_t> pos(3);
    for (int s = 0; s < 3; ++s) {
      pos[s] = g.slot_length(s);
      ASSERT_EQ(pos[s], e.slot_length(s));
      b.seqs.push_back({s, pos[s], std::span<const int32_t>(seqs[s].data() + pos[s], n), tables[s],
                        n == 1 ? LogitsMode::kLast : LogitsMode::kAll, false});
    }
    const RowArrays a = step_rows(3, per, step, V, seqs, pos);
    std::vector<SampleRowResult> in_graph(a.rows.size()), separate(a.rows.size()), eager(a.rows.size());
    Status st = g.forward_sample(b, a.rows, a.prompt_ids, a.counts, a.masks, W, in_graph);
    ASSERT_TRUE(st.ok()) << st.to_string();
    // The separate launch over the same logits (still on the device) and descriptors.
    st = g.sample(a.rows, a.prompt_ids, a.counts, a.masks, W, separate);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(e.forward(b, nullptr, /*synchronize=*/false).ok());
    st = e.sample(a.rows, a.prompt_ids, a.counts, a.masks, W, eager);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (size_t k = 0; k < a.rows.size(); ++k) {
      const std::string d1 = result_difference(in_graph[k], separate[k]);
      if (!d1.empty()) {
        ++in_graph_vs_separate_bad;
        if (first_bad.empty()) first_bad = "step " + std::to_string(step) + " row " + std::to_string(k) + ": " + d1;
      }
      graph_vs_eager_bad += in_graph[k].token != eager[k].token || in_graph[k].accepted != eager[k].accepted;
    }
    rows_total += static_cast<int>(a.rows.size());
  }
  const auto after = g.graph_stats();
  std::printf("[cuda-sampler-graph] %d rows over 16 steps: %lld steps sampled inside the graph, %lld replays, %lld "
              "captures after start-up; in-graph vs separate launch: %d rows differ%s%s; in-graph vs eager model: %d "
              "tokens differ\n",
              rows_total, static_cast<long long>(after.sampled_in_graph - before.sampled_in_graph),
              static_cast<long long>(after.replays - before.replays),
              static_cast<long long>(after.captures - before.captures), in_graph_vs_separate_bad,
              first_bad.empty() ? "" : ", first: ", first_bad.c_str(), graph_vs_eager_bad);
  EXPECT_EQ(after.sampled_in_graph - before.sampled_in_graph, 16);
  EXPECT_EQ(after.replays - before.replays, 16);
  EXPECT_EQ(after.captures - before.captures, 0) << "every decode/verify shape was captured with the sampler";
  EXPECT_EQ(in_graph_vs_separate_bad, 0) << first_bad;
  EXPECT_EQ(graph_vs_eager_bad, 0);
}

TEST(CudaSamplerGraph, RowsOffTheGraphLayoutTakeTheSeparateLaunch) {
  TANDEM_REQUIRE_GPU();
  Models mm;
  ASSERT_TRUE(mm.graph);
  CudaModel& g = *mm.graph;
  g.capture_graphs(/*taps=*/false, /*sampler=*/true);
  const int64_t V = g.vocab_size(), W = (V + 31) / 32;
  std::vector<std::vector<int32_t>> seqs = {tokens(300, 95), tokens(300, 96)};
  std::vector<std::vector<int32_t>> tables = {testing::table_for(0), testing::table_for(1)};
  StepBatch pre;
  for (int s = 0; s < 2; ++s) {
    g.reset(s);
    pre.seqs.push_back({s, 0, std::span<const int32_t>(seqs[s].data(), 90), tables[s], LogitsMode::kLast, false});
  }
  ASSERT_TRUE(g.forward(pre, nullptr).ok());
  const auto before = g.graph_stats();
  // A verify step of 6 whose rows sample only each sequence's last logits row, in reverse order.
  StepBatch b;
  std::vector<int64_t> pos = {90, 90};
  for (int s = 0; s < 2; ++s)
    b.seqs.push_back({s, 90, std::span<const int32_t>(seqs[s].data() + 90, 6), tables[s], LogitsMode::kAll, false});
  std::vector<SampleRow> rows(2);
  for (int s = 0; s < 2; ++s) {
    rows[s].logits_row = (1 - s) * 6 + 5;
    rows[s].temperature = 0.7;
    rows[s].seed = 5 + s;
    rows[s].position = 97;
    rows[s].top_logprobs = 2;
  }
  std::vector<SampleRowResult> got(2), want(2);
  ASSERT_TRUE(g.forward_sample(b, rows, {}, {}, {}, W, got).ok());
  ASSERT_TRUE(g.sample(rows, {}, {}, {}, W, want).ok());
  for (int s = 0; s < 2; ++s) EXPECT_EQ(result_difference(got[s], want[s]), "") << "row " << s;
  const auto after = g.graph_stats();
  EXPECT_EQ(after.replays - before.replays, 1);
  EXPECT_EQ(after.sampled_in_graph, before.sampled_in_graph) << "these rows are off the graph's layout";
  EXPECT_EQ(g.slot_length(0), 96);
  // A row outside the step's logits is an error; the model stays usable.
  rows[0].logits_row = 12;
  b.seqs[0].start_pos = b.seqs[1].start_pos = 96;
  b.seqs[0].tokens = std::span<const int32_t>(seqs[0].data() + 96, 6);
  b.seqs[1].tokens = std::span<const int32_t>(seqs[1].data() + 96, 6);
  EXPECT_FALSE(g.forward_sample(b, rows, {}, {}, {}, W, got).ok());
  rows[0].logits_row = 0;
  rows[1].logits_row = 1;
  pos = {g.slot_length(0), g.slot_length(1)};
  b.seqs[0].start_pos = pos[0];
  b.seqs[1].start_pos = pos[1];
  b.seqs[0].tokens = std::span<const int32_t>(seqs[0].data() + pos[0], 6);
  b.seqs[1].tokens = std::span<const int32_t>(seqs[1].data() + pos[1], 6);
  EXPECT_TRUE(g.forward_sample(b, rows, {}, {}, {}, W, got).ok());
}

// Empty when the logits rows `m`'s last step reports are the ones planned for `b` before it ran,
// else both layouts as text.
std::string layout_difference(const CudaModel& m, const StepBatch& b) {
  std::vector<int64_t> planned;
  CudaModel::step_logits_rows(b, planned);
  const auto used = m.last_logits_rows();
  if (std::equal(used.begin(), used.end(), planned.begin(), planned.end())) return "";
  std::string t = "reported [";
  for (int64_t r : used) t += std::to_string(r) + ",";
  t += "] planned [";
  for (int64_t r : planned) t += std::to_string(r) + ",";
  return t + "]";
}

// Greedy rows, one per logits row of the planned layout, in order (the graph's layout).
std::vector<SampleRow> greedy_rows(const StepBatch& b) {
  std::vector<int64_t> planned;
  CudaModel::step_logits_rows(b, planned);
  std::vector<SampleRow> rows;
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    if (planned[i] < 0) continue;
    const SeqStep& q = b.seqs[i];
    const int64_t per = q.logits == LogitsMode::kAll ? static_cast<int64_t>(q.tokens.size()) : 1;
    for (int64_t j = 0; j < per; ++j) {
      SampleRow r;
      r.logits_row = static_cast<int32_t>(planned[i] + j);
      r.temperature = 0.0;
      r.position = q.start_pos + j + 1;
      rows.push_back(r);
    }
  }
  return rows;
}

// The engine's concurrency-8 failure (a sequence count that is not a captured graph size): a graph
// step of 3 sequences runs padded to 4, and last_logits_rows reported the padding's entry too, so
// the runner's check against the planned layout failed the step. Every step kind here: padded
// decode and verify replays with the sampler in the graph, a padded replay without sampling, and
// eager steps mixing kLast, kNone, kAll and empty sequences, on a graph model and an eager one.
TEST(CudaSamplerGraph, ReportedLogitsRowsAreThePlannedOnesInPaddedAndMixedSteps) {
  TANDEM_REQUIRE_GPU();
  Models mm;
  ASSERT_TRUE(mm.graph && mm.eager);
  mm.graph->capture_graphs(/*taps=*/false, /*sampler=*/true);
  const int64_t W = (mm.graph->vocab_size() + 31) / 32;
  std::vector<std::vector<int32_t>> seqs = {tokens(300, 81), tokens(300, 82), tokens(300, 83), tokens(300, 84)};
  std::vector<std::vector<int32_t>> tables = {testing::table_for(0), testing::table_for(1), testing::table_for(2),
                                              testing::table_for(3)};
  for (CudaModel* m : {mm.graph.get(), mm.eager.get()}) {
    const char* which = m == mm.graph.get() ? "graph model" : "eager model";
    for (int s = 0; s < 4; ++s) m->reset(s);
    const auto before = m->graph_stats();
    int steps = 0, bad = 0;
    std::string first_bad;
    std::vector<SampleRowResult> out;
    auto seq = [&](int s, int n, LogitsMode lm) {
      const int64_t pos = m->slot_length(s);
      return SeqStep{s, pos, std::span<const int32_t>(seqs[s].data() + pos, static_cast<size_t>(n)), tables[s], lm,
                     false};
    };
    auto run = [&](const StepBatch& b, bool sampled, const std::string& what) {
      ++steps;
      Status st;
      if (sampled) {
        const std::vector<SampleRow> rows = greedy_rows(b);
        out.assign(rows.size(), SampleRowResult());
        st = m->forward_sample(b, rows, {}, {}, {}, W, out);
      } else {
        st = m->forward(b, nullptr);
      }
      EXPECT_TRUE(st.ok()) << which << ", " << what << ": " << st.to_string();
      const std::string d = layout_difference(*m, b);
      if (!d.empty() && ++bad == 1) first_bad = what + ": " + d;
    };
    StepBatch b;
    // Mixed prompts: kLast, kNone (a chunk that samples nothing), kAll, and an empty sequence.
    b.seqs = {seq(0, 40, LogitsMode::kLast), seq(1, 30, LogitsMode::kNone), seq(2, 12, LogitsMode::kAll),
              seq(3, 0, LogitsMode::kLast)};
    run(b, true, "mixed prefill (eager)");
    b.seqs = {seq(1, 25, LogitsMode::kLast), seq(3, 20, LogitsMode::kLast)};
    run(b, true, "prefill of slots 1 and 3 (eager)");
    for (int rep = 0; rep < 2; ++rep) {
      b.seqs = {seq(0, 1, LogitsMode::kLast), seq(1, 1, LogitsMode::kLast), seq(2, 1, LogitsMode::kLast)};
      run(b, true, "3 decodes (padded to 4)");
      b.seqs = {seq(2, 6, LogitsMode::kAll), seq(0, 6, LogitsMode::kAll), seq(1, 6, LogitsMode::kAll)};
      run(b, true, "3 verifies of 6 (padded to 4)");
      b.seqs = {seq(1, 1, LogitsMode::kLast), seq(0, 1, LogitsMode::kLast), seq(2, 1, LogitsMode::kLast)};
      run(b, false, "3 decodes without sampling (padded to 4)");
      b.seqs = {seq(0, 1, LogitsMode::kLast), seq(1, 6, LogitsMode::kAll), seq(3, 3, LogitsMode::kNone),
                seq(2, 1, LogitsMode::kLast)};
      run(b, true, "decode + verify + prefill chunk (eager)");
      b.seqs = {seq(3, 1, LogitsMode::kLast), seq(0, 1, LogitsMode::kLast), seq(1, 1, LogitsMode::kLast),
                seq(2, 1, LogitsMode::kLast)};
      run(b, true, "4 decodes (a captured size)");
      b.seqs = {seq(3, 1, LogitsMode::kLast)};
      run(b, true, "1 decode");
    }
    const auto after = m->graph_stats();
    std::printf("[cuda-sampler-graph] %s: %d steps (%lld replays, %lld sampled inside the graph), %d report a "
                "layout other than the planned one%s%s\n",
                which, steps, static_cast<long long>(after.replays - before.replays),
                static_cast<long long>(after.sampled_in_graph - before.sampled_in_graph), bad,
                first_bad.empty() ? "" : ", first: ", first_bad.c_str());
    EXPECT_EQ(bad, 0) << which << ": " << first_bad;
    if (m == mm.graph.get()) {
      // Per rep, the padded decodes and verifies, the 4-decode and the 1-decode step are graph
      // steps: the sampled ones (4 a rep) sample inside their graph; the unsampled padded decode's
      // shape (no sampler launch) is captured on first use, then replayed.
      EXPECT_EQ(after.sampled_in_graph - before.sampled_in_graph, 8);
      EXPECT_EQ(after.captures - before.captures, 1);
      EXPECT_EQ(after.replays - before.replays, 9);
    }
  }
}

}  // namespace
}  // namespace tandem

// The tensor-parallel control plane in one process: a TpHeadRunner and a worker's plan loop joined
// by an in-memory ControlComm, each over its own fake model. Through the engine (speculative
// decoding with sampled drafts, prefix-cache restores, rollbacks), a step is one forward plan plus
// one draft plan however many sequences commit; the worker's model follows the head's exactly (its
// forwards and draft-context checks would fail otherwise) and the output equals one process's. A
// failed control plane fails the call that carries a commit instead of being dropped.
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "engine/engine_core.h"
#include "engine/fake_model.h"
#include "engine/parallel/tp_runner.h"
#include "harness.h"

namespace tandem::testing {
namespace {

// Rank 0's broadcasts queue up for rank 1; barriers meet both; a failure fails both ends.
struct Link {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::vector<uint8_t>> plans;
  int64_t broadcasts = 0;
  int arrived = 0;
  int64_t generation = 0;
  std::string failure;
};

class LinkComm : public ControlComm {
 public:
  LinkComm(std::shared_ptr<Link> link, int rank) : link_(std::move(link)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  Status broadcast(std::vector<uint8_t>& bytes, int root) override {
    std::unique_lock<std::mutex> lock(link_->mu);
    if (!link_->failure.empty()) return Status(StatusCode::kUnavailable, link_->failure);
    if (rank_ == root) {
      link_->plans.push_back(bytes);
      ++link_->broadcasts;
      link_->cv.notify_all();
      return Status();
    }
    link_->cv.wait(lock, [&] { return !link_->plans.empty() || !link_->failure.empty(); });
    if (link_->plans.empty()) return Status(StatusCode::kUnavailable, link_->failure);
    bytes = std::move(link_->plans.front());
    link_->plans.pop_front();
    return Status();
  }
  Status barrier(std::chrono::milliseconds) override {
    std::unique_lock<std::mutex> lock(link_->mu);
    const int64_t gen = link_->generation;
    if (++link_->arrived == 2) {
      link_->arrived = 0;
      ++link_->generation;
      link_->cv.notify_all();
      return Status();
    }
    link_->cv.wait(lock, [&] { return link_->generation != gen || !link_->failure.empty(); });
    return link_->failure.empty() ? Status() : Status(StatusCode::kUnavailable, link_->failure);
  }
  std::string failure() const override {
    std::lock_guard<std::mutex> lock(link_->mu);
    return link_->failure;
  }
  void fail(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(link_->mu);
    if (link_->failure.empty()) link_->failure = reason;
    link_->cv.notify_all();
  }

 private:
  std::shared_ptr<Link> link_;
  int rank_;
};

// A head (TpHeadRunner over a fake model) and a worker thread (the plan loop over another).
struct TwoRanks {
  explicit TwoRanks(const FakeModelConfig& fc) : link(std::make_shared<Link>()), worker_model(fc) {
    auto local = std::make_unique<FakeModelRunner>(fc);
    head_model = local.get();
    head = make_tp_head_runner(std::make_unique<LinkComm>(link, 0), std::move(local));
    worker_comm = std::make_unique<LinkComm>(link, 1);
    worker = std::thread([this] { worker_exit = tp_worker_loop(*worker_comm, worker_model); });
  }
  // Shuts the worker down (the head's destructor sends the shutdown plan) and returns its exit code.
  int stop() {
    head.reset();
    if (worker.joinable()) worker.join();
    return worker_exit;
  }
  ~TwoRanks() {
    if (worker.joinable()) {
      worker_comm->fail("test over");
      head.reset();
      worker.join();
    }
  }
  std::shared_ptr<Link> link;
  FakeModelRunner worker_model;
  FakeModelRunner* head_model = nullptr;
  std::unique_ptr<ModelRunner> head;
  std::unique_ptr<LinkComm> worker_comm;
  std::thread worker;
  int worker_exit = -1;
};

FakeModelConfig fake() {
  FakeModelConfig fc;
  fc.draft_agree = 0.6;
  return fc;
}

EngineConfig spec_config() {
  EngineConfig ec = with_spec(small_config(4, 16), "fixed", 4);
  ec.speculative.draft_sample_method = DraftSampleMethod::kSample;
  ec.kv_cache_memory = 0;
  return ec;
}

// Requests: two that share a 40-token prefix (the second hits the first's cached blocks and
// restores its slot snapshot), greedy and sampled.
void submit_all(EngineCore& core, std::map<std::string, Collected>& out) {
  const auto shared = make_prompt(5, 40, 64);
  std::vector<std::pair<std::string, std::vector<int32_t>>> reqs = {
      {"a", shared}, {"b", make_prompt(6, 23, 64)}, {"c", make_prompt(7, 9, 64)}};
  for (auto& [id, prompt] : reqs) {
    SamplingParams sp = greedy_params(30);
    if (id == "c") sp.temperature = 0.8;
    Request r;
    r.request_id = id;
    r.prompt_tokens = prompt;
    r.sampling = sp;
    ASSERT_TRUE(core.add_request(std::move(r), [&out](const RequestEvent& ev) {
                      Collected& c = out[ev.request_id];
                      c.tokens.insert(c.tokens.end(), ev.tokens.begin(), ev.tokens.end());
                      if (ev.finish != FinishReason::kNone) {
                        c.finish = ev.finish;
                        c.error = ev.error;
                        c.usage = ev.usage;
                      }
                    }).ok());
  }
}

std::unique_ptr<EngineCore> make_core(std::unique_ptr<ModelRunner> runner, const EngineConfig& ec) {
  CoreOptions o;
  o.log_startup = false;
  o.check_integrity_each_step = true;
  auto c = EngineCore::create(std::move(runner), ec, o);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Runs a, b and c (b and c after a finished, so b's prompt hits a's blocks).
std::map<std::string, Collected> run(EngineCore& core, const std::function<void()>& after_step) {
  std::map<std::string, Collected> out;
  submit_all(core, out);
  for (int i = 0; i < 10000 && core.has_work(); ++i) {
    Status st = core.step();
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) break;
    after_step();
  }
  const auto shared = make_prompt(5, 40, 64);
  Request again;
  again.request_id = "a2";
  again.prompt_tokens = shared;
  again.prompt_tokens.push_back(7);
  again.sampling = greedy_params(12);
  EXPECT_TRUE(core.add_request(std::move(again), [&out](const RequestEvent& ev) {
                    Collected& c = out[ev.request_id];
                    c.tokens.insert(c.tokens.end(), ev.tokens.begin(), ev.tokens.end());
                    if (ev.finish != FinishReason::kNone) c.usage = ev.usage;
                  }).ok());
  for (int i = 0; i < 10000 && core.has_work(); ++i) {
    Status st = core.step();
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) break;
    after_step();
  }
  return out;
}

TEST(TpPlans, AStepIsOneForwardPlanAndOneDraftPlan) {
  const EngineConfig ec = spec_config();
  auto one = make_core(std::make_unique<FakeModelRunner>(fake()), ec);
  ASSERT_TRUE(one);
  const auto want = run(*one, [] {});

  TwoRanks ranks(fake());
  auto core = make_core(std::move(ranks.head), ec);
  ASSERT_TRUE(core);
  int64_t steps = 0, most = 0, before = ranks.link->broadcasts;
  const auto got = run(*core, [&] {
    const int64_t now = ranks.link->broadcasts;
    most = std::max(most, now - before);
    before = now;
    ++steps;
  });
  // Every step: one forward plan, one draft plan when it drafts; the commits of all its sequences
  // ride on them.
  EXPECT_LE(most, 2) << "plans in one step";
  EXPECT_GT(steps, 10);
  for (const auto& [id, c] : want) {
    EXPECT_EQ(got.at(id).tokens, c.tokens) << id;
    EXPECT_EQ(c.tokens.size(), id == "a2" ? 12u : 30u) << id;
  }
  EXPECT_GT(got.at("a2").usage.cached_tokens, 0) << "the prefix hit (a restore in a forward plan) did not happen";
  EXPECT_GT(got.at("a").usage.draft_tokens, got.at("a").usage.accepted_draft_tokens) << "no draft was rejected";
  const int64_t head_forwards = ranks.head_model->forward_calls();
  EXPECT_EQ(ranks.head_model->draft_context_errors(), 0);
  core.reset();  // the head runner goes with it: its shutdown plan ends the worker's loop
  EXPECT_EQ(ranks.stop(), 0) << "the worker left its plan loop on a failure";
  EXPECT_EQ(ranks.worker_model.forward_calls(), head_forwards);
  EXPECT_EQ(ranks.worker_model.draft_context_errors(), 0);
}

TEST(TpPlans, AFailedControlPlaneFailsTheCallCarryingACommit) {
  TwoRanks ranks(fake());
  ModelRunner& head = *ranks.head;
  RunnerAllocation a;
  a.num_blocks = 8;
  a.block_size = 16;
  a.max_slots = 2;
  a.max_tokens_per_step = 64;
  a.max_verify_tokens = 5;
  a.num_draft_tokens = 4;
  a.kv_cache_dtype = "bf16";
  ASSERT_TRUE(head.allocate(a).ok());
  const auto prompt = make_prompt(9, 20, 64);
  const std::vector<int32_t> table = {0, 1};
  RunnerSeq s;
  s.slot = 0;
  s.tokens = prompt;
  s.block_table = table;
  s.collect_taps = true;
  s.reset = true;
  RunnerOutput out;
  ASSERT_TRUE(head.forward(std::span<const RunnerSeq>(&s, 1), nullptr, out).ok());
  ASSERT_TRUE(head.commit(std::vector<SlotCommit>{{0, 0, 20, 20, -1}}).ok());
  std::vector<DraftQuery> q = {{0, prompt.back(), 20, 0.0, 1}};
  std::vector<DraftProposal> props;
  ASSERT_TRUE(head.draft_propose(q, props).ok());  // carried the commit to the worker
  EXPECT_EQ(ranks.worker_model.draft_context_errors(), 0);
  // The worker goes away: the next commit and the call that would carry it both fail.
  ranks.worker_comm->fail("rank 1 exited");
  Status c = head.commit(std::vector<SlotCommit>{{0, 0, 20, 0, -1}});
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.message().find("rank 1 exited"), std::string::npos) << c.message();
  EXPECT_FALSE(head.draft_propose(q, props).ok());
  EXPECT_FALSE(head.health().ok());
  ranks.worker.join();
  EXPECT_EQ(ranks.worker_exit, 1);
}

}  // namespace
}  // namespace tandem::testing

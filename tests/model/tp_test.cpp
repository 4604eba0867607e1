// Tensor parallelism on the CPU: the tiny "tp8" checkpoint sharded over 2 and 4 ranks (threads of
// this process, each with its own DsV4Model and a ZeroMQ communicator over loopback) against the
// unsharded model: same greedy tokens, logits within tolerance, the same bits on every rank, the
// DSpark draft's proposals, and each rank binding only its share of the weights. The model needs
// only the data plane: an in-process DataComm (no control plane at all) gives the ZeroMQ group's
// bits exactly, as the determinism contract of common/comm.h says two rank-order backends must.
#include <unistd.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "common/numeric.h"
#include "engine/parallel/zmq_comm.h"
#include "io/model_config.h"
#include "model/model.h"
#include "model/run_helpers.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string make_tiny(const std::string& preset) {
  const std::string dir =
      (fs::temp_directory_path() / ("tandem-tp-" + preset + "-" + std::to_string(getpid()))).string();
  if (fs::exists(dir + "/config.json")) return dir;
  const std::string cmd = std::string(TANDEM_BINARY) + " make-tiny " + dir + " --seed 3 --preset " + preset +
                          " > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir;
}

ModelOptions options(int rank, int size, DataComm* comm) {
  ModelOptions o;
  o.max_slots = 2;
  o.num_blocks = 8;
  o.block_size = 256;
  o.max_tokens_per_step = 128;
  o.max_rollback = 6;
  o.num_threads = 1;
  o.tp_rank = rank;
  o.tp_size = size;
  o.comm = comm;
  return o;
}

void on_all_ranks(int n, const std::function<void(int)>& f) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back(f, r);
  for (auto& t : ts) t.join();
}

// The data plane of N threads of this process: every rank reads every rank's buffer and sums in
// rank order (rank 0 first) in fp32 itself, then all copy their result in; barriers between the
// phases. A DataComm and nothing else.
class ThreadDataComm : public DataComm {
 public:
  struct Shared {
    explicit Shared(int n) : size(n), sync(n), bufs(n) {}
    int size;
    std::barrier<> sync;
    std::vector<const void*> bufs;
  };
  ThreadDataComm(std::shared_ptr<Shared> sh, int rank) : sh_(std::move(sh)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return sh_->size; }
  std::string path() const override { return "threads-rank-order"; }
  Status all_reduce_sum(void* data, size_t count, CommDtype dtype, CommStream) override {
    wide_.assign(count, 0.0f);
    publish(data);
    for (int r = 0; r < sh_->size; ++r)
      for (size_t i = 0; i < count; ++i) {
        const float v = dtype == CommDtype::kF32 ? static_cast<const float*>(sh_->bufs[r])[i]
                                                 : num::bf16_to_f32(static_cast<const uint16_t*>(sh_->bufs[r])[i]);
        wide_[i] = r == 0 ? v : wide_[i] + v;
      }
    sh_->sync.arrive_and_wait();  // everyone has read every buffer
    for (size_t i = 0; i < count; ++i) {
      if (dtype == CommDtype::kF32) static_cast<float*>(data)[i] = wide_[i];
      else static_cast<uint16_t*>(data)[i] = num::f32_to_bf16(wide_[i]);
    }
    return Status();
  }
  Status all_gather(const void* in, size_t bytes, void* out, CommStream) override {
    publish(in);
    for (int r = 0; r < sh_->size; ++r)
      std::memcpy(static_cast<uint8_t*>(out) + r * bytes, sh_->bufs[r], bytes);
    sh_->sync.arrive_and_wait();
    return Status();
  }
  Status broadcast(void* data, size_t bytes, int root, CommStream) override {
    publish(data);
    if (rank_ != root) std::memcpy(data, sh_->bufs[root], bytes);
    sh_->sync.arrive_and_wait();
    return Status();
  }

 private:
  void publish(const void* p) {
    sh_->sync.arrive_and_wait();  // the previous collective's readers are done
    sh_->bufs[rank_] = p;
    sh_->sync.arrive_and_wait();
  }
  std::shared_ptr<Shared> sh_;
  int rank_;
  std::vector<float> wide_;
};

// N ranks in this process: communicators (created together: start-up waits for every rank) and models.
struct Group {
  std::vector<std::unique_ptr<DataComm>> comms;
  std::vector<std::unique_ptr<DsV4Model>> models;
};

// port > 0: ZeroMQ over loopback; port 0 with n > 1: ThreadDataComm.
Group make_group(const std::string& dir, int n, int port) {
  Group g;
  g.comms.resize(n);
  g.models.resize(n);
  std::vector<Status> st(n);
  auto shared = std::make_shared<ThreadDataComm::Shared>(n);
  on_all_ranks(n, [&](int r) {
    if (n > 1 && port == 0) {
      g.comms[r] = std::make_unique<ThreadDataComm>(shared, r);
    } else if (n > 1) {
      ZmqCommOptions o;
      o.rank = r;
      o.size = n;
      o.master_port = port;
      o.connect_timeout_s = 30;
      o.fingerprint = {{"test", "tp"}};
      auto c = create_zmq_comm(o);
      if (!c.ok()) {
        st[r] = c.status();
        return;
      }
      g.comms[r] = std::move(*c);
    }
    auto m = DsV4Model::load(dir, options(r, n, n > 1 ? g.comms[r].get() : nullptr));
    if (!m.ok()) {
      st[r] = m.status();
      return;
    }
    g.models[r] = std::move(*m);
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
  return g;
}

// Greedy decoding of `steps` tokens after `prompt` (prefill in chunks of 7), on every rank at once;
// returns rank 0's tokens and every position's logits, and checks all ranks saw the same bits.
struct Decode {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [prompt + steps - 1 rows, vocab]... one row per forward position
};

Decode greedy(Group& g, const std::vector<int32_t>& prompt, int steps) {
  const int n = static_cast<int>(g.models.size());
  std::vector<Decode> per(n);
  on_all_ranks(n, [&](int r) {
    DsV4Model& m = *g.models[r];
    const int64_t V = m.vocab_size();
    std::vector<int32_t> seq = prompt;
    auto table = testing::table_for(0);
    StepOutput out;
    m.reset(0);
    size_t pos = 0;
    while (static_cast<int>(per[r].tokens.size()) < steps) {
      const size_t len = pos < prompt.size() ? std::min<size_t>(7, prompt.size() - pos) : 1;
      StepBatch b;
      SeqStep s;
      s.slot = 0;
      s.start_pos = static_cast<int64_t>(pos);
      s.tokens = std::span<const int32_t>(seq.data() + pos, len);
      s.block_table = table;
      s.logits = LogitsMode::kAll;
      b.seqs.push_back(s);
      Status st = m.forward(b, out);
      ASSERT_TRUE(st.ok()) << st.to_string();
      per[r].logits.insert(per[r].logits.end(), out.logits.begin(), out.logits.begin() + len * V);
      pos += len;
      if (pos < prompt.size()) continue;
      const float* last = out.logits.data() + (len - 1) * V;
      const int32_t tok = static_cast<int32_t>(std::max_element(last, last + V) - last);
      per[r].tokens.push_back(tok);
      seq.push_back(tok);
    }
  });
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(per[r].tokens, per[0].tokens) << "rank " << r;
    EXPECT_TRUE(per[r].logits == per[0].logits) << "rank " << r << " logits differ from rank 0's";
  }
  return per[0];
}

class TensorParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new std::string(make_tiny("tp8")); }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  static std::string* dir_;
};
std::string* TensorParallel::dir_ = nullptr;

void expect_close(const std::vector<float>& a, const std::vector<float>& b, int64_t V, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0, scale = 0;
  int64_t argmax_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  for (size_t r = 0; r < a.size() / V; ++r) {
    const float* x = a.data() + r * V;
    const float* y = b.data() + r * V;
    argmax_diff += (std::max_element(x, x + V) - x) != (std::max_element(y, y + V) - y);
  }
  // Sharding changes the summation order of wo_b, the MoE and the indexer scores (fp32 / bf16
  // partial sums): small differences, never a different greedy choice on these inputs.
  EXPECT_LT(worst, 0.02 * scale + 1e-3) << what << ": worst |diff| " << worst << " (logit scale " << scale << ")";
  EXPECT_EQ(argmax_diff, 0) << what;
  std::printf("[ %s ] worst |logit diff| %.3g (max |logit| %.3g)\n", what.c_str(), worst, scale);
}

TEST_F(TensorParallel, GreedyTokensAndLogitsMatchOneRank) {
  const auto prompt = testing::tokens(40, 11);
  Group one = make_group(*dir_, 1, 0);
  ASSERT_TRUE(one.models[0]);
  const Decode ref = greedy(one, prompt, 24);
  const int64_t V = one.models[0]->vocab_size();
  int port = 18500;
  for (int n : {2, 4}) {
    Group g = make_group(*dir_, n, port);
    port += 4;
    ASSERT_TRUE(g.models[n - 1]);
    const Decode d = greedy(g, prompt, 24);
    EXPECT_EQ(d.tokens, ref.tokens) << "TP=" << n;
    expect_close(d.logits, ref.logits, V, "TP=" + std::to_string(n) + " vs TP=1");
  }
}

TEST_F(TensorParallel, TheModelNeedsOnlyTheDataPlane) {
  const auto prompt = testing::tokens(40, 11);
  Group zmq = make_group(*dir_, 2, 18644);
  ASSERT_TRUE(zmq.models[1]);
  const Decode want = greedy(zmq, prompt, 12);
  Group threads = make_group(*dir_, 2, 0);
  ASSERT_TRUE(threads.models[1]);
  EXPECT_EQ(threads.comms[0]->path(), "threads-rank-order");
  const Decode got = greedy(threads, prompt, 12);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  size_t differ = 0, first = got.logits.size();
  for (size_t i = 0; i < got.logits.size(); ++i)
    if (std::memcmp(&got.logits[i], &want.logits[i], sizeof(float)) != 0 && !differ++) first = i;
  EXPECT_EQ(differ, 0u) << "logits differ from the ZeroMQ group's bits at " << differ << " places, first " << first
                        << ": " << (first < got.logits.size() ? got.logits[first] : 0.0f) << " vs "
                        << (first < got.logits.size() ? want.logits[first] : 0.0f);
}

TEST_F(TensorParallel, DraftProposalsMatchOneRank) {
  const auto prompt = testing::tokens(30, 5);
  auto propose = [&](Group& g) {
    const int n = static_cast<int>(g.models.size());
    std::vector<std::vector<int32_t>> toks(n);
    std::vector<std::vector<float>> logits(n);
    on_all_ranks(n, [&](int r) {
      DsV4Model& m = *g.models[r];
      std::vector<float> taps;
      testing::run(m, 0, prompt, {9}, &taps);
      // Context = every position but the last; the last token is the anchor.
      const int64_t td = m.tap_dim();
      ASSERT_TRUE(m.draft_insert_context(0, 0, std::span<const float>(taps.data(), (prompt.size() - 1) * td)).ok());
      std::vector<DraftRequest> reqs = {{0, prompt.back(), static_cast<int64_t>(prompt.size() - 1)}};
      std::vector<DraftResult> res;
      Status st = m.draft_propose(reqs, DraftSampling{}, res);
      ASSERT_TRUE(st.ok()) << st.to_string();
      toks[r] = res[0].tokens;
      logits[r] = res[0].logits;
    });
    for (int r = 1; r < n; ++r) EXPECT_EQ(toks[r], toks[0]);
    return std::make_pair(toks[0], logits[0]);
  };
  Group one = make_group(*dir_, 1, 0);
  const auto ref = propose(one);
  EXPECT_EQ(ref.first.size(), 5u);
  Group two = make_group(*dir_, 2, 18520);
  const auto tp2 = propose(two);
  EXPECT_EQ(tp2.first, ref.first);
  expect_close(tp2.second, ref.second, one.models[0]->vocab_size(), "draft logits TP=2 vs TP=1");
}

TEST_F(TensorParallel, EachRankBindsItsShare) {
  Group one = make_group(*dir_, 1, 0);
  const size_t total = one.models[0]->load_report().weight_bytes;
  size_t prev = total;
  int port = 18530;
  for (int n : {2, 4, 8}) {
    Group g = make_group(*dir_, n, port);
    port += 4;
    ASSERT_TRUE(g.models[0]);
    size_t sum = 0, worst = 0;
    for (int r = 0; r < n; ++r) {
      const LoadReport& rep = g.models[r]->load_report();
      sum += rep.weight_bytes;
      worst = std::max(worst, rep.weight_bytes);
      EXPECT_GT(rep.other_rank_tensors, 0) << "rank " << r;
    }
    std::printf("[ TP=%d ] weights per rank: %.2f MiB (TP=1: %.2f MiB; sum over ranks %.2f MiB)\n", n,
                worst / 1048576.0, total / 1048576.0, sum / 1048576.0);
    EXPECT_LT(worst, prev) << "TP=" << n << " should bind less per rank than TP=" << n / 2;
    EXPECT_GE(sum, total);  // replicated parts (shared expert, wq_a, wkv, compressors, mHC) on every rank
    prev = worst;
  }
}

// Validation runs before any collective: a communicator that only knows its size is enough.
struct SizeOnlyComm : Comm {
  explicit SizeOnlyComm(int n) : n_(n) {}
  int rank() const override { return 0; }
  int size() const override { return n_; }
  std::string path() const override { return "size-only"; }
  Status all_reduce_sum(void*, size_t, CommDtype, CommStream) override { return Status(StatusCode::kInternal, "unused"); }
  Status all_gather(const void*, size_t, void*, CommStream) override { return Status(StatusCode::kInternal, "unused"); }
  Status broadcast(void*, size_t, int, CommStream) override { return Status(StatusCode::kInternal, "unused"); }
  Status broadcast(std::vector<uint8_t>&, int) override { return Status(StatusCode::kInternal, "unused"); }
  Status barrier(std::chrono::milliseconds) override { return Status(StatusCode::kInternal, "unused"); }
  std::string failure() const override { return ""; }
  void fail(const std::string&) override {}
  int n_;
};

TEST_F(TensorParallel, ShapesThatDoNotShardAreRefused) {
  auto none = DsV4Model::load(*dir_, options(0, 2, nullptr));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("communicator"), std::string::npos) << none.status().message();
  // tp8 has 8 heads: 3 ranks cannot split them.
  SizeOnlyComm three(3);
  auto m = DsV4Model::load(*dir_, options(0, 3, &three));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("num_attention_heads"), std::string::npos) << m.status().message();
  // The default preset's 2 output groups do not split over 4 ranks.
  const std::string def = make_tiny("default");
  SizeOnlyComm four(4);
  auto d = DsV4Model::load(def, options(0, 4, &four));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("o_groups"), std::string::npos) << d.status().message();
  std::error_code ec;
  fs::remove_all(def, ec);
}

}  // namespace
}  // namespace tandem

// The CPU communicator (engine/parallel/zmq_comm.h): collectives in rank order, start-up that
// names a missing rank or a mismatched fingerprint, and a silent peer failing the group.
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "common/numeric.h"
#include "engine/parallel/zmq_comm.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

ZmqCommOptions opts(int rank, int size, int port) {
  ZmqCommOptions o;
  o.rank = rank;
  o.size = size;
  o.master_port = port;
  o.connect_timeout_s = 20;
  o.fingerprint = {{"build.commit", "abc"}, {"checkpoint.config", "123"}};
  return o;
}

std::vector<std::unique_ptr<Comm>> group(int n, int port) {
  std::vector<std::unique_ptr<Comm>> c(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      auto x = create_zmq_comm(opts(r, n, port));
      ASSERT_TRUE(x.ok()) << x.status().to_string();
      c[r] = std::move(*x);
    });
  for (auto& t : ts) t.join();
  return c;
}

void on_all(int n, const std::function<void(int)>& f) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back(f, r);
  for (auto& t : ts) t.join();
}

TEST(ZmqComm, CollectivesInRankOrder) {
  const int n = 3;
  auto c = group(n, 18560);
  ASSERT_TRUE(c[2]);
  std::vector<std::vector<float>> red(n);
  std::vector<std::vector<int32_t>> gat(n);
  std::vector<std::vector<uint8_t>> bc(n);
  on_all(n, [&](int r) {
    // 1e8 + 1 - 1e8 in rank order is 0 in float; any other order gives a different answer.
    red[r] = {r == 0 ? 1e8f : (r == 1 ? 1.0f : -1e8f), static_cast<float>(r)};
    ASSERT_TRUE(c[r]->all_reduce_sum(red[r].data(), 2).ok());
    int32_t mine[2] = {r, 10 * r};
    gat[r].resize(2 * n);
    ASSERT_TRUE(c[r]->all_gather(mine, sizeof mine, gat[r].data(), nullptr).ok());
    bc[r] = r == 1 ? std::vector<uint8_t>{7, 8, 9} : std::vector<uint8_t>{};
    ASSERT_TRUE(c[r]->broadcast(bc[r], 1).ok());
    ASSERT_TRUE(c[r]->barrier(std::chrono::seconds(5)).ok());
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(red[r][0], (1e8f + 1.0f) - 1e8f) << r;
    EXPECT_EQ(red[r][1], 3.0f) << r;
    EXPECT_EQ(gat[r], (std::vector<int32_t>{0, 0, 1, 10, 2, 20})) << r;
    EXPECT_EQ(bc[r], (std::vector<uint8_t>{7, 8, 9})) << r;
  }
}

// The data plane's bf16 path: every rank's bf16 elements are widened to fp32, summed in rank order
// (rank 0 first) and rounded to bf16 once; every rank gets the same bits. Element 0 cancels only in
// rank order (2^24 + 1 rounds back to 2^24 in fp32); element 1 needs the single rounding (1 +
// 2^-8 + 2^-8 is 1 + 2^-7 in fp32, but 1 after two bf16 roundings); elements 2 and 3 carry inf
// and NaN through; the rest are random.
TEST(ZmqComm, Bf16AllReduceSumsWidenedInRankOrderAndRoundsOnce) {
  const int n = 3;
  const size_t count = 4096;
  auto c = group(n, 18640);
  ASSERT_TRUE(c[2]);
  std::vector<std::vector<uint16_t>> in(n, std::vector<uint16_t>(count));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) in[r][i] = num::f32_to_bf16(u(rng) * std::ldexp(1.0f, static_cast<int>(i % 7) - 3));
  const float e0[3] = {16777216.0f, 1.0f, -16777216.0f}, e1[3] = {1.0f, 0.00390625f, 0.00390625f};
  const float e2[3] = {1.0f, INFINITY, 2.0f}, e3[3] = {1.0f, 2.0f, NAN};
  for (int r = 0; r < n; ++r) {
    in[r][0] = num::f32_to_bf16(e0[r]);
    in[r][1] = num::f32_to_bf16(e1[r]);
    in[r][2] = num::f32_to_bf16(e2[r]);
    in[r][3] = num::f32_to_bf16(e3[r]);
  }
  std::vector<uint16_t> want(count);
  for (size_t i = 0; i < count; ++i) {
    float acc = num::bf16_to_f32(in[0][i]);
    for (int r = 1; r < n; ++r) acc += num::bf16_to_f32(in[r][i]);
    want[i] = num::f32_to_bf16(acc);
  }
  ASSERT_EQ(num::bf16_to_f32(want[0]), 0.0f);
  ASSERT_EQ(num::bf16_to_f32(want[1]), 1.0078125f);
  std::vector<std::vector<uint16_t>> got = in;
  on_all(n, [&](int r) {
    DataComm& data = *c[r];
    Status st = data.all_reduce_sum(got[r].data(), count, CommDtype::kBf16, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
  });
  EXPECT_EQ(c[0]->path(), "zmq-rank-order");
  for (int r = 0; r < n; ++r) {
    size_t bad = 0, first = count;
    for (size_t i = 0; i < count; ++i)
      if (got[r][i] != want[i] && !bad++) first = i;
    EXPECT_EQ(bad, 0u) << "rank " << r << ": " << bad << " elements differ, first at " << first << ": got 0x"
                       << std::hex << (first < count ? got[r][first] : 0) << " want 0x"
                       << (first < count ? want[first] : 0);
    EXPECT_TRUE(std::isinf(num::bf16_to_f32(got[r][2]))) << r;
    EXPECT_TRUE(std::isnan(num::bf16_to_f32(got[r][3]))) << r;
  }
}

// A barrier's ranks reach rank 0 in any order (here the last rank first): TP=4 start-up.
TEST(ZmqComm, BarrierTakesRanksInAnyOrder) {
  const int n = 4;
  auto c = group(n, 18576);
  ASSERT_TRUE(c[3]);
  std::vector<Status> st(n);
  on_all(n, [&](int r) {
    if (r > 0) std::this_thread::sleep_for(std::chrono::milliseconds(60 * (n - r)));
    st[r] = c[r]->barrier(std::chrono::seconds(5));
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << r << ": " << st[r].message();
}

TEST(ZmqComm, MismatchedFingerprintIsRefusedNamingTheKey) {
  Status head, worker;
  std::thread t0([&] { head = create_zmq_comm(opts(0, 2, 18564)).status(); });
  std::thread t1([&] {
    ZmqCommOptions o = opts(1, 2, 18564);
    o.fingerprint[1].second = "456";
    worker = create_zmq_comm(o).status();
  });
  t0.join();
  t1.join();
  ASSERT_FALSE(head.ok());
  EXPECT_NE(head.message().find("rank 1 has checkpoint.config = 456 where rank 0 has 123"), std::string::npos)
      << head.message();
  ASSERT_FALSE(worker.ok());
  EXPECT_NE(worker.message().find("checkpoint.config"), std::string::npos) << worker.message();
}

TEST(ZmqComm, MissingRankTimesOutNamingIt) {
  ZmqCommOptions o = opts(0, 3, 18568);
  o.connect_timeout_s = 1.0;
  o.rank_hosts = {"this node", "this node", "node 1"};
  Status rank1;
  std::thread t1([&] {
    ZmqCommOptions w = opts(1, 3, 18568);
    w.connect_timeout_s = 1.0;
    rank1 = create_zmq_comm(w).status();
  });
  auto head = create_zmq_comm(o);
  t1.join();
  ASSERT_FALSE(head.ok());
  EXPECT_NE(head.status().message().find("rank 2 (node 1) did not connect"), std::string::npos)
      << head.status().message();
  EXPECT_EQ(head.status().message().find("rank 1"), std::string::npos) << head.status().message();
}

TEST(ZmqComm, SilentPeerFailsTheGroupWithinFiveSeconds) {
  auto c = group(2, 18572);
  ASSERT_TRUE(c[1]);
  c[1].reset();  // rank 1 vanishes (its heartbeats stop)
  const auto t0 = Clock::now();
  float x = 1;
  Status st = c[0]->all_reduce_sum(&x, 1);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  EXPECT_LT(waited, 5.0);
  EXPECT_FALSE(c[0]->failure().empty());
  // Failed for good: the next call fails at once.
  EXPECT_FALSE(c[0]->barrier(std::chrono::seconds(10)).ok());
}

}  // namespace
}  // namespace tandem

// The runtime audit: its JSON carries the contract's fields, and it fails closed: an op class
// without a kernel, an emulated path, an unreadable/empty manifest and every manifest mismatch.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/build_info.h"
#include "server/runtime_audit.h"

namespace tandem::server {
namespace {

ModelInfo cpu_info() {
  ModelInfo info;
  info.device = "cpu";
  info.kv_cache_dtype = "nvfp4";
  DeviceFacts f;
  f.device = "cpu";
  f.name = "test CPU";
  for (const auto& op : audit_op_classes()) f.kernels.push_back({op, "cpu-reference"});
  info.ranks.push_back(f);
  return info;
}

ServeOptions opts() {
  ServeOptions o;
  o.model = "echo:";
  o.engine.speculative.method = "dspark";
  o.engine.speculative.num_speculative_tokens = 5;
  return o;
}

TEST(Audit, ReportsTheContract) {
  ModelInfo info = cpu_info();
  nlohmann::json a = build_runtime_audit(opts(), &info);
  EXPECT_EQ(a["tandem"]["version"], build_info().version);
  EXPECT_FALSE(a["tandem"]["commit"].get<std::string>().empty());
  EXPECT_TRUE(a["tandem"].contains("cxx_flags"));
  EXPECT_TRUE(a["tandem"].contains("cuda_architectures"));
  EXPECT_FALSE(a["cuda"]["status"].get<std::string>().empty());  // says why there is no GPU, never throws
  EXPECT_EQ(a["kv_cache_dtype"], "nvfp4");
  EXPECT_EQ(a["speculative"]["method"], "dspark");
  EXPECT_EQ(a["speculative"]["num_speculative_tokens"], 5);
  ASSERT_EQ(a["ranks"].size(), 1u);
  EXPECT_EQ(a["ranks"][0]["kernels"]["sparse_attention"], "cpu-reference");
  EXPECT_EQ(a["identity_digest"].get<std::string>().rfind("sha256:", 0), 0u);
  EXPECT_TRUE(finish_audit(a, nullptr)) << a.dump(2);
  EXPECT_EQ(a["pass"], true);
}

// A tensor-parallel GPU rank reports how its collectives travel; one rank reports none.
TEST(Audit, ReportsTheCollectivesOfAGpuRank) {
  ModelInfo info = cpu_info();
  nlohmann::json a = build_runtime_audit(opts(), &info);
  EXPECT_FALSE(a["ranks"][0].contains("collectives"));
  DeviceFacts& f = info.ranks[0];
  f.device = "cuda:0";
  f.collectives.topology = "2 ranks on 1 host; GPUs: 0000:18:00.0 NVIDIA H200, 0000:2a:00.0 NVIDIA H200";
  f.collectives.routes = {"all_reduce <= 1 MiB: peer-oneshot", "all_reduce: nccl"};
  f.collectives.unavailable = {"nccl-symmetric: test"};
  a = build_runtime_audit(opts(), &info);
  ASSERT_TRUE(a["ranks"][0].contains("collectives")) << a.dump(2);
  EXPECT_EQ(a["ranks"][0]["collectives"]["routes"][0], "all_reduce <= 1 MiB: peer-oneshot");
  EXPECT_EQ(a["ranks"][0]["collectives"]["unavailable"][0], "nccl-symmetric: test");
  EXPECT_EQ(a["ranks"][0]["collectives"]["topology"], f.collectives.topology);
}

TEST(Audit, IdentityDigestFollowsTheBuildAndCheckpointOnly) {
  ModelInfo info = cpu_info();
  ServeOptions o = opts();
  auto a = build_runtime_audit(o, &info);
  o.engine.max_num_seqs = 3;  // configuration is not identity
  EXPECT_EQ(build_runtime_audit(o, &info)["identity_digest"], a["identity_digest"]);
}

TEST(Audit, MissingOrEmulatedKernelFails) {
  ModelInfo info = cpu_info();
  info.ranks[0].kernels.pop_back();
  auto a = build_runtime_audit(opts(), &info);
  EXPECT_FALSE(finish_audit(a, nullptr));
  ASSERT_EQ(a["problems"].size(), 1u);
  EXPECT_NE(a["problems"][0].get<std::string>().find(audit_op_classes().back()), std::string::npos);

  info = cpu_info();
  info.ranks[0].kernels[0].path = "cuda:emulated-fp8";
  a = build_runtime_audit(opts(), &info);
  EXPECT_FALSE(finish_audit(a, nullptr));
  EXPECT_NE(a["problems"].dump().find("not native"), std::string::npos);

  ServeOptions o = opts();
  o.engine.device = "cuda";  // asked for a GPU, runs on the CPU
  info = cpu_info();
  a = build_runtime_audit(o, &info);
  EXPECT_FALSE(finish_audit(a, nullptr));
}

TEST(Audit, ManifestMismatchesAreEachNamed) {
  ModelInfo info = cpu_info();
  auto a = build_runtime_audit(opts(), &info);
  nlohmann::json m = {{"kv_cache_dtype", "fp8"},
                      {"speculative", {{"method", "dspark"}, {"num_speculative_tokens", 3}}},
                      {"ranks", {{"0", {{"compute_capability", "12.1"}}}}},
                      {"no_such_field", 1}};
  // Arrays are addressed by index in paths; the nested "0" above is such an index.
  auto mism = compare_audit(a, m);
  ASSERT_EQ(mism.size(), 4u);
  std::string all;
  for (const auto& x : mism) all += x + "\n";
  EXPECT_NE(all.find("kv_cache_dtype: manifest \"fp8\", runtime \"nvfp4\""), std::string::npos) << all;
  EXPECT_NE(all.find("speculative.num_speculative_tokens"), std::string::npos) << all;
  EXPECT_NE(all.find("ranks.0.compute_capability"), std::string::npos) << all;
  EXPECT_NE(all.find("no_such_field: manifest 1, absent at runtime"), std::string::npos) << all;
  EXPECT_FALSE(finish_audit(a, &m));
  EXPECT_EQ(a["mismatches"].size(), 4u);

  nlohmann::json good = {{"kv_cache_dtype", "nvfp4"}, {"speculative", {{"method", "dspark"}}},
                         {"tandem", {{"version", build_info().version}}}};
  auto b = build_runtime_audit(opts(), &info);
  EXPECT_TRUE(finish_audit(b, &good)) << b["mismatches"].dump();
}

TEST(Audit, ManifestFileFailsClosed) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("tandem-audit-" + std::to_string(getpid()))).string();
  fs::create_directories(dir);
  EXPECT_FALSE(load_audit_manifest(dir + "/absent.json").ok());
  std::ofstream(dir + "/bad.json") << "{\"kv_cache_dtype\": ";
  EXPECT_FALSE(load_audit_manifest(dir + "/bad.json").ok());
  std::ofstream(dir + "/empty.json") << "{}";
  EXPECT_FALSE(load_audit_manifest(dir + "/empty.json").ok());
  std::ofstream(dir + "/array.json") << "[1]";
  EXPECT_FALSE(load_audit_manifest(dir + "/array.json").ok());
  std::ofstream(dir + "/ok.json") << "{\"kv_cache_dtype\": \"fp8\"}";
  EXPECT_TRUE(load_audit_manifest(dir + "/ok.json").ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::server

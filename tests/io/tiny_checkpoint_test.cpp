// make-tiny and check: every preset passes check, output is byte-identical for a seed, weights
// have the documented conditioning, and each kind of corruption is reported by name.
#include "io/tiny_checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/numeric.h"
#include "io/catalog.h"
#include "io/checkpoint_check.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "text/bpe_trainer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path scratch(const std::string& tag) {
  fs::path p = fs::temp_directory_path() / ("tandem_tiny_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

class TinyCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = new std::string(train_tiny_tokenizer_json(0));
    base_ = new fs::path(scratch("base"));
    TinyCheckpointOptions o;
    o.write_manifest = true;
    o.revision = "tiny-default-0";
    Status st = write_tiny_checkpoint(base_->string(), o, *tokenizer_);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  static void TearDownTestSuite() {
    fs::remove_all(*base_);
    delete base_;
    delete tokenizer_;
  }
  // A private copy of the default checkpoint to corrupt.
  fs::path copy(const std::string& tag) {
    fs::path p = scratch(tag);
    fs::copy(*base_, p, fs::copy_options::recursive);
    return p;
  }
  static std::string* tokenizer_;
  static fs::path* base_;
};
std::string* TinyCheckpointTest::tokenizer_ = nullptr;
fs::path* TinyCheckpointTest::base_ = nullptr;

// Rewrites one shard through `edit`, which may drop, add or change tensors.
void rewrite_shard(const fs::path& path, const std::function<void(std::vector<TensorData>&)>& edit) {
  std::vector<TensorData> ts;
  {
    auto f = SafetensorsFile::open(path.string());
    ASSERT_TRUE(f.ok()) << f.status().message();
    for (const auto& v : (*f)->tensors()) {
      TensorData t;
      t.name = v.name;
      t.dtype = v.dtype;
      t.shape = v.shape;
      t.bytes.assign(v.data, v.data + v.nbytes);
      ts.push_back(std::move(t));
    }
  }
  edit(ts);
  std::vector<const TensorData*> ptrs;
  for (const auto& t : ts) ptrs.push_back(&t);
  ASSERT_TRUE(write_safetensors(path.string(), ptrs, {{"format", "pt"}}).ok());
}

bool has_problem(const CheckReport& r, const std::string& a, const std::string& b = "") {
  for (const auto& p : r.problems) {
    if (p.find(a) != std::string::npos && p.find(b) != std::string::npos) return true;
  }
  return false;
}

std::string problems(const CheckReport& r) {
  std::string s;
  for (const auto& p : r.problems) s += "  " + p + "\n";
  return s;
}

const char* kShard1 = "model-00001-of-00002.safetensors";
const char* kShard2 = "model-00002-of-00002.safetensors";

TEST_F(TinyCheckpointTest, DefaultPassesCheckWithManifestAndRevision) {
  CheckOptions o;
  o.manifest_path = (*base_ / "SHA256SUMS").string();
  o.revision = "tiny-default-0";
  CheckReport r = check_checkpoint(base_->string(), o);
  EXPECT_TRUE(r.ok()) << problems(r);
  EXPECT_EQ(r.shards, 2u);
  EXPECT_EQ(r.shards_ok, 2u);
  EXPECT_EQ(r.found_tensors, r.catalog_tensors);
  EXPECT_EQ(r.found_bytes, r.catalog_bytes);
  EXPECT_EQ(r.hashed_files, 9);  // 6 json + 2 shards + REVISION
  EXPECT_EQ(r.config.num_draft_stages, 3);
  EXPECT_EQ(r.config.draft_kind, DraftKind::kDSpark);
}

TEST_F(TinyCheckpointTest, ConfigMatchesPresetAndTokenizer) {
  auto c = load_model_config((*base_ / "config.json").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto vocab = tiny_vocab_from_tokenizer_json(*tokenizer_);
  ASSERT_TRUE(vocab.ok());
  EXPECT_EQ(c->vocab_size, vocab->vocab_size);
  EXPECT_EQ(c->vocab_size, kTinyBaseVocabSize + kNumDeepSeekExtraAddedTokens);
  EXPECT_EQ(c->dspark_noise_token_id, kTinyBaseVocabSize + kDspNoiseTokenOffset);
  EXPECT_EQ(c->hidden_size, 256);
  EXPECT_EQ(c->compress_ratios, (std::vector<int>{0, 4, 128, 4, 128, 4, 0, 0, 0}));
  EXPECT_EQ(c->dspark_target_layer_ids, (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(c->num_hash_layers, 2);
  EXPECT_EQ(c->dspark_markov_rank, 32);
  EXPECT_EQ(c->dspark_block_size, 5);
  EXPECT_EQ(c->index_topk, 16);
  // Official file set.
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json",
                        "tokenizer_config.json", "model.safetensors.index.json", kShard1, kShard2}) {
    EXPECT_TRUE(fs::exists(*base_ / f)) << f;
  }
  auto index = nlohmann::json::parse(read_all(*base_ / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(),
            build_catalog(*c)->total_bytes());
  auto gen = nlohmann::json::parse(read_all(*base_ / "generation_config.json"));
  EXPECT_EQ(gen["eos_token_id"], 1);
  // inference/config.json under the reference's ModelArgs names.
  auto inf = nlohmann::json::parse(read_all(*base_ / "inference" / "config.json"));
  EXPECT_EQ(inf["dim"], 256);
  EXPECT_EQ(inf["n_layers"], 6);
  EXPECT_EQ(inf["n_mtp_layers"], 3);
  EXPECT_EQ(inf["n_activated_experts"], 2);
  EXPECT_EQ(inf["rope_head_dim"], 64);
  EXPECT_EQ(inf["window_size"], 128);
  EXPECT_EQ(inf["original_seq_len"], 65536);
  EXPECT_EQ(inf["dtype"], "fp8");
  EXPECT_EQ(inf["expert_dtype"], "fp4");
  EXPECT_EQ(inf["dspark_noise_token_id"], c->dspark_noise_token_id);
  EXPECT_EQ(inf["compress_ratios"].size(), 9u);
  EXPECT_FALSE(inf.contains("hidden_size"));
}

TEST_F(TinyCheckpointTest, WeightsAreWellConditioned) {
  auto ck = Checkpoint::open(base_->string());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  auto c = load_model_config((*base_ / "config.json").string());
  ASSERT_TRUE(c.ok());
  auto get = [&](const std::string& n) {
    auto t = (*ck)->get(n);
    EXPECT_TRUE(t.ok()) << n;
    return *t;
  };
  auto rms = [](const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    return std::sqrt(s / v.size());
  };
  // FP8 linear: 1/sqrt(in) after dequantization; scale tensor one byte per 128x128 tile.
  const TensorView* wq = get("layers.1.attn.wq_a.weight");
  const TensorView* wq_s = get("layers.1.attn.wq_a.scale");
  ASSERT_EQ(wq->dtype, DType::kF8E4M3);
  ASSERT_EQ(wq_s->shape, (std::vector<int64_t>{1, 2}));
  auto w = num::dequantize_fp8_block(wq->data, wq_s->data, 128, 256);
  EXPECT_NEAR(rms(w), 1.0 / 16.0, 0.1 / 16.0);
  // Residual-branch output is scaled down.
  const TensorView* wo = get("layers.1.attn.wo_b.weight");
  auto wob = num::dequantize_fp8_block(wo->data, get("layers.1.attn.wo_b.scale")->data, 256, 256);
  EXPECT_NEAR(rms(wob), 0.2 / 16.0, 0.03 / 16.0);
  // MXFP4 expert: e2m1 codes with per-32 scales, RMS ~ 1/sqrt(D) (FP4 rounding is coarse).
  const TensorView* e1 = get("layers.2.ffn.experts.3.w1.weight");
  const TensorView* e1s = get("layers.2.ffn.experts.3.w1.scale");
  ASSERT_EQ(e1->dtype, DType::kI8);
  ASSERT_EQ(e1->shape, (std::vector<int64_t>{128, 128}));
  ASSERT_EQ(e1s->shape, (std::vector<int64_t>{128, 8}));
  auto ew = num::dequantize_mxfp4(e1->data, e1s->data, 128, 256);
  EXPECT_NEAR(rms(ew), 1.0 / 16.0, 0.2 / 16.0);
  // Norms around 1.
  for (uint16_t h : get("layers.0.attn_norm.weight")->as<uint16_t>()) {
    float x = num::bf16_to_f32(h);
    EXPECT_GE(x, 0.89f);
    EXPECT_LE(x, 1.11f);
  }
  // Router: bias decides top-k with margins >= 0.25; hash layers: distinct experts per row.
  for (int l = c->num_hash_layers; l < c->num_hidden_layers + c->num_draft_stages; ++l) {
    std::string p = l < c->num_hidden_layers ? "layers." + std::to_string(l) + "."
                                             : "mtp." + std::to_string(l - c->num_hidden_layers) + ".";
    auto b = get(p + "ffn.gate.bias")->as<float>();
    std::vector<float> sorted(b.begin(), b.end());
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 1; i < sorted.size(); ++i) EXPECT_NEAR(sorted[i] - sorted[i - 1], 0.25f, 1e-6f) << p;
    EXPECT_EQ((*ck)->find(p + "ffn.gate.tid2eid"), nullptr);
  }
  for (int l = 0; l < c->num_hash_layers; ++l) {
    const TensorView* t = get("layers." + std::to_string(l) + ".ffn.gate.tid2eid");
    ASSERT_EQ(t->dtype, DType::kI64);
    ASSERT_EQ(t->shape, (std::vector<int64_t>{c->vocab_size, 2}));
    auto ids = t->as<int64_t>();
    std::set<int64_t> used;
    for (int64_t r = 0; r < c->vocab_size; ++r) {
      EXPECT_NE(ids[r * 2], ids[r * 2 + 1]);
      for (int k = 0; k < 2; ++k) {
        ASSERT_GE(ids[r * 2 + k], 0);
        ASSERT_LT(ids[r * 2 + k], c->n_routed_experts);
        used.insert(ids[r * 2 + k]);
      }
    }
    EXPECT_EQ(used.size(), static_cast<size_t>(c->n_routed_experts));
    EXPECT_EQ((*ck)->find("layers." + std::to_string(l) + ".ffn.gate.bias"), nullptr);
  }
  // Gate weights small: sqrtsoftplus scores spread far less than the bias steps.
  auto gw = get("layers.3.ffn.gate.weight")->as<uint16_t>();
  float amax = 0;
  for (uint16_t h : gw) amax = std::max(amax, std::fabs(num::bf16_to_f32(h)));
  EXPECT_LT(amax * 16.0f, 0.2f);  // |z| <= amax * sum|x| ~ amax * D for unit x; tight enough
  // DSpark heads exist with the right shapes.
  EXPECT_EQ(get("mtp.0.main_proj.weight")->shape, (std::vector<int64_t>{256, 768}));
  EXPECT_EQ(get("mtp.0.main_proj.scale")->shape, (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(get("mtp.2.markov_head.markov_w1.weight")->shape, (std::vector<int64_t>{3280, 32}));
  EXPECT_EQ(get("mtp.2.confidence_head.proj.weight")->shape, (std::vector<int64_t>{1, 288}));
}

TEST_F(TinyCheckpointTest, SameSeedIsByteIdenticalOtherSeedDiffers) {
  fs::path again = scratch("again");
  TinyCheckpointOptions o;
  o.write_manifest = true;
  o.revision = "tiny-default-0";
  ASSERT_TRUE(write_tiny_checkpoint(again.string(), o, train_tiny_tokenizer_json(0)).ok());
  for (const auto& entry : fs::directory_iterator(*base_)) {
    const auto name = entry.path().filename();
    EXPECT_EQ(sha256_hex(read_all(entry.path())), sha256_hex(read_all(again / name))) << name;
  }
  fs::path other = scratch("other");
  o.seed = 1;
  ASSERT_TRUE(write_tiny_checkpoint(other.string(), o, *tokenizer_).ok());
  EXPECT_NE(read_all(*base_ / kShard1), read_all(other / kShard1));
  EXPECT_TRUE(check_checkpoint(other.string(), {}).ok());
  fs::remove_all(again);
  fs::remove_all(other);
}

TEST_F(TinyCheckpointTest, EveryPresetPassesCheck) {
  for (const std::string& preset : tiny_preset_names()) {
    fs::path dir = scratch("preset_" + preset);
    TinyCheckpointOptions o;
    o.preset = preset;
    o.num_shards = 3;
    ASSERT_TRUE(write_tiny_checkpoint(dir.string(), o, *tokenizer_).ok()) << preset;
    CheckReport r = check_checkpoint(dir.string(), {});
    EXPECT_TRUE(r.ok()) << preset << "\n" << problems(r);
    EXPECT_EQ(r.shards, 3u);
    if (preset == "preview") {
      EXPECT_EQ(r.config.draft_kind, DraftKind::kMtp);
      EXPECT_EQ(r.config.num_draft_stages, 1);
      auto j = nlohmann::json::parse(read_all(dir / "config.json"));
      EXPECT_FALSE(j.contains("dspark_block_size"));
      EXPECT_FALSE(j.contains("expert_dtype"));
    } else {
      EXPECT_EQ(r.config.draft_kind, DraftKind::kDSpark);
      EXPECT_EQ(r.config.num_draft_stages, 3);
    }
    if (preset == "small") {
      EXPECT_EQ(r.config.hidden_size, 384);
      EXPECT_EQ(r.config.o_groups, 3);
      EXPECT_EQ(r.config.n_routed_experts, 16);
    }
    fs::remove_all(dir);
  }
  EXPECT_FALSE(write_tiny_checkpoint(scratch("bad").string(), {.preset = "huge"}, *tokenizer_).ok());
}

TEST_F(TinyCheckpointTest, TruncatedShard) {
  fs::path d = copy("trunc");
  fs::resize_file(d / kShard2, fs::file_size(d / kShard2) - 100);
  CheckReport r = check_checkpoint(d.string(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has_problem(r, kShard2, "truncated")) << problems(r);
  EXPECT_EQ(r.shards_ok, 1u);
  // The tensors of the broken shard are not re-reported one by one as missing.
  EXPECT_EQ(r.problems.size(), 1u) << problems(r);
  fs::remove_all(d);
}

TEST_F(TinyCheckpointTest, MissingTensor) {
  fs::path d = copy("missing");
  rewrite_shard(d / kShard1, [](std::vector<TensorData>& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(),
                            [](const TensorData& t) { return t.name == "layers.0.attn_norm.weight"; }),
             ts.end());
  });
  CheckReport r = check_checkpoint(d.string(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has_problem(r, "missing tensor 'layers.0.attn_norm.weight'", "BF16 [256]")) << problems(r);
  EXPECT_TRUE(has_problem(r, "index maps tensor 'layers.0.attn_norm.weight'")) << problems(r);
  fs::remove_all(d);
}

TEST_F(TinyCheckpointTest, WrongDtypeAndShape) {
  fs::path d = copy("dtype");
  rewrite_shard(d / kShard1, [](std::vector<TensorData>& ts) {
    for (auto& t : ts) {
      if (t.name == "layers.0.attn_norm.weight") t.dtype = DType::kF16;  // same size
      if (t.name == "layers.0.attn.attn_sink") t.shape = {2, 2};         // same numel
    }
  });
  CheckReport r = check_checkpoint(d.string(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has_problem(r, "'layers.0.attn_norm.weight' is F16 [256], expected BF16 [256]"))
      << problems(r);
  EXPECT_TRUE(has_problem(r, "'layers.0.attn.attn_sink' is F32 [2, 2], expected F32 [4]")) << problems(r);
  EXPECT_EQ(r.problems.size(), 2u) << problems(r);
  fs::remove_all(d);
}

TEST_F(TinyCheckpointTest, ExtraTensor) {
  fs::path d = copy("extra");
  rewrite_shard(d / kShard2, [](std::vector<TensorData>& ts) {
    TensorData t;
    t.name = "layers.0.attn.extra.weight";
    t.dtype = DType::kF32;
    t.shape = {2};
    t.bytes.assign(8, 0);
    ts.push_back(t);
  });
  // Consistent index, so the only problem is the catalog mismatch.
  auto idx = nlohmann::json::parse(read_all(d / "model.safetensors.index.json"));
  idx["weight_map"]["layers.0.attn.extra.weight"] = kShard2;
  idx["metadata"]["total_size"] = idx["metadata"]["total_size"].get<uint64_t>() + 8;
  std::ofstream(d / "model.safetensors.index.json") << idx.dump(2);
  CheckReport r = check_checkpoint(d.string(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has_problem(r, "unexpected tensor 'layers.0.attn.extra.weight'", kShard2)) << problems(r);
  EXPECT_EQ(r.problems.size(), 1u) << problems(r);
  fs::remove_all(d);
}

TEST_F(TinyCheckpointTest, FlippedByteUnderManifest) {
  fs::path d = copy("flip");
  {
    std::fstream f(d / kShard1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);  // inside the data region: still a valid safetensors file
    char c = 0;
    f.read(&c, 1);
    f.seekp(-10, std::ios::end);
    c = static_cast<char>(c ^ 0x01);
    f.write(&c, 1);
  }
  EXPECT_TRUE(check_checkpoint(d.string(), {}).ok());  // structure intact
  CheckOptions o;
  o.manifest_path = (d / "SHA256SUMS").string();
  CheckReport r = check_checkpoint(d.string(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has_problem(r, kShard1, "SHA-256 mismatch")) << problems(r);
  EXPECT_EQ(r.problems.size(), 1u) << problems(r);
  // Malformed manifest lines and uncovered shards are reported too.
  std::ofstream(d / "BAD") << "xyz  config.json\n"
                           << sha256_hex("") << "  ../etc/passwd\n";
  o.manifest_path = (d / "BAD").string();
  r = check_checkpoint(d.string(), o);
  EXPECT_TRUE(has_problem(r, "BAD:1", "malformed")) << problems(r);
  EXPECT_TRUE(has_problem(r, "BAD:2", "not a path inside")) << problems(r);
  EXPECT_TRUE(has_problem(r, kShard2, "not covered by the manifest")) << problems(r);
  fs::remove_all(d);
}

TEST_F(TinyCheckpointTest, RevisionMarker) {
  fs::path d = copy("rev");
  CheckOptions o;
  o.revision = "other";
  CheckReport r = check_checkpoint(d.string(), o);
  EXPECT_TRUE(has_problem(r, "revision mismatch", "'tiny-default-0'")) << problems(r);
  fs::remove(d / "REVISION");
  r = check_checkpoint(d.string(), o);
  EXPECT_TRUE(has_problem(r, "no revision marker")) << problems(r);
  // A Hugging Face cache snapshot directory names its revision.
  fs::path snap = scratch("hf") / "models--x--y" / "snapshots" / "7872f01b";
  fs::create_directories(snap.parent_path());
  fs::rename(d, snap);
  o.revision = "7872f01b";
  r = check_checkpoint(snap.string(), o);
  EXPECT_TRUE(r.ok()) << problems(r);
  EXPECT_EQ(r.revision_found, "7872f01b");
  fs::remove_all(scratch("hf"));
}

TEST_F(TinyCheckpointTest, TokenizerLargerThanVocab) {
  fs::path d = copy("tok");
  auto c = nlohmann::json::parse(read_all(d / "config.json"));
  c["vocab_size"] = 3000;  // the tokenizer has 3,280 ids (embed shape mismatches too)
  c["dspark_noise_token_id"] = 2;
  std::ofstream(d / "config.json") << c.dump(2);
  CheckReport r = check_checkpoint(d.string(), {});
  EXPECT_TRUE(has_problem(r, "tokenizer.json: token id 3279 >= config vocab_size 3000")) << problems(r);
  EXPECT_TRUE(has_problem(r, "'embed.weight' is BF16 [3280, 256], expected BF16 [3000, 256]")) << problems(r);
  fs::remove(d / "tokenizer.json");
  r = check_checkpoint(d.string(), {});
  EXPECT_TRUE(has_problem(r, "tokenizer.json missing")) << problems(r);
  fs::remove_all(d);
}

TEST_F(TinyCheckpointTest, SingleFileCheckpoint) {
  fs::path d = copy("single");
  std::vector<TensorData> all;
  for (const char* shard : {kShard1, kShard2}) {
    auto f = SafetensorsFile::open((d / shard).string());
    ASSERT_TRUE(f.ok());
    for (const auto& v : (*f)->tensors()) {
      all.push_back({v.name, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes)});
    }
  }
  std::vector<const TensorData*> ptrs;
  for (const auto& t : all) ptrs.push_back(&t);
  ASSERT_TRUE(write_safetensors((d / "model.safetensors").string(), ptrs).ok());
  fs::remove(d / kShard1);
  fs::remove(d / kShard2);
  fs::remove(d / "model.safetensors.index.json");
  CheckReport r = check_checkpoint(d.string(), {});
  EXPECT_TRUE(r.ok()) << problems(r);
  EXPECT_EQ(r.shards, 1u);
  EXPECT_EQ(r.found_tensors, r.catalog_tensors);
  fs::remove_all(d);
}

TEST_F(TinyCheckpointTest, MissingShardAndBadConfig) {
  fs::path d = copy("noshard");
  fs::remove(d / kShard2);
  std::ofstream(d / "config.json") << "{\"model_type\": \"deepseek_v4\"}";
  CheckReport r = check_checkpoint(d.string(), {});
  EXPECT_TRUE(has_problem(r, kShard2, "missing")) << problems(r);
  EXPECT_TRUE(has_problem(r, "config.json", "missing required key")) << problems(r);
  fs::remove_all(d);
  CheckReport none = check_checkpoint("/nonexistent/dir", {});
  EXPECT_TRUE(has_problem(none, "not a directory"));
}

// ---- the CLI, as users run it ----

struct CliRun {
  int rc = -1;
  std::string out;
};
CliRun run_cli(const std::string& args) {
  CliRun r;
  std::string cmd = std::string(TANDEM_BINARY) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(CheckCli, CatalogNumbersForOfficialConfigs) {
  const std::string data = std::string(TANDEM_SOURCE_DIR) + "/tests/io/data/";
  CliRun a = run_cli("check --catalog --config " + data + "deepseek-v4-flash-0731.config.json");
  EXPECT_EQ(a.rc, 0) << a.out;
  EXPECT_NE(a.out.find("72,317 tensors, 166,878,536,440 bytes"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("I8            35,328      148,176,371,712"), std::string::npos) << a.out;
  CliRun b = run_cli("check --catalog --config " + data + "deepseek-v4-flash-preview.config.json");
  EXPECT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("69,187 tensors, 159,609,485,896 bytes"), std::string::npos) << b.out;
  CliRun c = run_cli("check --catalog --config /nonexistent.json");
  EXPECT_NE(c.rc, 0);
  EXPECT_NE(c.out.find("/nonexistent.json"), std::string::npos) << c.out;
}

TEST(CheckCli, MakeTinyThenCheckThenCorrupt) {
  fs::path d = scratch("cli");
  CliRun m = run_cli("make-tiny " + d.string() + " --seed 7 --preset preview --manifest --revision r1");
  ASSERT_EQ(m.rc, 0) << m.out;
  CliRun ok = run_cli("check " + d.string() + " --manifest " + (d / "SHA256SUMS").string() + " --revision r1");
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_NE(ok.out.find("1 MTP draft stages"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("OK"), std::string::npos) << ok.out;
  fs::resize_file(d / kShard1, 1000);
  CliRun bad = run_cli("check " + d.string() + " --manifest " + (d / "SHA256SUMS").string() + " --revision r2");
  EXPECT_EQ(bad.rc, 1) << bad.out;
  EXPECT_NE(bad.out.find("FAILED: 3 problems"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("revision mismatch"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("SHA-256 mismatch"), std::string::npos) << bad.out;
  CliRun preset = run_cli("make-tiny " + d.string() + " --preset nope");
  EXPECT_NE(preset.rc, 0);
  fs::remove_all(d);
}

}  // namespace
}  // namespace tandem

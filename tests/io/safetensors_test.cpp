// safetensors reader/writer: round trips, sharded checkpoints and each header validation rule.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> image(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(i));
  return out;
}

Status validate(const std::string& header, size_t data_bytes) {
  auto bytes = image(header, data_bytes);
  return SafetensorsFile::validate_bytes(bytes, "t.safetensors");
}

std::string tmp_dir(const std::string& tag) {
  fs::path p = fs::temp_directory_path() /
               ("tandem_io_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

TensorData make_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                       uint8_t seed) {
  TensorData t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (auto d : t.shape) n *= d;
  t.bytes.resize(n * dtype_size(dtype));
  for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<uint8_t>(seed + i * 7);
  return t;
}

TEST(DType, NamesRoundTrip) {
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32, DType::kF8E4M3, DType::kF8E8M0,
                  DType::kI8, DType::kI32, DType::kI64, DType::kU8, DType::kBool}) {
    auto p = parse_dtype(dtype_name(d));
    ASSERT_TRUE(p.ok()) << dtype_name(d);
    EXPECT_EQ(*p, d);
  }
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_size(DType::kF8E8M0), 1u);
  EXPECT_FALSE(parse_dtype("F8_E5M2").ok());
  EXPECT_FALSE(parse_dtype("bf16").ok());
}

TEST(SafetensorsValidate, AcceptsMinimalAndEmpty) {
  EXPECT_TRUE(validate("{}", 0).ok());
  EXPECT_TRUE(validate(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8).ok());
  EXPECT_TRUE(validate(R"({"a":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}})", 0).ok());
  EXPECT_TRUE(validate(R"({"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})", 8).ok());
  EXPECT_TRUE(validate(R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[1,2],)"
                       R"("data_offsets":[4,8]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}   )",
                       8)
                  .ok());
}

void expect_error(const std::string& header, size_t data_bytes, const std::string& needle) {
  Status st = validate(header, data_bytes);
  ASSERT_FALSE(st.ok()) << header;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("t.safetensors"), std::string::npos) << st.message();
}

TEST(SafetensorsValidate, RejectsBadHeaders) {
  // Short file and header length bounds.
  std::vector<uint8_t> tiny = {1, 0, 0};
  EXPECT_FALSE(SafetensorsFile::validate_bytes(tiny, "x").ok());
  auto big = image("{}", 0);
  big[5] = 0x7f;  // enormous length
  EXPECT_NE(SafetensorsFile::validate_bytes(big, "x").message().find("limit"), std::string::npos);
  auto past = image("{}", 0);
  past[0] = 40;
  EXPECT_NE(SafetensorsFile::validate_bytes(past, "x").message().find("past the end"),
            std::string::npos);
  expect_error("[1,2]", 0, "JSON object");
  expect_error("{\"a\":", 0, "not valid JSON");
  expect_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               8, "duplicate header key 'a'");
  expect_error(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8, "'w': unknown dtype");
  expect_error(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "non-negative");
  expect_error(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4, "non-negative");
  expect_error(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "needs 12 bytes");
  expect_error(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
               "overflows");
  expect_error(R"({"w":{"dtype":"F32","shape":[2305843009213693952,4],"data_offsets":[0,8]}})", 8,
               "overflows");
  expect_error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "end before begin");
  expect_error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "past the 4 byte");
  expect_error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "data_offsets");
  expect_error(R"({"w":{"dtype":"F32","shape":[2]}})", 8, "data_offsets");
  expect_error(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8, "dtype");
  expect_error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8,
               "unknown field 'x'");
  expect_error(R"({"w":[1]})", 8, "'w': entry is not an object");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               12, "overlap");
  expect_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "gap");
  expect_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8,
               "cover 4 bytes but the data region is 8");
  expect_error(R"({"__metadata__":{"k":1}})", 0, "__metadata__");
  expect_error(R"({"__metadata__":[1]})", 0, "__metadata__");
}

TEST(SafetensorsFile, WriteOpenRoundTrip) {
  std::string dir = tmp_dir("rt");
  TensorData a = make_tensor("a.weight", DType::kBF16, {3}, 1);   // 6 bytes
  TensorData b = make_tensor("b.scale", DType::kF8E8M0, {2, 3}, 2);
  TensorData c = make_tensor("c", DType::kF32, {2, 2}, 3);
  TensorData d = make_tensor("d", DType::kI64, {3, 2}, 4);
  TensorData e = make_tensor("e", DType::kI8, {0}, 5);
  std::string path = dir + "/x.safetensors";
  ASSERT_TRUE(write_safetensors(path, {&a, &b, &c, &d, &e}, {{"format", "pt"}}).ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ((*f)->tensors().size(), 5u);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  for (const TensorData* t : {&a, &b, &c, &d, &e}) {
    const TensorView* v = (*f)->find(t->name);
    ASSERT_NE(v, nullptr) << t->name;
    EXPECT_EQ(v->dtype, t->dtype);
    EXPECT_EQ(v->shape, t->shape);
    ASSERT_EQ(v->nbytes, t->bytes.size());
    EXPECT_EQ(std::memcmp(v->data, t->bytes.data(), v->nbytes), 0);
    // Element-size alignment inside the mapping (the map itself is page aligned).
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data) % dtype_size(v->dtype), 0u) << t->name;
  }
  EXPECT_EQ((*f)->find("d")->as<int64_t>().size(), 6u);
  EXPECT_EQ((*f)->find("nope"), nullptr);
  fs::remove_all(dir);
}

TEST(SafetensorsFile, OpenErrorsNameTheFile) {
  std::string dir = tmp_dir("err");
  auto missing = SafetensorsFile::open(dir + "/missing.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("missing.safetensors"), std::string::npos);

  TensorData a = make_tensor("layers.0.attn.wkv.weight", DType::kF32, {64}, 1);
  std::string path = dir + "/t.safetensors";
  ASSERT_TRUE(write_safetensors(path, {&a}).ok());
  fs::resize_file(path, fs::file_size(path) - 3);
  auto trunc = SafetensorsFile::open(path);
  ASSERT_FALSE(trunc.ok());
  EXPECT_EQ(trunc.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(trunc.status().message().find("t.safetensors"), std::string::npos);
  EXPECT_NE(trunc.status().message().find("layers.0.attn.wkv.weight"), std::string::npos)
      << trunc.status().message();
  fs::remove_all(dir);
}

TEST(Checkpoint, ShardedRoundTripAndIndex) {
  std::string dir = tmp_dir("shard");
  std::vector<TensorData> ts;
  for (int i = 0; i < 7; ++i) {
    ts.push_back(make_tensor("t" + std::to_string(i), i % 2 ? DType::kBF16 : DType::kF32,
                             {i + 1, 4}, static_cast<uint8_t>(i)));
  }
  ASSERT_TRUE(write_sharded_checkpoint(dir, ts, 3).ok());
  EXPECT_TRUE(fs::exists(dir + "/model-00001-of-00003.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/model-00003-of-00003.safetensors"));
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ((*ck)->shards().size(), 3u);
  EXPECT_EQ((*ck)->tensors().size(), 7u);
  EXPECT_EQ((*ck)->weight_map().size(), 7u);
  for (const auto& t : ts) {
    auto v = (*ck)->get(t.name);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ((*v)->shape, t.shape);
    EXPECT_EQ(std::memcmp((*v)->data, t.bytes.data(), t.bytes.size()), 0);
  }
  auto missing = (*ck)->get("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);

  // Index pointing a tensor at the wrong shard.
  {
    std::ifstream in(dir + "/model.safetensors.index.json");
    std::string s((std::istreambuf_iterator<char>(in)), {});
    auto pos = s.find("\"t0\": \"model-00001-of-00003.safetensors\"");
    ASSERT_NE(pos, std::string::npos) << s;
    s.replace(pos, std::strlen("\"t0\": \"model-00001-of-00003.safetensors\""),
              "\"t0\": \"model-00002-of-00003.safetensors\"");
    std::ofstream(dir + "/model.safetensors.index.json") << s;
    auto bad = Checkpoint::open(dir);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("'t0'"), std::string::npos) << bad.status().message();
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, SingleFileAndMissing) {
  std::string dir = tmp_dir("single");
  EXPECT_EQ(Checkpoint::open(dir).status().code(), StatusCode::kNotFound);
  TensorData a = make_tensor("embed.weight", DType::kBF16, {4, 8}, 9);
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", {&a}).ok());
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_TRUE((*ck)->weight_map().empty());
  EXPECT_NE((*ck)->find("embed.weight"), nullptr);
  fs::remove_all(dir);
}

TEST(Checkpoint, IndexCannotEscapeDirectory) {
  std::string dir = tmp_dir("escape");
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"a":"../x.safetensors"}})";
  auto ck = Checkpoint::open(dir);
  ASSERT_FALSE(ck.ok());
  EXPECT_NE(ck.status().message().find("invalid shard file"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem

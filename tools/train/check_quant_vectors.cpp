// Checks src/common/numeric.{h,cpp} against tools/train/quant_vectors.json byte for byte (the
// trainer's Python quantizers wrote the file). Not part of the CMake build: a starting point for a
// gtest in tests/common, and a quick manual check:
//   g++ -std=c++20 -O1 -Isrc tools/train/check_quant_vectors.cpp src/common/numeric.cpp -o /tmp/cqv
//   /tmp/cqv tools/train/quant_vectors.json      -> "274 cases, 0 bad" (exit 0)
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/numeric.h"

using namespace tandem::num;

static std::string hex(const std::vector<uint8_t>& v) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (uint8_t b : v) {
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

int main(int argc, char** argv) {
  std::ifstream f(argc > 1 ? argv[1] : "tools/train/quant_vectors.json");
  auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    std::fprintf(stderr, "cannot parse vectors file\n");
    return 2;
  }
  int bad = 0, n = 0;
  auto in = [](const nlohmann::json& c, const char* k) { return bits_f32(c[k].get<uint32_t>()); };
  for (auto& c : j["f32_to_e4m3"]) {
    ++n;
    if (f32_to_e4m3(in(c, "in")) != c["out"].get<int>()) ++bad, std::printf("e4m3 %08x\n", c["in"].get<uint32_t>());
  }
  for (auto& c : j["f32_to_e2m1"]) {
    ++n;
    if (f32_to_e2m1(in(c, "in")) != c["out"].get<int>()) ++bad, std::printf("e2m1 %08x\n", c["in"].get<uint32_t>());
  }
  for (auto& c : j["f32_to_bf16"]) {
    ++n;
    if (f32_to_bf16(in(c, "in")) != c["out"].get<int>()) ++bad, std::printf("bf16 %08x\n", c["in"].get<uint32_t>());
  }
  for (auto& c : j["ue8m0_scale_exponent"]) {
    ++n;
    if (ue8m0_scale_exponent(in(c, "amax"), c["qmax"].get<float>(), in(c, "floor")) != c["exponent"].get<int>())
      ++bad, std::printf("scale %08x\n", c["amax"].get<uint32_t>());
  }
  {
    auto& c = j["quantize_fp8_block"];
    std::vector<float> w;
    for (auto& x : c["w"]) w.push_back(bits_f32(x.get<uint32_t>()));
    auto r = quantize_fp8_block(w.data(), c["out"], c["in"], c["block"]);
    ++n;
    if (hex(r.data) != c["data"] || hex(r.scale) != c["scale"]) ++bad, std::printf("quantize_fp8_block\n");
  }
  {
    auto& c = j["quantize_mxfp4"];
    std::vector<float> w;
    for (auto& x : c["w"]) w.push_back(bits_f32(x.get<uint32_t>()));
    auto r = quantize_mxfp4(w.data(), c["out"], c["in"]);
    ++n;
    if (hex(r.data) != c["data"] || hex(r.scale) != c["scale"]) ++bad, std::printf("quantize_mxfp4\n");
  }
  std::printf("%d cases, %d bad\n", n, bad);
  return bad != 0;
}

// Grammar-constrained decoding cost: time to compute one token mask (JsonSchemaConstraint::
// allowed_tokens) in typical JSON states, over a real tokenizer's vocabulary (trie walk), and the
// trie build time. Usage: bench_grammar [tokenizer.json] (default data/builtin/tokenizer.json);
// writes bench/results/grammar-<date>.json.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/bench_results.h"
#include "text/json_schema_grammar.h"
#include "text/tokenizer.h"

using namespace tandem;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  std::string path = argc > 1 ? argv[1] : std::string(TANDEM_SOURCE_DIR) + "/data/builtin/tokenizer.json";
  auto tok = Tokenizer::from_file(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "bench_grammar: %s\n", tok.status().message().c_str());
    return 1;
  }
  auto t0 = Clock::now();
  auto trie = json_grammar::TokenTrie::from_tokenizer(**tok);
  double build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  nlohmann::json schema = nlohmann::json::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}},
      "kind":{"enum":["alpha","beta","gamma"]}},"required":["name","age","tags","kind"],"additionalProperties":false})");
  auto g = json_grammar::compile(schema);
  if (!g.ok()) return 1;
  struct Case { const char* name; const char* prefix; };
  const Case cases[] = {
      {"object_start", ""},
      {"after_open_brace", "{"},
      {"in_key", "{\"na"},
      {"after_colon", "{\"name\":"},
      {"in_string_value", "{\"name\":\"Ada Love"},
      {"in_integer", "{\"name\":\"Ada\",\"age\":3"},
      {"in_array", "{\"name\":\"Ada\",\"age\":36,\"tags\":[\"x\","},
      {"in_enum", "{\"name\":\"Ada\",\"age\":36,\"tags\":[],\"kind\":\"ga"},
  };
  int32_t eos = 1;
  std::vector<bool> allowed(static_cast<size_t>((*tok)->vocab_size()));
  nlohmann::json rows = nlohmann::json::array();
  std::printf("vocab %lld, trie nodes %zu, trie build %.1f ms\n", static_cast<long long>((*tok)->vocab_size()),
              trie->node_count(), build_ms);
  std::printf("%-18s %12s %10s\n", "state", "mask_us", "allowed");
  for (const auto& c : cases) {
    json_grammar::JsonSchemaConstraint con(*g, trie, eos);
    // Feed the prefix through the matcher byte by byte (token boundaries do not matter for the mask).
    auto* m = const_cast<json_grammar::Matcher*>(&con.matcher());
    if (!m->advance(c.prefix)) {
      std::fprintf(stderr, "prefix rejected: %s\n", c.prefix);
      return 1;
    }
    int iters = 0;
    auto s = Clock::now();
    double el = 0;
    do {
      con.allowed_tokens(allowed);
      ++iters;
      el = std::chrono::duration<double, std::micro>(Clock::now() - s).count();
    } while (el < 3e5 && iters < 1000);
    size_t n = 0;
    for (bool b : allowed) n += b;
    std::printf("%-18s %12.1f %10zu\n", c.name, el / iters, n);
    rows.push_back({{"state", c.name}, {"mask_us", el / iters}, {"allowed_tokens", n}});
  }
  nlohmann::json out = tandem::bench::run_info();
  out.update({{"bench", "grammar_mask"}, {"tokenizer", path}, {"vocab", (*tok)->vocab_size()},
              {"trie_nodes", trie->node_count()}, {"trie_build_ms", build_ms}, {"threads", 1}, {"rows", rows}});
  tandem::bench::write_result(out, tandem::bench::result_path("grammar"));
  return 0;
}

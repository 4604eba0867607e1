// Developer tool for the tokenizer (not part of the CMake build; see tools/tokenizer/README.md):
//   tok_tool corpus <seed> <out.txt>              write the generated training text
//   tok_tool tiny <seed> <out.json>               write train_tiny_tokenizer_json(seed)
//   tok_tool train <corpus.txt> <vocab> <out.json> train byte-level BPE on a file
//   tok_tool encode <tokenizer.json> <text file>  print ids, one line
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "text/bpe_trainer.h"
#include "text/tokenizer.h"

static std::string slurp(const char* path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

static int spit(const char* path, const std::string& s) {
  std::ofstream f(path, std::ios::binary);
  f << s;
  return f ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string cmd = argv[1];
  auto t0 = std::chrono::steady_clock::now();
  int rc = 2;
  if (cmd == "corpus" && argc == 4) {
    rc = spit(argv[3], tandem::generate_tiny_corpus(std::strtoull(argv[2], nullptr, 10)));
  } else if (cmd == "tiny" && argc == 4) {
    rc = spit(argv[3], tandem::train_tiny_tokenizer_json(std::strtoull(argv[2], nullptr, 10)));
  } else if (cmd == "train" && argc == 5) {
    rc = spit(argv[4], tandem::train_bpe_tokenizer_json(slurp(argv[2]), std::atoi(argv[3])));
  } else if (cmd == "encode" && argc == 4) {
    auto tok = tandem::Tokenizer::from_file(argv[2]);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
      return 1;
    }
    for (int32_t id : (*tok)->encode(slurp(argv[3]))) std::printf("%d ", id);
    std::printf("\n");
    rc = 0;
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "%s: %.3f s\n", cmd.c_str(), s);
  return rc;
}

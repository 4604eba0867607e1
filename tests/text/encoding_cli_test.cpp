// `tandem encode` end to end: the binary prints the official fixture's prompt byte for byte, maps
// it to the same ids as the in-process tokenizer with --ids, and reports bad input by field.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "text/bpe_trainer.h"
#include "text/encoding_dsv4.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct CliRun {
  int rc = -1;
  std::string out;
};

CliRun run_encode(const std::string& args) {
  CliRun r;
  std::string cmd = std::string(TANDEM_BINARY) + " encode " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

class EncodeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tandem_encode_cli_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  fs::path dir_;
};

const std::string kData = std::string(TANDEM_SOURCE_DIR) + "/tests/text/data/encoding/";

TEST_F(EncodeCli, PrintsOfficialFixturePrompt) {
  CliRun r = run_encode("--messages " + kData + "test_input_1.json --thinking");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, slurp(kData + "test_output_1.txt"));
  r = run_encode("--messages " + kData + "test_input_4.json");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, slurp(kData + "test_output_4.txt"));
}

TEST_F(EncodeCli, IdsMatchInProcessTokenizer) {
  std::string tok_json = train_bpe_tokenizer_json(generate_tiny_corpus(7, 16 * 1024), 600);
  write("tokenizer.json", tok_json);
  auto tok = Tokenizer::from_json(tok_json);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  std::string tools = write("tools.json", R"([{"type":"function","function":{"name":"f","parameters":{}}}])");
  std::string msgs = write("m.json", R"([{"role":"user","content":"Hello, world! 123\nsecond line"}])");
  CliRun r = run_encode("--model " + dir_.string() + " --messages " + msgs + " --tools " + tools + " --thinking --ids");
  ASSERT_EQ(r.rc, 0) << r.out;
  EncodeOptions opt;
  opt.thinking = true;
  auto prompt = encode_messages(nlohmann::ordered_json::parse(slurp(msgs)), nlohmann::ordered_json::parse(slurp(tools)), opt);
  ASSERT_TRUE(prompt.ok());
  std::vector<int32_t> expected = (*tok)->encode(*prompt);
  auto got = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(got.is_array()) << r.out;
  EXPECT_EQ(got.get<std::vector<int32_t>>(), expected);
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(expected.front(), 0);  // BOS
  EXPECT_EQ((*tok)->decode(expected), *prompt);
}

TEST_F(EncodeCli, BadInputNamesTheField) {
  std::string bad = write("bad.json", R"([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}])");
  CliRun r = run_encode("--messages " + bad);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("messages[1].tool_calls[0].function.arguments"), std::string::npos) << r.out;
  r = run_encode("--messages " + write("broken.json", "[{"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("not valid JSON"), std::string::npos) << r.out;
  r = run_encode("--messages " + bad + " --ids");
  EXPECT_EQ(r.rc, 2) << r.out;
  r = run_encode("--messages " + kData + "test_input_2.json --reasoning-effort ludicrous");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("reasoning_effort"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tandem

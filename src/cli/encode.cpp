// `tandem encode`: renders an OpenAI-style conversation into the DeepSeek-V4 prompt text (the same
// encoder the server uses), or with --ids into token ids via MODEL_DIR/tokenizer.json. For
// checking prompts by eye and diffing against the official Python encoder.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/command.h"
#include "text/encoding_dsv4.h"
#include "text/tokenizer.h"

namespace {

using nlohmann::ordered_json;

tandem::Result<ordered_json> read_json_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return tandem::not_found("{}: cannot open", path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return ordered_json::parse(ss.str());
  } catch (const ordered_json::parse_error& e) {
    return tandem::invalid_argument("{}: not valid JSON: {}", path, e.what());
  }
}

int fail(const tandem::Status& st) {
  std::fprintf(stderr, "tandem encode: %s\n", st.message().c_str());
  return 1;
}

int run_encode(int argc, char** argv) {
  CLI::App app{"Render chat messages as a DeepSeek-V4 prompt (text, or token ids with --ids)."};
  std::string model_dir, messages_path, tools_path, effort;
  bool thinking = false, ids = false, keep_thinking = false, no_bos = false, continue_final = false;
  app.add_option("--model", model_dir, "model directory (its tokenizer.json is used for --ids)");
  app.add_option("--messages", messages_path,
                 "JSON file: an array of OpenAI messages, or an object with \"messages\" (and \"tools\")")
      ->required();
  app.add_option("--tools", tools_path, "JSON file: an OpenAI \"tools\" array");
  app.add_flag("--thinking", thinking, "thinking mode (the answer opens with <think>)");
  app.add_option("--reasoning-effort", effort, "low (default) | high | max; OpenAI names are mapped too");
  app.add_flag("--keep-thinking", keep_thinking, "keep the reasoning of earlier turns (drop_thinking=False)");
  app.add_flag("--continue-final-message", continue_final,
               "leave a final assistant message open (no EOS) for the model to continue");
  app.add_flag("--no-bos", no_bos, "do not start with <｜begin▁of▁sentence｜>");
  app.add_flag("--ids", ids, "print token ids (JSON array) instead of text; needs --model");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (ids && model_dir.empty()) {
    std::fprintf(stderr, "tandem encode: --ids needs --model DIR (for DIR/tokenizer.json)\n");
    return 2;
  }

  tandem::EncodeOptions options;
  options.thinking = thinking;
  options.drop_thinking = !keep_thinking;
  options.add_bos = !no_bos;
  options.continue_final_message = continue_final;
  if (!effort.empty()) {
    tandem::Status st = tandem::apply_openai_reasoning_effort(effort, options);
    if (!st.ok()) return fail(st);
  }

  auto input = read_json_file(messages_path);
  if (!input.ok()) return fail(input.status());
  ordered_json messages = *input;
  ordered_json tools;
  if (messages.is_object()) {
    if (messages.contains("tools")) tools = messages["tools"];
    if (!messages.contains("messages")) {
      return fail(tandem::invalid_argument("{}: an object needs a \"messages\" array", messages_path));
    }
    ordered_json inner = messages["messages"];
    messages = std::move(inner);
  }
  if (!tools_path.empty()) {
    auto t = read_json_file(tools_path);
    if (!t.ok()) return fail(t.status());
    tools = *t;
  }

  auto prompt = tandem::encode_messages(messages, tools, options);
  if (!prompt.ok()) return fail(prompt.status().with_context(messages_path));
  if (!ids) {
    std::fwrite(prompt->data(), 1, prompt->size(), stdout);
    return 0;
  }
  auto tok = tandem::Tokenizer::from_file(model_dir + "/tokenizer.json");
  if (!tok.ok()) return fail(tok.status());
  std::vector<int32_t> tokens = (*tok)->encode(*prompt);
  std::string out = "[";
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(tokens[i]);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

TANDEM_REGISTER_COMMAND(encode, "encode", "render chat messages as a DeepSeek-V4 prompt (or token ids)",
                        run_encode);

// `tandem logits --model DIR --tokens-file T.json --out OUT.safetensors [--device cpu|cuda]`: runs
// the forward (the CPU oracle or the device-resident CUDA model) over fixed token ids and writes every position's logits (and DSpark draft outputs) for external
// checks. The format is documented in docs/LOGITS.md; keep it stable.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "common/log.h"
#include "engine/dsv4_runner.h"
#include "io/safetensors.h"
#include "model/model.h"
#ifdef TANDEM_HAVE_CUDA_RUNNER
#include "kernels/cuda/cuda_util.h"
#include "model/cuda/cuda_model.h"
#endif
#include "server/options.h"

namespace tandem {
namespace {

Status read_ids(const nlohmann::json& j, const char* key, bool required, int64_t vocab, std::vector<int32_t>& out) {
  if (!j.contains(key)) {
    if (required) return invalid_argument("tokens file: missing \"{}\"", key);
    return Status();
  }
  const auto& a = j[key];
  if (!a.is_array()) return invalid_argument("tokens file: \"{}\" must be an array of integers", key);
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_number_integer()) return invalid_argument("tokens file: {}[{}] is not an integer", key, i);
    const int64_t v = a[i].get<int64_t>();
    if (vocab > 0 && (v < 0 || v >= vocab))
      return invalid_argument("tokens file: {}[{}] = {} outside the vocabulary [0, {})", key, i, v, vocab);
    out.push_back(static_cast<int32_t>(v));
  }
  return Status();
}

TensorData f32_tensor(const std::string& name, std::vector<int64_t> shape, const float* data) {
  TensorData t;
  t.name = name;
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.bytes.resize(n * 4);
  if (n) std::memcpy(t.bytes.data(), data, n * 4);
  return t;
}

// The two backends behind one loop: forward, context insert and a greedy single-request draft.
struct CpuBackend {
  std::unique_ptr<DsV4Model> m;
  Status forward(const StepBatch& b, StepOutput& out) { return m->forward(b, out); }
  Status draft(int32_t anchor, int64_t pos, std::vector<DraftResult>& res) {
    DraftRequest r{0, anchor, pos};
    return m->draft_propose(std::span<const DraftRequest>(&r, 1), DraftSampling(), res);
  }
};
#ifdef TANDEM_HAVE_CUDA_RUNNER
struct CudaBackend {
  std::unique_ptr<CudaModel> m;
  Status forward(const StepBatch& b, StepOutput& out) { return m->forward(b, &out); }
  Status draft(int32_t anchor, int64_t pos, std::vector<DraftResult>& res) {
    CudaModel::DraftQueryDev q{0, anchor, pos, 0.0, 0};
    return m->draft_propose(std::span<const CudaModel::DraftQueryDev>(&q, 1), false, res, /*want_logits=*/true);
  }
};
#endif

template <typename Backend>
Status run_model(Backend& be, int64_t T, int64_t M, const std::vector<int32_t>& prompt,
                 const std::vector<int32_t>& decode, const std::vector<int32_t>& chunk_ids, int num_blocks,
                 const std::string& out_path);

Status run_logits(const std::string& model_dir, const std::string& tokens_file, const std::string& out_path,
                  int threads, const std::string& device) {
  std::ifstream f(tokens_file);
  if (!f) return not_found("tokens file {} cannot be opened", tokens_file);
  std::stringstream ss;
  ss << f.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("tokens file {}: not a JSON object", tokens_file);

  std::vector<int32_t> prompt, decode, chunk_ids;
  TANDEM_RETURN_IF_ERROR(read_ids(j, "prompt", true, 0, prompt));
  TANDEM_RETURN_IF_ERROR(read_ids(j, "decode", false, 0, decode));
  TANDEM_RETURN_IF_ERROR(read_ids(j, "prefill_chunks", false, 0, chunk_ids));
  if (prompt.empty()) return invalid_argument("tokens file: \"prompt\" is empty");
  for (int32_t c : chunk_ids)
    if (c <= 0) return invalid_argument("tokens file: prefill_chunks must be positive");
  const int64_t T = static_cast<int64_t>(prompt.size()), M = static_cast<int64_t>(decode.size());

  ModelOptions opt;
  opt.max_slots = 1;
  opt.block_size = 256;
  opt.num_blocks = static_cast<int>((T + M + 255) / 256 + 1);
  opt.max_tokens_per_step = static_cast<int>(T);
  opt.num_threads = threads;
  // auto (the default): the GPU when this build has the CUDA runner and a GPU is visible.
  const std::string dev = device == "auto" ? (cuda_runner_available() ? "cuda" : "cpu") : device;
  if (dev == "cuda") {
#ifdef TANDEM_HAVE_CUDA_RUNNER
    CudaModelOptions copt;
    copt.model = opt;
    copt.max_logits_rows = static_cast<int>(std::max<int64_t>(T, 1));
    CudaBackend be;
    TANDEM_ASSIGN_OR_RETURN(be.m, CudaModel::load(model_dir, copt));
    std::fprintf(stderr, "device: %s\n", be.m->device_name().c_str());
    return run_model(be, T, M, prompt, decode, chunk_ids, opt.num_blocks, out_path);
#else
    return make_error(StatusCode::kUnimplemented, "--device cuda: this build has no CUDA runner");
#endif
  }
  if (dev != "cpu") return invalid_argument("--device '{}' is not auto, cpu or cuda", device);
  CpuBackend be;
  TANDEM_ASSIGN_OR_RETURN(be.m, DsV4Model::load(model_dir, opt));
  return run_model(be, T, M, prompt, decode, chunk_ids, opt.num_blocks, out_path);
}

template <typename Backend>
Status run_model(Backend& be, int64_t T, int64_t M, const std::vector<int32_t>& prompt,
                 const std::vector<int32_t>& decode, const std::vector<int32_t>& chunk_ids, int num_blocks,
                 const std::string& out_path) {
  auto& model = be.m;
  const int64_t V = model->vocab_size();
  for (auto* ids : {&prompt, &decode})
    for (size_t i = 0; i < ids->size(); ++i)
      if ((*ids)[i] < 0 || (*ids)[i] >= V)
        return invalid_argument("tokens file: token {} outside the vocabulary [0, {})", (*ids)[i], V);
  std::fprintf(stderr, "%s\n", model->load_report().summary().c_str());

  const bool draft = model->has_draft();
  const int64_t K = model->draft_block_size();
  std::vector<int32_t> table(num_blocks);
  for (int i = 0; i < num_blocks; ++i) table[i] = i;
  std::vector<float> logits(static_cast<size_t>((T + M) * V));
  std::vector<float> dlogits, dconf;
  std::vector<int32_t> dtok;
  StepOutput out;
  // ---- prompt in chunks ----
  int64_t pos = 0;
  size_t ci = 0;
  while (pos < T) {
    int64_t n = chunk_ids.empty() ? T : chunk_ids[std::min(ci, chunk_ids.size() - 1)];
    ++ci;
    n = std::min(n, T - pos);
    StepBatch b;
    b.seqs.push_back({0, pos, std::span<const int32_t>(prompt.data() + pos, n), table, LogitsMode::kAll, draft});
    TANDEM_RETURN_IF_ERROR(be.forward(b, out));
    std::memcpy(&logits[pos * V], out.logits.data(), sizeof(float) * n * V);
    if (draft)
      TANDEM_RETURN_IF_ERROR(model->draft_insert_context(
          0, pos, std::span<const float>(out.taps.data(), n * model->tap_dim())));
    pos += n;
  }
  // ---- decode: draft step k (anchor decode[k] at T+k, context < T+k), then the target ----
  std::vector<DraftResult> dres;
  for (int64_t k = 0; k < M; ++k) {
    if (draft) {
      TANDEM_RETURN_IF_ERROR(be.draft(decode[k], T + k, dres));
      dlogits.insert(dlogits.end(), dres[0].logits.begin(), dres[0].logits.end());
      dconf.insert(dconf.end(), dres[0].confidence.begin(), dres[0].confidence.end());
      dtok.insert(dtok.end(), dres[0].tokens.begin(), dres[0].tokens.end());
    }
    StepBatch b;
    b.seqs.push_back({0, T + k, std::span<const int32_t>(decode.data() + k, 1), table, LogitsMode::kAll, draft});
    TANDEM_RETURN_IF_ERROR(be.forward(b, out));
    std::memcpy(&logits[(T + k) * V], out.logits.data(), sizeof(float) * V);
    if (draft)
      TANDEM_RETURN_IF_ERROR(
          model->draft_insert_context(0, T + k, std::span<const float>(out.taps.data(), model->tap_dim())));
  }

  std::vector<TensorData> tensors;
  tensors.push_back(f32_tensor("logits", {T + M, V}, logits.data()));
  if (draft && M > 0) {
    tensors.push_back(f32_tensor("draft_logits", {M, K, V}, dlogits.data()));
    tensors.push_back(f32_tensor("draft_confidence", {M, K}, dconf.data()));
    TensorData t;
    t.name = "draft_tokens";
    t.dtype = DType::kI32;
    t.shape = {M, K};
    t.bytes.resize(dtok.size() * 4);
    std::memcpy(t.bytes.data(), dtok.data(), t.bytes.size());
    tensors.push_back(std::move(t));
  }
  std::vector<const TensorData*> ptrs;
  for (const auto& t : tensors) ptrs.push_back(&t);
  std::map<std::string, std::string> meta = {{"prompt_len", std::to_string(T)},
                                             {"decode_len", std::to_string(M)},
                                             {"format", "tandem-logits-v1"}};
  TANDEM_RETURN_IF_ERROR(write_safetensors(out_path, ptrs, meta));
  std::fprintf(stderr, "wrote %s: logits [%lld, %lld]%s\n", out_path.c_str(), static_cast<long long>(T + M),
               static_cast<long long>(V), draft && M > 0 ? " + draft_logits, draft_confidence, draft_tokens" : "");
  return Status();
}

int logits_main(int argc, char** argv) {
  // Flags come from the one option table (src/server/options.cpp) shared with `serve` and `run`.
  std::vector<std::string> args(argv + 1, argv + argc);
  auto opts = server::parse_options(server::kLogits, args, server::process_env);
  if (!opts.ok()) {
    if (opts.status().code() == StatusCode::kCancelled) {
      std::printf("%s", server::command_help(server::kLogits).c_str());
      return 0;
    }
    std::fprintf(stderr, "tandem logits: %s\n(tandem logits --help lists the options)\n",
                 opts.status().message().c_str());
    return 2;
  }
  Status st = run_logits(opts->model, opts->logits.tokens_file, opts->logits.out, opts->engine.num_threads,
                         opts->engine.device);
  if (!st.ok()) {
    std::fprintf(stderr, "tandem logits: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem

TANDEM_REGISTER_COMMAND(logits, "logits", "write logits for fixed token ids (external checks)", tandem::logits_main);

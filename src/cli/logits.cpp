// `tandem logits --model DIR --tokens-file T.json --out OUT.safetensors [--device cpu|cuda]`: runs
// the forward (the CPU oracle or the device-resident CUDA model) over fixed token ids and writes every position's logits (and DSpark draft outputs) for external
// checks. The format is documented in docs/LOGITS.md; keep it stable.
//
// With --tensor-parallel-size N every rank runs this same program on its shard (no step plans:
// the same calls in the same order, kept in step by the model's collectives): rank 0 starts its
// node's other ranks (`tandem logits <same flags> --tp-rank R`), reads the tokens file and sends
// it to them, and alone writes the output; on other nodes `tandem logits --nnodes N --node-rank R
// <same flags>` starts that node's ranks.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "common/log.h"
#include "common/comm.h"
#include "engine/dsv4_runner.h"
#include "engine/parallel/device_tp.h"
#include "engine/parallel/tp_runner.h"
#include "io/safetensors.h"
#include "model/model.h"
#ifdef TANDEM_HAVE_CUDA_RUNNER
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_util.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/device_comm.h"
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
                 const std::string& out_path, bool write);

// The tokens file's text: read by rank 0, sent to the other ranks of a group (with rank 0's error,
// so that every rank stops alike).
Result<std::string> tokens_text(const std::string& path, int rank, TpGroup* group) {
  std::string text, err;
  if (rank == 0) {
    std::ifstream f(path);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      text = ss.str();
    } else {
      err = fmt::format("tokens file {} cannot be opened", path);
    }
  }
  if (group) {
    const std::string& body = err.empty() ? text : err;
    std::vector<uint8_t> msg(1 + body.size());
    msg[0] = err.empty() ? 1 : 0;
    std::copy(body.begin(), body.end(), msg.begin() + 1);
    TANDEM_RETURN_IF_ERROR(group->comm().broadcast(msg, 0));
    if (msg.empty()) return make_error(StatusCode::kDataLoss, "rank 0 sent no tokens file");
    const std::string got(msg.begin() + 1, msg.end());
    if (msg[0] != 1) err = got;
    else text = got;
  }
  if (!err.empty()) return not_found("{}", err);
  return text;
}

Status run_logits(const EngineConfig& config, const std::string& tokens_file, const std::string& out,
                  bool every_rank, const std::vector<std::string>& args, int tp_rank) {
  EngineConfig c = config;
  // auto (the default): the GPU when this build has the CUDA runner and a GPU is visible.
  if (c.device == "auto") c.device = cuda_runner_available() ? "cuda" : "cpu";
  if (c.device != "cpu" && c.device != "cuda") return invalid_argument("--device '{}' is not auto, cpu or cuda", c.device);
  const int tp = c.tensor_parallel_size;
  std::unique_ptr<TpGroup> group;
  const int rank = tp_rank < 0 ? 0 : tp_rank;
  if (tp > 1) {
    auto args_for = [&c, &args](int r) {
      std::vector<std::string> a = {tp_worker_binary(c), "logits"};
      a.insert(a.end(), args.begin(), args.end());
      a.insert(a.end(), {"--device", c.device, "--tp-rank", std::to_string(r)});
      return a;
    };
    TANDEM_ASSIGN_OR_RETURN(group, join_tp_group(c, rank, args_for));
  }
  TANDEM_ASSIGN_OR_RETURN(const std::string text, tokens_text(tokens_file, rank, group.get()));
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("tokens file {}: not a JSON object", tokens_file);

  std::vector<int32_t> prompt, decode, chunk_ids;
  TANDEM_RETURN_IF_ERROR(read_ids(j, "prompt", true, 0, prompt));
  TANDEM_RETURN_IF_ERROR(read_ids(j, "decode", false, 0, decode));
  TANDEM_RETURN_IF_ERROR(read_ids(j, "prefill_chunks", false, 0, chunk_ids));
  if (prompt.empty()) return invalid_argument("tokens file: \"prompt\" is empty");
  for (int32_t ch : chunk_ids)
    if (ch <= 0) return invalid_argument("tokens file: prefill_chunks must be positive");
  const int64_t T = static_cast<int64_t>(prompt.size()), M = static_cast<int64_t>(decode.size());

  ModelOptions opt;
  opt.max_slots = 1;
  opt.block_size = 256;
  opt.num_blocks = static_cast<int>((T + M + 255) / 256 + 1);
  opt.max_tokens_per_step = static_cast<int>(T);
  opt.num_threads = c.num_threads;
  opt.tp_rank = rank;
  opt.tp_size = tp;
  // Rank 0 writes the output; with --tp-write-every-rank the others write OUT.rankR too.
  const bool write = rank == 0 || every_rank;
  const std::string out_path = rank == 0 ? out : out + ".rank" + std::to_string(rank);
  if (c.device == "cuda") {
#ifdef TANDEM_HAVE_CUDA_RUNNER
    int device = 0;
    std::unique_ptr<DeviceComm> dcomm;
    if (group) {
      TANDEM_ASSIGN_OR_RETURN(device, tp_device_for_rank(c, rank));
      TANDEM_ASSIGN_OR_RETURN(dcomm, create_rank_device_comm(c, rank, device, group->comm()));
      opt.comm = dcomm.get();
    }
    CudaModelOptions copt;
    copt.model = opt;
    copt.device = device;
    copt.max_logits_rows = static_cast<int>(std::max<int64_t>(T, 1));
    CudaBackend be;
    TANDEM_ASSIGN_OR_RETURN(be.m, CudaModel::load(c.model_dir, copt));
    if (write) std::fprintf(stderr, "device: %s\n", be.m->device_name().c_str());
    Status st = run_model(be, T, M, prompt, decode, chunk_ids, opt.num_blocks, out_path, write);
    be.m.reset();  // the model goes before the communicator it uses
    return st;
#else
    return make_error(StatusCode::kUnimplemented, "--device cuda: this build has no CUDA runner");
#endif
  }
  if (group) opt.comm = &group->comm();
  CpuBackend be;
  TANDEM_ASSIGN_OR_RETURN(be.m, DsV4Model::load(c.model_dir, opt));
  return run_model(be, T, M, prompt, decode, chunk_ids, opt.num_blocks, out_path, write);
}

template <typename Backend>
Status run_model(Backend& be, int64_t T, int64_t M, const std::vector<int32_t>& prompt,
                 const std::vector<int32_t>& decode, const std::vector<int32_t>& chunk_ids, int num_blocks,
                 const std::string& out_path, bool write) {
  auto& model = be.m;
  const int64_t V = model->vocab_size();
  for (auto* ids : {&prompt, &decode})
    for (size_t i = 0; i < ids->size(); ++i)
      if ((*ids)[i] < 0 || (*ids)[i] >= V)
        return invalid_argument("tokens file: token {} outside the vocabulary [0, {})", (*ids)[i], V);
  if (write) std::fprintf(stderr, "%s\n", model->load_report().summary().c_str());

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

  if (!write) return Status();  // a tensor-parallel rank other than 0: same calls, no file
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
  // Flags come from the one option table (src/server/options.cpp) shared with `serve` and `run`;
  // --tp-rank R (internal) marks a rank started by rank 0 or by its node's `tandem logits`.
  std::vector<std::string> args;
  int tp_rank = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tp-rank" && i + 1 < argc) {
      tp_rank = std::atoi(argv[++i]);
      continue;
    }
    args.push_back(a);
  }
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
  const EngineConfig& e = opts->engine;
  if (tp_rank >= 0 && (e.tensor_parallel_size < 2 || tp_rank >= e.tensor_parallel_size)) {
    std::fprintf(stderr, "tandem logits: --tp-rank %d needs --tensor-parallel-size > %d\n", tp_rank, tp_rank);
    return 2;
  }
  if (tp_rank < 0 && e.tensor_parallel_size > 1 && e.node_rank > 0) {
    // Another node: start this node's ranks with the same flags and wait for them.
    EngineConfig c = e;
    if (c.device == "auto") c.device = cuda_runner_available() ? "cuda" : "cpu";
    return run_tp_node_ranks(
        c,
        [&c, &args](int r) {
          std::vector<std::string> a = {tp_worker_binary(c), "logits"};
          a.insert(a.end(), args.begin(), args.end());
          a.insert(a.end(), {"--device", c.device, "--tp-rank", std::to_string(r)});
          return a;
        },
        [] { return false; });
  }
  Status st = run_logits(e, opts->logits.tokens_file, opts->logits.out, opts->logits.every_rank, args, tp_rank);
  if (!st.ok()) {
    std::fprintf(stderr, "tandem logits%s: %s\n", tp_rank > 0 ? fmt::format(" (rank {})", tp_rank).c_str() : "",
                 st.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem

TANDEM_REGISTER_COMMAND(logits, "logits", "write logits for fixed token ids (external checks)", tandem::logits_main);

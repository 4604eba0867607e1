// CudaRunner: adapts CudaModel (src/model/cuda/cuda_model.h, the device-resident forward and
// DSpark draft) to the engine's ModelRunner interface, as Dsv4Runner does for the CPU model. KV
// pool and slot-state sizes are the device layout's real bytes for the chosen cache dtype. Built
// only when the CUDA toolkit was found (TANDEM_HAVE_CUDA_RUNNER).
#include "engine/dsv4_runner.h"

#ifdef TANDEM_HAVE_CUDA_RUNNER

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "common/check.h"
#include "common/log.h"
#include "io/model_config.h"
#include "kernels/cuda/cuda_util.h"
#include "model/cuda/cuda_model.h"
#include "text/tokenizer.h"

namespace tandem {

namespace {

class CudaRunner : public ModelRunner {
 public:
  CudaRunner(std::string dir, std::unique_ptr<Tokenizer> tok, ModelConfig config, ModelOptions probe, int max_graph_batch)
      : dir_(std::move(dir)),
        tokenizer_(std::move(tok)),
        config_(std::move(config)),
        probe_(probe),
        max_graph_batch_(max_graph_batch) {}

  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_model_len() const override { return config_.max_position_embeddings; }
  int32_t eos_token_id() const override { return static_cast<int32_t>(config_.eos_token_id); }
  int32_t noise_token_id() const override {
    return config_.has_dspark() ? static_cast<int32_t>(config_.dspark_noise_token_id) : -1;
  }
  std::string device() const override { return "cuda:0"; }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }

  Status check_kv_cache_dtype(const std::string& dtype) const override {
    if (!parse_kv_dtype(dtype).ok())
      return invalid_argument("kv_cache_dtype {} is not supported by the CUDA runner (supported: fp8, bf16, nvfp4)",
                              dtype);
    return Status();
  }
  // Real bytes of one device pool block (kv_record.h) for the dtype.
  int64_t kv_bytes_per_block(int block_size, const std::string& dtype) const override {
    ModelOptions o = probe_;
    o.block_size = block_size;
    auto d = parse_kv_dtype(dtype);
    if (d.ok()) o.kv_dtype = *d;
    auto sz = CudaModel::state_sizes(config_, o);
    return sz.ok() ? static_cast<int64_t>(sz->pool_block_bytes) : 1;
  }
  int64_t slot_state_bytes() const override {
    if (model_) return static_cast<int64_t>(model_->slot_state_bytes());
    auto sz = CudaModel::state_sizes(config_, probe_);
    return sz.ok() ? static_cast<int64_t>(sz->slot_state_bytes) : 1;
  }

  Status allocate(const RunnerAllocation& alloc) override {
    if (alloc.block_size % 128 != 0)
      return invalid_argument("--block-size {} must be a multiple of 128 for DeepSeek-V4 (compression ratio 128)",
                              alloc.block_size);
    CudaModelOptions o;
    o.model.max_slots = alloc.max_slots;
    o.model.num_blocks = alloc.num_blocks;
    o.model.block_size = alloc.block_size;
    o.model.max_tokens_per_step = alloc.max_tokens_per_step;
    o.model.max_rollback = std::max(alloc.max_verify_tokens, 1);
    o.model.load_draft = true;
    TANDEM_ASSIGN_OR_RETURN(o.model.kv_dtype,
                            parse_kv_dtype(alloc.kv_cache_dtype.empty() ? "fp8" : alloc.kv_cache_dtype));
    // Logits rows of one step: the last row of each sequence, or K+1 verify rows of each.
    o.max_logits_rows = std::max(alloc.max_slots * std::max(alloc.max_verify_tokens, 1),
                                 std::min(alloc.max_tokens_per_step, alloc.max_slots * 8));
    // Decode and verify steps of up to --max-cudagraph-capture-size sequences replay CUDA graphs
    // (0 = always eager).
    o.max_graph_batch = std::min(max_graph_batch_, alloc.max_slots);
    o.draft_tokens = config_.has_dspark() ? std::min(alloc.num_draft_tokens, config_.dspark_block_size) : 0;
    model_.reset();
    TANDEM_ASSIGN_OR_RETURN(model_, CudaModel::load(dir_, o));
    q_rows_.assign(static_cast<size_t>(alloc.max_slots), 0);
    // Every decode/verify/draft shape the engine replays is captured now, not on a request's path.
    const auto t0 = std::chrono::steady_clock::now();
    const int graphs = model_->capture_graphs(/*taps=*/alloc.num_draft_tokens > 0);
    if (graphs > 0)
      TLOG_INFO("engine", "captured {} CUDA graphs (decode and verify steps of up to {} sequences, drafts) in {:.0f} ms",
                graphs, o.max_graph_batch,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    allocs_at_start_ = kernels::cuda::alloc_stats().count;
    TLOG_INFO("engine", "model loaded on {} from {} (KV dtype {}): {}", model_->device_name(), dir_,
              kv_dtype_name(o.model.kv_dtype), model_->load_report().summary());
    return Status();
  }

  // ---- operations: audit facts, memory plan, allocation counter ----
  DeviceFacts device_facts() const override {
    DeviceFacts f;
    f.device = device();
    f.name = kernels::cuda::device_description(0);
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
      f.compute_capability = std::to_string(p.major) + "." + std::to_string(p.minor);
    else
      cudaGetLastError();
    const std::string arch = std::string("sm_") + TANDEM_CUDA_ARCHS;
    for (const auto& op : audit_op_classes()) {
      std::string path;
      if (op == "all_reduce") path = "none (single rank)";
      else if (op == "sampling") path = "cuda:tandem-sample-rows (" + arch + ")";
      else if (op == "dspark_draft") path = has_draft() ? "cuda:tandem-draft (" + arch + ")" : "none (no draft)";
      else if (op == "gemm_fp8" || op == "moe_experts_mxfp4" || op == "lm_head")
        path = "cuda:tandem-gemv-fp32acc (" + arch + ")";
      else path = "cuda:tandem (" + arch + ")";
      f.kernels.push_back({op, path});
    }
    for (int b = 1; b <= max_graph_batch_; b *= 2) f.cudagraph_capture_sizes.push_back(b);
    return f;
  }
  void plan_memory(const RunnerAllocation& alloc, MemoryPlan& plan) const override {
    // Weights: the stored bytes of the checkpoint's shards, uploaded as they are.
    int64_t wbytes = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec))
      if (e.path().extension() == ".safetensors") wbytes += static_cast<int64_t>(e.file_size(ec));
    // On an integrated GPU (GB10) these pools are host memory: add_gpu_domain puts them in the
    // host's domain, against MemAvailable. The compute capabilities of the unified-memory parts
    // (Orin 8.7, Thor 11.0, GB10 12.1: the list vLLM keys on) count too, in case the attribute
    // does not say so.
    GpuMemoryReport gpu;
    gpu.device = device();
    int dev = 0, integrated = 0, major = 0, minor = 0;
    size_t free_b = 0, total_b = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&integrated, cudaDevAttrIntegrated, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
        cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      const int cc = major * 10 + minor;
      gpu.integrated = integrated != 0 || cc == 87 || cc == 110 || cc == 121;
      gpu.free_bytes = static_cast<int64_t>(free_b);
      gpu.total_bytes = static_cast<int64_t>(total_b);
    } else {
      cudaGetLastError();
    }
    const std::string domain = add_gpu_domain(plan, gpu, read_host_memory());
    const std::string on = gpu.integrated ? " (" + device() + ", unified memory)" : "";
    plan.add(kPoolWeights, domain, wbytes, "the shards' stored bytes (FP8/MXFP4 kept as stored)" + on);
    plan.add(kPoolKv, domain, int64_t{alloc.num_blocks} * kv_bytes_per_block(alloc.block_size, alloc.kv_cache_dtype),
             "real bytes of the " + alloc.kv_cache_dtype + " records" + on);
    plan.add(kPoolSlotState, domain, int64_t{alloc.max_slots} * slot_state_bytes(), on.empty() ? "" : on.substr(1));
  }
  int64_t device_allocations_after_start() const override {
    return model_ ? kernels::cuda::alloc_stats().count - allocs_at_start_ : -1;
  }

  // The step runs on the device and its rows are sampled there: logits, taps and draft
  // distributions stay on the GPU; token ids and logprobs come back.
  Status forward(std::span<const RunnerSeq> batch, const StepSamples* samples, RunnerOutput& out) override {
    to_step_batch(batch, model_->has_draft(), batch_);
    // With rows to sample, the sampler's one synchronization finishes the step too.
    const bool sampling = samples && !samples->rows.empty();
    TANDEM_RETURN_IF_ERROR(model_->forward(batch_, nullptr, /*synchronize=*/!sampling));
    out.samples.clear();
    if (!sampling) return Status();
    first_sampled_row(batch, model_->last_logits_rows(), first_row_);
    rows_.assign(samples->rows.begin(), samples->rows.end());
    for (size_t i = 0; i < batch.size(); ++i) {
      const RunnerSeq& s = batch[i];
      if (s.sample_rows > 0 && (s.sample_begin < 0 || s.sample_begin + s.sample_rows > static_cast<int>(rows_.size()))) {
        model_->synchronize();
        return make_error(StatusCode::kInternal, "sampling: seq {} rows [{}, +{}) outside the step's {} rows", i,
                          s.sample_begin, s.sample_rows, rows_.size());
      }
      for (int j = 0; j < s.sample_rows; ++j) {
        SampleRow& r = rows_[static_cast<size_t>(s.sample_begin + j)];
        r.logits_row = static_cast<int32_t>(first_row_[i] + j);
        if (r.q_row < 0) continue;
        if (r.q_row >= q_rows_[s.slot]) {
          model_->synchronize();
          return make_error(StatusCode::kInternal, "sampling: slot {} has no stored draft distribution {}", s.slot,
                            r.q_row);
        }
        r.q_row += s.slot * model_->draft_tokens();
      }
    }
    out.samples.resize(rows_.size());
    return model_->sample(rows_, samples->prompt_ids, samples->counts, samples->masks, samples->mask_words,
                          out.samples);
  }

  void rollback(int slot, int64_t new_len) override {
    Status st = model_->rollback(slot, new_len);
    TANDEM_CHECK_MSG(st.ok(), st.message().c_str());
  }
  void reset(int slot) override {
    model_->reset(slot);
    q_rows_[slot] = 0;
  }
  void export_slot_state(int slot, std::span<uint8_t> out) const override {
    Status st = model_->export_slot_state(slot, out);
    TANDEM_CHECK_MSG(st.ok(), st.message().c_str());
  }
  Status import_slot_state(int slot, std::span<const uint8_t> in) override {
    return model_->import_slot_state(slot, in);
  }

  bool has_draft() const override { return model_ ? model_->has_draft() : config_.has_dspark(); }
  int num_draft_tokens() const override {
    if (model_) return model_->draft_block_size();
    return config_.has_dspark() ? config_.dspark_block_size : 0;
  }
  void draft_insert_context(int slot, int64_t start_pos, int64_t rows, int batch_index) override {
    if (!model_->has_draft() || rows <= 0) return;
    Status st = model_->draft_insert_context_from_step(slot, start_pos, batch_index, rows);
    if (!st.ok()) TLOG_WARN("engine", "draft context insert (slot {}, pos {}): {}", slot, start_pos, st.message());
  }
  Status draft_propose(std::span<const DraftQuery> reqs, std::vector<DraftProposal>& out) override {
    out.resize(reqs.size());
    queries_.clear();
    for (const DraftQuery& q : reqs) queries_.push_back({q.slot, q.anchor, q.position, q.temperature, q.seed});
    // Sampled requests' q stay on the device, in the slot's rows of the draft store.
    TANDEM_RETURN_IF_ERROR(model_->draft_propose(queries_, /*want_probs=*/false, results_));
    for (size_t i = 0; i < reqs.size(); ++i) {
      to_draft_proposal(results_[i], reqs[i].temperature > 0, out[i]);
      q_rows_[reqs[i].slot] = out[i].sampled ? static_cast<int>(out[i].tokens.size()) : 0;
    }
    return Status();
  }

 private:
  std::string dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelConfig config_;
  ModelOptions probe_;
  int max_graph_batch_ = 0;
  int64_t allocs_at_start_ = 0;
  std::unique_ptr<CudaModel> model_;
  StepBatch batch_;
  std::vector<int64_t> first_row_;
  std::vector<SampleRow> rows_;
  std::vector<int> q_rows_;  // per slot: draft distributions stored on the device (0: none)
  std::vector<CudaModel::DraftQueryDev> queries_;
  std::vector<DraftResult> results_;
};

}  // namespace

bool cuda_runner_available() { return kernels::cuda::device_count() > 0; }

Result<std::unique_ptr<ModelRunner>> create_cuda_runner(const EngineConfig& config) {
  const std::string& dir = config.model_dir;
  if (kernels::cuda::device_count() == 0)
    return make_error(StatusCode::kUnavailable, "--device cuda: no CUDA device is visible (driver missing or no GPU)");
  TANDEM_ASSIGN_OR_RETURN(auto tok, Tokenizer::from_file(dir + "/tokenizer.json"));
  auto cfg = load_model_config(dir + "/config.json");
  if (!cfg.ok()) return cfg.status().with_context("loading " + dir);
  ModelOptions probe;
  probe.max_slots = 1;
  probe.num_blocks = 1;
  probe.block_size = 256;
  probe.max_tokens_per_step = 8;
  probe.max_rollback = config.speculative.method.empty() ? 1 : config.speculative.num_speculative_tokens + 1;
  probe.load_draft = true;
  auto sizes = CudaModel::state_sizes(*cfg, probe);
  if (!sizes.ok()) return sizes.status().with_context("loading " + dir);
  return std::unique_ptr<ModelRunner>(
      new CudaRunner(dir, std::move(tok), std::move(cfg).value(), probe, config.max_cudagraph_capture_size));
}

}  // namespace tandem

#else  // no CUDA toolkit at build time

namespace tandem {
bool cuda_runner_available() { return false; }
Result<std::unique_ptr<ModelRunner>> create_cuda_runner(const EngineConfig&) {
  return make_error(StatusCode::kUnimplemented,
                    "--device cuda: this build has no CUDA runner (the CUDA toolkit was not found at build time)");
}
}  // namespace tandem

#endif

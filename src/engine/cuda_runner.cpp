// CudaRunner: adapts CudaModel (src/model/cuda/cuda_model.h, the device-resident forward and
// DSpark draft) to the engine's ModelRunner interface through SlotRunner (slot_runner.h), as
// Dsv4Runner does for the CPU model. KV pool and slot-state sizes are the device layout's real
// bytes for the chosen cache dtype. Built only when the CUDA toolkit was found
// (TANDEM_HAVE_CUDA_RUNNER).
#include "engine/dsv4_runner.h"

#ifdef TANDEM_HAVE_CUDA_RUNNER

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include <fmt/ranges.h>

#include "common/check.h"
#include "common/log.h"
#include "engine/slot_runner.h"
#include "io/catalog.h"
#include "kernels/cuda/cuda_util.h"
#include "model/cuda/cuda_model.h"
#include "model/shard_plan.h"

namespace tandem {

namespace {

// The device's free memory (cudaMemGetInfo), -1 when it cannot be read.
int64_t free_device_memory() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return static_cast<int64_t>(free_b);
}

class CudaRunner : public SlotRunner<CudaModel> {
 public:
  // tp_rank / tp_size / comm: this rank's place in a tensor-parallel group and its device data
  // plane; device: the CUDA ordinal it runs on.
  CudaRunner(RunnerCheckpoint ck, int max_graph_batch, SyntheticOptions synthetic, int tp_rank, int tp_size,
             DataComm* comm, int device)
      : SlotRunner(std::move(ck), "CUDA runner"),
        max_graph_batch_(max_graph_batch),
        synthetic_(std::move(synthetic)),
        tp_rank_(tp_rank),
        tp_size_(tp_size),
        comm_(comm),
        device_(device) {}

  std::string device() const override { return "cuda:" + std::to_string(device_); }

  Status allocate(const RunnerAllocation& alloc) override {
    CudaModelOptions o;
    TANDEM_ASSIGN_OR_RETURN(o.model, model_options_for(alloc));
    o.model.tp_rank = tp_rank_;  // a tensor-parallel rank binds its shard
    o.model.tp_size = tp_size_;
    o.model.comm = comm_;
    o.device = device_;
    // Logits rows of one step: the last row of each sequence, or K+1 verify rows of each.
    o.max_logits_rows = std::max(alloc.max_slots * std::max(alloc.max_verify_tokens, 1),
                                 std::min(alloc.max_tokens_per_step, alloc.max_slots * 8));
    // Decode and verify steps of up to --max-cudagraph-capture-size sequences replay CUDA graphs
    // (0 = always eager).
    o.max_graph_batch = std::min(max_graph_batch_, alloc.max_slots);
    o.draft_tokens = ck_.config.has_dspark() ? std::min(alloc.num_draft_tokens, ck_.config.dspark_block_size) : 0;
    model_.reset();
    if (synthetic_.name.empty()) {
      TANDEM_ASSIGN_OR_RETURN(model_, CudaModel::load(ck_.dir, o));
    } else {
      TANDEM_ASSIGN_OR_RETURN(model_, CudaModel::synthetic(ck_.config, o, synthetic_));
    }
    set_max_slots(alloc.max_slots);
    // Prefix-cache snapshots on the device, allocated before the graphs and the allocation count.
    TANDEM_RETURN_IF_ERROR(init_snapshots(alloc.num_snapshots));
    if (alloc.num_snapshots > 0)
      TLOG_INFO("engine", "prefix-cache snapshots on {}: {} x {} bytes = {:.1f} MiB", device(), alloc.num_snapshots,
                model_->snapshot_device_bytes(),
                static_cast<double>(alloc.num_snapshots) * model_->snapshot_device_bytes() / 1048576.0);
    q_rows_.assign(static_cast<size_t>(alloc.max_slots), 0);
    // Every decode/verify/draft shape the engine replays is captured now, not on a request's path.
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t free0 = free_device_memory();
    // The rank that samples (a tensor-parallel group's head; workers only compute) captures the
    // decode and verify graphs with the sampler as their last launch.
    const int graphs = model_->capture_graphs(/*taps=*/alloc.num_draft_tokens > 0, /*sampler=*/tp_rank_ == 0);
    const int64_t free1 = free_device_memory();
    if (graphs > 0)
      TLOG_INFO("engine",
                "captured {} CUDA graphs (decode and verify steps of up to {} sequences at contexts up to {} tokens, "
                "drafts) in {:.0f} ms, {:.1f} MiB of device memory",
                graphs, o.max_graph_batch, model_->graph_context_captured(),
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                free0 >= 0 && free1 >= 0 ? static_cast<double>(free0 - free1) / 1048576.0 : 0.0);
    allocs_at_start_ = kernels::cuda::alloc_stats().count;
    TLOG_INFO("engine", "model loaded on {} from {} (KV dtype {}): {}", model_->device_name(),
              synthetic_.name.empty() ? ck_.dir : "synthetic " + synthetic_.name, kv_dtype_name(o.model.kv_dtype),
              model_->load_report().summary());
    return Status();
  }

  // ---- operations: audit facts, memory plan, allocation counter ----
  DeviceFacts device_facts() const override {
    DeviceFacts f;
    f.device = device();
    f.name = kernels::cuda::device_description(device_);
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, device_) == cudaSuccess)
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
        path = "cuda:tandem-decode-mma-f32acc (" + arch + ")";  // kernels/cuda/decode_gemm.h, moe_decode.h
      else path = "cuda:tandem (" + arch + ")";
      f.kernels.push_back({op, path});
    }
    for (int b = 1; b <= max_graph_batch_; b *= 2) f.cudagraph_capture_sizes.push_back(b);
    return f;
  }
  void plan_memory(const RunnerAllocation& alloc, MemoryPlan& plan) const override {
    int64_t wbytes = 0;
    std::string wwhat;
    if (!synthetic_.name.empty() || tp_size_ > 1) {
      // Synthetic weights, or a tensor-parallel rank: the stored bytes of the catalog tensors this
      // rank holds (generated on the device, or its slices of the checkpoint's).
      auto cat = build_catalog(ck_.config);
      if (cat.ok()) {
        auto p = model::plan_shard(ck_.config, *cat, {tp_rank_, tp_size_}, true);
        if (p.ok()) wbytes = static_cast<int64_t>(p->held_bytes);
      }
      wwhat = fmt::format("{} rank {} of {}: its catalog tensors' stored bytes",
                          synthetic_.name.empty() ? ck_.dir : "synthetic " + synthetic_.name, tp_rank_, tp_size_);
    } else {
      // Weights: the stored bytes of the checkpoint's shards, uploaded as they are.
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(ck_.dir, ec))
        if (e.path().extension() == ".safetensors") wbytes += static_cast<int64_t>(e.file_size(ec));
      wwhat = "the shards' stored bytes (FP8/MXFP4 kept as stored)";
    }
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
    plan.add(kPoolWeights, domain, wbytes, wwhat + on);
    plan.add(kPoolKv, domain, int64_t{alloc.num_blocks} * kv_bytes_per_block(alloc.block_size, alloc.kv_cache_dtype),
             "real bytes of the " + alloc.kv_cache_dtype + " records" + on);
    plan.add(kPoolSlotState, domain, int64_t{alloc.max_slots} * slot_state_bytes(), on.empty() ? "" : on.substr(1));
    if (alloc.num_snapshots > 0)
      plan.add(kPoolPrefixSnapshots, domain, int64_t{alloc.num_snapshots} * slot_state_bytes(),
               "prefix-cache slot snapshots, device to device" + on);
  }
  int64_t device_allocations_after_start() const override {
    return model_ ? kernels::cuda::alloc_stats().count - allocs_at_start_ : -1;
  }
  int64_t device_graph_instantiations() const override { return model_ ? model_->graph_stats().instantiations : -1; }
  int64_t device_free_bytes() const override { return model_ ? free_device_memory() : -1; }
  double device_wait_seconds() const override { return model_ ? model_->device_wait_seconds() : -1; }
  double device_submit_seconds() const override { return model_ ? model_->device_submit_seconds() : -1; }
  int64_t max_sample_rows() const override { return model_ ? model_->max_logits_rows() : INT64_MAX; }

  // The step runs on the device and its rows are sampled there: logits, taps and draft
  // distributions stay on the GPU; token ids and logprobs come back. A decode or verify step's
  // sampling is the last launch of its graph (CudaModel::forward_sample), one synchronization.
  Status forward(std::span<const RunnerSeq> batch, const StepSamples* samples, RunnerOutput& out) override {
    TANDEM_RETURN_IF_ERROR(begin_step(batch));
    to_step_batch(batch, model_->has_draft(), batch_);
    out.samples.clear();
    if (!samples || samples->rows.empty()) return model_->forward(batch_, nullptr, /*synchronize=*/true);
    // The rows' logits rows are known before the step runs (the step's layout).
    CudaModel::step_logits_rows(batch_, logits_row_);
    first_sampled_row(batch, logits_row_, first_row_);
    rows_.assign(samples->rows.begin(), samples->rows.end());
    for (size_t i = 0; i < batch.size(); ++i) {
      const RunnerSeq& s = batch[i];
      if (s.sample_rows > 0 && (s.sample_begin < 0 || s.sample_begin + s.sample_rows > static_cast<int>(rows_.size())))
        return make_error(StatusCode::kInternal, "sampling: seq {} rows [{}, +{}) outside the step's {} rows", i,
                          s.sample_begin, s.sample_rows, rows_.size());
      for (int j = 0; j < s.sample_rows; ++j) {
        SampleRow& r = rows_[static_cast<size_t>(s.sample_begin + j)];
        r.logits_row = static_cast<int32_t>(first_row_[i] + j);
        if (r.q_row < 0) continue;
        if (r.q_row >= q_rows_[s.slot])
          return make_error(StatusCode::kInternal, "sampling: slot {} has no stored draft distribution {}", s.slot,
                            r.q_row);
        r.q_row += s.slot * model_->draft_tokens();
      }
    }
    out.samples.resize(rows_.size());
    TANDEM_RETURN_IF_ERROR(model_->forward_sample(batch_, rows_, samples->prompt_ids, samples->counts, samples->masks,
                                                  samples->mask_words, out.samples));
    // The layout the rows assumed is the one the step used: both are CudaModel::step_logits_rows of
    // this batch (a graph step's padding sequences come after it and are not reported), so this
    // guards the model's bookkeeping, not a case the engine can produce.
    const auto used = model_->last_logits_rows();
    if (!std::equal(used.begin(), used.end(), logits_row_.begin(), logits_row_.end()))
      return make_error(StatusCode::kInternal,
                        "sampling: the step's logits rows [{}] differ from the planned layout [{}] ({} sequences)",
                        fmt::join(used, ","), fmt::join(logits_row_, ","), batch.size());
    return Status();
  }

  Status draft_propose(std::span<const DraftQuery> reqs, std::vector<DraftProposal>& out) override {
    out.resize(reqs.size());
    // Sampled requests' q stay on the device, in the slot's rows of the draft store.
    TANDEM_RETURN_IF_ERROR(model_->draft_propose(reqs, /*want_probs=*/false, results_));
    for (size_t i = 0; i < reqs.size(); ++i) {
      to_draft_proposal(results_[i], !is_greedy(reqs[i].temperature), out[i]);
      q_rows_[reqs[i].slot] = out[i].sampled ? static_cast<int>(out[i].tokens.size()) : 0;
    }
    return Status();
  }

 protected:
  Status insert_draft_context(int slot, int64_t start_pos, int64_t rows, int batch_index) override {
    return model_->draft_insert_context_from_step(slot, start_pos, batch_index, rows);
  }
  void reset_draft_store(int slot) override { q_rows_[slot] = 0; }
  // Snapshots stay on the device: copies on the model's stream, no synchronization.
  Status allocate_snapshots(int count) override { return model_->allocate_snapshots(count); }
  Status save_snapshot(int slot, int index) override { return model_->save_snapshot(slot, index); }
  Status load_snapshot(int slot, int index) override { return model_->load_snapshot(slot, index); }

 private:
  int max_graph_batch_ = 0;
  SyntheticOptions synthetic_;  // name empty: the checkpoint in ck_.dir
  int tp_rank_ = 0, tp_size_ = 1;
  DataComm* comm_ = nullptr;    // the device data plane (tp_size > 1), owned by the caller
  int device_ = 0;              // CUDA ordinal
  int64_t allocs_at_start_ = 0;
  StepBatch batch_;
  std::vector<int64_t> logits_row_, first_row_;
  std::vector<SampleRow> rows_;
  std::vector<int> q_rows_;  // per slot: draft distributions stored on the device (0: none)
  std::vector<DraftResult> results_;
};

}  // namespace

bool cuda_runner_available() { return kernels::cuda::device_count() > 0; }

Result<std::unique_ptr<ModelRunner>> create_cuda_runner(const EngineConfig& config, int tp_rank, int tp_size,
                                                        DataComm* comm, int device) {
  if (kernels::cuda::device_count() == 0)
    return make_error(StatusCode::kUnavailable, "--device cuda: no CUDA device is visible (driver missing or no GPU)");
  if (device < 0 || device >= kernels::cuda::device_count())
    return invalid_argument("--device cuda: device {} does not exist ({} visible)", device,
                            kernels::cuda::device_count());
  // --synthetic: the built-in official config (open_runner_checkpoint); the model directory only
  // supplies the tokenizer (ids it cannot decode become no text).
  TANDEM_ASSIGN_OR_RETURN(RunnerCheckpoint ck, open_runner_checkpoint(config, &CudaModel::state_sizes));
  SyntheticOptions synth;
  synth.name = config.synthetic;
  synth.seed = config.synthetic_seed;
  return std::unique_ptr<ModelRunner>(new CudaRunner(std::move(ck), config.max_cudagraph_capture_size,
                                                     std::move(synth), tp_rank, tp_size, comm, device));
}

}  // namespace tandem

#else  // no CUDA toolkit at build time

namespace tandem {
bool cuda_runner_available() { return false; }
Result<std::unique_ptr<ModelRunner>> create_cuda_runner(const EngineConfig&, int, int, DataComm*, int) {
  return make_error(StatusCode::kUnimplemented,
                    "--device cuda: this build has no CUDA runner (the CUDA toolkit was not found at build time)");
}
}  // namespace tandem

#endif

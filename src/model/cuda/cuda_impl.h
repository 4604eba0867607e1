// CudaModel::Impl: device weights, state layout, scratch and the layer pieces shared by the target
// forward (cuda_forward.cpp), the DSpark draft (cuda_dspark.cpp) and the state API (cuda_model.cpp).
// Mirrors DsV4Model::Impl (src/model/impl.h) piece for piece, on device pointers.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/comm.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/gemm_tc.h"
#include "kernels/ops.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/decode_path.h"
#include "model/cuda/kv_record.h"
#include "model/cuda/model_kernels.h"
#include "model/cuda/moe_prefill.h"
#include "model/cuda/norm_rope.h"
#include "model/math.h"

namespace tandem {

namespace cuda_model {

struct DLinear {
  kernels::WeightRef w;       // device pointers
  bool act_quant = false;
  int64_t out = 0, in = 0;
};
struct DComp {
  int ratio = 0, head_dim = 0;
  bool overlap = false, rotate = false;
  DLinear wkv, wgate;
  const float* ape = nullptr;
  const float* norm = nullptr;
};
struct DAttn {
  // This rank's query heads, output groups and index heads (the config's counts / tp_size).
  int64_t n_heads = 0, n_groups = 0, n_idx_heads = 0;
  DLinear wq_a, wq_b, wkv, wo_a, wo_b;
  const float *q_norm = nullptr, *kv_norm = nullptr, *attn_sink = nullptr;
  bool has_compressor = false, has_indexer = false;
  DComp comp;
  DLinear idx_wq_b, idx_wproj;
  DComp icomp;
};
struct DMoE {
  bool hash = false;
  DLinear gate;
  const float* bias = nullptr;
  const int32_t* tid2eid = nullptr;
  // This rank's routed experts [expert_begin, expert_begin + n_local) (every expert on one rank),
  // concatenated by rows: expert e's rows start at (e - expert_begin) * rows of one expert.
  int expert_begin = 0, n_local = 0;
  kernels::WeightRef w1_all, w2_all, w3_all;
  bool up_act_quant = false, down_act_quant = false;
  DLinear sh_w1, sh_w2, sh_w3;
  bool grouped = false;               // MXFP4 experts the grouped prefill path can run (moe_prefill.h)
};
struct DBlock {
  int ratio = 0;
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  const float *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
  const float *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  DAttn attn;
  DMoE ffn;
};
struct DDraft {
  std::vector<DBlock> stages;
  DLinear main_proj;
  const float *main_norm = nullptr, *norm = nullptr;
  const float *hc_head_fn = nullptr, *hc_head_base = nullptr, *hc_head_scale = nullptr;
  DLinear markov_w1, markov_w2;
  const float* confidence = nullptr;
};
struct DWeights {
  // Vocabulary-parallel embedding and LM head: this rank's rows [vocab_begin, vocab_end).
  int64_t vocab_begin = 0, vocab_end = 0;
  DLinear embed, head;
  const float *norm = nullptr, *hc_head_fn = nullptr, *hc_head_base = nullptr, *hc_head_scale = nullptr;
  std::vector<DBlock> layers;
  bool has_draft = false;
  DDraft draft;
};

// Byte layout of one slot's device state and of one pool block.
struct DeviceLayout {
  KvRecordLayout rec;
  IndexKeyLayout key;
  int win_ring = 0;
  std::vector<LayerState> layers;
  std::vector<int> comp_ring, icomp_ring;     // per layer (0 when absent)
  std::vector<int64_t> comp_chans, icomp_chans;
  int64_t slot_bytes = 0;     // all layers' rings of one slot
  int64_t block_bytes = 0;    // one pool block, all layers
  // DSpark context rings of one slot: [stages, draft_ring, rec.bytes], position p at row
  // p % draft_ring; draft_ring = W + max_rollback (a step's unaccepted rows never overwrite the
  // W rows before its first one: CudaModelOptions::draft_insert_in_step).
  int draft_ring = 0;
  int64_t draft_slot_bytes = 0;
};
DeviceLayout plan_layout(const ModelConfig& cfg, const ModelOptions& opt, bool has_draft);

// Runs `launch` (device work on `stream`) eager_reps times eagerly and reps times as a replay of
// one captured CUDA graph (two warm-up runs each); the graph's kernel and copy nodes, the medians
// and every replay's time. `hook` (optional) is called once with a function replaying the graph.
// `marks` (optional) is where the launches record their op classes while the graph is captured.
// `ablate`: also StepProfile::ablation (each kernel's nodes removed in turn, reps replays each).
CudaModel::StepProfile time_eager_and_graph(cudaStream_t stream, int reps, int eager_reps,
                                            const std::function<void()>& launch, const CudaModel::ReplayHook& hook,
                                            std::vector<CudaModel::ClassMark>** marks, bool ablate = false);

}  // namespace cuda_model

struct CudaModel::Impl {
  ModelConfig cfg;
  CudaModelOptions copt;
  ModelOptions opt;
  LoadReport report;
  std::string origin;          // "DIR" or "synthetic NAME (seed S)", for logs
  cuda_model::DWeights w;
  cuda_model::DeviceLayout lay;
  cudaStream_t stream = nullptr;
  // The mHC comb's branch (kernels::cuda::HcCombSide): the layer halves' Sinkhorn runs on
  // side_stream beside the main chain; hc_post (its reader) joins it first (join_comb).
  cudaStream_t side_stream = nullptr;
  cudaEvent_t comb_fork = nullptr, comb_join = nullptr;
  bool comb_pending = false;   // a comb branch forked and not yet joined into `stream`
  void join_comb();
  // The compressors' branch (attention_target, decode rows): x's projections, the compressors' rows,
  // entries and pool stores run on comp_stream beside q_and_kv; the indexer joins its compressor
  // (comp_join_idx), the attention the whole branch (comp_join).
  cudaStream_t comp_stream = nullptr;
  cudaEvent_t comp_fork = nullptr, comp_join_idx = nullptr, comp_join = nullptr;
  // The ring commit's branch (attention_target): forked after the attention (the last reader of the
  // rings' old rows), joined before the next layer's attention_target rewrites the step rows it
  // copies (join_ring), and at the end of every forward.
  cudaStream_t ring_stream = nullptr;
  cudaEvent_t ring_fork = nullptr, ring_join = nullptr;
  bool ring_pending = false;
  void join_ring();
  std::string device_name;
  int64_t own_bytes = 0;       // device bytes this model allocated (weights, state, scratch)
  int64_t max_rows = 0;        // rows of the scratch (max(step tokens, draft rows))
  int64_t max_logits_rows = 0;
  int max_draft_requests = 0;
  int draft_k = 0;             // tokens per draft proposal (<= dspark_block_size)
  int64_t max_entries = 0;     // indexer score columns per row (max visible CSA entries)
  int64_t score_rows = 0;      // rows of the indexer score buffer (chunking)
  int sm_count = 0;            // multiprocessors of the device

  template <typename T>
  using Buf = kernels::cuda::DeviceBuffer<T>;
  Buf<uint8_t> weight_arena;
  Buf<float> rope_swa, rope_comp;   // inverse frequencies [rope_dim/2]
  Buf<uint8_t> slot_state;          // [max_slots, lay.slot_bytes]
  Buf<uint8_t> pool;                // [num_blocks, lay.block_bytes]
  Buf<uint8_t> draft_ctx;           // [max_slots, lay.draft_slot_bytes]
  std::vector<int64_t> slot_len;
  // Prefix-cache snapshots (allocate_snapshots): [count, lay.slot_bytes + lay.draft_slot_bytes],
  // each a slot's rings then its draft context; the lengths stay on the host (-1: never saved).
  Buf<uint8_t> snapshots;
  std::vector<int64_t> snap_len;

  // ---- step plan: one pinned host staging area mirrored on the device, copied once per step ----
  // Each step packs its own layout (Step::plan) from the start of the staging and copies only
  // that: its rows, sequences and logits rows, and block tables step.table_width wide (its context
  // bucket's blocks) rather than max_blocks (the model's whole context: 16 KB a sequence at 1M
  // positions) for every sequence the runner holds. plan_capacity: the same packing at every
  // array's longest.
  struct PlanLayout {
    size_t tokens = 0, positions = 0, row_seq = 0, seq_start = 0, seq_row0 = 0, seq_len = 0, seq_slot = 0,
           head_src = 0, taps_dst = 0, block_tables = 0, bytes = 0;
    // Byte offsets of the arrays of `rows` rows, `seqs` sequences, `lrows` logits rows and block
    // tables `width` wide, each on 16 bytes.
    static PlanLayout pack(int64_t rows, int64_t seqs, int64_t lrows, int64_t width);
  };
  size_t plan_capacity = 0;
  int max_blocks = 0;           // block tables' largest width per sequence
  uint8_t* plan_host = nullptr; // pinned
  Buf<uint8_t> plan_dev;
  cuda_model::StepMeta meta;    // pointers into plan_dev: the last prepared step's layout

  // ---- scratch (device, sized at start-up) ----
  Buf<float> h, x, a, post, comb, qr, q, kv, o, u, tmp_kv, tmp_gate, tmp_ikv, tmp_igate, comp_rows, icomp_rows, entry, iq,
      iw, gate_logits, ew, xq, gact, gq, pair_out, sh_g, sh_u, sh_out, head_in, head_y, logits, taps, mh, main_x, base, bias,
      e_row, yn;
  Buf<uint8_t> kv_rec, entry_rec;
  Buf<float> attn_partial;         // split-K attention: attn_partial_slots (row, chunk) partials
  int64_t attn_partial_slots = 0;
  Buf<uint16_t> attn_keys;         // the attention's key-row scratch (AttnArgs::key_rows): attn_keys_rows x hd bf16
  int64_t attn_keys_rows = 0;
  Buf<uint16_t> idx_scores;        // indexer scores (bf16) of a chunk of rows
  Buf<uint8_t> topk_counters, topk_work;  // the indexer top-k's state (indexer_topk.h)
  Buf<int64_t> entry_pos, draft_pos;
  Buf<int32_t> flag, visible, topk, eids, draft_ids;
  // ---- tensor parallelism (opt.tp_size > 1): the collectives of forward.cpp, on the device ----
  Buf<float> tp_local, tp_gather;   // LM head: this rank's [rows, P] logits, every rank's [size, rows, P]
  Status comm_status;               // the first collective failure of the step (reported by finish)
  bool tp() const { return opt.tp_size > 1; }
  // In place, stream-ordered: x[n] = sum over ranks (fp32).
  void all_reduce(float* xx, int64_t n);
  void all_reduce_raw(void* xx, int64_t n, CommDtype dtype);  // n elements of dtype, summed as comm.h says
  // The epilogue of a sub-block output's all-reduce (wo_b's bf16 round: the CPU's all_reduce_bf16;
  // moe_reduce_shared's shared-expert add and round), left for the consumer hc_post to apply as it
  // loads f (HcPostParams::f_add, f_round): one launch fewer per collective. f: the output it belongs
  // to (null: none pending); hc_post of that f takes it, and every hc_post clears it.
  struct {
    float* f = nullptr;
    const float* add = nullptr;
  } f_epilogue;
  // Test hook (cuda_model_testing.h): the epilogues as their own launches on f after the all-reduce
  // (round_bf16, moe_add_shared: the forward before the load epilogue), the reference it is tested
  // against at the model level.
  bool epilogue_launches = false;
  // h rows (every hc stream) = embedding of ids: vocabulary-parallel under tensor parallelism.
  void embed_tokens(const int32_t* ids, int64_t n);
  // logits[n, V] = yn W_head^T (fp32): each rank its vocabulary rows, then gathered.
  void head_gemm(const cuda_model::DLinear& head, const float* yn, int64_t n, float* logits_out);
  // ---- measurement aids (bench-model): op classes of the launches and the routed experts ----
  std::vector<CudaModel::ClassMark>* marks = nullptr;  // non-null while a profiled step is captured
  CudaModel::OpClass cur_class = CudaModel::OpClass::kOther;
  std::unordered_map<cudaGraphNode_t, cudaGraphNodeType> mark_types;  // node types seen in this capture
  void section(CudaModel::OpClass c);
  Buf<int32_t> route_rec;            // [layers + draft stages, max_rows * topk] expert ids of a recorded step
  bool recording_routes = false;
  uint64_t* moe_timeline = nullptr;  // set_moe_timeline: records of layer moe_timeline_layer's decode MoE
  int moe_timeline_layer = -1;
  Buf<int32_t> fill_table;           // block ids of a synthetic context fill [max_blocks]
  // draft request arrays (device) + pinned staging
  // The request arrays of a B-request draft as one region in draft_host's layout (slots | prev:
  // the anchors, then each Markov step's token | positions | T | seeds; 32 bytes a request), so
  // one copy uploads them.
  Buf<uint8_t> d_draft_in;
  struct DraftIn {
    int32_t* slot;
    int32_t* prev;
    int64_t* pos;
    double* temp;
    uint64_t* seed;
  };
  DraftIn draft_in(int64_t B) const {
    uint8_t* p = d_draft_in.get();
    return {reinterpret_cast<int32_t*>(p), reinterpret_cast<int32_t*>(p + 4 * B), reinterpret_cast<int64_t*>(p + 8 * B),
            reinterpret_cast<double*>(p + 16 * B), reinterpret_cast<uint64_t*>(p + 24 * B)};
  }
  Buf<int32_t> d_tokens;
  Buf<float> d_conf, d_zlogits, d_probs;
  Buf<uint8_t> markov_scratch;     // markov_step's per-request chunk records and counters (draft.h)
  uint8_t* draft_host = nullptr;  // pinned staging for request arrays and results
  size_t draft_host_bytes = 0;
  Buf<float> q_store;             // [max_slots, draft_k, V]: sampled drafts' q, by slot

  // ---- sampling (cuda_sampling.cpp): fixed device buffers and their pinned staging ----
  int sample_rows_cap = 0;        // rows per sampling launch
  int64_t sample_ints_cap = 0;    // prompt ids + (token, count) ints per launch
  int64_t mask_words = 0;         // (V + 31) / 32
  Buf<SampleRow> d_srows;
  Buf<SampleRowResult> d_sres;
  Buf<uint32_t> d_smasks;
  Buf<int32_t> d_sints;
  Buf<uint8_t> d_sscratch;
  uint8_t* sample_host = nullptr; // pinned: rows | results | masks | ints
  // The sampler inside the step's graph (forward_sample): decode/verify graphs captured with
  // `graph_sampler` end with the sampling launch over d_srows[0, graph_srows), the descriptors
  // uploaded before the replay. graph_srows is the key's last field while a step runs.
  bool graph_sampler = false;
  int graph_srows = 0;
  SampleInputs sample_inputs() const;
  // Packs rows[begin..] (their arrays next to them) into the staging area, at most `limit` rows;
  // returns how many fit and the ints/masks they took.
  int pack_sample_rows(std::span<const SampleRow> rows, std::span<const int32_t> prompt_ids,
                       std::span<const int32_t> counts, std::span<const uint32_t> masks, int64_t mask_words,
                       size_t begin, int limit, int64_t& nints, int& nmask);
  void upload_sample_rows(int n, int64_t nints, int nmask);  // staging -> d_srows / d_sints / d_smasks
  // Allocates the sampling buffers (measure: only returns the device bytes they need).
  int64_t alloc_sampling(bool measure);
  Status check_sample_rows(std::span<const SampleRow> rows, std::span<const int32_t> prompt_ids,
                           std::span<const int32_t> counts, std::span<const uint32_t> masks, int64_t mask_words,
                           size_t out_size, int64_t lrows = -1) const;
  Status sample_rows(std::span<const SampleRow> rows, std::span<const int32_t> prompt_ids,
                     std::span<const int32_t> counts, std::span<const uint32_t> masks, int64_t mask_words,
                     std::span<SampleRowResult> out);
  // Draft context from n taps rows (host or device memory, per kind) at positions start_pos.. .
  Status insert_draft_context(int slot, int64_t start_pos, const float* taps_rows, int64_t n, cudaMemcpyKind kind);
  // The draft's context KV of n rows of taps (device rows at taps_rows, or host rows when kind says
  // so): rounded to bf16, main_proj and its norm into main_x, then per stage its wkv, the kv norm,
  // RoPE at positions[t] and its records, handed to `store(stage, records)`.
  template <typename Store>
  void draft_context_records(const float* taps_rows, int64_t n, cudaMemcpyKind kind, const int64_t* positions,
                             int64_t stage_stride, Store store);  // stage st's records at kv_rec + st * stage_stride
  // Inside launch(): every row of the step into the draft's context rings at its position
  // (step.ctx_in_step; CudaModelOptions::draft_insert_in_step).
  void insert_step_context();

  // The step being run (prepare -> launch -> finish).
  struct Step {
    const StepBatch* batch = nullptr;  // what runs: a graph step's padded copy (finish() advances its slots)
    // The caller's sequences, the first of `batch`'s: a graph step's padding sequences follow them,
    // and last_logits_rows() reports only these.
    size_t seqs = 0;
    int64_t rows = 0, lrows = 0, trows = 0, max_end = 0;
    // Context bound the launch grids are sized for: max_end (eager) or its power-of-two bucket
    // (graph replay), so one graph serves every position up to the bucket.
    int64_t end_bound = 0;
    // The step's plan layout (prepare_plan; meta points into it) and the width of each sequence's
    // block table there (meta.max_blocks: the tables' stride): the blocks of the step's context
    // bucket (graph_bound), so the copy and the pointers a graph captured fit every step that
    // replays it.
    PlanLayout plan;
    int table_width = 0;
    std::vector<int64_t> logits_row, taps_row;
    // The step's GEMMs take the tensor cores (cuda_prefill.cpp) only when one of its sequences
    // adds more than tc_min_rows tokens, or it has more rows than the decode path holds; otherwise
    // every row of it runs the decode kernels (or the generic ops), so a row of a decode, a verify
    // or a short prompt gets the same bits whatever else shares its step (prepare_plan).
    bool tc = false;
    // The step inserts its rows into the draft's context rings itself (insert_step_context), so
    // draft_insert_context_from_step has nothing left to do for it.
    bool ctx_in_step = false;
  } step;
  bool in_step = false;  // launch() is running step (a forward's layers), not a draft
  // Whether a call of m rows runs on the tensor cores: the step's choice inside a forward, the row
  // count elsewhere (the draft's context insertion and proposals).
  bool tc_rows(int64_t m) const { return in_step ? step.tc : m > copt.tc_min_rows; }
  // ---- CUDA graphs: key = (sequences, tokens per sequence, logits mode, taps, context bucket,
  // rows of the sampler launch that ends the graph: 0 = none) ----
  using GraphKey = std::tuple<int, int, int, int, int64_t, int>;
  std::map<GraphKey, cudaGraphExec_t> graphs;
  std::map<std::pair<int64_t, bool>, cudaGraphExec_t> draft_graphs;  // (requests, probabilities wanted)
  CudaModel::GraphStats gstats;
  int64_t graph_context_captured = 0;  // capture_graphs' decode and verify graphs cover contexts up to this
  // Blocks until the stream's work is done; the time it blocked adds to wait_s (the engine's
  // device-wait figure).
  void wait_stream();
  double wait_s = 0;
  // The host's side of a step call (forward, forward_sample, sample, draft_propose): from the
  // outermost call's entry to the start of its first wait_stream() (packing, uploads, launches),
  // summed into submit_s (the engine's device-submit figure). A CallTimer marks the entry.
  double submit_s = 0;
  int call_depth = 0;
  bool call_open = false;
  std::chrono::steady_clock::time_point call_t0{};
  struct CallTimer {
    Impl& m;
    explicit CallTimer(Impl& i) : m(i) {
      if (m.call_depth++ > 0) return;
      m.call_t0 = std::chrono::steady_clock::now();
      m.call_open = true;
    }
    ~CallTimer() {
      if (--m.call_depth == 0) m.call_open = false;
    }
    CallTimer(const CallTimer&) = delete;
    CallTimer& operator=(const CallTimer&) = delete;
  };
  int pad_slot = -1;            // the slot padding sequences run in (one past the engine's slots)
  int pad_block = -1;           // the pool block padding sequences write to
  StepBatch padded;             // the padded copy of a graph step
  std::vector<int32_t> pad_tokens, pad_table;

  ~Impl();
  Status prepare(const StepBatch& batch, StepOutput* host_out);  // validate + plan (eager)
  // bound: the context bucket the step's block tables are laid out for (0: graph_bound of its
  // longest sequence's end; capture_graphs passes the bucket it captures).
  void prepare_plan(const StepBatch& batch, StepOutput* host_out, int64_t bound = 0);
  bool graph_step(const StepBatch& batch);
  // The context bound a graph step whose sequences end at `end` is captured for: its power-of-two
  // bucket (from 256), no longer than the model's positions.
  int64_t graph_bound(int64_t end) const;
  void launch();
  void finish(StepOutput* host_out, bool synchronize = true);
  void capture(const GraphKey& key);  // eager launch, then capture and keep the step's graph
  void capture_draft(int64_t B, bool want_probs);  // the same for a draft of B staged requests
  // Runs `launch` eagerly (kernel attributes and op scratch are set up outside any capture), then
  // captures the same launches into an instantiated graph.
  template <typename F>
  cudaGraphExec_t capture_after_eager(F&& launch) {
    launch();
    cudaGraph_t g;
    TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    launch();
    TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    cudaGraphExec_t ge;
    TANDEM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    TANDEM_CUDA_CHECK(cudaGraphDestroy(g));
    ++gstats.captures;
    ++gstats.instantiations;
    ++gstats.eager;
    return ge;
  }
  // The draft's device work for B staged requests (draft_host): capturable. Its pieces (run apart by
  // the test hooks): the request arrays' upload and the blocks' embedding into h, each stage's two
  // halves over h, and the heads with the Markov steps.
  void launch_draft(int64_t B, bool want_probs);
  void draft_inputs(int64_t B);
  void draft_stage_attention(int stage, int64_t B);
  void draft_stage_ffn(int stage, int64_t B);
  void draft_heads(int64_t B, bool want_probs);

  // ---- prefill on the tensor cores (cuda_prefill.cpp): steps of more than copt.tc_min_rows rows ----
  Buf<uint8_t> tc_codes, moe_scratch;
  Buf<float> tc_scales;
  Buf<uint16_t> tc_bf16;                       // bf16 copy of a bf16-weight linear's input
  std::vector<Buf<uint16_t>> tc_bf16_copies;   // bf16 copies of FP8 wo_a weights (exact)
  std::map<const void*, kernels::WeightRef> tc_bf16_weights;  // FP8 weight data -> its bf16 copy
  kernels::cuda::TcLinearScratch tc;
  cuda_model::MoePrefillScratch moe_tc;
  // At start-up, after the step scratch (measure: allocates nothing, returns the device bytes).
  int64_t alloc_prefill(bool measure);
  // Each returns false when the shape has no tensor-core path (the caller runs the GEMV kernels).
  bool linear_tc(const cuda_model::DLinear& l, const float* x, int64_t m, float* y, bool round_out, int64_t ldy = 0);
  bool gemm_bf16_tc(const kernels::GemmParams& p);
  // Linears that share an input convert it once (FP8 codes, bf16 copy) inside a TcShare scope: the
  // scope names an input its code does not write; a conversion of it still held in the scratch (the
  // same rows, k and stride, no other input converted since) is reused. Outside a scope: never.
  struct TcHeld {
    const float* x = nullptr;
    int64_t m = 0, k = 0, ldx = 0;
    bool operator==(const TcHeld&) const = default;
  };
  const float* tc_share_src = nullptr;
  TcHeld tc_codes_of, tc_xb_of;  // what the scratch's codes / bf16 copy hold (in the scope)
  struct TcShare {
    Impl& im;
    TcShare(Impl& i, const float* src) : im(i) {
      im.tc_share_src = src;
      im.tc_codes_of = {};
      im.tc_xb_of = {};
    }
    ~TcShare() {
      im.tc_share_src = nullptr;
      im.tc_codes_of = {};
      im.tc_xb_of = {};
    }
    TcShare(const TcShare&) = delete;
    TcShare& operator=(const TcShare&) = delete;
  };
  bool moe_routed_tc(const cuda_model::DMoE& mo, const float* x, int64_t n);  // -> pair_out

  // ---- decode-size kernels (cuda_decode.cpp): each returns false, launching nothing, when the
  // weights do not suit them (the caller then runs the generic ops) ----
  cuda_model::DecodePath dec;
  int64_t dec_allocate(bool measure);  // measure: allocates nothing, returns the device bytes
  void dec_pack(const float* x, int64_t m, int64_t k, const float* norm_weight = nullptr, float* normed = nullptr);
  // Whether dec_norm_rows packs [rows, dim] (else it runs norm_rows).
  bool dec_packs(int64_t rows, int64_t dim) const;
  // norm_rows(x) fused with x's quantization for the next q/kv or MoE (falls back to norm_rows).
  void dec_norm_rows(float* x, int64_t rows, int64_t dim, const float* weight);
  // hc_pre(p) then dec_norm_rows(p.x, weight) in one kernel (hc_pre_pack) where dec_packs.
  bool dec_hc_pre_norm(const kernels::HcPreParams& p, const float* weight);
  void dec_codes_of(const float* x, int64_t n, int64_t k);
  bool dec_linear(const cuda_model::DLinear& l, const float* x, int64_t m, float* y, bool round_out, int64_t ldy = 0);
  bool dec_q_and_kv(const cuda_model::DAttn& at, const float* x, int64_t n);
  // x's bf16 projections (the compressors' wkv/wgate, the indexer's weights_proj) as one launch;
  // returns whether they group (launch = false: only whether they would).
  bool dec_x_projections(const cuda_model::DAttn& at, int ratio, const float* x, int64_t n, float* comp_kv,
                         float* comp_gate, float* icomp_kv, float* icomp_gate, bool launch = true);
  bool dec_output_proj(const cuda_model::DAttn& at, const float* o, int64_t n, float* y);
  bool dec_moe(const cuda_model::DMoE& m, const float* x, const int32_t* tokens, int64_t n, float* y, int layer);

  Status init(const ModelConfig& config, const CudaModelOptions& options);
  Status validate_step(const StepBatch& batch) const;

  // ---- layer pieces (cuda_forward.cpp) ----
  // y [m, ldy] (0: the weight's rows) = x W^T on the path the weight and row count pick.
  void linear(const cuda_model::DLinear& l, const float* x, int64_t m, float* y, bool round_out = true,
              int64_t ldy = 0);
  void norm_rows(float* x, int64_t rows, int64_t dim, const float* weight);
  // With norm_weight: then xo = RMSNorm(xo) as dec_norm_rows does (x's codes packed for the decode
  // q/kv or MoE), fused into hc_pre's last kernel where the decode pack applies.
  void hc_pre(const float* hh, int64_t n, const float* fn, const float* scale, const float* base, float* xo,
              float* posto, float* combo, const float* norm_weight = nullptr);
  // hh = hc_post(f = aa, res = rr), aa loaded with its pending all-reduce epilogue (f_epilogue).
  void hc_post(const float* aa, const float* rr, int64_t n, float* hh);
  // layer >= 0: a target layer or (num_hidden_layers + s) draft stage s (its expert ids are kept
  // when a step's routing is recorded).
  void moe(const cuda_model::DMoE& m, const float* xx, const int32_t* tokens, int64_t n, float* y, int layer = -1);
  // Where the last moe() left its gate logits [n, n_routed_experts] and global expert ids [n, topk]:
  // the generic path's buffers or the decode MoE's (host bookkeeping for the layer-by-layer test
  // hooks of cuda_model_testing.h; nothing on the device reads it).
  struct {
    const float* gate_logits = nullptr;
    const int32_t* expert_ids = nullptr;
  } last_routing;
  // The last CSA layer's last chunk of indexer rows [r0, r0 + rows) left in idx_scores ([rows, lds]
  // bf16 bits, cols valid columns): host bookkeeping for the same test hooks.
  struct {
    int64_t r0 = 0, rows = 0, lds = 0, cols = 0;
  } last_indexer;
  // q (normed, no RoPE yet) and kv (normed, no RoPE yet) of n rows of xx; qr kept for the indexer.
  void q_and_kv(const cuda_model::DAttn& at, const float* xx, int64_t n, const float* rope, const int64_t* positions);
  void output_proj(const cuda_model::DAttn& at, float* oo, int64_t n, float* y);
  // y = u . wo_b^T: bf16 on one rank; under tensor parallelism fp32 partials, all-reduced, rounded
  // by the consumer hc_post as it loads y (f_epilogue).
  void wo_b(const cuda_model::DAttn& at, int64_t n, float* y);
  // Under tensor parallelism: y (this rank's fp32 routed sum, [n, hidden]) all-reduced; bf16(y +
  // shared) is then the consumer hc_post's, as it loads y (f_epilogue).
  void moe_reduce_shared(float* y, const float* shared, int64_t n);
  void attention_target(int layer, int64_t n, float* y);
  // kv_buf / gate_buf: [n, chans] scratch of the compressor's two projections of xx.
  void run_compressor(const cuda_model::DComp& cw, int64_t ring_off, int ring, float* rows_buf, int64_t pool_off,
                      const float* xx, int64_t n, float* kv_buf, float* gate_buf);
  void block_forward(int layer, int64_t n);
  // The layer's two halves over h (block_forward runs both; the test hooks of
  // cuda_model_testing.h run them apart): mHC + attention with its state, and mHC + MoE.
  void attention_half(int layer, int64_t n);
  void ffn_half(int layer, int64_t n);
  void head_logits(const float* hin, int64_t n, const cuda_model::DWeights& ww, const float* hc_fn,
                   const float* hc_scale, const float* hc_base, const float* norm, float* y_out, float* logits_out);
};

namespace cuda_model {
// Start-up pieces shared by the checkpoint (cuda_model.cpp) and synthetic (cuda_measure.cpp) paths.
// The options and tensor-parallel group a model can start with (InvalidArgument naming the field).
Status validate_start(const ModelConfig& config, const CudaModelOptions& options);
// Allocates every buffer of m (sized from cfg, options, weight shapes and layout); measure: only
// returns the device bytes they would take.
int64_t allocate_all(CudaModel::Impl& m, bool measure);
// kResourceExhausted with the bytes needed (by pool) and free when they do not fit the device.
Status check_fits(const CudaModel::Impl& m, int64_t weight_bytes, int64_t buffer_bytes);
}  // namespace cuda_model

}  // namespace tandem

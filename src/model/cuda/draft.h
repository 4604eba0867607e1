// DSpark's device pieces besides attention (the CPU: src/model/dspark.cpp and the taps in
// src/model/model.cpp): the target taps, the draft block's ids and positions, and the sequential
// Markov head (gather of markov_w1 rows, the corrected logits, confidence and the drafted token).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::cuda_model {

// taps[dst_row[t]][col_off + d] = bf16(mean_k h[t][k][d]) for rows with dst_row[t] >= 0.
struct TapsMeanArgs {
  const float* h = nullptr;          // [rows, hc, dim]
  const int32_t* dst_row = nullptr;  // [rows] taps row of each step row, -1 = none
  int64_t rows = 0;
  int hc = 4;
  int64_t dim = 0;
  float* taps = nullptr;             // [*, td]
  int64_t td = 0;
  int64_t col_off = 0;
};
void taps_mean(const TapsMeanArgs& a, cudaStream_t s);

// positions[i] = base[i / per] + i % per (draft block positions)
struct BlockPositionsArgs {
  const int64_t* base = nullptr;     // [count / per]
  int64_t count = 0;
  int per = 1;
  int64_t* positions = nullptr;      // [count]
};
void block_positions(const BlockPositionsArgs& a, cudaStream_t s);

// positions[i] = start + i
struct IotaPositionsArgs {
  int64_t start = 0;
  int64_t count = 0;
  int64_t* positions = nullptr;      // [count]
};
void iota_positions(const IotaPositionsArgs& a, cudaStream_t s);

// ids[b*K + t] = t == 0 ? anchor[b] : noise
struct DraftBlockIdsArgs {
  const int32_t* anchor = nullptr;   // [B]
  int64_t B = 0;
  int K = 5;
  int32_t noise = 0;
  int32_t* ids = nullptr;            // [B, K]
};
void draft_block_ids(const DraftBlockIdsArgs& a, cudaStream_t s);

// e[b] = markov_w1 row prev[b] (dense, as stored)
struct MarkovGatherArgs {
  kernels::WeightRef w1;             // [V, rank]
  const int32_t* prev = nullptr;     // [B]
  int64_t B = 0;
  int64_t rank = 0;
  float* e = nullptr;                // [B, rank]
};
void markov_gather(const MarkovGatherArgs& a, cudaStream_t s);

// One Markov step of every request's draft block (position i), after markov_gather (or the
// previous step's e_next) and the caller's bias = e @ markov_w2^T: z = base[b*K+i] + bias[b];
// conf[b*K+i] = dot([y[b*K+i], e], conf_w); token = argmax z (greedy) or an inverse-CDF draw from softmax(z/T) with
// rng_uniform(seed[b], P_b + 1 + i, RngStream::kDraft) (kernels/sampling.h: the drafted token's
// position, the CPU draft's key); prev[b] = token; q[b*K+i] = probs.
// The vocabulary is cut into kMarkovChunk-id chunks, a CTA each (a request's whole row in one CTA
// read 1.5 MB at one SM's pace: 170 us a step at V = 129,280); the last CTA of a request (an
// arrival counter in `scratch`) finishes it from the chunks' argmax keys and mass sums. A second
// launch writes q when probs is set.
struct MarkovStepArgs {
  const float* base = nullptr;   // [B*K, V]
  const float* bias = nullptr;   // [B, V]
  const float* e = nullptr;      // [B, rank]
  const float* y = nullptr;      // [B*K, dim] hc_head output (before the norm)
  const float* conf_w = nullptr; // [dim + rank]
  const double* temperature = nullptr;  // [B]
  const uint64_t* seed = nullptr;       // [B]
  const int64_t* pos = nullptr;         // [B] anchor positions
  int64_t V = 0, dim = 0, rank = 0;
  int K = 5, i = 0;
  int32_t* prev = nullptr;       // [B] in: previous token, out: this position's token
  int32_t* tokens = nullptr;     // [B, K]
  float* conf = nullptr;         // [B, K] raw projection
  float* logits = nullptr;       // [B, K, V] z (Markov-corrected)
  float* probs = nullptr;        // optional [B, K, V]
  int64_t B = 0;
  // markov_scratch_bytes(B, V) bytes, zero before the first call (every call leaves its counters
  // zero, so a captured graph replays it as it is).
  uint8_t* scratch = nullptr;
  // Optional: a request's finishing CTA also gathers the next position's e (markov_w1's row of the
  // drawn token) into e_next (may be e), so only position 0 needs markov_gather; none after K - 1.
  kernels::WeightRef w1{};
  float* e_next = nullptr;       // [B, rank]
};
constexpr int64_t kMarkovChunk = 4096;
size_t markov_scratch_bytes(int64_t B, int64_t V);
void markov_step(const MarkovStepArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model

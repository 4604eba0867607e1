// The one draft query of the project: what the engine asks a DSpark draft for one sequence, and
// what both models (DsV4Model, CudaModel) take; the engine's DraftQuery is this type.
#pragma once

#include <cstdint>

namespace tandem {

// The anchor is the newest token (already sampled by the target, not yet run through it) at
// position P; the draft's context must cover positions < P. Draft position i (0..K-1) sits at P+i
// and predicts the token at P+i+1.
struct DraftRequest {
  int slot = 0;
  int32_t anchor_token = 0;
  int64_t anchor_pos = 0;     // P
  // Greedy (argmax of the Markov-corrected logits) when is_greedy(temperature) (kernels/sampling.h);
  // else draws from softmax(z_i / T), keyed by rng_uniform(seed, P + i + 1, kDraft).
  double temperature = 0.0;
  uint64_t seed = 0;          // the request's stream: its drafts never depend on batch neighbours
};

}  // namespace tandem

// Which part of every tensor of the official catalog one tensor-parallel rank holds, decided from
// the config alone (no weights): the same slicing load_weights applies (weights.h: heads, output
// groups, index heads, routed experts, vocabulary rows; everything else whole on every rank), as
// local shapes in the stored formats. The synthetic-weight generator allocates exactly these
// tensors on the device, start-up checks their bytes against the memory available before
// allocating anything, and the benchmarks count the bytes a step reads from them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/catalog.h"
#include "model/weights.h"

namespace tandem::model {

enum class SliceKind : uint8_t {
  kWhole,      // the whole tensor on every rank (replicated)
  kRows,       // rows [begin, begin + count) of the logical [out, in] (or [n]) tensor
  kCols,       // columns [begin, begin + count) (wo_b: row-parallel input)
  kOtherRank,  // a routed expert of another rank: not held here
  kSkipped,    // not bound by the model (draft stages when the draft is not loaded, a preview MTP stage)
};

// One stored tensor of the catalog as this rank holds it.
struct TensorSlice {
  const TensorSpec* tensor = nullptr;   // the catalog's (whole) tensor
  SliceKind kind = SliceKind::kWhole;
  int64_t begin = 0, count = 0;         // logical rows or columns (kRows / kCols)
  TensorSpec local;                     // the held tensor: name, stored dtype, local stored shape
  bool partitioned = false;             // the ranks' holdings partition the tensor (slices, experts)
  bool held() const { return kind == SliceKind::kWhole || kind == SliceKind::kRows || kind == SliceKind::kCols; }
  uint64_t bytes() const { return held() ? local.nbytes() : 0; }
};

struct ShardPlan {
  Shard shard;
  std::vector<TensorSlice> slices;            // catalog order
  std::map<std::string, size_t> index;        // tensor name -> slices[i]
  int64_t held_tensors = 0, other_rank_tensors = 0, skipped_tensors = 0;
  uint64_t held_bytes = 0;                    // stored bytes of every held tensor (this rank's slices)
  uint64_t replicated_bytes = 0;              // of those, whole tensors (every rank holds them)
  uint64_t sharded_bytes = 0;                 // of those, slices (the ranks' slices partition the tensor)
  const TensorSlice* find(const std::string& name) const;
};

// The plan of rank `shard` (validate_shard's rules: InvalidArgument when the config does not
// shard over shard.size). load_draft: bind the DSpark stages (as ModelOptions::load_draft).
Result<ShardPlan> plan_shard(const ModelConfig& config, const Catalog& catalog, const Shard& shard, bool load_draft);

// This rank's vocabulary rows [begin, end): ceil(V / size) per rank, the last one shorter.
std::pair<int64_t, int64_t> vocab_range(int64_t vocab_size, const Shard& shard);

}  // namespace tandem::model

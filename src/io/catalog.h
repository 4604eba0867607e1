// The complete tensor catalog of a DeepSeek-V4 checkpoint, derived from its ModelConfig (spec
// section 8): every parameter with its storage format, and the stored tensors (name, dtype, shape)
// it expands to. `tandem check` compares checkpoints against it; make-tiny writes exactly it; the
// model loader can use `params` to know which linears are FP8/FP4 and where their scales live.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace tandem {

// How one logical parameter is stored.
enum class Storage {
  kBF16,     // BF16 tensor of the logical shape
  kF32,      // F32 tensor of the logical shape
  kI64,      // I64 tensor (tid2eid)
  kFP8Block, // F8_E4M3 [out, in] + `.scale` F8_E8M0 [ceil(out/bn), ceil(in/bk)]
  kFP4,      // I8 [out, in/2] (two e2m1, even index low nibble) + `.scale` F8_E8M0 [out, in/32]
};

// What a parameter is, so generators (make-tiny) and loaders can treat families alike.
enum class ParamRole {
  kEmbed, kHead, kNorm, kHcFn, kHcBase, kHcScale, kAttnSink, kLinear, kCompressorApe,
  kGateWeight, kGateBias, kTid2Eid, kExpertW13, kExpertW2, kSharedW13, kSharedW2,
  kAttnOut, kMarkov, kConfidence,
};

struct ParamSpec {
  std::string name;             // the stored weight tensor's name, e.g. "layers.3.attn.wq_a.weight"
  Storage storage = Storage::kBF16;
  ParamRole role = ParamRole::kLinear;
  std::vector<int64_t> shape;   // logical shape ([out, in] for linears)
  // Stored tensors: the weight, then the scale for kFP8Block / kFP4.
  std::string scale_name() const;  // name with the trailing ".weight" replaced by ".scale"
};

struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

struct DTypeCensus {
  int64_t tensors = 0;
  uint64_t bytes = 0;
};

struct Catalog {
  std::vector<ParamSpec> params;       // in a fixed order: globals, layers, draft stages
  std::vector<TensorSpec> tensors;     // params expanded, same order
  std::map<std::string, size_t> index; // tensor name -> position in `tensors`

  const TensorSpec* find(const std::string& name) const;
  uint64_t total_bytes() const;
  std::map<DType, DTypeCensus> census() const;
};

// Builds the catalog; InvalidArgument if a dimension cannot be stored in the configured format
// (e.g. FP4 with an inner dim not divisible by 32).
Result<Catalog> build_catalog(const ModelConfig& config);

// Expands one parameter into its stored tensors (weight [+ scale]).
std::vector<TensorSpec> expand_param(const ParamSpec& p, const ModelConfig& config);

// "166,878,536,440"
std::string with_thousands(uint64_t v);

}  // namespace tandem

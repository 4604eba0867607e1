// The DeepSeek-V4 runner's own kernels (the generic ops are src/kernels/cuda, cuda_ops.h), one file
// per concern: embed.h, kv_record.h (records and their encoders), compressor.h, ring.h, indexer.h,
// indexer_topk.h, attention.h, moe.h, draft.h. Each launcher takes an Args struct (a shape comment per pointer) and
// an explicit stream; each has a CPU counterpart (named in its header) and an op-level test in
// tests/cuda/ against it. This header includes them all.
#pragma once

#include "model/cuda/attention.h"
#include "model/cuda/compressor.h"
#include "model/cuda/draft.h"
#include "model/cuda/embed.h"
#include "model/cuda/indexer.h"
#include "model/cuda/indexer_topk.h"
#include "model/cuda/kv_record.h"
#include "model/cuda/moe.h"
#include "model/cuda/ring.h"
#include "model/cuda/step_meta.h"

// A runner wrapped around the rank's own model runner (the head of a tensor-parallel group, a
// device rank): the model's facts that a step does not change are the inner runner's.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "engine/model_runner.h"

namespace tandem {

class ForwardingRunner : public ModelRunner {
 public:
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_model_len() const override { return inner_->max_model_len(); }
  int32_t eos_token_id() const override { return inner_->eos_token_id(); }
  int32_t noise_token_id() const override { return inner_->noise_token_id(); }
  std::string device() const override { return inner_->device(); }
  const Tokenizer& tokenizer() const override { return inner_->tokenizer(); }
  Status check_kv_cache_dtype(const std::string& dtype) const override { return inner_->check_kv_cache_dtype(dtype); }
  int64_t kv_bytes_per_block(int block_size, const std::string& dtype) const override {
    return inner_->kv_bytes_per_block(block_size, dtype);
  }
  int64_t slot_state_bytes() const override { return inner_->slot_state_bytes(); }
  int64_t max_sample_rows() const override { return inner_->max_sample_rows(); }

 protected:
  explicit ForwardingRunner(std::unique_ptr<ModelRunner> inner) : inner_(std::move(inner)) {}
  // Derived destructors reset it where the order matters (the model before its communicator).
  std::unique_ptr<ModelRunner> inner_;
};

}  // namespace tandem

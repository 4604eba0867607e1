// safetensors reader (mmap; one file or a sharded model.safetensors.index.json) and writer.
// Every header is validated strictly: size bounds, JSON, known dtype, shape x dtype == byte length,
// offsets inside the data region and not overlapping. A corrupt or hostile file is an error that
// names the file and tensor; nothing here reads out of bounds or aborts on file contents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem {

enum class DType : uint8_t {
  kBF16,
  kF16,
  kF32,
  kF8E4M3,   // "F8_E4M3" (e4m3fn)
  kF8E8M0,   // "F8_E8M0" (power-of-two scales, 2^(b-127))
  kI8,       // also holds packed FP4 e2m1, two per byte, even index in the low nibble
  kI32,
  kI64,
  kU8,
  kBool,
};

const char* dtype_name(DType dtype);               // "BF16", "F8_E4M3", ...
Result<DType> parse_dtype(const std::string& name);
size_t dtype_size(DType dtype);                    // bytes per element

// A tensor inside a mapped file. Data stays valid while its SafetensorsFile / Checkpoint lives.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // shard path, for error messages

  int64_t numel() const;
  template <typename T>
  std::span<const T> as() const { return {reinterpret_cast<const T*>(data), nbytes / sizeof(T)}; }
};

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Validates a whole file image given as bytes (8-byte length prefix, header, data region): the
  // same checks open() applies, without mapping anything. Used by the fuzzer.
  // Note: tensor data is aligned to its element size only if the writer laid tensors out in
  // decreasing element size (ours and the reference writer do); otherwise read through memcpy.
  static Status validate_bytes(std::span<const uint8_t> bytes, const std::string& label);
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A whole checkpoint directory: model.safetensors.index.json + shards, or a single
// model.safetensors. Tensor names are unique across shards.
class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir);
  const std::string& dir() const { return dir_; }
  const TensorView* find(const std::string& name) const;
  Result<const TensorView*> get(const std::string& name) const;  // NotFound names the tensor
  const std::map<std::string, const TensorView*>& tensors() const { return by_name_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  // weight_map of the index (tensor -> shard file name); empty for a single-file checkpoint.
  const std::map<std::string, std::string>& weight_map() const { return weight_map_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const TensorView*> by_name_;
  std::map<std::string, std::string> weight_map_;
};

// Reads model.safetensors.index.json: weight_map (tensor -> shard file name). Shard names must be
// plain file names (no '/'), so an index cannot point outside its directory.
Result<std::map<std::string, std::string>> read_index_weight_map(const std::string& index_path);

// Writer: the header is padded so the data region starts 8-byte aligned; tensors are laid out
// contiguously (larger element sizes first, otherwise in the given order), so each is aligned to
// its element size. Written to PATH.tmp, then renamed.
struct TensorData {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

Status write_safetensors(const std::string& path, const std::vector<const TensorData*>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// Writes shards named model-0000K-of-0000N.safetensors plus model.safetensors.index.json with
// metadata.total_size and weight_map; tensors are split over num_shards in order, balancing bytes.
Status write_sharded_checkpoint(const std::string& dir, const std::vector<TensorData>& tensors,
                                int num_shards);

}  // namespace tandem

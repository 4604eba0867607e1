// safetensors reader and writer. The header rules follow the reference `safetensors` library
// (which the official Python loads our tiny checkpoints with), so a file we accept it accepts:
// header length bounded by the file and by kMaxHeaderBytes, a JSON object without duplicate keys,
// known dtypes, numel x dtype size == end - begin (overflow-checked), and the tensors covering the
// data region exactly, without gaps or overlap.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace tandem {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // same bound as the reference library
constexpr int kMaxRank = 16;

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kBF16, "BF16", 2},   {DType::kF16, "F16", 2},        {DType::kF32, "F32", 4},
    {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E8M0, "F8_E8M0", 1}, {DType::kI8, "I8", 1},
    {DType::kI32, "I32", 4},     {DType::kI64, "I64", 8},        {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Parses and validates a complete safetensors image. `bytes` is the whole file; on success fills
// `tensors` (sorted by offset, data pointing into `bytes`) and `metadata`.
Status parse_image(std::span<const uint8_t> bytes, const std::string& label,
                   std::vector<TensorView>* tensors, std::map<std::string, std::string>* metadata) {
  if (bytes.size() < 8) {
    return data_loss("{}: file is {} bytes, shorter than the 8-byte header length", label,
                     bytes.size());
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) {
    return data_loss("{}: header length {} exceeds the {} byte limit", label, header_len,
                     kMaxHeaderBytes);
  }
  if (header_len > bytes.size() - 8) {
    return data_loss("{}: header length {} runs past the end of the {} byte file (truncated?)",
                     label, header_len, bytes.size());
  }
  if (header_len < 2 || bytes[8] != '{') {
    return data_loss("{}: header does not start with a JSON object", label);
  }
  const uint8_t* hbegin = bytes.data() + 8;
  const uint8_t* hend = hbegin + header_len;

  // Duplicate top-level keys would silently shadow a tensor; the callback sees every key.
  std::set<std::string> seen;
  std::string duplicate;
  auto cb = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!seen.insert(parsed.get_ref<const std::string&>()).second && duplicate.empty()) {
        duplicate = parsed.get_ref<const std::string&>();
      }
    }
    return true;
  };
  nlohmann::json header = nlohmann::json::parse(hbegin, hend, cb, /*allow_exceptions=*/false);
  if (header.is_discarded()) return data_loss("{}: header is not valid JSON", label);
  if (!header.is_object()) return data_loss("{}: header is not a JSON object", label);
  if (!duplicate.empty()) return data_loss("{}: duplicate header key '{}'", label, duplicate);

  const uint64_t data_size = bytes.size() - 8 - header_len;
  const uint8_t* data = hend;
  std::vector<TensorView> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::map<std::string, std::string> meta;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return data_loss("{}: __metadata__ is not an object", label);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return data_loss("{}: __metadata__ value for '{}' is not a string", label, m.key());
        }
        meta[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) return data_loss("{}: tensor '{}': entry is not an object", label, name);
    for (auto f = v.begin(); f != v.end(); ++f) {
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets") {
        return data_loss("{}: tensor '{}': unknown field '{}'", label, name, f.key());
      }
    }
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) {
      return data_loss("{}: tensor '{}': missing or non-string dtype", label, name);
    }
    Result<DType> dtype = parse_dtype(dt->get<std::string>());
    if (!dtype.ok()) return data_loss("{}: tensor '{}': {}", label, name, dtype.status().message());
    if (sh == v.end() || !sh->is_array()) {
      return data_loss("{}: tensor '{}': missing or non-array shape", label, name);
    }
    if (sh->size() > static_cast<size_t>(kMaxRank)) {
      return data_loss("{}: tensor '{}': rank {} exceeds {}", label, name, sh->size(), kMaxRank);
    }
    TensorView t;
    t.name = name;
    t.dtype = *dtype;
    t.file = label;
    uint64_t numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) {
        return data_loss("{}: tensor '{}': shape entries must be non-negative integers", label, name);
      }
      uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel)) {
        return data_loss("{}: tensor '{}': shape overflows", label, name);
      }
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(*dtype)), &nbytes)) {
      return data_loss("{}: tensor '{}': byte size overflows", label, name);
    }
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return data_loss("{}: tensor '{}': data_offsets must be two non-negative integers", label,
                       name);
    }
    uint64_t begin = (*off)[0].get<uint64_t>();
    uint64_t end = (*off)[1].get<uint64_t>();
    if (end < begin) {
      return data_loss("{}: tensor '{}': data_offsets [{}, {}] end before begin", label, name,
                       begin, end);
    }
    if (end - begin != nbytes) {
      return data_loss("{}: tensor '{}': {} {} needs {} bytes but data_offsets [{}, {}] hold {}",
                       label, name, dtype_name(*dtype), shape_string(t.shape), nbytes, begin, end,
                       end - begin);
    }
    if (end > data_size) {
      return data_loss("{}: tensor '{}': data_offsets [{}, {}] run past the {} byte data region "
                       "(truncated file?)",
                       label, name, begin, end, data_size);
    }
    t.data = data + begin;
    t.nbytes = static_cast<size_t>(nbytes);
    ranges.push_back({begin, end});
    out.push_back(std::move(t));
  }
  // Coverage: sorted by offset, each tensor starts where the previous ended and the last ends at
  // the end of the file (no overlap, no gap, no trailing bytes).
  std::vector<size_t> order(out.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ranges[a] != ranges[b] ? ranges[a] < ranges[b] : out[a].name < out[b].name;
  });
  uint64_t cursor = 0;
  for (size_t i : order) {
    if (ranges[i].first < cursor) {
      return data_loss("{}: tensor '{}': data_offsets [{}, {}] overlap the previous tensor", label,
                       out[i].name, ranges[i].first, ranges[i].second);
    }
    if (ranges[i].first > cursor) {
      return data_loss("{}: tensor '{}': gap of {} bytes before data_offsets [{}, {}]", label,
                       out[i].name, ranges[i].first - cursor, ranges[i].first, ranges[i].second);
    }
    cursor = ranges[i].second;
  }
  if (cursor != data_size) {
    return data_loss("{}: tensors cover {} bytes but the data region is {} bytes", label, cursor,
                     data_size);
  }
  if (tensors) {
    tensors->clear();
    tensors->reserve(out.size());
    for (size_t i : order) tensors->push_back(std::move(out[i]));
  }
  if (metadata) *metadata = std::move(meta);
  return Status::ok_status();
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

const char* dtype_name(DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

Result<DType> parse_dtype(const std::string& name) {
  for (const auto& d : kDTypes) {
    if (name == d.name) return d.dtype;
  }
  return invalid_argument("unknown dtype '{}'", name);
}

size_t dtype_size(DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.size;
  }
  return 0;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile
// ---------------------------------------------------------------------------------------------

Status SafetensorsFile::validate_bytes(std::span<const uint8_t> bytes, const std::string& label) {
  return parse_image(bytes, label, nullptr, nullptr);
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status(errno == ENOENT ? StatusCode::kNotFound : StatusCode::kFailedPrecondition,
                  fmt::format("{}: cannot open: {}", path, errno_text()));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string err = errno_text();
    ::close(fd);
    return data_loss("{}: cannot stat: {}", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument("{}: not a regular file", path);
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    return data_loss("{}: file is {} bytes, shorter than the 8-byte header length", path, f->size_);
  }
  void* map = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return data_loss("{}: mmap failed: {}", path, errno_text());
  f->map_ = map;  // owned from here on: the destructor unmaps
  std::span<const uint8_t> bytes(static_cast<const uint8_t*>(map), f->size_);
  TANDEM_RETURN_IF_ERROR(parse_image(bytes, path, &f->tensors_, &f->metadata_));
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_[f->tensors_[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------
// Checkpoint
// ---------------------------------------------------------------------------------------------

Result<std::map<std::string, std::string>> read_index_weight_map(const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return not_found("{}: cannot open", index_path);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return data_loss("{}: not a valid JSON object", index_path);
  }
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) {
    return data_loss("{}: missing or non-object 'weight_map'", index_path);
  }
  std::map<std::string, std::string> out;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) {
      return data_loss("{}: weight_map entry '{}' is not a string", index_path, it.key());
    }
    const std::string& file = it.value().get_ref<const std::string&>();
    // Shard names are plain file names inside the checkpoint directory.
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return data_loss("{}: weight_map entry '{}' names an invalid shard file '{}'", index_path,
                       it.key(), file);
    }
    out[it.key()] = file;
  }
  return out;
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  std::error_code ec;
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single_path = (fs::path(dir) / "model.safetensors").string();
  std::vector<std::string> shard_files;
  if (fs::exists(index_path, ec)) {
    TANDEM_ASSIGN_OR_RETURN(ck->weight_map_, read_index_weight_map(index_path));
    std::set<std::string> files;
    for (const auto& [name, file] : ck->weight_map_) files.insert(file);
    shard_files.assign(files.begin(), files.end());
  } else if (fs::exists(single_path, ec)) {
    shard_files.push_back("model.safetensors");
  } else {
    return not_found("{}: neither model.safetensors.index.json nor model.safetensors found", dir);
  }
  for (const std::string& file : shard_files) {
    TANDEM_ASSIGN_OR_RETURN(auto shard, SafetensorsFile::open((fs::path(dir) / file).string()));
    for (const TensorView& t : shard->tensors()) {
      if (!ck->weight_map_.empty()) {
        auto it = ck->weight_map_.find(t.name);
        if (it == ck->weight_map_.end()) {
          return data_loss("{}: tensor '{}' is not in the index weight_map", shard->path(), t.name);
        }
        if (it->second != file) {
          return data_loss("{}: tensor '{}' is mapped to shard '{}' by the index", shard->path(),
                           t.name, it->second);
        }
      }
      if (!ck->by_name_.emplace(t.name, &t).second) {
        return data_loss("{}: tensor '{}' also appears in another shard", shard->path(), t.name);
      }
    }
    ck->shards_.push_back(std::move(shard));
  }
  for (const auto& [name, file] : ck->weight_map_) {
    if (!ck->by_name_.count(name)) {
      return data_loss("{}: index maps tensor '{}' to '{}' but that shard does not contain it",
                       index_path, name, file);
    }
  }
  return ck;
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

Result<const TensorView*> Checkpoint::get(const std::string& name) const {
  const TensorView* t = find(name);
  if (!t) return not_found("{}: tensor '{}' not found in the checkpoint", dir_, name);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------

namespace {
Status write_safetensors_impl(const std::string& path, const std::vector<const TensorData*>& tensors,
                              const std::map<std::string, std::string>& metadata);
}  // namespace

Status write_safetensors(const std::string& path, const std::vector<const TensorData*>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  // Larger elements first (stable), so with an 8-aligned data start every tensor is aligned to
  // its element size, as the reference writer arranges it.
  // nlohmann's dump() throws on invalid UTF-8; keep that inside this function.
  try {
    return write_safetensors_impl(path, tensors, metadata);
  } catch (const std::exception& e) {
    return invalid_argument("{}: cannot write header: {}", path, e.what());
  }
}

namespace {
Status write_safetensors_impl(const std::string& path, const std::vector<const TensorData*>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorData*> order = tensors;
  std::stable_sort(order.begin(), order.end(), [](const TensorData* a, const TensorData* b) {
    return dtype_size(a->dtype) > dtype_size(b->dtype);
  });
  std::set<std::string> names;
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":" + nlohmann::json(metadata).dump();
  }
  uint64_t offset = 0;
  for (const TensorData* t : order) {
    if (t->name.empty() || t->name == "__metadata__" || !names.insert(t->name).second) {
      return invalid_argument("{}: invalid or duplicate tensor name '{}'", path, t->name);
    }
    uint64_t numel = 1;
    for (int64_t d : t->shape) {
      if (d < 0) return invalid_argument("{}: tensor '{}': negative dimension", path, t->name);
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * dtype_size(t->dtype) != t->bytes.size()) {
      return invalid_argument("{}: tensor '{}': {} {} needs {} bytes, got {}", path, t->name,
                              dtype_name(t->dtype), shape_string(t->shape),
                              numel * dtype_size(t->dtype), t->bytes.size());
    }
    nlohmann::json e;
    e["dtype"] = dtype_name(t->dtype);
    e["shape"] = t->shape;
    e["data_offsets"] = {offset, offset + t->bytes.size()};
    if (header.size() > 1) header += ",";
    header += nlohmann::json(t->name).dump() + ":" + e.dump();
    offset += t->bytes.size();
  }
  header += "}";
  while ((8 + header.size()) % 8 != 0) header += ' ';

  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return make_error(StatusCode::kFailedPrecondition, "{}: cannot create: {}", tmp, errno_text());
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const TensorData* t : order) {
    if (!ok) break;
    if (!t->bytes.empty()) ok = std::fwrite(t->bytes.data(), 1, t->bytes.size(), f) == t->bytes.size();
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return make_error(StatusCode::kFailedPrecondition, "{}: write failed", path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return make_error(StatusCode::kFailedPrecondition, "{}: rename failed: {}", path, errno_text());
  }
  return Status::ok_status();
}
}  // namespace

Status write_sharded_checkpoint(const std::string& dir, const std::vector<TensorData>& tensors,
                                int num_shards) {
  namespace fs = std::filesystem;
  if (num_shards < 1 || static_cast<size_t>(num_shards) > std::max<size_t>(1, tensors.size())) {
    return invalid_argument("{}: cannot split {} tensors into {} shards", dir, tensors.size(),
                            num_shards);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(StatusCode::kFailedPrecondition, "{}: cannot create: {}", dir, ec.message());
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.bytes.size();
  // Shard s takes tensors (in order) until the running total passes (s+1)/num_shards of the bytes,
  // leaving at least one tensor for every later shard.
  std::vector<std::vector<const TensorData*>> shards(num_shards);
  uint64_t running = 0;
  size_t i = 0;
  for (int s = 0; s < num_shards; ++s) {
    const uint64_t target = total * static_cast<uint64_t>(s + 1) / num_shards;
    const size_t must_leave = static_cast<size_t>(num_shards - s - 1);
    while (i < tensors.size() && tensors.size() - i > must_leave &&
           (shards[s].empty() || running < target || s == num_shards - 1)) {
      running += tensors[i].bytes.size();
      shards[s].push_back(&tensors[i++]);
    }
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (int s = 0; s < num_shards; ++s) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, num_shards);
    TANDEM_RETURN_IF_ERROR(write_safetensors((fs::path(dir) / file).string(), shards[s],
                                             {{"format", "pt"}}));
    for (const TensorData* t : shards[s]) weight_map[t->name] = file;
  }
  nlohmann::json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  std::string text;
  try {
    text = index.dump(2) + "\n";
  } catch (const std::exception& e) {  // invalid UTF-8 in a name (already rejected above)
    return invalid_argument("{}: {}", index_path, e.what());
  }
  std::ofstream out(index_path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) return make_error(StatusCode::kFailedPrecondition, "{}: write failed", index_path);
  return Status::ok_status();
}

}  // namespace tandem

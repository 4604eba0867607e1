// check_checkpoint: every problem of a model directory, each in one line naming the file and
// tensor (see checkpoint_check.h).
#include "io/checkpoint_check.h"

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/catalog.h"
#include "io/safetensors.h"
#include "io/sha256.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string describe(DType dtype, const std::vector<int64_t>& shape) {
  std::string s = std::string(dtype_name(dtype)) + " [";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string read_file(const fs::path& p, bool* ok) {
  std::ifstream in(p, std::ios::binary);
  *ok = static_cast<bool>(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool is_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
  }
  return true;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void check_manifest(const fs::path& dir, const std::string& manifest_path,
                    const std::vector<std::string>& shard_files, CheckReport* r) {
  bool ok = false;
  std::string text = read_file(manifest_path, &ok);
  if (!ok) {
    r->problems.push_back(fmt::format("{}: cannot read the manifest", manifest_path));
    return;
  }
  std::set<std::string> listed;
  std::istringstream lines(text);
  std::string line;
  int lineno = 0;
  while (std::getline(lines, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    // "<hex>  <name>" (text mode) or "<hex> *<name>" (binary mode), as sha256sum writes them.
    if (line.size() < 67 || !is_hex64(line.substr(0, 64)) || line[64] != ' ' ||
        (line[65] != ' ' && line[65] != '*')) {
      r->problems.push_back(fmt::format("{}:{}: malformed manifest line", manifest_path, lineno));
      continue;
    }
    const std::string want = lower(line.substr(0, 64));
    std::string name = line.substr(66);
    if (name.rfind("./", 0) == 0) name = name.substr(2);
    const fs::path rel(name);
    bool escapes = rel.is_absolute();
    for (const auto& part : rel) escapes |= (part == "..");
    if (name.empty() || escapes) {
      r->problems.push_back(
          fmt::format("{}:{}: '{}' is not a path inside the model directory", manifest_path, lineno, name));
      continue;
    }
    listed.insert(rel.lexically_normal().string());
    const fs::path file = dir / rel;
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) {
      r->problems.push_back(fmt::format("{}: listed in the manifest but missing", name));
      continue;
    }
    auto got = sha256_file_hex(file.string());
    if (!got.ok()) {
      r->problems.push_back(got.status().message());
      continue;
    }
    ++r->hashed_files;
    if (*got != want) {
      r->problems.push_back(
          fmt::format("{}: SHA-256 mismatch (manifest {}, file {})", name, want, *got));
    }
  }
  for (const auto& f : shard_files) {
    if (!listed.count(f)) {
      r->problems.push_back(fmt::format("{}: shard not covered by the manifest {}", f, manifest_path));
    }
  }
}

}  // namespace

std::string find_revision_marker(const std::string& model_dir) {
  const fs::path dir(model_dir);
  bool ok = false;
  std::string text = read_file(dir / "REVISION", &ok);
  if (ok) {
    std::string first = text.substr(0, text.find('\n'));
    while (!first.empty() && (first.back() == '\r' || first.back() == ' ' || first.back() == '\t')) {
      first.pop_back();
    }
    return first;
  }
  std::error_code ec;
  fs::path canon = fs::weakly_canonical(dir, ec);
  if (ec) canon = dir;
  if (canon.filename().empty()) canon = canon.parent_path();
  if (canon.parent_path().filename() == "snapshots") return canon.filename().string();
  return "";
}

CheckReport check_checkpoint(const std::string& model_dir, const CheckOptions& options) {
  CheckReport r;
  auto problem = [&](std::string s) { r.problems.push_back(std::move(s)); };
  const fs::path dir(model_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    problem(fmt::format("{}: not a directory", model_dir));
    return r;
  }

  // ---- config and catalog ----
  std::unique_ptr<Catalog> catalog;
  auto config = load_model_config((dir / "config.json").string());
  if (!config.ok()) {
    problem(config.status().message());
  } else {
    r.config_ok = true;
    r.config = *config;
    auto cat = build_catalog(*config);
    if (!cat.ok()) {
      problem(cat.status().with_context("config.json").message());
    } else {
      catalog = std::make_unique<Catalog>(std::move(cat).value());
      r.catalog_tensors = catalog->tensors.size();
      r.catalog_bytes = catalog->total_bytes();
    }
  }

  // ---- tokenizer: every id must have an embedding row ----
  if (r.config_ok) {
    bool ok = false;
    const std::string text = read_file(dir / "tokenizer.json", &ok);
    if (!ok) {
      problem(fmt::format("{}: tokenizer.json missing", model_dir));
    } else {
      auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      int64_t max_id = -1;
      bool shape_ok = j.is_object() && j.contains("model") && j["model"].is_object() &&
                      j["model"].contains("vocab") && j["model"]["vocab"].is_object();
      if (shape_ok) {
        for (const auto& [tok, id] : j["model"]["vocab"].items()) {
          if (id.is_number_integer()) max_id = std::max(max_id, id.get<int64_t>());
        }
        if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
          for (const auto& t : j["added_tokens"]) {
            if (t.is_object() && t.contains("id") && t["id"].is_number_integer()) {
              max_id = std::max(max_id, t["id"].get<int64_t>());
            }
          }
        }
      }
      if (!shape_ok) {
        problem("tokenizer.json: not a tokenizer JSON with model.vocab");
      } else if (max_id >= r.config.vocab_size) {
        problem(fmt::format("tokenizer.json: token id {} >= config vocab_size {}", max_id,
                            r.config.vocab_size));
      }
    }
  }

  // ---- shards ----
  const fs::path index_path = dir / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;
  bool have_index = false;
  std::vector<std::string> shard_files;
  std::optional<uint64_t> index_total;
  if (fs::exists(index_path, ec)) {
    auto wm = read_index_weight_map(index_path.string());
    if (!wm.ok()) {
      problem(wm.status().message());
    } else {
      have_index = true;
      weight_map = std::move(wm).value();
      std::set<std::string> files;
      for (const auto& [name, file] : weight_map) files.insert(file);
      shard_files.assign(files.begin(), files.end());
      bool ok = false;
      auto j = nlohmann::json::parse(read_file(index_path, &ok), nullptr, false);
      if (j.is_object() && j.contains("metadata") && j["metadata"].is_object() &&
          j["metadata"].contains("total_size")) {
        if (j["metadata"]["total_size"].is_number_unsigned()) {
          index_total = j["metadata"]["total_size"].get<uint64_t>();
        } else {
          problem(fmt::format("{}: metadata.total_size is not a non-negative integer",
                              index_path.string()));
        }
      }
    }
  } else if (fs::exists(dir / "model.safetensors", ec)) {
    shard_files.push_back("model.safetensors");
  } else {
    problem(fmt::format("{}: neither model.safetensors.index.json nor model.safetensors found",
                        model_dir));
  }
  r.shards = shard_files.size();

  std::vector<std::unique_ptr<SafetensorsFile>> opened;
  std::set<std::string> failed;
  std::map<std::string, std::pair<const TensorView*, std::string>> found;  // name -> (view, shard)
  for (const std::string& file : shard_files) {
    const fs::path path = dir / file;
    if (!fs::exists(path, ec)) {
      problem(fmt::format("{}: shard listed in the index is missing", path.string()));
      failed.insert(file);
      continue;
    }
    auto shard = SafetensorsFile::open(path.string());
    if (!shard.ok()) {
      problem(shard.status().message());
      failed.insert(file);
      continue;
    }
    ++r.shards_ok;
    for (const TensorView& t : (*shard)->tensors()) {
      ++r.found_tensors;
      r.found_bytes += t.nbytes;
      if (have_index) {
        auto it = weight_map.find(t.name);
        if (it == weight_map.end()) {
          problem(fmt::format("{}: tensor '{}' is not in the index weight_map", file, t.name));
        } else if (it->second != file) {
          problem(fmt::format("{}: tensor '{}' is mapped to '{}' by the index", file, t.name,
                              it->second));
        }
      }
      auto [pos, inserted] = found.emplace(t.name, std::make_pair(&t, file));
      if (!inserted) {
        problem(fmt::format("tensor '{}' appears in both {} and {}", t.name, pos->second.second, file));
      }
    }
    opened.push_back(std::move(shard).value());
  }
  if (have_index) {
    for (const auto& [name, file] : weight_map) {
      if (!failed.count(file) && !found.count(name)) {
        problem(fmt::format("{}: the index maps tensor '{}' here but the shard does not contain it",
                            file, name));
      }
    }
    if (index_total && failed.empty() && *index_total != r.found_bytes) {
      problem(fmt::format("{}: metadata.total_size {} != {} bytes of tensors in the shards",
                          index_path.filename().string(), *index_total, r.found_bytes));
    }
    // Stray shard files suggest a mixed-up download.
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (it->path().extension() == ".safetensors" &&
          !std::binary_search(shard_files.begin(), shard_files.end(), name)) {
        problem(fmt::format("{}: .safetensors file not referenced by the index", name));
      }
    }
  }

  // ---- catalog vs contents ----
  if (catalog) {
    for (const TensorSpec& spec : catalog->tensors) {
      auto it = found.find(spec.name);
      if (it == found.end()) {
        auto wm = weight_map.find(spec.name);
        if (wm != weight_map.end() && failed.count(wm->second)) continue;  // shard already reported
        problem(fmt::format("missing tensor '{}' (expected {})", spec.name,
                            describe(spec.dtype, spec.shape)));
        continue;
      }
      const TensorView* t = it->second.first;
      if (t->dtype != spec.dtype || t->shape != spec.shape) {
        problem(fmt::format("{}: tensor '{}' is {}, expected {}", it->second.second, spec.name,
                            describe(t->dtype, t->shape), describe(spec.dtype, spec.shape)));
      }
    }
    for (const auto& [name, where] : found) {
      if (!catalog->find(name)) {
        problem(fmt::format("{}: unexpected tensor '{}' ({}), not in the catalog for this config",
                            where.second, name, describe(where.first->dtype, where.first->shape)));
      }
    }
  }

  // ---- manifest and revision ----
  if (!options.manifest_path.empty()) check_manifest(dir, options.manifest_path, shard_files, &r);
  if (!options.revision.empty()) {
    r.revision_found = find_revision_marker(model_dir);
    if (r.revision_found.empty()) {
      problem(fmt::format("no revision marker (a REVISION file or a .../snapshots/<rev> directory) "
                          "to compare with '{}'",
                          options.revision));
    } else if (r.revision_found != options.revision) {
      problem(fmt::format("revision mismatch: expected '{}', the checkpoint is '{}'",
                          options.revision, r.revision_found));
    }
  }
  return r;
}

}  // namespace tandem

// runtime_audit.h. The shard digest avoids hashing a 160 GB checkpoint at every start: with a
// sha256sum manifest in the model dir (SHA256SUMS, what `tandem check --manifest` verifies) it is
// the digest of those hashes; without one, of each shard's name, size and safetensors header.
#include "server/runtime_audit.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/build_info.h"
#include "io/checkpoint_check.h"
#include "io/sha256.h"

namespace tandem::server {
namespace {

namespace fs = std::filesystem;

nlohmann::json checkpoint_facts(const std::string& dir) {
  nlohmann::json j;
  j["model_dir"] = dir;
  std::string rev = find_revision_marker(dir);
  j["revision"] = rev.empty() ? nlohmann::json(nullptr) : nlohmann::json(rev);
  std::vector<std::string> shards;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path().filename().string());
  std::sort(shards.begin(), shards.end());
  j["shards"] = shards.size();
  std::string lines;
  std::ifstream sums(dir + "/SHA256SUMS");
  if (sums) {
    std::vector<std::string> entries;
    std::string line;
    while (std::getline(sums, line))
      if (line.find(".safetensors") != std::string::npos) entries.push_back(line);
    std::sort(entries.begin(), entries.end());
    for (const auto& l : entries) lines += l + "\n";
    j["shard_hash_source"] = "SHA256SUMS";
  } else {
    for (const auto& name : shards) {
      std::ifstream f(dir + "/" + name, std::ios::binary);
      uint64_t n = 0;
      std::string header;
      if (f.read(reinterpret_cast<char*>(&n), 8) && n < (uint64_t{100} << 20)) {
        header.resize(n);
        f.read(header.data(), static_cast<std::streamsize>(n));
      }
      lines += sha256_hex(header) + " " + std::to_string(fs::file_size(dir + "/" + name, ec)) + " " + name + "\n";
    }
    j["shard_hash_source"] = "safetensors headers (no SHA256SUMS in the model dir)";
  }
  j["shard_digest"] = "sha256:" + sha256_hex(lines);
  return j;
}

void flatten(const nlohmann::json& j, const std::string& prefix, std::vector<std::pair<std::string, nlohmann::json>>& out) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    return;
  }
  out.emplace_back(prefix, j);
}

const nlohmann::json* at_path(const nlohmann::json& j, const std::string& path) {
  const nlohmann::json* cur = &j;
  std::stringstream in(path);
  std::string part;
  while (std::getline(in, part, '.')) {
    if (cur->is_object()) {
      auto it = cur->find(part);
      if (it == cur->end()) return nullptr;
      cur = &*it;
    } else if (cur->is_array() && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      size_t i = std::stoul(part);
      if (i >= cur->size()) return nullptr;
      cur = &(*cur)[i];
    } else {
      return nullptr;
    }
  }
  return cur;
}

}  // namespace

nlohmann::json build_runtime_audit(const ServeOptions& o, const ModelInfo* info) {
  const BuildInfo& b = build_info();
  nlohmann::json a;
  a["schema"] = "tandem-runtime-audit/1";
  a["tandem"] = {{"version", b.version},       {"commit", b.commit},
                 {"commit_dirty", b.commit_dirty}, {"build_type", b.build_type},
                 {"compiler", b.compiler},     {"cxx_flags", b.cxx_flags},
                 {"cuda_built", b.cuda_built}, {"cuda_architectures", b.cuda_architectures},
                 {"cuda_runtime_built", b.cuda_runtime_built}, {"nccl_built", b.nccl_built}};
  CudaRuntimeInfo c = probe_cuda_runtime();
  nlohmann::json devs = nlohmann::json::array();
  for (const auto& d : c.devices)
    devs.push_back({{"index", d.index}, {"name", d.name}, {"compute_capability", d.compute_capability},
                    {"total_memory_bytes", d.total_memory_bytes}});
  a["cuda"] = {{"status", c.status}, {"runtime_version", c.runtime_version}, {"driver_version", c.driver_version},
               {"devices", devs}};
  a["profile"] = o.profile.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.profile);
  a["config"] = options_fingerprint(o);
  a["speculative"] = {{"method", o.engine.speculative.method.empty() ? "none" : o.engine.speculative.method},
                      {"num_speculative_tokens",
                       o.engine.speculative.method.empty() ? 0 : o.engine.speculative.num_speculative_tokens}};
  nlohmann::json ranks = nlohmann::json::array();
  if (info) {
    a["kv_cache_dtype"] = info->kv_cache_dtype.empty() ? nlohmann::json(nullptr) : nlohmann::json(info->kv_cache_dtype);
    for (const auto& r : info->ranks) {
      nlohmann::json k = nlohmann::json::object();
      for (const auto& p : r.kernels) k[p.op_class] = p.path;
      nlohmann::json rank = {{"rank", r.rank},
                             {"device", r.device},
                             {"name", r.name},
                             {"compute_capability", r.compute_capability},
                             {"kernels", k},
                             {"cudagraph_capture_sizes", r.cudagraph_capture_sizes}};
      if (!r.collectives.topology.empty())
        rank["collectives"] = {{"topology", r.collectives.topology},
                               {"routes", r.collectives.routes},
                               {"unavailable", r.collectives.unavailable}};
      ranks.push_back(rank);
    }
    a["cudagraph_capture_sizes"] = info->ranks.empty() ? nlohmann::json::array()
                                                       : nlohmann::json(info->ranks[0].cudagraph_capture_sizes);
    if (!o.model.empty() && o.model.rfind("echo:", 0) != 0) a["checkpoint"] = checkpoint_facts(o.model);
  }
  a["ranks"] = ranks;
  // What every rank of one deployment must share: the build and the checkpoint. Ranks compare
  // this one string (the tensor-parallel start-up exchanges it).
  nlohmann::json identity = {{"tandem", a["tandem"]},
                             {"checkpoint_revision", a.contains("checkpoint") ? a["checkpoint"]["revision"] : nullptr},
                             {"shard_digest", a.contains("checkpoint") ? a["checkpoint"]["shard_digest"] : nullptr}};
  a["identity_digest"] = "sha256:" + sha256_hex(identity.dump());
  return a;
}

std::vector<std::string> audit_problems(const nlohmann::json& a) {
  std::vector<std::string> p;
  if (!a.contains("ranks") || !a["ranks"].is_array()) return p;
  for (const auto& r : a["ranks"]) {
    const std::string who = "rank " + std::to_string(r.value("rank", 0)) + " (" + r.value("device", "?") + ")";
    const auto& k = r["kernels"];
    for (const auto& op : audit_op_classes()) {
      if (!k.contains(op) || !k[op].is_string() || k[op].get<std::string>().empty()) {
        p.push_back(who + ": no kernel path for op class " + op);
        continue;
      }
      std::string path = k[op].get<std::string>();
      std::string lower = path;
      std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
      for (const char* bad : {"emulat", "fallback", "marlin"})
        if (lower.find(bad) != std::string::npos) p.push_back(who + ": op class " + op + " runs '" + path + "' (not native)");
    }
  }
  const std::string want = a.contains("config") ? a["config"].value("device", "auto") : "auto";
  if (want == "cuda")
    for (const auto& r : a["ranks"])
      if (r.value("device", "").rfind("cuda", 0) != 0)
        p.push_back("--device cuda, but rank " + std::to_string(r.value("rank", 0)) + " runs on " + r.value("device", "?"));
  return p;
}

Result<nlohmann::json> load_audit_manifest(const std::string& path) {
  std::ifstream f(path);
  if (!f) return make_error(StatusCode::kNotFound, "audit manifest {}: cannot be read", path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return invalid_argument("audit manifest {}: not valid JSON", path);
  if (!j.is_object()) return invalid_argument("audit manifest {}: must be a JSON object", path);
  if (j.empty()) return invalid_argument("audit manifest {}: is empty (it would check nothing)", path);
  return j;
}

std::vector<std::string> compare_audit(const nlohmann::json& audit, const nlohmann::json& manifest) {
  std::vector<std::pair<std::string, nlohmann::json>> leaves;
  flatten(manifest, "", leaves);
  std::vector<std::string> out;
  for (const auto& [path, want] : leaves) {
    const nlohmann::json* got = at_path(audit, path);
    if (!got) out.push_back(path + ": manifest " + want.dump() + ", absent at runtime");
    else if (*got != want) out.push_back(path + ": manifest " + want.dump() + ", runtime " + got->dump());
  }
  return out;
}

bool finish_audit(nlohmann::json& audit, const nlohmann::json* manifest) {
  auto problems = audit_problems(audit);
  std::vector<std::string> mismatches;
  if (manifest) mismatches = compare_audit(audit, *manifest);
  audit["problems"] = problems;
  audit["mismatches"] = mismatches;
  audit["manifest_checked"] = manifest != nullptr;
  audit["pass"] = problems.empty() && mismatches.empty();
  return audit["pass"].get<bool>();
}

}  // namespace tandem::server

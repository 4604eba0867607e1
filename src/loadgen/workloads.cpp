// Prompts and output checks of the serving benchmark's workloads.
#include "loadgen/workloads.h"

#include <cctype>
#include <sstream>

#include "common/hash.h"

namespace tandem::loadgen {

const std::vector<Workload>& all_workloads() {
  // The prompts are the ones bench/engine/bench_seeds.cpp gives the engine directly, so the two
  // benchmarks measure the same requests from the two sides of the HTTP server.
  static const std::vector<Workload> w = {
      {WorkloadKind::kCount, "count", "Count from 1 to 300 (exact bounded output, checked)", 1500},
      {WorkloadKind::kDataclasses, "dataclasses", "Twenty Python dataclasses (structured code)", 1024},
      {WorkloadKind::kProse, "prose", "Low-predictability technical prose", 512},
      {WorkloadKind::kLongPrompt, "long-prompt",
       "Long synthetic prompt with a unique prefix per request (uncached prefill, TTFT)", 16},
  };
  return w;
}

Result<std::vector<Workload>> select_workloads(const std::string& comma_list) {
  std::vector<Workload> out;
  std::stringstream ss(comma_list);
  std::string name;
  while (std::getline(ss, name, ',')) {
    if (name.empty()) continue;
    bool found = false;
    for (const auto& w : all_workloads()) {
      if (w.name == name) {
        out.push_back(w);
        found = true;
      }
    }
    if (!found) return invalid_argument("--workloads: unknown workload '{}' (count, dataclasses, prose, long-prompt)", name);
  }
  if (out.empty()) return invalid_argument("--workloads: empty list");
  return out;
}

namespace {
// Technical words drawn at random: text no model can predict far ahead, of a known length.
const char* const kWords[] = {
    "allocator", "barrier",  "cache",     "checksum", "compaction", "consensus", "cursor",    "daemon",
    "deadline",  "epoch",    "eviction",  "fence",    "fragment",   "gossip",    "handshake", "heap",
    "histogram", "index",    "journal",   "kernel",   "latch",      "lease",     "ledger",    "manifest",
    "mutex",     "offset",   "page",      "partition", "payload",   "pipeline",  "quorum",    "replica",
    "ring",      "scheduler", "segment",  "shard",    "snapshot",   "socket",    "spill",     "stripe",
    "tablet",    "tenant",   "throttle",  "timer",    "token",      "tombstone", "vector",    "watermark",
    "window",    "writer",   "bloom",     "buffer",   "cohort",     "delta",     "frontier",  "gauge",
    "hint",      "inode",    "marker",    "quota",    "region",     "splice",    "trace",     "vertex"};
constexpr uint64_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

std::string synthetic_text(int words) {
  std::string out;
  out.reserve(static_cast<size_t>(words) * 9);
  for (int i = 0; i < words; ++i) {
    // The same text for every request (a fixed key); only the prefix differs.
    out += kWords[mix64(0x7a6e646dULL + static_cast<uint64_t>(i)) % kNumWords];
    out += (i + 1) % 12 == 0 ? ". " : " ";
  }
  return out;
}
}  // namespace

std::string user_message(const Workload& w, const std::string& unique, int long_prompt_words) {
  switch (w.kind) {
    case WorkloadKind::kCount:
      return "Count from 1 to 300.";
    case WorkloadKind::kDataclasses:
      return "Write twenty Python dataclasses for an online bookshop (Book, Author, Order, Customer, ...), each "
             "with typed fields and a short docstring.";
    case WorkloadKind::kProse:
      return "Explain in a few paragraphs how a log-structured merge tree trades write amplification against "
             "read amplification, and when a B-tree is the better choice.";
    case WorkloadKind::kLongPrompt:
      // The unique part comes first: prefix caches match from the first token on.
      return "Session " + unique + ". Read these notes.\n\n" + synthetic_text(long_prompt_words) +
             "\n\nIn one sentence, which word appears first in the notes?";
  }
  return "";
}

const char* count_check_name(CountCheck c) {
  switch (c) {
    case CountCheck::kExact: return "exact";
    case CountCheck::kTruncated: return "truncated";
    case CountCheck::kWrong: return "wrong";
  }
  return "?";
}

CountCheck check_count(const std::string& text, int last, const std::string& finish_reason) {
  std::vector<long long> ints;
  for (size_t i = 0; i < text.size();) {
    if (std::isdigit(static_cast<unsigned char>(text[i]))) {
      long long v = 0;
      size_t j = i;
      while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j])) && j - i < 12)
        v = v * 10 + (text[j++] - '0');
      while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
      ints.push_back(v);
      i = j;
    } else {
      ++i;
    }
  }
  if (ints.empty()) return CountCheck::kWrong;
  // The final run of consecutive integers must start at 1.
  size_t start = ints.size() - 1;
  while (start > 0 && ints[start - 1] == ints[start] - 1) --start;
  if (ints[start] != 1) return CountCheck::kWrong;
  const long long reached = ints.back();
  if (reached == last) return CountCheck::kExact;
  if (reached < last && finish_reason == "length") return CountCheck::kTruncated;
  return CountCheck::kWrong;
}

int count_dataclasses(const std::string& text) {
  int n = 0;
  for (size_t p = text.find("@dataclass"); p != std::string::npos; p = text.find("@dataclass", p + 1)) ++n;
  return n;
}

}  // namespace tandem::loadgen

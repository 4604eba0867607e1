// The serving benchmark's workloads, matching the seed deployments' (counting 1 to 300 with an
// exact bounded output, twenty Python dataclasses, low-predictability technical prose) plus a long
// synthetic prompt with a unique prefix per request, so no prefix cache can serve it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem::loadgen {

enum class WorkloadKind { kCount, kDataclasses, kProse, kLongPrompt };

struct Workload {
  WorkloadKind kind;
  std::string name;        // "count", "dataclasses", "prose", "long-prompt"
  std::string description;
  int max_tokens = 0;      // default output bound
};

const std::vector<Workload>& all_workloads();
Result<std::vector<Workload>> select_workloads(const std::string& comma_list);

// The user message of one request. `unique` makes the long prompt's first words differ per request
// (run nonce, repeat, request index); the other workloads ignore it. `long_prompt_words` sets the
// length of the long prompt's synthetic text.
std::string user_message(const Workload& w, const std::string& unique, int long_prompt_words);

// Verdict on the counting output: the text ends with the integers 1, 2, ..., n (anything before
// the final run, such as a preamble that mentions "1 to 300", is ignored).
enum class CountCheck { kExact, kTruncated, kWrong };
const char* count_check_name(CountCheck c);
// kExact: the run reaches `last`; kTruncated: it stops early and the request ended on its token
// bound (finish_reason "length"); kWrong: anything else.
CountCheck check_count(const std::string& text, int last, const std::string& finish_reason);

// "@dataclass" decorators in the text (the dataclasses workload asks for twenty).
int count_dataclasses(const std::string& text);

}  // namespace tandem::loadgen

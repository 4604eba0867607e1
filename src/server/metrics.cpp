// Prometheus text exposition (format 0.0.4) of the engine counters under vLLM's names.
#include "server/metrics.h"

#include <fmt/format.h>

namespace tandem::server {

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, cum);
  out += fmt::format("{}_sum{{{}}} {}\n", name, labels, sum_);
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, count_);
}

MetricsRegistry::MetricsRegistry()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0}) {}

void MetricsRegistry::count_request_error() {
  std::lock_guard<std::mutex> lk(mu_);
  ++errors_;
}

namespace {
std::string escape_label(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') { o += "\\n"; continue; }
    o += c;
  }
  return o;
}
void metric(std::string& out, const char* name, const char* type, const char* help, const std::string& labels, double v) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", name, help, name, type, name, labels, v);
}
}  // namespace

std::string MetricsRegistry::render(const EngineMetrics& m, const std::string& model_name, int64_t in_flight) {
  std::lock_guard<std::mutex> lk(mu_);
  for (double v : m.ttft_s) ttft_.observe(v);
  for (double v : m.itl_s) itl_.observe(v);
  for (double v : m.e2e_s) e2e_.observe(v);
  std::string l = "model_name=\"" + escape_label(model_name) + "\"";
  std::string out;
  metric(out, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", l, m.num_requests_running);
  metric(out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", l, m.num_requests_waiting);
  metric(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", l, m.kv_cache_usage_perc);
  metric(out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", l, m.prompt_tokens_total);
  metric(out, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", l, m.generation_tokens_total);
  metric(out, "vllm:request_success_total", "counter", "Count of successfully processed requests.", l, m.request_success_total);
  metric(out, "vllm:num_preemptions_total", "counter", "Cumulative number of preemptions.", l, m.num_preemptions_total);
  metric(out, "vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", l, m.prefix_cache_queries_total);
  metric(out, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", l, m.prefix_cache_hits_total);
  metric(out, "vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", l, m.spec_decode_num_drafts_total);
  metric(out, "vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", l, m.spec_decode_num_draft_tokens_total);
  metric(out, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.", l, m.spec_decode_num_accepted_tokens_total);
  out += "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.\n"
         "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n";
  for (size_t i = 0; i < m.spec_decode_num_accepted_tokens_per_pos_total.size(); ++i)
    out += fmt::format("vllm:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n", l, i,
                       m.spec_decode_num_accepted_tokens_per_pos_total[i]);
  out += "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n"
         "# TYPE vllm:time_to_first_token_seconds histogram\n";
  ttft_.render(out, "vllm:time_to_first_token_seconds", l);
  out += "# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.\n"
         "# TYPE vllm:inter_token_latency_seconds histogram\n";
  itl_.render(out, "vllm:inter_token_latency_seconds", l);
  out += "# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency in seconds.\n"
         "# TYPE vllm:e2e_request_latency_seconds histogram\n";
  e2e_.render(out, "vllm:e2e_request_latency_seconds", l);
  metric(out, "tandem:kv_blocks_total", "gauge", "KV blocks in the pool.", l, m.kv_blocks_total);
  metric(out, "tandem:kv_blocks_free", "gauge", "KV blocks free.", l, m.kv_blocks_free);
  metric(out, "tandem:kv_blocks_leaked", "gauge", "KV blocks allocated with no owner (integrity check; must be 0).", l, m.kv_blocks_leaked);
  metric(out, "tandem:prefill_tokens_pending", "gauge", "Prompt tokens still to prefill (running and waiting requests).", l, m.prefill_tokens_pending);
  metric(out, "tandem:long_prefill_done_tokens", "gauge", "Prompt tokens prefilled so far by the oldest long prefill in flight (0 when none).", l, m.long_prefill_done_tokens);
  metric(out, "tandem:long_prefill_prompt_tokens", "gauge", "Prompt length of the oldest long prefill in flight (0 when none).", l, m.long_prefill_prompt_tokens);
  metric(out, "tandem:watchdog_stalls_total", "counter", "Engine steps the watchdog declared stalled.", l, m.watchdog_stalls_total);
  if (m.device_allocations_after_start >= 0)
    metric(out, "tandem:device_allocations_after_start", "gauge", "Device allocations since start-up (must stay 0).", l, m.device_allocations_after_start);
  if (m.device_graphs_after_start >= 0) {
    metric(out, "tandem:device_graphs_after_start", "gauge", "CUDA graphs instantiated since start-up (must stay 0).", l, m.device_graphs_after_start);
    metric(out, "tandem:device_bytes_taken_after_start", "gauge", "Device memory taken since start-up, as cudaMemGetInfo reports it (must stay 0; read at most every 100 ms under load).", l, m.device_bytes_taken_after_start);
  }
  metric(out, "tandem:engine_steps_total", "counter", "Engine steps that ran a batch.", l, m.engine_steps_total);
  metric(out, "tandem:engine_schedule_seconds_total", "counter", "Engine thread: scheduling and building batches.", l, m.engine_schedule_s);
  metric(out, "tandem:engine_forward_seconds_total", "counter", "Engine thread: the runner's forward steps (uploads, launch, device, results).", l, m.engine_forward_s);
  metric(out, "tandem:engine_outputs_seconds_total", "counter", "Engine thread: step outputs (sampling results, request events).", l, m.engine_outputs_s);
  metric(out, "tandem:engine_commit_seconds_total", "counter", "Engine thread: the runner's commits (draft context insertion).", l, m.engine_commit_s);
  metric(out, "tandem:engine_draft_seconds_total", "counter", "Engine thread: choosing drafts and the runner's draft proposals.", l, m.engine_draft_s);
  metric(out, "tandem:engine_between_steps_seconds_total", "counter", "Engine thread: between two steps while work was left (inbox, metrics).", l, m.engine_between_steps_s);
  if (m.device_wait_s >= 0)
    metric(out, "tandem:engine_device_wait_seconds_total", "counter", "Engine thread: blocked on the device inside forward and draft.", l, m.device_wait_s);
  if (m.device_submit_s >= 0)
    metric(out, "tandem:engine_device_submit_seconds_total", "counter", "Engine thread: inside forward and draft before their wait for the device (packing, uploads, launches).", l, m.device_submit_s);
  metric(out, "tandem:http_requests_in_flight", "gauge", "Generation requests the HTTP server holds.", l, in_flight);
  metric(out, "tandem:request_errors_total", "counter", "Requests answered with an error status.", l, errors_);
  return out;
}

}  // namespace tandem::server

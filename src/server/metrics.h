// Prometheus /metrics: vLLM's metric names (with a model_name label) built from EngineMetrics
// snapshots; latency samples are accumulated into cumulative histograms here because the engine
// hands them out once (metrics() drains them).
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace tandem::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Appends the _bucket/_sum/_count lines.
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class MetricsRegistry {
 public:
  MetricsRegistry();
  // Folds one engine snapshot in and renders the exposition text.
  std::string render(const EngineMetrics& m, const std::string& model_name, int64_t http_requests_in_flight);
  void count_request_error() ;

 private:
  std::mutex mu_;
  Histogram ttft_, itl_, e2e_;
  int64_t errors_ = 0;
};

}  // namespace tandem::server

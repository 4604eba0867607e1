// The serving benchmark's chart, drawn by the tool itself: output tok/s (aggregate and per-stream
// decode, median with min-max whiskers over the repeats) and median TTFT against concurrency, one
// colour per workload. Plain SVG 1.1, no scripts or external references.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tandem::loadgen {

std::string render_svg(const nlohmann::json& report);

}  // namespace tandem::loadgen

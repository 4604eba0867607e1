// bench_timeline.h: per-CTA phase timestamps read back and summarised.
#include "cli/bench_timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kernels/cuda/timeline.cuh"

namespace tandem::bench_timeline {

namespace timeline = kernels::cuda::timeline;

const std::vector<TlKernel>& moe_kernels() {
  static const std::vector<TlKernel> k = {
      {"gate_route",
       {{1, "entry"}, {3, "wait_done"}, {4, "partials_stored"}, {5, "route_start"}, {10, "route_zeroed"},
        {11, "sel_computed"}, {12, "sel_shared"}, {13, "first_pick"}, {7, "route_picked"}, {8, "route_counted"},
        {9, "route_grouped"}, {6, "route_end"}, {15, "exit"}},
       false},
      {"experts_up", {{1, "entry"}, {2, "prologue_issued"}, {3, "routing_known"}, {15, "exit"}}, true},
      {"experts_down", {{1, "entry"}, {2, "prologue_issued"}, {14, "early_poll_done"}, {3, "routing_known"}, {15, "exit"}},
       true}};
  return k;
}

nlohmann::json report(const std::vector<uint64_t>& h, const std::vector<TlKernel>& kernels, const std::string& name,
                      int64_t m) {
  const int nk = static_cast<int>(kernels.size());
  auto at = [&](int k, int cta, int slot) { return h[(static_cast<size_t>(k) * timeline::kCtas + cta) * timeline::kSlots + slot]; };
  uint64_t t0 = UINT64_MAX;
  for (int c = 0; c < timeline::kCtas; ++c)
    if (at(0, c, 3)) t0 = std::min(t0, at(0, c, 3));
  // The timer's step: the smallest difference between distinct readings (word 0 of a record holds
  // the SM id and a count, not a reading).
  std::vector<uint64_t> all;
  for (size_t i = 0; i < h.size(); ++i)
    if (i % timeline::kSlots != 0 && h[i]) all.push_back(h[i]);
  std::sort(all.begin(), all.end());
  uint64_t tick = 0;
  for (size_t i = 1; i < all.size(); ++i)
    if (all[i] != all[i - 1] && (tick == 0 || all[i] - all[i - 1] < tick)) tick = all[i] - all[i - 1];
  auto us = [&](uint64_t v) { return v ? (static_cast<double>(v) - static_cast<double>(t0)) / 1000.0 : -1.0; };
  auto stats = [](std::vector<double> v) {
    if (v.empty()) return nlohmann::json();
    std::sort(v.begin(), v.end());
    return nlohmann::json{{"n", v.size()}, {"min", v.front()}, {"median", v[v.size() / 2]}, {"max", v.back()}};
  };
  nlohmann::json out = {{"layer", name}, {"batch", m}, {"timer_tick_ns", tick},
                        {"note", "us from the first kernel's first dependency release; per kernel, each mark's "
                                 "distribution over its CTAs; items: per CTA, thread 0's item i from its first "
                                 "stage ready to its tile-0 epilogue done; records: per CTA [sm, count, marks 1..15] "
                                 "in us (-1: not reached)"}};
  std::printf("\n  timeline, %s, batch %lld (us from the first kernel's dependency release; timer tick %llu ns)\n",
              name.c_str(), static_cast<long long>(m), static_cast<unsigned long long>(tick));
  for (int k = 0; k < nk; ++k) {
    nlohmann::json kj = {{"kernel", kernels[k].name}};
    nlohmann::json recs = nlohmann::json::array();
    std::vector<double> dur, first_start, items;
    int ctas = 0;
    for (int c = 0; c < timeline::kCtas; ++c) {
      if (!at(k, c, 1)) continue;
      ++ctas;
      const uint64_t w0 = at(k, c, 0);
      nlohmann::json r = nlohmann::json::array({w0 & 0xffffffffu, w0 >> 32});
      for (int q = 1; q < timeline::kSlots; ++q) r.push_back(std::round(us(at(k, c, q)) * 1000.0) / 1000.0);
      recs.push_back(r);
      items.push_back(static_cast<double>(w0 >> 32));
      for (int i = 0; i < 5 && kernels[k].items; ++i) {
        const uint64_t a0 = at(k, c, 4 + 2 * i), a1 = at(k, c, 5 + 2 * i);
        if (a0 && a1) dur.push_back((static_cast<double>(a1) - static_cast<double>(a0)) / 1000.0);
        if (i == 0 && a0) first_start.push_back(us(a0));
      }
    }
    kj["ctas"] = ctas;
    std::printf("  %-13s %4d CTAs", kernels[k].name, ctas);
    for (const auto& [slot, label] : kernels[k].marks) {
      std::vector<double> v;
      for (int c = 0; c < timeline::kCtas; ++c)
        if (at(k, c, 1) && at(k, c, slot)) v.push_back(us(at(k, c, slot)));
      kj[label] = stats(v);
      if (!v.empty()) {
        std::sort(v.begin(), v.end());
        std::printf("  %s %.1f/%.1f/%.1f", label, v.front(), v[v.size() / 2], v.back());
      }
    }
    if (kernels[k].items) {
      kj["items_per_cta"] = stats(items);
      kj["first_item_ready"] = stats(first_start);
      kj["item_us"] = stats(dur);
      if (!dur.empty()) {
        std::sort(dur.begin(), dur.end());
        std::printf("  item %.1f/%.1f/%.1f", dur.front(), dur[dur.size() / 2], dur.back());
      }
    }
    std::printf("\n");
    kj["records"] = recs;
    out["kernels"].push_back(kj);
  }
  std::fflush(stdout);
  return out;
}

}  // namespace tandem::bench_timeline

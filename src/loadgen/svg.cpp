// SVG chart of a `tandem bench` report (see svg.h).
#include "loadgen/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

namespace tandem::loadgen {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\n' || c == '\t') o += c;
    }
  }
  return o;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

struct Point {
  double x_index;
  double med, lo, hi;
};

// A "nice" upper bound and step for a linear axis starting at 0.
std::pair<double, double> nice_axis(double max_v) {
  if (!(max_v > 0)) return {1.0, 0.25};
  const double raw = max_v / 4;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  return {std::ceil(max_v / step) * step, step};
}

std::string fmt_num(double v) {
  if (v == 0) return "0";
  if (std::fabs(v) >= 100) return fmt::format("{:.0f}", v);
  if (std::fabs(v) >= 1) return fmt::format("{:.3g}", v);
  return fmt::format("{:.2g}", v);
}

struct Panel {
  double x0, y0, w, h;  // plot area
};

}  // namespace

std::string render_svg(const nlohmann::json& report) {
  const double W = 980, H = 520;
  const Panel left{70, 70, 380, 330}, right{570, 70, 380, 330};
  std::vector<int> conc;
  if (report.contains("settings") && report["settings"].contains("concurrency"))
    for (const auto& c : report["settings"]["concurrency"]) conc.push_back(c.get<int>());
  std::vector<std::string> workloads;
  const nlohmann::json summary = report.value("summary", nlohmann::json::array());
  for (const auto& s : summary) {
    const std::string w = s["workload"].get<std::string>();
    if (std::find(workloads.begin(), workloads.end(), w) == workloads.end()) workloads.push_back(w);
    const int c = s["concurrency"].get<int>();
    if (std::find(conc.begin(), conc.end(), c) == conc.end()) conc.push_back(c);
  }
  auto x_of = [&](const Panel& p, double i) {
    const double n = std::max<double>(1, conc.size());
    return p.x0 + p.w * (i + 0.5) / n;
  };
  auto series = [&](const std::string& w, const char* key) {
    std::vector<Point> pts;
    for (const auto& s : summary) {
      if (s["workload"] != w || !s.contains(key) || s[key].is_null()) continue;
      const int c = s["concurrency"].get<int>();
      const size_t i = std::find(conc.begin(), conc.end(), c) - conc.begin();
      pts.push_back({double(i), s[key]["median"].get<double>(), s[key]["min"].get<double>(), s[key]["max"].get<double>()});
    }
    return pts;
  };

  std::string o = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
      W, H);
  const auto& target = report.value("target", nlohmann::json::object());
  o += fmt::format("<text x=\"{}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", 20,
                   esc("tandem bench: " + target.value("model", std::string("?")) + " at " +
                       target.value("base_url", std::string("?"))));
  o += fmt::format("<text x=\"20\" y=\"44\" fill=\"#444\">{}</text>\n",
                   esc(report.value("date", std::string("")) + "  client " +
                       report.value("client_commit", std::string("?")) + "  " + report.value("notes", std::string(""))));

  // Left: output tok/s, linear. Right: TTFT, log scale (long prompts sit decades above short ones).
  double max_tok = 0, min_ttft = 1e30, max_ttft = 0;
  for (const auto& w : workloads) {
    for (const char* k : {"aggregate_tok_s", "per_stream_decode_tok_s"})
      for (const auto& p : series(w, k)) max_tok = std::max(max_tok, p.hi);
    for (const auto& p : series(w, "ttft_s"))
      if (p.lo > 0) {
        min_ttft = std::min(min_ttft, p.lo);
        max_ttft = std::max(max_ttft, p.hi);
      }
  }
  const auto [tok_top, tok_step] = nice_axis(max_tok * 1.05);
  if (max_ttft <= 0) {
    min_ttft = 1e-3;
    max_ttft = 1.0;
  }
  const double dec_lo = std::floor(std::log10(min_ttft)), dec_hi = std::max(dec_lo + 1, std::ceil(std::log10(max_ttft)));
  auto y_tok = [&](double v) { return left.y0 + left.h * (1 - v / tok_top); };
  auto y_ttft = [&](double v) {
    const double l = std::log10(std::max(v, 1e-9));
    return right.y0 + right.h * (1 - (l - dec_lo) / (dec_hi - dec_lo));
  };

  auto frame = [&](const Panel& p, const std::string& title, const std::string& ylabel) {
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", p.x0, p.y0, p.w, p.h);
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-weight=\"bold\">{}</text>\n", p.x0 + p.w / 2,
                     p.y0 - 10, esc(title));
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 {} {})\">{}</text>\n",
                     p.x0 - 50, p.y0 + p.h / 2, p.x0 - 50, p.y0 + p.h / 2, esc(ylabel));
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">concurrency (streams)</text>\n", p.x0 + p.w / 2,
                     p.y0 + p.h + 36);
    for (size_t i = 0; i < conc.size(); ++i)
      o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x_of(p, double(i)),
                       p.y0 + p.h + 16, conc[i]);
  };
  frame(left, "output tokens/s (median, min-max over repeats)", "tokens/s");
  frame(right, "time to first token (median, min-max)", "seconds (log scale)");
  for (double v = 0; v <= tok_top + tok_step / 2; v += tok_step) {
    o += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", left.x0,
                     left.x0 + left.w, y_tok(v), y_tok(v));
    o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left.x0 - 4, y_tok(v) + 4, fmt_num(v));
  }
  for (double d = dec_lo; d <= dec_hi + 0.5; d += 1) {
    const double v = std::pow(10.0, d);
    o += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", right.x0,
                     right.x0 + right.w, y_ttft(v), y_ttft(v));
    o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", right.x0 - 4, y_ttft(v) + 4,
                     d >= 0 ? fmt::format("{:.0f}", v) : fmt::format("{:g}", v));
  }

  auto draw = [&](const Panel& p, const std::vector<Point>& pts, const char* color, bool dashed, auto y_of) {
    if (pts.empty()) return;
    std::string path;
    for (const auto& pt : pts) path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "" : " ", x_of(p, pt.x_index), y_of(pt.med));
    o += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{}/>\n", path, color,
                     dashed ? " stroke-dasharray=\"6 4\"" : "");
    for (const auto& pt : pts) {
      const double x = x_of(p, pt.x_index);
      o += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"{3}\"/>\n", x,
                       y_of(pt.lo), y_of(pt.hi), color);
      o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", x, y_of(pt.med), dashed ? "white" : color);
      if (dashed) o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"none\" stroke=\"{}\"/>\n", x, y_of(pt.med), color);
    }
  };
  for (size_t i = 0; i < workloads.size(); ++i) {
    const char* color = kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
    draw(left, series(workloads[i], "aggregate_tok_s"), color, false, y_tok);
    draw(left, series(workloads[i], "per_stream_decode_tok_s"), color, true, y_tok);
    draw(right, series(workloads[i], "ttft_s"), color, false, y_ttft);
    const double lx = 70 + 170 * double(i % 5), ly = H - 46 + 18 * double(i / 5);
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"4\" fill=\"{}\"/>\n", lx, ly - 5, color);
    o += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", lx + 20, ly, esc(workloads[i]));
  }
  o += fmt::format("<text x=\"70\" y=\"{}\" fill=\"#444\">solid: aggregate tok/s over all streams; dashed, open "
                   "marks: per-stream decode tok/s (median request)</text>\n",
                   H - 12);
  o += "</svg>\n";
  return o;
}

}  // namespace tandem::loadgen

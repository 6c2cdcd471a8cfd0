#include "train/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/strings.h"

namespace fsdp::train {

namespace {

// The largest loss magnitude drawn: well inside double's range, so every range and tick computed from
// the data stays finite.
constexpr double kMaxPlotted = 1e100;

// The curves' colors (a colorblind-safe palette).
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b"};

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

// "1", "2.5", "0.01", "1e+06": a tick's label, short.
std::string tick_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi], about `count` of them.
std::vector<double> nice_ticks(double lo, double hi, int count) {
  const double raw = (hi - lo) / std::max(1, count);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * power >= raw) {
      step = m * power;
      break;
    }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push_back(t);
  return ticks;
}

// Log-axis ticks (as log10 values) in [lo, hi]: 1, 2 and 5 times powers of ten, or every digit when
// the range is too short for three of those.
std::vector<double> log_ticks(double lo, double hi) {
  for (const std::vector<double>& mantissas :
       {std::vector<double>{1, 2, 5}, std::vector<double>{1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9}}) {
    std::vector<double> ticks;
    for (int k = static_cast<int>(std::floor(lo)); k <= static_cast<int>(std::ceil(hi)); ++k)
      for (double m : mantissas) {
        const double t = std::log10(m) + k;
        if (t >= lo && t <= hi) ticks.push_back(t);
      }
    if (ticks.size() >= 3) return ticks;
  }
  return nice_ticks(lo, hi, 6);
}

// Maps data to the plot area's pixels.
struct Frame {
  double x0, x1, y0, y1;            // data ranges (y in log10 when log_y)
  double left, right, top, bottom;  // pixels
  bool log_y;
  double px(double step) const { return left + (step - x0) / (x1 - x0) * (right - left); }
  double py(double loss) const {
    const double v = log_y ? std::log10(loss) : loss;
    return bottom - (v - y0) / (y1 - y0) * (bottom - top);
  }
};

Frame frame_of(const std::vector<LossCurves>& runs, const PlotOptions& o) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& r : runs)
    for (const auto* curve : {&r.loss, &r.eval})
      for (const auto& [step, loss] : *curve) {
        if (o.log_y && loss <= 0) continue;
        const double v = o.log_y ? std::log10(loss) : loss;
        x0 = std::min(x0, static_cast<double>(step));
        x1 = std::max(x1, static_cast<double>(step));
        y0 = std::min(y0, v);
        y1 = std::max(y1, v);
      }
  if (x1 <= x0) x1 = x0 + 1;
  const double pad = y1 > y0 ? 0.05 * (y1 - y0) : 0.5;
  return Frame{x0, x1, y0 - pad, y1 + pad, 70, o.width - 200.0, 45, o.height - 55.0, o.log_y};
}

std::string axes(const Frame& f, const PlotOptions& o) {
  std::string s;
  for (double t : nice_ticks(f.x0, f.x1, 8)) {
    const double x = f.px(t);
    s += str("<line x1=\"", num(x), "\" y1=\"", num(f.top), "\" x2=\"", num(x), "\" y2=\"", num(f.bottom),
             "\" stroke=\"#e5e5e5\"/>\n<text x=\"", num(x), "\" y=\"", num(f.bottom + 18), "\" text-anchor=\"middle\">",
             tick_label(t), "</text>\n");
  }
  const std::vector<double> yticks = f.log_y ? log_ticks(f.y0, f.y1) : nice_ticks(f.y0, f.y1, 6);
  for (double t : yticks) {
    const double y = f.log_y ? f.py(std::pow(10.0, t)) : f.py(t);
    s += str("<line x1=\"", num(f.left), "\" y1=\"", num(y), "\" x2=\"", num(f.right), "\" y2=\"", num(y),
             "\" stroke=\"#e5e5e5\"/>\n<text x=\"", num(f.left - 8), "\" y=\"", num(y + 4), "\" text-anchor=\"end\">",
             tick_label(f.log_y ? std::pow(10.0, t) : t), "</text>\n");
  }
  s += str("<rect x=\"", num(f.left), "\" y=\"", num(f.top), "\" width=\"", num(f.right - f.left), "\" height=\"",
           num(f.bottom - f.top), "\" fill=\"none\" stroke=\"#444\"/>\n");
  s += str("<text x=\"", num((f.left + f.right) / 2), "\" y=\"", num(o.height - 15.0),
           "\" text-anchor=\"middle\">step</text>\n");
  s += str("<text transform=\"translate(18,", num((f.top + f.bottom) / 2), ") rotate(-90)\" text-anchor=\"middle\">",
           o.log_y ? "loss (log scale)" : "loss", "</text>\n");
  return s + str("<text x=\"", num((f.left + f.right) / 2), "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">",
                 escape_xml(o.title), "</text>\n");
}

std::string polyline(const Frame& f, const std::vector<std::pair<int64_t, double>>& points, const char* color,
                     bool dashed) {
  std::string pts;
  for (const auto& [step, loss] : points)
    if (!f.log_y || loss > 0)
      pts += str(pts.empty() ? "" : " ", num(f.px(static_cast<double>(step))), ",", num(f.py(loss)));
  if (pts.empty()) return "";
  std::string s = str("<polyline fill=\"none\" stroke=\"", color, "\" stroke-width=\"2\"",
                      dashed ? " stroke-dasharray=\"6 4\"" : "", " points=\"", pts, "\"/>\n");
  if (dashed)
    for (const auto& [step, loss] : points)
      if (!f.log_y || loss > 0)
        s += str("<circle cx=\"", num(f.px(static_cast<double>(step))), "\" cy=\"", num(f.py(loss)),
                 "\" r=\"3\" fill=\"", color, "\"/>\n");
  return s;
}

std::string legend(const std::vector<LossCurves>& runs, const Frame& f) {
  std::string s;
  double y = f.top + 10;
  for (size_t i = 0; i < runs.size(); ++i) {
    const char* color = kColors[i % std::size(kColors)];
    const std::string label = escape_xml(runs[i].label);
    for (bool held_out : {false, true}) {
      if (held_out && runs[i].eval.empty()) continue;
      s += str("<line x1=\"", num(f.right + 14), "\" y1=\"", num(y), "\" x2=\"", num(f.right + 40), "\" y2=\"", num(y),
               "\" stroke=\"", color, "\" stroke-width=\"2\"", held_out ? " stroke-dasharray=\"6 4\"" : "", "/>\n");
      s += str("<text x=\"", num(f.right + 46), "\" y=\"", num(y + 4), "\">", label,
               held_out ? " (held-out)" : " (train)", "</text>\n");
      y += 20;
    }
  }
  return s;
}

}  // namespace

LossCurves read_loss_curves(const std::string& path) {
  std::ifstream in(path);
  FSDP_CHECK(in.good(), "[plot] cannot read ", quoted(path), "; give metrics files written by logging.metrics_file");
  std::map<int64_t, double> loss, eval;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (trim(line).empty()) continue;
    nlohmann::json j;
    try {
      j = parse_json(line, str("[plot] ", path, ":", n));
    } catch (const InputError& e) {
      throw InputError(str(e.what(), "; is this a logging.metrics_file?"));
    }
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const int64_t step = j["step"].get<int64_t>();
    for (const auto& [key, curve] :
         {std::pair<const char*, std::map<int64_t, double>*>{"loss", &loss}, {"eval_loss", &eval}}) {
      if (!j.contains(key) || !j[key].is_number()) continue;
      const double v = j[key].get<double>();
      // Past this, the axis arithmetic itself overflows: such a run diverged long before.
      FSDP_CHECK(std::abs(v) <= kMaxPlotted, "[plot] ", path, ":", n, ": ", key, " ", v,
                 " is too large to draw (beyond 1e100); the run diverged. Plot it up to the step before");
      (*curve)[step] = v;
    }
  }
  FSDP_CHECK(!loss.empty() || !eval.empty(), "[plot] ", path, " holds no loss; is this a logging.metrics_file?");
  LossCurves c;
  const std::string name = base_name(path), folder = base_name(parent_folder(path));
  c.label = name == "metrics.jsonl" && folder != "." && folder != "/" ? folder : name.substr(0, name.rfind(".jsonl"));
  c.loss.assign(loss.begin(), loss.end());
  c.eval.assign(eval.begin(), eval.end());
  return c;
}

std::string plot_svg(const std::vector<LossCurves>& runs, const PlotOptions& o) {
  const Frame f = frame_of(runs, o);
  std::string s = str("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", o.width, "\" height=\"", o.height,
                      "\" viewBox=\"0 0 ", o.width, " ", o.height,
                      "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
                      "fill=\"white\"/>\n");
  s += axes(f, o);
  for (size_t i = 0; i < runs.size(); ++i) {
    const char* color = kColors[i % std::size(kColors)];
    s += polyline(f, runs[i].loss, color, false);
    s += polyline(f, runs[i].eval, color, true);
  }
  return s + legend(runs, f) + "</svg>\n";
}

}  // namespace fsdp::train

// `fsdptrain plot`: the loss and held-out loss of one or more runs against the step, from their
// metrics files (logging.metrics_file), as an SVG any browser opens. No LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::train {

struct LossCurves {
  std::string label;                               // the legend's name for the run
  std::vector<std::pair<int64_t, double>> loss;    // (step, training loss), ascending steps
  std::vector<std::pair<int64_t, double>> eval;    // (step, held-out loss)
};

// Reads a metrics JSONL file. A step logged twice (a run resumed, or repeated into the same file)
// keeps its last value. label: the file's name without .jsonl, or its folder's name when the file
// is metrics.jsonl. Throws InputError naming the file and line for a line that is not JSON, and
// for a file with no loss at all.
LossCurves read_loss_curves(const std::string& path);

struct PlotOptions {
  bool log_y = false;  // a logarithmic loss axis
  std::string title = "Loss";
  int width = 860, height = 500;
};

// The SVG document: one color per run, the training loss as a solid line, the held-out loss dashed
// with markers, a legend, axes with round ticks and a grid.
std::string plot_svg(const std::vector<LossCurves>& runs, const PlotOptions& options);

}  // namespace fsdp::train

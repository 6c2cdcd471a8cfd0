// Traces logging.profile_steps of a training run with LibTorch's Kineto profiler: one Chrome/
// Perfetto trace per rank (open it in https://ui.perfetto.dev or chrome://tracing) holding the
// host's ops and our named ranges (step N, forward/backward micro-batch k, fsdp gather/reduce
// <unit>, the collectives, grad norm, optimizer) and, on a GPU, its kernels, copies and NCCL
// collectives. Works on CPU too.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "config/config.h"

namespace fsdp::train {

// [first, last] of logging.profile_steps for a run of `steps` steps ({0, 0}: none; --profile alone:
// steps 3 and 4, or the last two of a shorter run). Throws InputError for steps past `steps`.
std::pair<int64_t, int64_t> profile_window(const config::LoggingConfig& logging, int64_t steps);

class StepProfiler {
 public:
  StepProfiler(const config::LoggingConfig& logging, int64_t steps, int rank, const c10::Device& device);
  ~StepProfiler();  // a trace left running (the run failed inside the window) is dropped

  void before_step(int64_t step);  // starts tracing at the window's first step
  // At the window's last step: waits for the device, stops and writes the trace; returns its path
  // ("" at any other step).
  std::string after_step(int64_t step);
  std::pair<int64_t, int64_t> window() const { return window_; }

 private:
  std::pair<int64_t, int64_t> window_;
  std::string path_;
  c10::Device device_;
  bool running_ = false;
};

}  // namespace fsdp::train

#include "train/profiler.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <stdlib.h>

#include <algorithm>
#include <set>

#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::train {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;

namespace {

// Each op with its inputs' shapes and dtypes (the trace's "Input Dims" and "Input type"), so a
// trace says which products ran in which dtype (scripts/bench/trace_summary.py sums them).
torch::profiler::impl::ProfilerConfig kineto_config() {
  return torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO,
                                               /*report_input_shapes=*/true);
}

std::set<ActivityType> activities_for(const c10::Device& device) {
  std::set<ActivityType> a{ActivityType::CPU};
  if (device.is_cuda()) a.insert(ActivityType::CUDA);
  return a;
}

// Returns once the device has run everything queued on its current stream.
void wait_for_device(const c10::Device& device) {
  if (!device.is_cuda()) return;
  const c10::impl::VirtualGuardImpl guard(device.type());
  c10::Event done(device.type());
  done.record(guard.getStream(device));
  done.synchronize();
}

}  // namespace

std::pair<int64_t, int64_t> profile_window(const config::LoggingConfig& l, int64_t steps) {
  if (l.profile_first == 0) return {0, 0};
  if (l.profile_first == config::kProfileAuto) return {std::max<int64_t>(1, std::min<int64_t>(3, steps - 1)),
                                                       std::min<int64_t>(4, steps)};
  FSDP_CHECK(l.profile_last <= steps, "logging.profile_steps: [", l.profile_first, ", ", l.profile_last,
             "] goes past the run's last step (train.steps is ", steps, "); trace steps within 1..", steps);
  return {l.profile_first, l.profile_last};
}

StepProfiler::StepProfiler(const config::LoggingConfig& logging, int64_t steps, int rank, const c10::Device& device)
    : window_(profile_window(logging, steps)), device_(device) {
  if (window_.first == 0) return;
  make_directories(logging.profile_dir);
  path_ = str(logging.profile_dir, "/rank", rank, ".steps-", window_.first, "-", window_.second, ".json");
  // Without a GPU, Kineto's probe for one prints an error that is not one (unless asked to speak).
  if (!device_.is_cuda()) setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  profiler::prepareProfiler(kineto_config(), activities_for(device_));  // CUPTI set up before step 1
}

StepProfiler::~StepProfiler() {
  if (!running_) return;
  try {
    (void)profiler::disableProfiler();
  } catch (...) {  // the run's own error is the one to report
  }
}

void StepProfiler::before_step(int64_t step) {
  if (running_ || step < window_.first || step > window_.second) return;
  profiler::enableProfiler(kineto_config(), activities_for(device_));
  running_ = true;
}

std::string StepProfiler::after_step(int64_t step) {
  if (!running_ || step != window_.second) return "";
  wait_for_device(device_);  // the window's kernels finish inside the trace
  std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  running_ = false;
  result->save(path_);
  FSDP_CHECK(file_exists(path_), "[train] the profiler did not write ", path_, "; check logging.profile_dir");
  return path_;
}

}  // namespace fsdp::train

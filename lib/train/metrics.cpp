#include "train/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#if FSDP_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "util/error.h"
#include "util/strings.h"

namespace fsdp::train {

namespace {

std::string duration(double s) {
  char buf[48];
  if (!(s < 86400.0 * 1e5))  // also NaN: a run of steps no machine will finish
    std::snprintf(buf, sizeof(buf), "over 100000 days");
  else if (s >= 86400)
    std::snprintf(buf, sizeof(buf), "%lldd%02dh", static_cast<long long>(s / 86400), static_cast<int>(s / 3600) % 24);
  else if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%dh%02dm", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof(buf), "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  else
    std::snprintf(buf, sizeof(buf), "%.0fs", s);
  return buf;
}

// In doubles: steps may be up to 2^63, where step * 100 would overflow. The pace is this launch's:
// elapsed_s covers the steps after resumed_from only.
double eta_seconds(int64_t step, int64_t steps, double elapsed_s, int64_t resumed_from) {
  const int64_t done = step - resumed_from;
  return done > 0 ? elapsed_s / static_cast<double>(done) * static_cast<double>(steps - step) : 0;
}

// label then v with `digits` decimals.
std::string fixed(const char* label, double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%.*f", label, digits, v);
  return buf;
}

}  // namespace

std::string format_metrics(const StepMetrics& m) {
  char head[160];
  std::snprintf(head, sizeof(head), "step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f",
                static_cast<long long>(m.step), static_cast<long long>(m.steps), m.loss, m.lr, m.grad_norm);
  std::string moe;
  if (m.aux_loss) moe += fixed(" | aux loss ", *m.aux_loss, 4);
  if (!m.expert_load.empty()) {
    double sum = 0;
    for (double v : m.expert_load) sum += v;
    const double mean = sum / static_cast<double>(m.expert_load.size());
    const auto [lo, hi] = std::minmax_element(m.expert_load.begin(), m.expert_load.end());
    if (mean > 0) moe += fixed(" | experts' load max ", *hi / mean, 2) + fixed(" min ", *lo / mean, 2) + " of mean";
  }
  char mfu[32] = "n/a";
  if (m.mfu) std::snprintf(mfu, sizeof(mfu), "%.1f%%", 100.0 * *m.mfu);
  return str(head, moe, " | ", format_count(m.tokens_per_s), " tok/s (", format_count(m.tokens_per_s_per_device),
             "/device) | MFU ", mfu, " | peak mem ", format_bytes(m.peak_memory_bytes), " | ",
             static_cast<int64_t>(m.step_time_s * 1000 + 0.5), " ms/step | ETA ",
             duration(eta_seconds(m.step, m.steps, m.elapsed_s, m.resumed_from)));
}

std::string progress_bar(int64_t step, int64_t steps, double loss, double elapsed_s, int64_t resumed_from) {
  constexpr int kWidth = 20;
  const double done = steps > 0 ? std::min(1.0, static_cast<double>(step) / static_cast<double>(steps)) : 1.0;
  const int filled = static_cast<int>(kWidth * done);
  char tail[96];
  std::snprintf(tail, sizeof(tail), "] %3d%% step %lld/%lld | loss %.4f | ETA ", static_cast<int>(100 * done),
                static_cast<long long>(step), static_cast<long long>(steps), loss);
  return "[" + std::string(filled, '#') + std::string(kWidth - filled, '-') + tail +
         duration(eta_seconds(step, steps, elapsed_s, resumed_from));
}

std::string metrics_json(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"tokens_per_s", m.tokens_per_s},
                      {"tokens_per_s_per_device", m.tokens_per_s_per_device},
                      {"mfu", m.mfu ? nlohmann::json(*m.mfu) : nlohmann::json(nullptr)},
                      {"peak_memory_bytes", m.peak_memory_bytes},
                      {"step_time_s", m.step_time_s}};
  if (m.aux_loss) j["aux_loss"] = *m.aux_loss;
  if (!m.expert_load.empty()) j["expert_load"] = m.expert_load;
  return j.dump();
}

int64_t peak_memory_bytes(const c10::Device& device) {
#if FSDP_HAVE_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;
  }
#endif
  (void)device;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return static_cast<int64_t>(std::stoll(line.substr(6))) * 1024;
  return 0;
}

std::optional<double> peak_flops(const c10::Device& device, double configured_tflops) {
  if (configured_tflops > 0) return configured_tflops * 1e12;
#if FSDP_HAVE_CUDA
  if (device.is_cuda()) {
    const std::string name = at::cuda::getDeviceProperties(device.index())->name;
    // Dense bf16 tensor-core peaks (datasheets; the sparsity figures are twice these).
    const std::pair<const char*, double> known[] = {{"H200", 989e12},  {"H100", 989e12}, {"H800", 989e12},
                                                    {"B200", 2250e12}, {"A100", 312e12}, {"A800", 312e12},
                                                    {"L40S", 362e12},  {"A10G", 70e12}};
    for (const auto& [key, flops] : known)
      if (name.find(key) != std::string::npos) return flops;
  }
#endif
  (void)device;
  return std::nullopt;
}

std::string dist_timeout_warning(double step_time_s, double dist_timeout_s, bool queued_ahead) {
  if (!queued_ahead || 2 * step_time_s < dist_timeout_s) return "";
  return str("[train] warning: a step takes ", format_seconds(step_time_s), " and dist_timeout is ",
             format_seconds(dist_timeout_s),
             "; the collective watchdog counts a collective's time from when it was "
             "queued, up to a step before it runs, so collectives may time out while they wait their turn. Raise "
             "dist_timeout (--dist_timeout) above ",
             format_seconds(std::ceil(3 * step_time_s)));
}

}  // namespace fsdp::train

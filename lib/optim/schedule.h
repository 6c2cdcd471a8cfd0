// Learning-rate schedules: linear warmup from 0, then cosine or linear decay to lr * min_lr_ratio
// at the last step, or constant.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace fsdp::optim {

enum class Decay { kCosine, kLinear, kConstant };

struct ScheduleOptions {
  Decay decay = Decay::kCosine;
  int64_t warmup_steps = 10;
  double min_lr_ratio = 0.1;  // the schedule ends at peak * min_lr_ratio
};

// step is 1-based (the step about to run); total is the run's number of steps.
inline double learning_rate(const ScheduleOptions& s, double peak, int64_t step, int64_t total) {
  if (s.warmup_steps > 0 && step <= s.warmup_steps) return peak * static_cast<double>(step) / s.warmup_steps;
  const double min_lr = peak * s.min_lr_ratio;
  const int64_t decay_steps = std::max<int64_t>(1, total - s.warmup_steps);
  const double p = std::clamp(static_cast<double>(step - s.warmup_steps) / decay_steps, 0.0, 1.0);
  switch (s.decay) {
    case Decay::kCosine:
      return min_lr + (peak - min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
    case Decay::kLinear:
      return peak - (peak - min_lr) * p;
    case Decay::kConstant:
      return peak;
  }
  return peak;
}

}  // namespace fsdp::optim

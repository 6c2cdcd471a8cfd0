// What a training run reports: per-step metrics, the device's peak memory and FLOP rate.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::train {

struct StepMetrics {
  int64_t step = 0, steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_s = 0, tokens_per_s_per_device = 0;
  std::optional<double> mfu;  // fraction of peak; none on CPU or an unknown GPU
  int64_t peak_memory_bytes = 0;
  double step_time_s = 0;
  double elapsed_s = 0;     // since this launch's first step
  int64_t resumed_from = 0;  // steps done before this launch (a resume): the ETA counts this launch's
  // A mixture of experts: the auxiliary load-balancing loss (before router_aux_loss_coef; the ranks'
  // and micro-batches' mean) and the step's top-k assignments per expert over every sparse layer.
  std::optional<double> aux_loss;
  std::vector<double> expert_load;
};

// One line: "step 10/100 | loss 4.1234 | lr 3.00e-04 | grad norm 1.23 | 12.3k tok/s (6.1k/device)
// | MFU n/a | peak mem 512.0 MB | 120 ms/step | ETA 1m48s"; a mixture of experts adds
// "| aux loss 2.0312 | experts' load max 1.42 min 0.61 of mean" after the gradient norm.
std::string format_metrics(const StepMetrics& m);
std::string metrics_json(const StepMetrics& m);
// "[########------------] 40% step 400/1000 | loss 1.4627 | ETA 22s"
// resumed_from: as StepMetrics'.
std::string progress_bar(int64_t step, int64_t steps, double loss, double elapsed_s, int64_t resumed_from = 0);

// A GPU trainer queues a step's collectives while the step before still runs, and the collective
// watchdog counts from when the host queued them: a dist_timeout under two steps times collectives
// out that are merely waiting their turn. The warning to print once for a step of `step_time_s`;
// "" when dist_timeout leaves room (or on CPU, where nothing is queued ahead).
std::string dist_timeout_warning(double step_time_s, double dist_timeout_s, bool queued_ahead);

// Peak memory of this process: the CUDA allocator's peak on a GPU, the resident-set high-water
// mark (VmHWM) on CPU.
int64_t peak_memory_bytes(const c10::Device& device);

// Dense bf16 peak FLOP/s of one device from its name (H100, H200, A100, B200...); none when unknown
// or on CPU. configured_tflops > 0 wins.
std::optional<double> peak_flops(const c10::Device& device, double configured_tflops);

}  // namespace fsdp::train

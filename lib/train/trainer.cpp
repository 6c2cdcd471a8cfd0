// The training loop. Each step's work lives in TrainingRun (training_run.cpp); what happens
// between steps (metrics, checkpoints, exports, held-out loss) lives in RunReport below.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "train/metrics.h"
#include "train/training_run.h"
#include "util/error.h"
#include "util/log.h"
#include "util/strings.h"

namespace fsdp::train {

namespace {

using Clock = std::chrono::steady_clock;

// What happens after a step: metrics (printed, metrics file, progress bar), a checkpoint, a
// Hugging Face export and the held-out loss, each when its interval comes due and once more after
// the last step; and the summary when the run ends.
class RunReport {
 public:
  RunReport(TrainingRun& run, int64_t first_step)
      : run_(run),
        config_(run.config()),
        start_(Clock::now()),
        peak_(peak_flops(run.context().device, config_.logging.peak_tflops)) {
    summary_.resumed_from = summary_.steps = first_step - 1;
    const char* progress = std::getenv("FSDPTRAIN_PROGRESS");  // a live bar on the launcher's terminal
    progress_ = run.context().is_main() && progress && std::string(progress) == "1";
    if (run.context().is_main() && !config_.logging.metrics_file.empty()) {
      metrics_.open(config_.logging.metrics_file, std::ios::app);
      FSDP_CHECK(metrics_.good(), "[train] cannot open logging.metrics_file ", quoted(config_.logging.metrics_file));
    }
  }

  void after_step(int64_t step, const StepResult& result) {
    const bool last = step == config_.train.steps;
    if (!result.skipped.empty()) {
      run_.say(str("[train] step ", step, ": ", result.skipped, "; step skipped (train.skip_nonfinite_loss)\n"));
    } else {
      if (summary_.steps == summary_.resumed_from) summary_.first_loss = result.loss;
      summary_.last_loss = result.loss;
      if (due(step, config_.logging.interval) || step == 1) log_metrics(step, result);
    }
    summary_.steps = step;
    if (progress_)
      run_.out() << kProgressLinePrefix
                 << progress_bar(step, config_.train.steps, summary_.last_loss, seconds_since(start_)) << std::endl;
    if (run_.checkpointing() && due(step, config_.checkpoint.interval)) save(step);
    if (!config_.checkpoint.export_dir.empty() && due(step, config_.checkpoint.export_interval)) run_.export_hf(step);
    if (due(step, config_.train.eval_interval) || last) log_eval(step, run_.evaluate());
  }

  TrainSummary finish() {
    run_.wait_for_checkpoint();
    const int64_t trained = summary_.steps - summary_.resumed_from;
    if (trained == 0) summary_.eval_loss = run_.evaluate();  // nothing trained: the loaded model's
    summary_.seconds = seconds_since(start_);
    summary_.tokens_per_s = trained > 0 ? run_.tokens_per_step() * trained / summary_.seconds : 0;
    char line[256];
    std::snprintf(line, sizeof(line),
                  "[train] done: %lld steps in %.1f s; loss %.4f -> %.4f; held-out loss %.4f; %.0f tokens/s\n",
                  static_cast<long long>(trained), summary_.seconds, summary_.first_loss, summary_.last_loss,
                  summary_.eval_loss, summary_.tokens_per_s);
    run_.say(line);
    return summary_;
  }

 private:
  // Every `interval` steps (0: never), and at the last step.
  bool due(int64_t step, int64_t interval) const {
    return (interval > 0 && step % interval == 0) || step == config_.train.steps;
  }

  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }

  void log_metrics(int64_t step, const StepResult& result) {
    StepMetrics m;
    m.step = step;
    m.steps = config_.train.steps;
    m.loss = result.loss;
    m.lr = result.lr;
    m.grad_norm = result.grad_norm;
    m.tokens_per_s = run_.tokens_per_step() / result.seconds;
    m.tokens_per_s_per_device = m.tokens_per_s / run_.context().world_size;
    if (peak_) m.mfu = run_.flops_per_token() * m.tokens_per_s_per_device / *peak_;
    m.peak_memory_bytes = peak_memory_bytes(run_.context().device);
    m.step_time_s = result.seconds;
    m.elapsed_s = seconds_since(start_);
    run_.say(format_metrics(m) + "\n");
    if (metrics_.is_open()) metrics_ << metrics_json(m) << "\n" << std::flush;
  }

  void save(int64_t step) {
    if (step == last_saved_) return;
    run_.save_checkpoint(step);
    last_saved_ = step;
  }

  void log_eval(int64_t step, double loss) {
    summary_.eval_loss = loss;
    if (!std::isfinite(loss)) return;
    run_.say(str("[train] step ", step, ": held-out loss ", loss, "\n"));
    if (metrics_.is_open()) metrics_ << "{\"step\": " << step << ", \"eval_loss\": " << loss << "}\n" << std::flush;
  }

  TrainingRun& run_;
  const config::Config& config_;
  const Clock::time_point start_;
  const std::optional<double> peak_;
  bool progress_ = false;
  std::ofstream metrics_;
  int64_t last_saved_ = -1;
  TrainSummary summary_;
};

}  // namespace

std::vector<std::string> check_trainer_config(const config::ResolvedConfig& resolved) {
  FSDP_CHECK(resolved.typed.fsdp.ignored_modules.empty(),
             "[train] fsdp_config.fsdp_ignored_modules: the built-in trainer shards, trains, checkpoints and exports "
             "every parameter, so it cannot leave modules out (FSDP2's ignored_params; the engine supports them for "
             "programs that call fully_shard, and Python programs get FSDP_IGNORED_MODULES); remove the key to use "
             "the built-in trainer");
  return config::unused_by_trainer(resolved);
}

TrainSummary run_training(const dist::WorkerContext& context, const config::ResolvedConfig& resolved,
                          std::ostream& out, const TrainHooks& hooks) {
  check_trainer_config(resolved);
  TrainingRun run(context, resolved, out, hooks);  // group, data, model, optimizer, checkpointer
  const int64_t first_step = run.resume();        // 1, or the step after the checkpoint's
  RunReport report(run, first_step);
  for (int64_t step = first_step; step <= run.config().train.steps; ++step) {
    const StepResult result = run.train_step(step);  // micro-batches, loss, backward, clip, AdamW
    report.after_step(step, result);                 // metrics, checkpoint, export, held-out loss
  }
  return report.finish();
}

}  // namespace fsdp::train

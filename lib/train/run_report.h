// What a training run tells: each step's metrics (printed, the metrics file, TensorBoard, the
// progress line), the held-out losses, where its checkpoints and exports went, and its summary
// (printed, run.json). It reports; the loop (trainer.cpp) does the work and tells it what happened.
//
// Rank 0 writes the files; every rank calls every method in the same order (what is printed goes
// through TrainingRun::say, rank 0's). Not thread-safe.
#pragma once

#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "train/metrics.h"
#include "train/tensorboard.h"
#include "train/train_summary.h"
#include "train/training_run.h"
#include "util/clock.h"

namespace fsdp::train {

// run.json: in the run folder, written when the run starts (finished: false) and when it ends.
std::string run_summary_path(const config::Config& c);

// When each piece of work between steps comes due: every `interval` steps (0: never), and at the
// last step.
class Due {
 public:
  explicit Due(const TrainingRun& run) : run_(run), config_(run.config()) {}

  bool metrics(int64_t step) const { return step == 1 || every(step, config_.logging.interval); }
  // train.eval_interval; and with checkpoint.keep_best before every checkpoint, which records it.
  bool evaluation(int64_t step) const {
    return every(step, config_.train.eval_interval) || (checkpoint(step) && config_.checkpoint.keep_best);
  }
  bool checkpoint(int64_t step) const { return run_.checkpointing() && every(step, config_.checkpoint.interval); }
  bool export_hf(int64_t step) const {
    return !config_.checkpoint.export_dir.empty() && every(step, config_.checkpoint.export_interval);
  }
  // Whether any is: then the step is read at once, not while the next one runs.
  bool any(int64_t step) const { return metrics(step) || evaluation(step) || checkpoint(step) || export_hf(step); }

 private:
  bool every(int64_t step, int64_t interval) const {
    return (interval > 0 && step % interval == 0) || step == run_.steps();
  }

  const TrainingRun& run_;
  const config::Config& config_;
};

class RunReport {
 public:
  // Opens the metrics file and TensorBoard's, and writes run.json's start (rank 0).
  RunReport(TrainingRun& run, const Due& due, int64_t first_step);

  // A step's numbers, read: its metrics when due (speed over the steps since the device was last
  // idle), the loss summary, the progress line.
  void step(const StepResult& result);
  void held_out(int64_t step, double loss);  // "[train] step N: held-out loss X", and its records
  void saved(int64_t step);                  // a checkpoint of `step` is written (or being written)
  void exported(int64_t step);               // a Hugging Face folder of `step`
  // The device is idle after `step`'s work (a step read at once): the next timing window starts.
  void device_idle(int64_t step);
  // With nothing trained, the loaded model's held-out loss, for the summary.
  void untrained_held_out(double loss);

  int64_t last_step() const { return summary_.steps; }
  int64_t last_saved() const { return last_saved_; }  // -1: none
  int64_t trained() const { return summary_.steps - summary_.resumed_from; }

  // The run ended after its last step: "[train] done: ...", the offload note, run.json.
  TrainSummary finish();
  // A stop request (StopSignals) after the last step read, before the run's last: `sig` is this
  // rank's signal (0 when another rank's was). stopping() says so before the checkpoint is saved,
  // stopped() where it is, after.
  void stopping(int sig);
  TrainSummary stopped(int sig);

 private:
  void time_summary();
  void open_tensorboard(int64_t first_step);
  void log_metrics(const StepResult& result);
  void log_scalars(const StepMetrics& m);
  void write_run_start(int64_t first_step) const;
  void write_run_summary() const;
  nlohmann::json best_checkpoint() const;
  void record(const std::string& line);

  TrainingRun& run_;
  const Due& due_;
  const config::Config& config_;
  const Clock::time_point start_;
  const std::optional<double> peak_;
  Clock::time_point window_start_;  // timing: since the device was last idle, at the end of step window_step_
  int64_t window_step_;
  bool progress_ = false;
  bool timeout_warned_ = false;
  std::ofstream metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  int64_t last_saved_ = -1;
  std::string last_checkpoint_, last_export_;
  std::string stopped_by_;  // the signal that stopped the run early ("" when it was not)
  double best_loss_ = std::numeric_limits<double>::infinity();
  double best_eval_loss_ = std::numeric_limits<double>::infinity();
  TrainSummary summary_;
};

}  // namespace fsdp::train

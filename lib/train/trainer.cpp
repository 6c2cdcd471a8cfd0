// The training loop. Each step's work lives in TrainingRun (training_run.cpp); what happens
// between steps (metrics, checkpoints, exports, held-out loss) lives in RunReport below.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/format.h"
#include "config/show.h"
#include "dist/build_info.h"
#include "dist/error_file.h"
#include "train/estimate_memory.h"
#include "train/metrics.h"
#include "train/profiler.h"
#include "train/tensorboard.h"
#include "train/training_run.h"
#include "util/clock.h"
#include "util/env.h"
#include "util/error.h"
#include "util/files.h"
#include "util/log.h"
#include "util/strings.h"

namespace fsdp::train {

namespace {

// Where run.json goes: beside the metrics file, else in the TensorBoard folder; "" for neither.
std::string run_summary_path(const config::LoggingConfig& logging) {
  if (!logging.metrics_file.empty()) return parent_folder(logging.metrics_file) + "/run.json";
  return logging.tensorboard_dir.empty() ? "" : logging.tensorboard_dir + "/run.json";
}

std::string format_loss(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", v);
  return buf;
}

nlohmann::json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// What happens after a step: metrics (printed, metrics file, TensorBoard, progress bar), a
// checkpoint, a Hugging Face export and the held-out loss, each when its interval comes due and
// once more after the last step; and the summary (printed, run.json) when the run ends.
class RunReport {
 public:
  RunReport(TrainingRun& run, int64_t first_step)
      : run_(run),
        config_(run.config()),
        start_(Clock::now()),
        peak_(peak_flops(run.context().device, config_.logging.peak_tflops)),
        window_start_(start_),
        window_step_(first_step - 1) {
    summary_.resumed_from = summary_.steps = first_step - 1;
    // A live bar on the launcher's terminal.
    progress_ = run.context().is_main() && env_is("FSDPTRAIN_PROGRESS", "1");
    if (run.context().is_main() && !config_.logging.metrics_file.empty()) {
      make_directories(parent_folder(config_.logging.metrics_file));
      metrics_.open(config_.logging.metrics_file, std::ios::app);
      FSDP_CHECK(metrics_.good(), "[train] cannot open logging.metrics_file ", quoted(config_.logging.metrics_file));
    }
    if (run.context().is_main() && !config_.logging.tensorboard_dir.empty()) open_tensorboard(first_step);
  }

  // Whether step `step` is read at once (it is logged, checkpointed, exported or evaluated, or it is
  // the last); the others are read while the next step runs.
  bool wants_now(int64_t step) const { return logs(step) || saves(step) || exports(step) || evaluates(step); }

  void after_step(const StepResult& result) {
    const int64_t step = result.step;
    if (!result.skipped.empty()) {
      run_.say(str("[train] step ", step, ": ", result.skipped, "\n"));
    } else {
      if (summary_.steps == summary_.resumed_from) summary_.first_loss = result.loss;
      summary_.last_loss = result.loss;
      best_loss_ = std::min(best_loss_, result.loss);
      if (logs(step)) log_metrics(result);
    }
    summary_.steps = step;
    if (progress_)
      run_.out() << kProgressLinePrefix
                 << progress_bar(step, config_.train.steps, summary_.last_loss, seconds_since(start_)) << std::endl;
    if (saves(step)) save(step);
    if (exports(step)) run_.export_hf(step);
    if (evaluates(step)) log_eval(step, run_.evaluate());
    if (wants_now(step)) {  // the device is idle here: the next timing window starts now
      window_start_ = Clock::now();
      window_step_ = step;
    }
  }

  TrainSummary finish() {
    if (run_.step_pending()) after_step(run_.finish_step());
    run_.wait_for_checkpoint();
    const int64_t trained = summary_.steps - summary_.resumed_from;
    if (trained == 0) summary_.eval_loss = run_.evaluate();  // nothing trained: the loaded model's
    summary_.seconds = seconds_since(start_);
    summary_.tokens_per_s = trained > 0 ? run_.tokens_per_step() * trained / summary_.seconds : 0;
    char line[256];
    std::snprintf(line, sizeof(line), "[train] done: %lld steps in %.1f s; loss %.4f -> %.4f; %s; %.0f tokens/s\n",
                  static_cast<long long>(trained), summary_.seconds, summary_.first_loss, summary_.last_loss,
                  std::isnan(summary_.eval_loss) ? "nothing held out (data.eval_fraction)"
                                                 : str("held-out loss ", format_loss(summary_.eval_loss)).c_str(),
                  summary_.tokens_per_s);
    run_.say(line);
    if (run_.context().is_main()) write_run_summary();
    return summary_;
  }

 private:
  // Every `interval` steps (0: never), and at the last step.
  bool due(int64_t step, int64_t interval) const {
    return (interval > 0 && step % interval == 0) || step == config_.train.steps;
  }
  bool logs(int64_t step) const { return step == 1 || due(step, config_.logging.interval); }
  bool saves(int64_t step) const { return run_.checkpointing() && due(step, config_.checkpoint.interval); }
  bool exports(int64_t step) const {
    return !config_.checkpoint.export_dir.empty() && due(step, config_.checkpoint.export_interval);
  }
  bool evaluates(int64_t step) const { return due(step, config_.train.eval_interval); }

  // A resumed run tells TensorBoard to drop what earlier runs logged from first_step on.
  void open_tensorboard(int64_t first_step) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(config_.logging.tensorboard_dir);
    if (first_step > 1) tensorboard_->start_session(first_step);
    tensorboard_->add_text("config", first_step,
                           "```\n" + config::format_resolved(run_.resolved(), config::ShowFormat::kTable) + "```");
    run_.say(str("[train] TensorBoard events: ", tensorboard_->path(), "\n"));
  }

  void log_scalars(const StepMetrics& m) {
    if (!tensorboard_) return;
    tensorboard_->add_scalar("train/loss", m.step, m.loss);
    tensorboard_->add_scalar("train/learning_rate", m.step, m.lr);
    tensorboard_->add_scalar("train/grad_norm", m.step, m.grad_norm);
    tensorboard_->add_scalar("train/tokens_per_s", m.step, m.tokens_per_s);
    if (m.mfu) tensorboard_->add_scalar("train/mfu", m.step, *m.mfu);
    tensorboard_->add_scalar("train/peak_memory_gib", m.step, static_cast<double>(m.peak_memory_bytes) / (1 << 30));
    tensorboard_->add_scalar("train/step_time_s", m.step, m.step_time_s);
  }

  // run.json: what a script comparing runs needs, in one file.
  void write_run_summary() const {
    const std::string path = run_summary_path(config_.logging);
    if (path.empty()) return;
    nlohmann::json values = nlohmann::json::object();
    for (const auto& v : run_.resolved().values)
      values[v.spec->key] = v.value.empty() ? nlohmann::json(nullptr) : nlohmann::json(v.value);
    const dist::WorkerContext& ctx = run_.context();
    const double per_device = summary_.tokens_per_s / ctx.world_size;
    const nlohmann::json doc = {
        {"versions", version_line()},
        {"world_size", ctx.world_size},
        {"device", ctx.device.is_cuda() ? cuda_device_name(ctx.gpu) : std::string("cpu")},
        {"parameters", run_.num_parameters()},
        {"steps", summary_.steps},
        {"resumed_from", summary_.resumed_from},
        {"first_loss", finite_or_null(summary_.first_loss)},
        {"final_loss", finite_or_null(summary_.last_loss)},
        {"best_loss", finite_or_null(best_loss_)},
        {"final_eval_loss", finite_or_null(summary_.eval_loss)},
        {"best_eval_loss", finite_or_null(best_eval_loss_)},
        {"tokens_per_s", summary_.tokens_per_s},
        {"tokens_per_s_per_device", per_device},
        {"mfu", peak_ ? nlohmann::json(run_.flops_per_token() * per_device / *peak_) : nlohmann::json(nullptr)},
        {"peak_memory_bytes", peak_memory_bytes(ctx.device)},
        {"wall_time_s", summary_.seconds},
        {"checkpoint", last_checkpoint_.empty() ? nlohmann::json(nullptr) : nlohmann::json(last_checkpoint_)},
        {"metrics_file", config_.logging.metrics_file},
        {"tensorboard", tensorboard_ ? nlohmann::json(tensorboard_->path()) : nlohmann::json(nullptr)},
        {"config", values}};
    write_file_atomic(path, doc.dump(2) + "\n");
    run_.say(str("[train] run summary: ", path, "\n"));
  }

  // Speed over the steps since the device was last idle (the last logged, saved, exported or
  // evaluated step): the host runs ahead of the device, so one step's host time says nothing.
  void log_metrics(const StepResult& result) {
    StepMetrics m;
    m.step = result.step;
    m.steps = config_.train.steps;
    m.loss = result.loss;
    m.lr = result.lr;
    m.grad_norm = result.grad_norm;
    m.step_time_s = seconds_since(window_start_) / static_cast<double>(result.step - window_step_);
    m.tokens_per_s = run_.tokens_per_step() / m.step_time_s;
    m.tokens_per_s_per_device = m.tokens_per_s / run_.context().world_size;
    if (peak_) m.mfu = run_.flops_per_token() * m.tokens_per_s_per_device / *peak_;
    m.peak_memory_bytes = peak_memory_bytes(run_.context().device);
    m.elapsed_s = seconds_since(start_);
    run_.say(format_metrics(m) + "\n");
    if (!timeout_warned_) {
      const std::string w =
          dist_timeout_warning(m.step_time_s, config_.launch.dist_timeout, run_.context().device.is_cuda());
      timeout_warned_ = !w.empty();
      if (timeout_warned_) run_.say(w + "\n");
    }
    record(metrics_json(m));
    log_scalars(m);
  }

  void save(int64_t step) {
    if (step == last_saved_) return;
    run_.save_checkpoint(step);
    last_saved_ = step;
    last_checkpoint_ = config_.checkpoint.dir + "/" + ckpt::checkpoint_name(step);
  }

  void log_eval(int64_t step, double loss) {
    summary_.eval_loss = loss;
    if (!std::isfinite(loss)) return;
    best_eval_loss_ = std::min(best_eval_loss_, loss);
    if (tensorboard_) tensorboard_->add_scalar("eval/loss", step, loss);
    run_.say(str("[train] step ", step, ": held-out loss ", loss, "\n"));
    // Through the JSON writer, like the step lines: every digit of the double, not the stream's six.
    record(nlohmann::json{{"step", step}, {"eval_loss", loss}}.dump());
  }

  // One line of the metrics file, whole: a write that fails (a full disk) stops the run at once,
  // naming the file, rather than training on with a record that silently ends.
  void record(const std::string& line) {
    if (!metrics_.is_open()) return;
    metrics_ << line << "\n" << std::flush;
    if (!metrics_.good())
      throw Error(str("[train] cannot write logging.metrics_file ", quoted(config_.logging.metrics_file), ": ",
                      std::strerror(errno),
                      " (a full disk?); stopping so no record is lost unseen. Free space and "
                      "resume from the last checkpoint"));
  }

  TrainingRun& run_;
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
  std::string last_checkpoint_;
  double best_loss_ = std::numeric_limits<double>::infinity();
  double best_eval_loss_ = std::numeric_limits<double>::infinity();
  TrainSummary summary_;
};

// Settings the built-in trainer cannot honour: refused, in the launcher and in every worker.
void refuse_unsupported(const config::ResolvedConfig& resolved) {
  FSDP_CHECK(resolved.typed.fsdp.ignored_modules.empty(),
             "[train] fsdp_config.fsdp_ignored_modules: the built-in trainer shards, trains, checkpoints and exports "
             "every parameter, so it cannot leave modules out (FSDP2's ignored_params; the engine supports them for "
             "programs that call fully_shard, and Python programs get FSDP_IGNORED_MODULES); remove the key to use "
             "the built-in trainer");
}

// A fresh run's exports go to folders that must not exist yet: found now, not after the last step.
void check_exports_free(const config::Config& config) {
  const config::CheckpointConfig& c = config.checkpoint;
  if (c.export_dir.empty() || !c.resume.empty()) return;  // a resumed run exports from where it left off
  const int64_t steps = config.train.steps;
  std::vector<int64_t> due{steps};
  for (int64_t s = c.export_interval; c.export_interval > 0 && s < steps; s += c.export_interval) due.push_back(s);
  for (int64_t s : due) {
    const std::string dir = str(c.export_dir, "/step-", s);
    FSDP_CHECK(!file_exists(dir), "[train] checkpoint.export_dir: ", dir,
               " already exists (an earlier run's export), and this run would write its step ", s,
               " there; move or delete it, or give another export_dir");
  }
}

}  // namespace

std::vector<std::string> check_trainer_config(const config::ResolvedConfig& resolved) {
  refuse_unsupported(resolved);
  std::vector<std::string> warnings = config::unused_by_trainer(resolved);
  // Its config.json parses (InputError naming the file otherwise).
  const model::LlamaConfig model = model_config_of(resolved.typed, &warnings);
  // Its sizes fit this machine: a refusal now, not an allocator's error on some rank later.
  check_fits_machine(resolved.typed, model, model_config_path(resolved.typed),
                     resolved.typed.launch.processes_per_machine());
  data::plan_data(data_options_of(resolved.typed, model.vocab_size));  // a tokenizer for text, when it needs one
  const config::CheckpointConfig& c = resolved.typed.checkpoint;
  check_exports_free(resolved.typed);
  profile_window(resolved.typed.logging, resolved.typed.train.steps);  // within the run
  if (!c.dir.empty())  // writable, not damaged, room for a checkpoint: before any step, not at the first save
    ckpt::check_checkpoint_dir(c.dir, ckpt::checkpoint_bytes(model.num_parameters()), c.keep,
                               ckpt::local_file_system());
  return warnings;
}

void prepare_training_data(const config::ResolvedConfig& resolved, std::ostream& log, bool live) {
  const data::DataPlan plan = data::prepare_data(
      data_options_of(resolved.typed, model_config_of(resolved.typed).vocab_size), live ? &log : nullptr);
  if (!plan.note.empty()) log << plan.note << "\n";
  data::check_prompt_fits(plan.longest_prompt, plan.longest_prompt_at, resolved.typed.train.sequence_length);
}

void check_checkpoint_dir_free(const config::ResolvedConfig& resolved) {
  const std::string& dir = resolved.typed.checkpoint.dir;
  if (dir.empty() || resolved.typed.launch.machine_rank != 0) return;
  ckpt::check_unlocked(dir);
}

TrainSummary run_training(const dist::WorkerContext& context, const config::ResolvedConfig& resolved, std::ostream& out,
                          const TrainHooks& hooks) {
  refuse_unsupported(resolved);                    // the launcher ran check_trainer_config; the workers need only this
  TrainingRun run(context, resolved, out, hooks);  // group, data, model, optimizer, checkpointer
  try {
    const int64_t first_step = run.resume();  // 1, or the step after the checkpoint's
    RunReport report(run, first_step);
    StepProfiler profiler(run.config().logging, run.config().train.steps, context.rank, context.device);
    for (int64_t step = first_step; step <= run.config().train.steps; ++step) {
      profiler.before_step(step);
      // Queues micro-batches, loss, backward, clip, AdamW; returns the step before, read meanwhile.
      if (std::optional<StepResult> before = run.train_step(step)) report.after_step(*before);
      // Metrics, checkpoint, export, held-out loss: these read the step at once.
      if (report.wants_now(step)) report.after_step(run.finish_step());
      if (const std::string trace = profiler.after_step(step); !trace.empty())
        run.say(str("[train] profiled steps ", profiler.window().first, "-", step, ": ", trace,
                    " (each rank wrote its own; open in https://ui.perfetto.dev)\n"));
    }
    return report.finish();
  } catch (const std::exception& e) {
    // Recorded now, before `run` tears down the process groups and its peers fail for that.
    dist::record_worker_error(e.what());
    throw;
  }
}

}  // namespace fsdp::train

#include "train/run_report.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/format.h"
#include "config/show.h"
#include "dist/build_info.h"
#include "util/env.h"
#include "util/error.h"
#include "util/files.h"
#include "util/log.h"
#include "util/signal_name.h"
#include "util/strings.h"

namespace fsdp::train {

namespace {

// A resolved value as JSON of its type: numbers and booleans as such, lists as arrays, unset as null.
nlohmann::json typed_value(const config::ResolvedValue& v) {
  if (v.value.empty()) return nullptr;
  try {
    switch (v.spec->type) {
      case config::ValueType::kBool:
        return v.value == "true";
      case config::ValueType::kInt:
        return std::stoll(v.value);
      case config::ValueType::kFloat:
        return std::stod(v.value);
      case config::ValueType::kList:
        return split(v.value, ',');
      case config::ValueType::kMap:  // its JSON text
        return nlohmann::json::parse(v.value);
      default:
        return v.value;
    }
  } catch (const std::exception&) {
    return v.value;  // as written, when it does not read as its type
  }
}

nlohmann::json typed_values(const config::ResolvedConfig& rc) {
  nlohmann::json values = nlohmann::json::object();
  for (const auto& v : rc.values)
    if (v.spec->type != config::ValueType::kIgnored) values[v.spec->key] = typed_value(v);
  return values;
}

std::string format_loss(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", v);
  return buf;
}

nlohmann::json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

std::string run_summary_path(const config::Config& c) {
  return c.train.output_dir + "/run.json";
}

RunReport::RunReport(TrainingRun& run, const Due& due, int64_t first_step)
    : run_(run),
      due_(due),
      config_(run.config()),
      start_(Clock::now()),
      peak_(peak_flops(run.context().device, config_.logging.peak_tflops)),
      window_start_(start_),
      window_step_(first_step - 1) {
  summary_.resumed_from = summary_.steps = first_step - 1;
  // A live bar on the launcher's terminal.
  progress_ = run.context().is_main() && env_flag(env::kProgress);
  if (run.context().is_main() && !config_.logging.metrics_file.empty()) {
    make_directories(parent_folder(config_.logging.metrics_file));
    metrics_.open(config_.logging.metrics_file, std::ios::app);
    FSDP_CHECK(metrics_.good(), "[train] cannot open logging.metrics_file ", quoted(config_.logging.metrics_file));
  }
  if (run.context().is_main() && !config_.logging.tensorboard_dir.empty()) open_tensorboard(first_step);
  if (run.context().is_main()) write_run_start(first_step);
}

void RunReport::step(const StepResult& result) {
  const int64_t step = result.step;
  if (!result.skipped.empty()) {
    run_.say(str("[train] step ", step, ": ", result.skipped, "\n"));
  } else {
    if (summary_.steps == summary_.resumed_from) summary_.first_loss = result.loss;
    summary_.last_loss = result.loss;
    best_loss_ = std::min(best_loss_, result.loss);
    if (due_.metrics(step)) log_metrics(result);
  }
  summary_.steps = step;
  if (progress_)
    run_.out() << kProgressLinePrefix << progress_bar(step, run_.steps(), summary_.last_loss, seconds_since(start_), summary_.resumed_from)
               << std::endl;
}

void RunReport::held_out(int64_t step, double loss) {
  summary_.eval_loss = loss;
  if (!std::isfinite(loss)) return;
  best_eval_loss_ = std::min(best_eval_loss_, loss);
  if (tensorboard_) tensorboard_->add_scalar("eval/loss", step, loss);
  run_.say(str("[train] step ", step, ": held-out loss ", loss, "\n"));
  // Through the JSON writer, like the step lines: every digit of the double, not the stream's six.
  record(nlohmann::json{{"step", step}, {"eval_loss", loss}}.dump());
}

void RunReport::saved(int64_t step) {
  last_saved_ = step;
  last_checkpoint_ = config_.checkpoint.dir + "/" + ckpt::checkpoint_name(step);
}

void RunReport::exported(int64_t step) {
  last_export_ = str(config_.checkpoint.export_dir, "/step-", step);
}

void RunReport::device_idle(int64_t step) {
  window_start_ = Clock::now();
  window_step_ = step;
}

void RunReport::untrained_held_out(double loss) {
  summary_.eval_loss = loss;
}

TrainSummary RunReport::finish() {
  time_summary();
  char line[256];
  std::snprintf(line, sizeof(line), "[train] done: %lld steps in %.1f s; loss %.4f -> %.4f; %s; %.0f tokens/s\n",
                static_cast<long long>(trained()), summary_.seconds, summary_.first_loss, summary_.last_loss,
                std::isnan(summary_.eval_loss) ? "nothing held out (data.eval_fraction)"
                                               : str("held-out loss ", format_loss(summary_.eval_loss)).c_str(),
                summary_.tokens_per_s);
  run_.say(line);
  run_.say(run_.offload_note());
  if (run_.context().is_main()) write_run_summary();
  return summary_;
}

void RunReport::stopping(int sig) {
  const std::string why = sig ? signal_name(sig) : std::string("another rank's stop request");
  run_.say(
      str("[train] ", why, ": saving a checkpoint of step ", summary_.steps, " of ", run_.steps(), " and stopping\n"));
}

TrainSummary RunReport::stopped(int sig) {
  const std::string why = sig ? signal_name(sig) : std::string("another rank's stop request");
  time_summary();
  summary_.stopped = true;
  stopped_by_ = sig ? signal_name(sig) : "a signal to another rank";
  run_.say(str("[train] stopped at step ", summary_.steps, " of ", run_.steps(), " (", why,
               "); its checkpoint: ", last_checkpoint_, "\n"));
  if (run_.context().is_main()) write_run_summary();
  return summary_;
}

void RunReport::time_summary() {
  summary_.seconds = seconds_since(start_);
  summary_.tokens_per_s = trained() > 0 ? run_.tokens_per_step() * trained() / summary_.seconds : 0;
}

// A resumed run tells TensorBoard to drop what earlier runs logged from first_step on.
void RunReport::open_tensorboard(int64_t first_step) {
  tensorboard_ = std::make_unique<TensorBoardWriter>(config_.logging.tensorboard_dir);
  if (first_step > 1) tensorboard_->start_session(first_step);
  tensorboard_->add_text("config", first_step,
                         "```\n" + config::format_resolved(run_.resolved(), config::ShowFormat::kTable) + "```");
  run_.say(str("[train] TensorBoard events: ", tensorboard_->path(), "\n"));
}

void RunReport::log_scalars(const StepMetrics& m) {
  if (!tensorboard_) return;
  tensorboard_->add_scalar("train/loss", m.step, m.loss);
  tensorboard_->add_scalar("train/learning_rate", m.step, m.lr);
  tensorboard_->add_scalar("train/grad_norm", m.step, m.grad_norm);
  tensorboard_->add_scalar("train/tokens_per_s", m.step, m.tokens_per_s);
  if (m.mfu) tensorboard_->add_scalar("train/mfu", m.step, *m.mfu);
  tensorboard_->add_scalar("train/peak_memory_gib", m.step, static_cast<double>(m.peak_memory_bytes) / (1 << 30));
  tensorboard_->add_scalar("train/step_time_s", m.step, m.step_time_s);
}

// run.json as the run starts: that it has not finished, what it will do, the resolved config.
void RunReport::write_run_start(int64_t first_step) const {
  make_directories(config_.train.output_dir);
  const nlohmann::json doc = {{"finished", false},
                              {"versions", version_line()},
                              {"world_size", run_.context().world_size},
                              {"steps_planned", run_.steps()},
                              {"resumed_from", first_step - 1},
                              {"config", typed_values(run_.resolved())}};
  write_file_atomic(run_summary_path(config_), doc.dump(2) + "\n");
}

// run.json: what a script comparing runs needs, in one file.
void RunReport::write_run_summary() const {
  const std::string path = run_summary_path(config_);
  const dist::WorkerContext& ctx = run_.context();
  const double per_device = summary_.tokens_per_s / ctx.world_size;
  const nlohmann::json doc = {
      {"finished", summary_.steps >= run_.steps()},
      {"stopped_by", stopped_by_.empty() ? nlohmann::json(nullptr) : nlohmann::json(stopped_by_)},
      {"versions", version_line()},
      {"world_size", ctx.world_size},
      {"device", ctx.device.is_cuda() ? cuda_device_name(ctx.gpu) : std::string("cpu")},
      {"parameters", run_.num_parameters()},
      {"steps", summary_.steps},
      {"steps_planned", run_.steps()},
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
      {"best_checkpoint", best_checkpoint()},
      {"metrics_file", config_.logging.metrics_file},
      {"tensorboard", tensorboard_ ? nlohmann::json(tensorboard_->path()) : nlohmann::json(nullptr)},
      {"export", last_export_.empty() ? nlohmann::json(nullptr) : nlohmann::json(last_export_)},
      {"config", typed_values(run_.resolved())}};
  write_file_atomic(path, doc.dump(2) + "\n");
  run_.say(str("[train] run summary: ", path, "\n"));
}

// With checkpoint.keep_best: the checkpoint it keeps (null otherwise, or before any was measured).
nlohmann::json RunReport::best_checkpoint() const {
  if (!config_.checkpoint.keep_best || config_.checkpoint.dir.empty()) return nullptr;
  const std::string best = ckpt::best_checkpoint(config_.checkpoint.dir, ckpt::local_file_system());
  return best.empty() ? nlohmann::json(nullptr) : nlohmann::json(best);
}

// Speed over the steps since the device was last idle (the last logged, saved, exported or
// evaluated step): the host runs ahead of the device, so one step's host time says nothing.
void RunReport::log_metrics(const StepResult& result) {
  StepMetrics m;
  m.step = result.step;
  m.steps = run_.steps();
  m.loss = result.loss;
  m.lr = result.lr;
  m.grad_norm = result.grad_norm;
  m.aux_loss = result.aux_loss;
  m.expert_load = result.expert_load;
  m.step_time_s = seconds_since(window_start_) / static_cast<double>(result.step - window_step_);
  m.tokens_per_s = run_.tokens_per_step() / m.step_time_s;
  m.tokens_per_s_per_device = m.tokens_per_s / run_.context().world_size;
  if (peak_) m.mfu = run_.flops_per_token() * m.tokens_per_s_per_device / *peak_;
  m.peak_memory_bytes = peak_memory_bytes(run_.context().device);
  m.elapsed_s = seconds_since(start_);
  m.resumed_from = summary_.resumed_from;
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

// One line of the metrics file, whole: a write that fails (a full disk) stops the run at once,
// naming the file, rather than training on with a record that silently ends.
void RunReport::record(const std::string& line) {
  if (!metrics_.is_open()) return;
  metrics_ << line << "\n" << std::flush;
  if (!metrics_.good())
    throw Error(str("[train] cannot write logging.metrics_file ", quoted(config_.logging.metrics_file), ": ",
                    std::strerror(errno),
                    " (a full disk?); stopping so no record is lost unseen. Free space and "
                    "resume from the last checkpoint"));
}

}  // namespace fsdp::train

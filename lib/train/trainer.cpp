// The training loop. Each step's work lives in TrainingRun (training_run.cpp); what happens
// between steps (metrics, checkpoints, exports, held-out loss) lives in RunReport below.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/format.h"
#include "ckpt/hf.h"
#include "config/show.h"
#include "dist/build_info.h"
#include "dist/error_file.h"
#include "model/tensor_parallel.h"
#include "train/estimate_memory.h"
#include "train/metrics.h"
#include "train/profiler.h"
#include "train/stop_signals.h"
#include "train/tensorboard.h"
#include "train/training_run.h"
#include "util/clock.h"
#include "util/env.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/log.h"
#include "util/signal_name.h"
#include "util/strings.h"

namespace fsdp::train {

namespace {

// run.json: in the run folder, written when the run starts (finished: false) and when it ends.
std::string run_summary_path(const config::Config& c) {
  return c.train.output_dir + "/run.json";
}

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
    progress_ = run.context().is_main() && env_flag(env::kProgress);
    if (run.context().is_main() && !config_.logging.metrics_file.empty()) {
      make_directories(parent_folder(config_.logging.metrics_file));
      metrics_.open(config_.logging.metrics_file, std::ios::app);
      FSDP_CHECK(metrics_.good(), "[train] cannot open logging.metrics_file ", quoted(config_.logging.metrics_file));
    }
    if (run.context().is_main() && !config_.logging.tensorboard_dir.empty()) open_tensorboard(first_step);
    if (run.context().is_main()) write_run_start(first_step);
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
      run_.out() << kProgressLinePrefix << progress_bar(step, run_.steps(), summary_.last_loss, seconds_since(start_))
                 << std::endl;
    // The held-out loss first: a checkpoint records it (checkpoint.keep_best keeps the lowest).
    std::optional<double> eval_loss;
    if (evaluates(step) || (saves(step) && config_.checkpoint.keep_best)) {
      eval_loss = run_.evaluate();
      log_eval(step, *eval_loss);
    }
    if (saves(step)) save(step, eval_loss);
    if (exports(step)) {
      run_.export_hf(step);
      last_export_ = str(config_.checkpoint.export_dir, "/step-", step);
    }
    if (wants_now(step)) {  // the device is idle here: the next timing window starts now
      window_start_ = Clock::now();
      window_step_ = step;
    }
  }

  int64_t last_step() const { return summary_.steps; }

  TrainSummary finish() {
    if (run_.step_pending()) after_step(run_.finish_step());
    run_.wait_for_checkpoint();
    const int64_t trained = summary_.steps - summary_.resumed_from;
    if (trained == 0) summary_.eval_loss = run_.evaluate();  // nothing trained: the loaded model's
    time_summary();
    char line[256];
    std::snprintf(line, sizeof(line), "[train] done: %lld steps in %.1f s; loss %.4f -> %.4f; %s; %.0f tokens/s\n",
                  static_cast<long long>(trained), summary_.seconds, summary_.first_loss, summary_.last_loss,
                  std::isnan(summary_.eval_loss) ? "nothing held out (data.eval_fraction)"
                                                 : str("held-out loss ", format_loss(summary_.eval_loss)).c_str(),
                  summary_.tokens_per_s);
    run_.say(line);
    run_.say(run_.offload_note());
    if (run_.context().is_main()) write_run_summary();
    return summary_;
  }

  // After the step that read a stop request (StopSignals), before the last: saves a checkpoint of
  // this step, unless one was just saved, and says where it is. `sig`: this rank's signal (0 when
  // another rank's was).
  TrainSummary stop(int sig) {
    const int64_t step = summary_.steps;
    const std::string why = sig ? signal_name(sig) : std::string("another rank's stop request");
    run_.say(str("[train] ", why, ": saving a checkpoint of step ", step, " of ", run_.steps(), " and stopping\n"));
    std::optional<double> eval_loss;  // keep_best compares the held-out loss of every save
    if (config_.checkpoint.keep_best && step != last_saved_) eval_loss = run_.evaluate();
    save(step, eval_loss);
    run_.wait_for_checkpoint();
    // Rank 0 commits the checkpoint after the others wrote their shards: none exits before that, so a
    // scheduler that ends the job when its first process exits (srun --kill-on-bad-exit) loses nothing.
    run_.barrier();
    time_summary();
    summary_.stopped = true;
    stopped_by_ = sig ? signal_name(sig) : "a signal to another rank";
    run_.say(str("[train] stopped at step ", step, " of ", run_.steps(), " (", why,
                 "); its checkpoint: ", last_checkpoint_, "\n"));
    if (run_.context().is_main()) write_run_summary();
    return summary_;
  }

 private:
  void time_summary() {
    const int64_t trained = summary_.steps - summary_.resumed_from;
    summary_.seconds = seconds_since(start_);
    summary_.tokens_per_s = trained > 0 ? run_.tokens_per_step() * trained / summary_.seconds : 0;
  }

  // Every `interval` steps (0: never), and at the last step.
  bool due(int64_t step, int64_t interval) const {
    return (interval > 0 && step % interval == 0) || step == run_.steps();
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

  // run.json as the run starts: that it has not finished, what it will do, the resolved config.
  void write_run_start(int64_t first_step) const {
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
  void write_run_summary() const {
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
  nlohmann::json best_checkpoint() const {
    if (!config_.checkpoint.keep_best || config_.checkpoint.dir.empty()) return nullptr;
    const std::string best = ckpt::best_checkpoint(config_.checkpoint.dir, ckpt::local_file_system());
    return best.empty() ? nlohmann::json(nullptr) : nlohmann::json(best);
  }

  // Speed over the steps since the device was last idle (the last logged, saved, exported or
  // evaluated step): the host runs ahead of the device, so one step's host time says nothing.
  void log_metrics(const StepResult& result) {
    StepMetrics m;
    m.step = result.step;
    m.steps = run_.steps();
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

  void save(int64_t step, std::optional<double> eval_loss) {
    if (step == last_saved_) return;
    run_.save_checkpoint(step, eval_loss && std::isfinite(*eval_loss) ? eval_loss : std::nullopt);
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
  std::string last_checkpoint_, last_export_;
  std::string stopped_by_;  // the signal that stopped the run early ("" when it was not)
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
  // A resumed run exports from where it left off; with train.epochs the steps depend on the data.
  if (c.export_dir.empty() || !c.resume.empty() || config.train.epochs > 0) return;
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

// A fresh run does not write into the folder of an earlier one (its run.json says so): its
// checkpoints, exports and metrics would mix with that run's, and `resume: latest` would later
// pick either. Continuing the earlier run is checkpoint.resume's job.
void check_run_folder(const config::Config& config) {  // see check_run_folder_free
  const std::string path = run_summary_path(config);
  if (!config.checkpoint.resume.empty() || !file_exists(path)) return;
  std::string what = "an earlier run";
  bool finished = false;
  const std::string& dir = config.checkpoint.dir;
  const std::optional<std::string> holder = dir.empty() ? std::nullopt : ckpt::lock_holder(dir);
  if (const std::optional<nlohmann::json> j = try_read_json_file(path); j && j->is_object()) {
    const nlohmann::json& r = *j;
    finished = r.value("finished", false);
    const int64_t steps = r.value("steps", r.value("resumed_from", int64_t{0}));
    const std::string by = r.contains("stopped_by") && r["stopped_by"].is_string()
                               ? str(" on ", r["stopped_by"].get<std::string>())
                               : std::string();
    if (finished)
      what = str("a finished run (", steps, " steps)");
    else if (holder)
      what = str("a run that is still going (its checkpoint.dir is held by ", *holder, ")");
    else
      what = r.contains("stopped_by") ? str("a run that stopped at step ", steps, by)
                                      : str("a run that ended before its last step");
  }
  std::string saved;  // what a resume would continue from
  if (!holder && !finished && !dir.empty()) {
    const std::string latest = ckpt::latest_checkpoint(dir);
    saved = latest.empty() ? str("; it saved no checkpoint in ", dir) : str("; its newest checkpoint: ", latest);
  }
  throw InputError(str(
      "[train] train.output_dir ", config.train.output_dir, " holds ", what, " (", path, ")", saved,
      ". A new run there would mix its outputs with it. ",
      holder ? "Wait for it to end, or stop it (Ctrl-C in its terminal saves and stops it); then c" : "C",
      "ontinue it with the same command and --set checkpoint.resume=latest", finished ? " (raising train.steps)" : "",
      ", or start over in another train.output_dir (--set train.output_dir=...) or after deleting "
      "that folder"));
}

// A model of the same family and switches with every size as small as it goes and `layers` decoder
// layers: its module tree (names, classes) is the real one's, and building it allocates next to nothing.
model::LlamaForCausalLM stand_in(const model::LlamaConfig& model, int64_t layers) {
  model::LlamaConfig tiny = model;
  tiny.vocab_size = 8;
  tiny.hidden_size = tiny.num_attention_heads * 2;
  tiny.head_dim = 2;
  tiny.intermediate_size = 2;
  tiny.num_hidden_layers = layers;
  tiny.sliding_layers.resize(std::min<size_t>(tiny.sliding_layers.size(), static_cast<size_t>(layers)));
  return model::LlamaForCausalLM(tiny, /*free_after_create=*/true);
}

// fsdp_transformer_layer_cls_to_wrap names classes of this model (empty: its decoder layer, as
// Accelerate reads _no_split_modules): a Llama name in a config pointed at a Qwen2 folder is refused
// here, listing the family's classes, not on every rank after the model is built.
void check_layer_classes(const config::FsdpConfig& fsdp, const model::LlamaConfig& model, const std::string& where) {
  if (fsdp.auto_wrap_policy != config::WrapPolicy::kTransformerBasedWrap) return;
  const model::LlamaForCausalLM m = stand_in(model, 1);
  std::set<std::string> classes, hf_names;  // ours, and transformers' names for them
  for (const auto& item : m->named_modules()) {
    classes.insert(item.value()->name());
    hf_names.insert(model::hf_class_name(item.value()->name(), model.family));
  }
  for (const std::string& c : fsdp.transformer_layer_cls_to_wrap)
    FSDP_CHECK(
        classes.count(model::our_class_name(c, model.family)),
        "[train] fsdp_config.fsdp_transformer_layer_cls_to_wrap: ", where, " is a ",
        model::family_names(model.family).architecture, " model, with no class ", quoted(c),
        "; its classes (transformers' names): ", join(std::vector<std::string>(hf_names.begin(), hf_names.end()), ", "),
        ". Leave the key empty for its decoder layer (", model::family_names(model.family).layer_class, ")");
}

// Tensor parallel splits heads, kv heads and the MLP's rows evenly over tp_size, and the vocabulary
// in blocks of ceil(V / tp_size) (the last padded).
void check_tensor_parallel(const config::Config& config, const model::LlamaConfig& model, const std::string& path) {
  const int tp = config::effective_fsdp_layout(config).tp_size;
  if (tp <= 1) return;
  std::vector<std::string> bad;
  for (const auto& [what, n] : {std::pair<const char*, int64_t>{"num_attention_heads", model.num_attention_heads},
                                {"num_key_value_heads", model.num_key_value_heads},
                                {"intermediate_size", model.intermediate_size}})
    if (n % tp != 0) bad.push_back(str(what, " ", n));
  if (!fsdp::model::vocab_splits(model.vocab_size, tp))
    bad.push_back(str("vocab_size ", model.vocab_size, " (the last rank would hold padding alone)"));
  std::vector<std::string> fits;
  for (int d = 2; d <= 64; d *= 2)
    if (model.num_attention_heads % d == 0 && model.num_key_value_heads % d == 0 && model.intermediate_size % d == 0 &&
        fsdp::model::vocab_splits(model.vocab_size, d))
      fits.push_back(std::to_string(d));
  FSDP_CHECK(bad.empty(), "[train] parallelism_config_tp_size ", tp, " does not divide ", join(bad, ", "), " of ", path,
             ": tensor parallel gives each rank an equal share of the heads and the MLP. ",
             fits.empty() ? std::string("This model takes no tp_size above 1") : "Use tp_size " + join(fits, ", "));
}

// Ulysses gives each sp rank an equal share of the (tp rank's) heads and kv heads; context parallel
// does not split a sliding window shorter than the sequence.
void check_sequence_split(const config::Config& config, const model::LlamaConfig& model, const std::string& path) {
  const config::FsdpLayout layout = config::effective_fsdp_layout(config);
  if (layout.cp_size <= 1) return;
  if (layout.cp_kind == "ulysses") {
    const int64_t per = static_cast<int64_t>(layout.cp_size) * layout.tp_size;
    if (model.num_attention_heads % per == 0 && model.num_key_value_heads % per == 0) return;
    std::vector<std::string> fits;
    for (int d = 2; d <= 64; d *= 2)
      if (model.num_attention_heads % (d * layout.tp_size) == 0 &&
          model.num_key_value_heads % (d * layout.tp_size) == 0)
        fits.push_back(std::to_string(d));
    throw InputError(str("[train] parallelism_config_sp_size ", layout.cp_size,
                         layout.tp_size > 1 ? str(" x tp_size ", layout.tp_size) : "", " does not divide ",
                         model.num_attention_heads, " query and ", model.num_key_value_heads, " kv heads of ", path,
                         ": Ulysses gives each rank an equal share of both. ",
                         fits.empty() ? std::string("This model takes no sp_size above 1 here; use cp_size (context "
                                                    "parallel), which splits tokens instead")
                                      : "Use sp_size " + join(fits, ", ") + ", or cp_size (context parallel)"));
  }
  for (int64_t layer = 0; layer < model.num_hidden_layers; ++layer) {
    const int64_t w = model.window_of(layer);
    FSDP_CHECK(w == 0 || w >= config.train.sequence_length, "[train] layer ", layer, " of ", path,
               " attends through a sliding window of ", w, " tokens, shorter than train.sequence_length ",
               config.train.sequence_length,
               ", which context parallel does not split; use Ulysses "
               "(parallelism_config_sp_size) for this model, or a sequence_length of at most ",
               w);
  }
}

// LoRA's targets and modules to save exist in the model (and are not tied to the embedding): checked
// on a stand-in with all of the model's layers (a target may name a layer by its index).
void check_lora_targets(const config::Config& config, const model::LlamaConfig& model) {
  if (!config.lora.enabled()) return;
  model::LlamaForCausalLM m = stand_in(model, model.num_hidden_layers);
  model::add_lora(*m, lora_settings_of(config), /*free_after_create=*/true);
}

// What the run will leave behind, when that is less than a model.
std::vector<std::string> output_warnings(const config::Config& config) {
  const config::CheckpointConfig& c = config.checkpoint;
  if (!c.export_dir.empty()) return {};
  if (c.dir.empty()) return {"checkpoint.export_dir and checkpoint.dir are both off: this run saves no model"};
  return {str("checkpoint.export_dir is off: this run leaves training checkpoints in ", c.dir,
              " but no Hugging Face folder (fsdptrain merge-weights makes one from a checkpoint)")};
}

}  // namespace

std::vector<std::string> check_trainer_config(const config::ResolvedConfig& resolved) {
  refuse_unsupported(resolved);
  std::vector<std::string> warnings = config::unused_by_trainer(resolved);
  // Its config.json parses (InputError naming the file otherwise).
  const model::LlamaConfig model = model_config_of(resolved.typed, &warnings);
  check_layer_classes(resolved.typed.fsdp, model, model_config_path(resolved.typed));
  // The weights' folder opens and holds every tensor this model needs (headers only, no weights read):
  // a damaged folder or a broken link is named here, not by every rank after the workers start.
  if (!resolved.typed.model.pretrained.empty())
    ckpt::HfCheckpoint(resolved.typed.model.pretrained).check_matches(model::describe(model).params);
  check_positions(resolved.typed, model);
  check_lora_targets(resolved.typed, model);
  check_tensor_parallel(resolved.typed, model, model_config_path(resolved.typed));
  check_sequence_split(resolved.typed, model, model_config_path(resolved.typed));
  // Its sizes fit this machine: a refusal now, not an allocator's error on some rank later.
  check_fits_machine(resolved.typed, model, model_config_path(resolved.typed),
                     resolved.typed.launch.processes_per_machine());
  data::plan_data(data_options_of(resolved.typed, model.vocab_size));  // a tokenizer for text, when it needs one
  const config::CheckpointConfig& c = resolved.typed.checkpoint;
  check_exports_free(resolved.typed);
  for (std::string& w : output_warnings(resolved.typed)) warnings.push_back(std::move(w));
  profile_window(resolved.typed.logging, resolved.typed.train.steps);  // within the run
  if (!c.dir.empty())  // writable, not damaged, room for a checkpoint: before any step, not at the first save
    ckpt::check_checkpoint_dir(c.dir, ckpt::checkpoint_bytes(model.num_parameters()), c.keep,
                               ckpt::local_file_system());
  return warnings;
}

namespace {

// The exit a signal would have given, 128 + its number (130 for Ctrl-C), as the launcher's own.
ExitCode interrupted_exit() {
  return static_cast<ExitCode>(128 + StopSignals::received());
}

}  // namespace

void prepare_training_data(const config::ResolvedConfig& resolved, std::ostream& log, bool live) {
  const StopSignals signals;  // tokenizing stops between batches, saying so
  data::DataOptions options = data_options_of(resolved.typed, model_config_of(resolved.typed).vocab_size);
  options.interrupted = [] { return StopSignals::received() != 0; };
  data::DataPlan plan;
  try {
    plan = data::prepare_data(options, live ? &log : nullptr);
  } catch (const Error& e) {
    if (StopSignals::received()) throw Error(e.what(), interrupted_exit());  // stopped by the signal, not failed
    throw;
  }
  if (!plan.note.empty()) log << plan.note << "\n";
  // A signal that came while nothing was tokenized still means stop: it must not be lost.
  if (StopSignals::received())
    throw Error("[train] interrupted before the workers started; nothing was trained", interrupted_exit());
  data::check_prompt_fits(plan.longest_prompt, plan.longest_prompt_at, resolved.typed.train.sequence_length);
}

void check_run_folder_free(const config::ResolvedConfig& resolved) {
  // Machine 0's: another machine may look after its workers wrote run.json (one shared folder).
  if (resolved.typed.launch.machine_rank == 0) check_run_folder(resolved.typed);
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
    if (first_step > run.steps()) {           // a finished run, launched again: nothing is written
      run.say(str("[train] nothing to do: the checkpoint is at step ", first_step - 1, " and this run has ",
                  run.steps(), " steps (", run.config().train.epochs > 0 ? "train.epochs" : "train.steps",
                  "); it finished. Raise it to train further\n"));
      TrainSummary done;
      done.steps = done.resumed_from = first_step - 1;
      return done;
    }
    run.reserve_checkpoint_memory();
    RunReport report(run, first_step);
    StepProfiler profiler(run.config().logging, run.steps(), context.rank, context.device);
    // Without checkpoints a signal ends the run as it always does: there is nothing to save.
    std::optional<StopSignals> signals;
    if (run.checkpointing()) signals.emplace();
    bool stop = false;  // a rank was signalled: every rank reads it in the same step's numbers
    for (int64_t step = first_step; step <= run.steps() && !stop; ++step) {
      profiler.before_step(step);
      // Queues micro-batches, loss, backward, clip, AdamW; returns the step before, read meanwhile.
      if (std::optional<StepResult> before = run.train_step(step, signals && StopSignals::received())) {
        report.after_step(*before);
        stop = before->stop;
      }
      // Metrics, checkpoint, export, held-out loss: these read the step at once; so does a stop.
      if (stop || report.wants_now(step)) {
        const StepResult now = run.finish_step();
        report.after_step(now);
        stop = stop || now.stop;
      }
      if (const std::string trace = profiler.after_step(step); !trace.empty())
        run.say(str("[train] profiled steps ", profiler.window().first, "-", step, ": ", trace,
                    " (each rank wrote its own; open in https://ui.perfetto.dev)\n"));
    }
    if (stop && report.last_step() < run.steps()) return report.stop(StopSignals::received());
    return report.finish();
  } catch (const std::exception& e) {
    // Recorded now, before `run` tears down the process groups and its peers fail for that.
    dist::record_worker_error(e.what());
    throw;
  }
}

}  // namespace fsdp::train

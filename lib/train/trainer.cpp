// The training loop (run_training, at the end), read top to bottom: each step's work lives in
// TrainingRun (training_run.cpp); the loop then asks for the held-out loss, a checkpoint and an export
// when each is due, and tells RunReport (run_report.cpp), which reports and does nothing else. Before
// it, the launcher's checks of a config for the built-in trainer.
#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/hf.h"
#include "dist/error_file.h"
#include "model/parallel/tensor_parallel.h"
#include "train/estimate_memory.h"
#include "train/profiler.h"
#include "train/run_report.h"
#include "train/stop_signals.h"
#include "train/training_run.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/log.h"
#include "util/strings.h"

namespace fsdp::train {

namespace {

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
model::CausalLM stand_in(const model::DecoderConfig& model, int64_t layers) {
  model::DecoderConfig tiny = model;
  tiny.vocab_size = 8;
  tiny.hidden_size = tiny.num_attention_heads * 2;
  tiny.head_dim = 2;
  if (tiny.global_head_dim > 0) tiny.global_head_dim = 2;
  tiny.intermediate_size = 2;
  tiny.num_hidden_layers = layers;
  tiny.sliding_layers.resize(std::min<size_t>(tiny.sliding_layers.size(), static_cast<size_t>(layers)));
  if (tiny.per_layer_input_dim > 0) {  // Gemma 4 E2B/E4B's table: its real one is billions of values
    tiny.per_layer_input_dim = 2;
    tiny.per_layer_vocab = tiny.vocab_size;
  }
  return model::CausalLM(tiny, /*free_after_create=*/true);
}

// fsdp_transformer_layer_cls_to_wrap names classes of this model (empty: its decoder layer, as
// Accelerate reads _no_split_modules): a Llama name in a config pointed at a Qwen2 folder is refused
// here, listing the family's classes, not on every rank after the model is built.
void check_layer_classes(const config::FsdpConfig& fsdp, const model::DecoderConfig& model, const std::string& where) {
  if (fsdp.auto_wrap_policy != config::WrapPolicy::kTransformerBasedWrap) return;
  const model::CausalLM m = stand_in(model, 1);
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
void check_tensor_parallel(const config::Config& config, const model::DecoderConfig& model, const std::string& path) {
  const int tp = config::effective_fsdp_layout(config).tp_size;
  if (tp <= 1) return;
  const std::string unsplit = model::tensor_parallel_unsplit_parts(model);
  FSDP_CHECK(unsplit.empty(), "[train] parallelism_config_tp_size ", tp, ": ", path,
             " is a Gemma 4 E2B/E4B form: tensor parallel does not split its ", unsplit,
             "; set parallelism_config_tp_size: 1 (FSDP shards the model; parallelism_config_cp_size or sp_size split "
             "its sequences)");
  std::vector<std::string> bad;
  std::vector<std::pair<const char*, int64_t>> split = {{"num_attention_heads", model.num_attention_heads},
                                                        {"num_key_value_heads", model.num_key_value_heads},
                                                        {"intermediate_size", model.intermediate_size}};
  if (model.global_kv_heads > 0 && model.global_kv_heads != model.num_key_value_heads)  // Gemma 4's full layers'
    split.push_back({"the full-attention layers' num_key_value_heads", model.global_kv_heads});
  for (const auto& [what, n] : split)
    if (n % tp != 0) bad.push_back(str(what, " ", n));
  if (!fsdp::model::vocab_splits(model.vocab_size, tp))
    bad.push_back(str("vocab_size ", model.vocab_size, " (the last rank would hold padding alone)"));
  std::vector<std::string> fits;
  for (int d = 2; d <= 64; d *= 2)
    if (std::all_of(split.begin(), split.end(), [&](const auto& s) { return s.second % d == 0; }) &&
        fsdp::model::vocab_splits(model.vocab_size, d))
      fits.push_back(std::to_string(d));
  FSDP_CHECK(bad.empty(), "[train] parallelism_config_tp_size ", tp, " does not divide ", join(bad, ", "), " of ", path,
             ": tensor parallel gives each rank an equal share of the heads and the MLP. ",
             fits.empty() ? std::string("This model takes no tp_size above 1") : "Use tp_size " + join(fits, ", "));
}

// Ulysses gives each sp rank an equal share of the (tp rank's) heads and kv heads, and of a hybrid's
// Gated DeltaNet heads; context parallel takes no Gated DeltaNet (whatever the scores: caps, windows,
// sinks are its blocks' own, model/parallel/context_parallel.h).
void check_sequence_split(const config::Config& config, const model::DecoderConfig& model, const std::string& path) {
  const config::FsdpLayout layout = config::effective_fsdp_layout(config);
  if (layout.cp_size <= 1) return;
  const bool hybrid =
      std::find(model.linear_layers.begin(), model.linear_layers.end(), true) != model.linear_layers.end();
  if (layout.cp_kind == "ulysses") {
    // Attention's query and kv heads, and a hybrid's Gated DeltaNet key and value heads.
    std::vector<int64_t> heads = {model.num_attention_heads, model.num_key_value_heads};
    if (model.global_kv_heads > 0) heads.push_back(model.global_kv_heads);  // Gemma 4's full-attention layers
    if (hybrid) {
      heads.push_back(model.linear_attention.key_heads);
      heads.push_back(model.linear_attention.value_heads);
    }
    auto divides = [&](int64_t d) {
      return std::all_of(heads.begin(), heads.end(), [&](int64_t n) { return n % d == 0; });
    };
    if (divides(static_cast<int64_t>(layout.cp_size) * layout.tp_size)) return;
    std::vector<std::string> fits;
    for (int d = 2; d <= 64; d *= 2)
      if (divides(static_cast<int64_t>(d) * layout.tp_size)) fits.push_back(std::to_string(d));
    // Context parallel splits tokens instead, where the model lets it (below).
    const char* cp_alternative = hybrid         ? ""
                                 : fits.empty() ? "; use cp_size (context parallel), which splits tokens instead"
                                                : ", or cp_size (context parallel)";
    throw InputError(
        str("[train] parallelism_config_sp_size ", layout.cp_size,
            layout.tp_size > 1 ? str(" x tp_size ", layout.tp_size) : "", " does not divide ",
            model.num_attention_heads, " query and ", model.num_key_value_heads, " kv heads",
            hybrid ? str(" (and ", model.linear_attention.key_heads, " key and ", model.linear_attention.value_heads,
                         " value heads of Gated DeltaNet)")
                   : "",
            " of ", path, ": Ulysses gives each rank an equal share of them. ",
            fits.empty() ? std::string("This model takes no sp_size above 1 here") : "Use sp_size " + join(fits, ", "),
            cp_alternative));
  }
  FSDP_CHECK(!hybrid, "[train] parallelism_config_cp_size ", layout.cp_size, ": ", path, " is a ",
             model::family_names(model.family).architecture,
             " model, whose Gated DeltaNet layers carry a state along the sequence, which context parallel's "
             "all-gather and ring strategies split; use Ulysses (parallelism_config_sp_size) for this model");
}

// Expert parallel splits each sparse layer's experts evenly over ep_size ranks: a mixture of experts
// whose num_experts it divides.
void check_expert_parallel(const config::Config& config, const model::DecoderConfig& model, const std::string& path) {
  const int ep = config.parallelism.ep_size;
  if (ep <= 1) return;
  const int64_t e = model.moe.num_experts;
  FSDP_CHECK(e > 0, "[train] parallelism_config_ep_size ", ep, ": ", path, " is a dense ",
             model::family_names(model.family).architecture,
             " model, with no experts to split; set parallelism_config_ep_size: 1");
  std::vector<std::string> fits;
  for (int d = 2; d <= e; ++d)
    if (e % d == 0 && config::effective_fsdp_layout(config).fsdp_shard_size() % d == 0)
      fits.push_back(std::to_string(d));
  FSDP_CHECK(e % ep == 0, "[train] parallelism_config_ep_size ", ep, " does not divide the ", e, " experts of ", path,
             ": expert parallel gives each rank an equal share of every layer's experts. ",
             fits.empty() ? std::string("No ep_size above 1 divides both them and the shard group here")
                          : "Use ep_size " + join(fits, ", "));
}

// Auxiliary-loss-free balancing moves the routers' selection bias: a mixture of experts' setting.
// Its transformers classes have no such bias, so an export routes without it: said at the start.
void check_load_balance(const config::Config& config, const model::DecoderConfig& model, const std::string& path,
                        std::vector<std::string>& warnings) {
  const double coeff = config.train.moe_load_balance_coeff;
  if (coeff <= 0) return;
  const std::string arch = model::family_names(model.family).architecture;
  FSDP_CHECK(model.moe.num_experts > 0, "[train] train.moe_load_balance_coeff ", coeff, ": ", path, " is a dense ",
             arch, " model, with no router to balance; remove train.moe_load_balance_coeff");
  warnings.push_back(str("train.moe_load_balance_coeff: the experts are chosen with a per-expert bias that ", arch,
                         " has no place for, so a Hugging Face export routes without it (the biases are written "
                         "beside its weights, in expert_selection_bias.json)"));
}

// LoRA's targets and modules to save exist in the model (and are not tied to the embedding): checked
// on a stand-in with all of the model's layers (a target may name a layer by its index).
void check_lora_targets(const config::Config& config, const model::DecoderConfig& model) {
  if (!config.lora.enabled()) return;
  model::CausalLM m = stand_in(model, model.num_hidden_layers);
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
  const model::DecoderConfig model = model_config_of(resolved.typed, &warnings);
  check_layer_classes(resolved.typed.fsdp, model, model_config_path(resolved.typed));
  // The weights' folder opens and holds every tensor this model needs (headers only, no weights read):
  // a damaged folder or a broken link is named here, not by every rank after the workers start.
  if (!resolved.typed.model.pretrained.empty())
    ckpt::HfCheckpoint(resolved.typed.model.pretrained).check_matches(model::describe(model));
  check_positions(resolved.typed, model);
  check_lora_targets(resolved.typed, model);
  check_tensor_parallel(resolved.typed, model, model_config_path(resolved.typed));
  check_sequence_split(resolved.typed, model, model_config_path(resolved.typed));
  check_expert_parallel(resolved.typed, model, model_config_path(resolved.typed));
  check_load_balance(resolved.typed, model, model_config_path(resolved.typed), warnings);
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
  std::optional<data::DataOptions> eval_options =
      eval_data_options_of(resolved.typed, model_config_of(resolved.typed).vocab_size);
  if (eval_options) eval_options->interrupted = options.interrupted;
  data::DataPlan plan;
  try {
    plan = data::prepare_data(options, live ? &log : nullptr);
    if (!plan.note.empty()) log << plan.note << "\n";
    // The held-out data too, so no worker tokenizes it (and one failure is said once, here).
    if (eval_options && !StopSignals::received())
      if (const data::DataPlan eval = data::prepare_data(*eval_options, live ? &log : nullptr); !eval.note.empty())
        log << eval.note << "\n";
  } catch (const Error& e) {
    if (StopSignals::received()) throw Error(e.what(), interrupted_exit());  // stopped by the signal, not failed
    throw;
  }
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

namespace {

// A finished run, launched again: nothing is written.
TrainSummary nothing_to_do(TrainingRun& run, int64_t first_step) {
  run.say(str("[train] nothing to do: the checkpoint is at step ", first_step - 1, " and this run has ", run.steps(),
              " steps (", run.config().train.epochs > 0 ? "train.epochs" : "train.steps",
              "); it finished. Raise it to train further\n"));
  TrainSummary done;
  done.steps = done.resumed_from = first_step - 1;
  return done;
}

// A checkpoint of `step`, with its held-out loss when measured (checkpoint.keep_best keeps the lowest).
void save_checkpoint(TrainingRun& run, RunReport& report, int64_t step, std::optional<double> held_out) {
  run.save_checkpoint(step, held_out && std::isfinite(*held_out) ? held_out : std::nullopt);
  report.saved(step);
}

// What follows a step once its numbers are read: its metrics, then the held-out loss, a checkpoint and
// a Hugging Face export, each when due. Returns whether a rank asked to stop.
bool after_step(TrainingRun& run, RunReport& report, const Due& due, const StepResult& result) {
  const int64_t step = result.step;
  report.step(result);
  std::optional<double> held_out;  // first: a checkpoint records it
  if (due.evaluation(step)) {
    held_out = run.evaluate();
    report.held_out(step, *held_out);
  }
  if (due.checkpoint(step)) save_checkpoint(run, report, step, held_out);
  if (due.export_hf(step)) {
    run.export_hf(step);
    report.exported(step);
  }
  if (due.any(step)) report.device_idle(step);
  return result.stop;
}

// After the step that read a stop request (StopSignals), before the last: a checkpoint of that step,
// unless one was just saved. `sig`: this rank's signal (0 when another rank's was).
TrainSummary stop_with_checkpoint(TrainingRun& run, RunReport& report, int sig) {
  const int64_t step = report.last_step();
  report.stopping(sig);
  if (report.last_saved() != step) {
    std::optional<double> held_out;  // keep_best compares the held-out loss of every save
    if (run.config().checkpoint.keep_best) held_out = run.evaluate();
    save_checkpoint(run, report, step, held_out);
  }
  run.wait_for_checkpoint();
  // Rank 0 commits the checkpoint after the others wrote their shards: none exits before that, so a
  // scheduler that ends the job when its first process exits (srun --kill-on-bad-exit) loses nothing.
  run.barrier();
  return report.stopped(sig);
}

}  // namespace

// The loop: each step's data, forward, backward and optimizer step are TrainingRun's; then its metrics,
// held-out loss, checkpoint and export (after_step), each when due; at the end the summary.
TrainSummary run_training(const dist::WorkerContext& context, const config::ResolvedConfig& resolved, std::ostream& out,
                          const TrainHooks& hooks) {
  refuse_unsupported(resolved);                    // the launcher ran check_trainer_config; the workers need only this
  TrainingRun run(context, resolved, out, hooks);  // group, data, model, optimizer, checkpointer
  try {
    const int64_t first_step = run.resume();  // 1, or the step after the checkpoint's
    if (first_step > run.steps()) return nothing_to_do(run, first_step);
    run.reserve_checkpoint_memory();
    const Due due(run);
    RunReport report(run, due, first_step);
    StepProfiler profiler(run.config().logging, run.steps(), context.rank, context.device);
    // Without checkpoints a signal ends the run as it always does: there is nothing to save.
    std::optional<StopSignals> signals;
    if (run.checkpointing()) signals.emplace();
    bool stop = false;  // a rank was signalled: every rank reads it in the same step's numbers
    for (int64_t step = first_step; step <= run.steps() && !stop; ++step) {
      profiler.before_step(step);
      // Queues micro-batches, loss, backward, clip, AdamW; returns the step before, read meanwhile.
      if (std::optional<StepResult> before = run.train_step(step, signals && StopSignals::received()))
        stop = after_step(run, report, due, *before);
      // Metrics, held-out loss, checkpoint, export: these read the step at once; so does a stop.
      if (stop || due.any(step)) stop = after_step(run, report, due, run.finish_step()) || stop;
      if (const std::string trace = profiler.after_step(step); !trace.empty())
        run.say(str("[train] profiled steps ", profiler.window().first, "-", step, ": ", trace,
                    " (each rank wrote its own; open in https://ui.perfetto.dev)\n"));
    }
    if (stop && report.last_step() < run.steps()) return stop_with_checkpoint(run, report, StopSignals::received());
    if (run.step_pending()) after_step(run, report, due, run.finish_step());
    run.wait_for_checkpoint();
    if (report.trained() == 0) report.untrained_held_out(run.evaluate());  // the loaded model's
    return report.finish();
  } catch (const std::exception& e) {
    // Recorded now, before `run` tears down the process groups and its peers fail for that.
    dist::record_worker_error(e.what());
    throw;
  }
}

}  // namespace fsdp::train

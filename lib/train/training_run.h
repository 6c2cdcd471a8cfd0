// TrainingRun: everything one worker's training holds (the process group, the data, the sharded
// model, AdamW, the checkpointer) and the operations of the loop in trainer.cpp: one training
// step, a held-out evaluation, a checkpoint, an export.
//
// Built in the order in which bad input fails fastest: data before the model, a checkpoint to
// resume before the first step. Collective: every rank builds it and calls its operations in the
// same order. Not thread-safe. Members are in build order; later ones refer to earlier ones.
#pragma once

#include <c10/core/Event.h>

#include <future>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/checkpointer.h"
#include "ckpt/hf.h"
#include "config/resolved.h"
#include "data/dataset.h"
#include "dist/process_group.h"
#include "dist/worker_context.h"
#include "fsdp/fully_shard.h"
#include "model/layers/decoder.h"
#include "optim/adamw.h"
#include "train/run_config.h"

namespace fsdp::train {

// What one optimizer step did.
struct StepResult {
  int64_t step = 0;
  double loss = 0;       // mean over the global batch's counted targets
  double grad_norm = 0;  // before clipping
  double lr = 0;
  std::string skipped;  // why the update was skipped (a non-finite loss or gradient, no target); "" when applied
  bool stop = false;    // some rank was asked to stop (StopSignals) before this step's numbers were reduced
  // A mixture of experts: the auxiliary loss (the ranks' and micro-batches' mean, before
  // router_aux_loss_coef) and the step's top-k assignments per expert, summed over ranks and layers.
  std::optional<double> aux_loss;
  std::vector<double> expert_load;
};

// One step's micro-batches, read ahead on a helper thread while the step before runs.
struct StepBatches {
  std::vector<at::Tensor> inputs, targets;  // (B, T) int64 on the host, pinned for a CUDA run
  std::vector<model::Packed> packed;        // with data.packing masked: positions and segments, (B, T)
  double counted = 0;                       // this rank's counted targets
  data::DistributedLoader::Position after;  // the loader's position once these are consumed
};

// A queued step whose numbers are on their way to the host: loss sum, counted targets, gradient norm.
struct PendingStep {
  int64_t step = 0;
  double lr = 0;
  at::Tensor
      host;  // (4) double: loss sum, stop flag, counted, norm (a mixture of experts: then the aux loss
             // and each expert's load); pinned and filled by an asynchronous copy on a GPU
  std::optional<c10::Event> copied;  // marks that copy done (none on CPU, where it is done at once)
};

// An export's note of which run wrote it (see TrainingRun::replace_own_export).
inline constexpr const char* kExportNote = "fsdptrain_export.json";

class TrainingRun {
 public:
  TrainingRun(const dist::WorkerContext& context, const config::ResolvedConfig& resolved, std::ostream& out,
              const TrainHooks& hooks);

  // Restores checkpoint.resume when set; returns the first step to train (1 on a fresh start).
  int64_t resume();
  // Queues one step on the device: data -> forward -> loss -> backward per micro-batch, then
  // clip -> AdamW. Nothing in it waits for the device: while this step's work runs there, the host
  // reads the step before's numbers and returns them (none for the first step).
  //
  // A non-finite loss or gradient norm, or a global batch with no target, skips the update on the
  // device (the weights, the AdamW state and its step count stay as they were), so such a step
  // never damages the model. The host learns of it one step later, when it reads that step's
  // numbers: then it throws Error naming the step, or (train.skip_nonfinite_loss) says it skipped
  // it. A step whose numbers are read at once (finish_step) is judged at once.
  //
  // `stop`: this rank was asked to stop. The flag is summed with the loss, so every rank reads it
  // in the same step's result (StepResult::stop) and they stop together.
  std::optional<StepResult> train_step(int64_t step, bool stop = false);
  // Waits for the queued step and returns its numbers (throwing as train_step does).
  StepResult finish_step();
  bool step_pending() const { return pending_.has_value(); }
  // The mean loss over every held-out token the ranks read; NaN when nothing is held out.
  double evaluate();
  void save_checkpoint(int64_t step, std::optional<double> eval_loss = std::nullopt);  // precondition: checkpointing()
  void export_hf(int64_t step);                              // into checkpoint.export_dir/step-N
  std::pair<ckpt::Dtype, std::string> export_dtype() const;  // checkpoint.export_dtype, and where it came from
  // When checkpointing: the host memory saves copy into, allocated before step 1 (Checkpointer::reserve).
  void reserve_checkpoint_memory();
  void wait_for_checkpoint();  // this rank's part of the last save is on disk (rank 0's: all of it)
  // With offload_params, what the host's AdamW cost on this rank: "[train] offload: ..." (its time
  // per update and the bandwidth of the bytes it moves); "" otherwise or before any update.
  std::string offload_note() const;
  void barrier();              // every rank got here (collective)

  bool checkpointing() const { return checkpointer_ != nullptr && !config_.checkpoint.dir.empty(); }
  void say(const std::string& line) const;  // rank 0 prints
  const config::Config& config() const { return config_; }
  const config::ResolvedConfig& resolved() const { return resolved_; }
  const dist::WorkerContext& context() const { return context_; }
  double tokens_per_step() const;
  int64_t steps() const { return steps_; }  // train.steps, or what train.epochs make of the data
  double flops_per_token() const { return model_config_.flops_per_token(config_.train.sequence_length); }
  int64_t num_parameters() const { return model_config_.num_parameters(); }
  int64_t resumed_from() const { return resumed_from_; }
  std::ostream& out() const { return out_; }

 private:
  // The data-parallel coordinates: tensor parallel's ranks (tp innermost) read the same batch.
  int tp_size() const { return tp_size_; }
  // The ranks of a tp group and of a cp group read the same batch; the data-parallel ranks are the rest.
  int dp_rank() const { return world_.rank() / (tp_size_ * cp_size_); }
  int dp_size() const { return world_.size() / (tp_size_ * cp_size_); }
  void read_data();
  void build_model();
  void build_checkpointer(const TrainHooks& hooks);
  void claim_checkpoint_dir(ckpt::FileSystem& fs);
  ckpt::TrainingState state_at(int64_t step) const;
  // Sequences a step trains on, over every data-parallel rank.
  int64_t sequences_per_step() const;
  // The learning rate of `step` in a run of `steps` (train.schedule; warmup_ratio counts `steps`).
  double learning_rate_at(int64_t step, int64_t steps) const;
  // A resume at another global batch than `saved`'s: refused unless checkpoint.resume_new_batch,
  // saying what changes (the steps train.epochs make, the learning rates).
  void check_resumed_batch(const ckpt::TrainingState& saved, const std::string& path) const;
  void restore_selection_biases(const ckpt::TrainingState& saved, const std::string& path);
  at::Tensor loss_sum(const data::Batch& batch, int64_t rows);  // evaluation's
  at::Tensor loss_sum(const at::Tensor& inputs, const at::Tensor& targets, const model::Packed& packed);
  ckpt::ExtraFiles text_files() const;
  std::string export_note(int64_t step) const;
  void replace_own_export(const std::string& dir, int64_t step) const;
  StepBatches read_batches();
  StepBatches take_batches();
  at::Tensor global_targets(double local);
  at::Tensor forward_backward(const StepBatches& batches, const at::Tensor& counted);
  void queue_update(int64_t step, double lr, at::Tensor loss_sum, const at::Tensor& counted);
  void dump_gradients(int64_t step) const;
  // Auxiliary-loss-free balancing (train.moe_load_balance_coeff): the step's rows per expert of each
  // sparse layer summed over every rank, then each layer's selection bias moved (collective).
  void balance_experts();
  void start_balancing();  // each sparse layer's selection bias at 0 (balancing on)
  std::vector<std::vector<double>> selection_biases() const;  // each sparse layer's, on the host
  StepResult judge(const PendingStep& pending) const;

  const dist::WorkerContext context_;
  const config::ResolvedConfig& resolved_;
  const config::Config& config_;
  std::ostream& out_;
  dist::ProcessGroup world_;
  const int tp_size_;  // parallelism_config_tp_size (1: none)
  const int cp_size_;  // parallelism_config_cp_size or sp_size (1: none)
  const model::DecoderConfig model_config_;
  data::TokenStream tokens_, eval_tokens_;  // eval_tokens_: data.eval_path's, when given
  std::unique_ptr<data::SequenceReader> reader_, eval_reader_;
  data::Split split_;
  bool every_target_counts_ = true;  // no prompts, no record boundaries: the count is known
  int64_t steps_ = 0;
  std::unique_ptr<data::DistributedLoader> loader_;
  model::CausalLM lm_{nullptr};
  std::unique_ptr<ShardedModel> sharded_;
  std::unique_ptr<optim::ShardedAdamW> adamw_;
  std::unique_ptr<ckpt::DirLock> dir_lock_;  // rank 0: held until the run ends
  std::unique_ptr<ckpt::Checkpointer> checkpointer_;
  int64_t resumed_from_ = 0;
  at::Tensor step_routed_;  // (sparse layers, E) fp32: the step's rows per expert (balancing on)
  data::DistributedLoader::Position consumed_;  // the loader's position after the steps queued so far
  std::optional<PendingStep> pending_;          // the last queued step, not yet read
  std::future<StepBatches> next_batches_;       // last: its thread reads loader_ until it is joined
};

}  // namespace fsdp::train

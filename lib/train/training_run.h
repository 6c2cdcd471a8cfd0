// TrainingRun: everything one worker's training holds (the process group, the data, the sharded
// model, AdamW, the checkpointer) and the operations of the loop in trainer.cpp: one training
// step, a held-out evaluation, a checkpoint, an export.
//
// Built in the order in which bad input fails fastest: data before the model, a checkpoint to
// resume before the first step. Collective: every rank builds it and calls its operations in the
// same order. Not thread-safe. Members are in build order; later ones refer to earlier ones.
#pragma once

#include <memory>
#include <ostream>
#include <string>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/checkpointer.h"
#include "data/dataset.h"
#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "train/trainer.h"

namespace fsdp::train {

// What one optimizer step did.
struct StepResult {
  double loss = 0;       // mean over the global batch's tokens
  double grad_norm = 0;  // before clipping
  double lr = 0;
  double seconds = 0;
  std::string skipped;  // why the update was skipped (a non-finite loss or gradient); "" when applied
};

class TrainingRun {
 public:
  TrainingRun(const dist::WorkerContext& context, const config::ResolvedConfig& resolved, std::ostream& out,
              const TrainHooks& hooks);

  // Restores checkpoint.resume when set; returns the first step to train (1 on a fresh start).
  int64_t resume();
  // data -> forward -> loss -> backward per micro-batch, then clip -> AdamW. A non-finite loss or
  // gradient throws, or (train.skip_nonfinite_loss) skips the update so the weights stay finite.
  StepResult train_step(int64_t step);
  // The mean loss over every held-out token the ranks read; NaN when nothing is held out.
  double evaluate();
  void save_checkpoint(int64_t step);  // precondition: checkpointing()
  void export_hf(int64_t step);        // into checkpoint.export_dir/step-N
  void wait_for_checkpoint();          // the last save is on disk

  bool checkpointing() const { return checkpointer_ != nullptr && !config_.checkpoint.dir.empty(); }
  void say(const std::string& line) const;  // rank 0 prints
  const config::Config& config() const { return config_; }
  const config::ResolvedConfig& resolved() const { return resolved_; }
  const dist::WorkerContext& context() const { return context_; }
  double tokens_per_step() const;
  double flops_per_token() const { return model_config_.flops_per_token(config_.train.sequence_length); }
  int64_t num_parameters() const { return model_config_.num_parameters(); }
  int64_t resumed_from() const { return resumed_from_; }
  std::ostream& out() const { return out_; }

 private:
  void build_model();
  void build_checkpointer(const TrainHooks& hooks);
  void claim_checkpoint_dir(ckpt::FileSystem& fs);
  ckpt::TrainingState state_at(int64_t step) const;
  at::Tensor loss_sum(const data::DistributedLoader::Batch& batch, int64_t rows);
  std::string copy_text_files(const std::string& dir) const;
  double counted_targets(const std::vector<data::DistributedLoader::Batch>& batches);
  void update(int64_t step, StepResult& result);

  const dist::WorkerContext context_;
  const config::ResolvedConfig& resolved_;
  const config::Config& config_;
  std::ostream& out_;
  dist::ProcessGroup world_;
  const model::LlamaConfig model_config_;
  data::TokenStream tokens_;
  data::Split split_;
  std::unique_ptr<data::DistributedLoader> loader_;
  model::LlamaForCausalLM llama_{nullptr};
  std::unique_ptr<ShardedModel> sharded_;
  std::unique_ptr<optim::ShardedAdamW> adamw_;
  std::unique_ptr<ckpt::DirLock> dir_lock_;  // rank 0: held until the run ends
  std::unique_ptr<ckpt::Checkpointer> checkpointer_;
  int64_t resumed_from_ = 0;
};

}  // namespace fsdp::train

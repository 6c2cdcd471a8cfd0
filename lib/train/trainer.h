// The built-in trainer: what each worker of `fsdptrain launch --config X.yaml` runs when no
// program is given. Builds the Llama model of model.config layer by layer, shards it by the
// config's FSDP settings, and trains it on data.path with AdamW, printing metrics (rank 0).
//
// Collective: every rank of the launched job calls run_training with the same config.
#pragma once

#include <ostream>

#include "config/loader.h"
#include "data/prepare.h"
#include "dist/worker_context.h"
#include "train/run_config.h"
#include "train/train_summary.h"

namespace fsdp::train {

// Before a launch of the built-in trainer: throws InputError for a setting it cannot honour
// (fsdp_ignored_modules) or a model config.json that does not parse, and returns warnings for keys
// it does not use (config::unused_by_trainer).
// Also checks checkpoint.dir (ckpt::check_checkpoint_dir): writable, no damaged checkpoint in it,
// room on its disk for one checkpoint.
std::vector<std::string> check_trainer_config(const config::ResolvedConfig& resolved);

// On each machine, before its workers start: tokenizes text data.path into data.cache_dir when it is
// not there yet (data::prepare_data), saying what it did on `log`; `live` adds a progress line.
void prepare_training_data(const config::ResolvedConfig& resolved, std::ostream& log, bool live);

// On machine 0, before its workers start: throws InputError naming the holder when another run
// holds checkpoint.dir's lock (ckpt::DirLock).
void check_checkpoint_dir_free(const config::ResolvedConfig& resolved);

// On machine 0, before a fresh launch of the built-in trainer (not a resume): throws InputError
// when train.output_dir holds an earlier run's run.json, naming it and the two ways on.
void check_run_folder_free(const config::ResolvedConfig& resolved);

// Trains on `context`'s device and ranks. Throws InputError for a bad model config, data or
// checkpoint, Error for a failure during training (a NaN loss names the step). With checkpoints on,
// SIGINT, SIGTERM or SIGUSR1 to any rank stops every rank after the same step, with a checkpoint of
// it saved (TrainSummary::stopped; train/stop_signals.h).
TrainSummary run_training(const dist::WorkerContext& context, const config::ResolvedConfig& resolved, std::ostream& out,
                          const TrainHooks& hooks = {});

}  // namespace fsdp::train

#include "ckpt/checkpoint_load.h"

#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "ckpt/checkpoint_plan.h"
#include "dist/store.h"
#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

// The big files this rank reads its rows of `slots` from (`everything`: every row, as a FULL load's
// rank 0, which checks every file).
std::set<std::string> files_to_read(const Source& src, const std::vector<Slot>& slots, bool everything) {
  std::set<std::string> files;
  for (const Slot& s : slots) {
    const ShardedParam& p = *s.param;
    const auto [first, last] = stored_rows(p);
    const int64_t r0 = everything ? 0 : first, r1 = everything ? p.full_shape()[0] : last;
    if (r0 == r1) continue;
    const std::string name = stored_name(src, p);
    src.files(name, r0, r1, files);
    if (p.trainable) {
      src.files(kExpAvg + name, r0, r1, files);
      src.files(kExpAvgSq + name, r0, r1, files);
    }
  }
  return files;
}

}  // namespace

CheckpointLoader::CheckpointLoader(ShardedModel& model, optim::ShardedAdamW& adamw,
                                   const model::ModelDescription& description, dist::ProcessGroup& world,
                                   const CheckpointOptions& options)
    : model_(model), adamw_(adamw), description_(description), world_(world), options_(options) {}

TrainingState CheckpointLoader::load(const std::string& path) {
  const c10::Device device = model_.options().device;
  // The small files first, on every rank: the same decision everywhere.
  std::string failure;
  std::unique_ptr<Source> src;
  TrainingState state;
  nlohmann::json state_doc;
  std::set<std::string> files;  // the big files this rank reads (FULL, rank 0: all of them)
  bool checksum_while_reading = false, sharded = false;
  const std::vector<Slot> slots = saved_slots(model_, options_.frozen_from_base);
  try {
    verify_checkpoint(path, {kState, kConfig});
    state_doc = parse_json_file(path_in(path, kState));
    state = parse_state(state_doc, path_in(path, kState));
    // The format the state names (a lost index.json is then reported as that, not as a missing
    // Hugging Face model file).
    sharded = state_doc.value("state_dict_type", "") == "SHARDED_STATE_DICT" || file_exists(path_in(path, kIndex));
    if (sharded) verify_checkpoint(path, {kIndex});
    check_state_matches_folder(state, path);
    FSDP_CHECK(description_.canonical_config(path_in(path, kConfig)) == description_.config_json, "[ckpt] ", path,
               "/config.json describes another model than this run's; resume with the model.config it was "
               "trained with, or start a new run in another checkpoint.dir");
    src = open_source(path);
    check_matches_model(*src, slots, /*optimizer=*/true, path, "");
    files = files_to_read(*src, slots, /*everything=*/!sharded && world_.rank() == 0);
    // Sizes now, checksums as the rows are read (one pass over the files, not two; a FULL load's
    // ranks each read their rows and rank 0 joins them), checked before training goes on; a load runs
    // only when a run starts, so the weights it overwrote before a mismatch showed are the run's
    // fresh ones, and the run stops.
    const std::vector<std::string> big(files.begin(), files.end());
    verify_checkpoint(path, big, /*checksums=*/false);  // sizes first: a truncated file says so
    checksum_while_reading = src->checksum_while_reading(path, files);
    if (!checksum_while_reading) verify_checkpoint(path, big);
  } catch (const InputError& e) {
    failure = e.what();
  }
  agree(world_, device, failure);

  for (const auto& g : model_.groups()) g->reshard();
  fill(slots, model_, &adamw_, src.get(), world_, /*efficient=*/false, options_.direct_io);  // each rank its own rows
  if (checksum_while_reading) {
    try {
      if (!sharded) join_read_segments(*src, path);
      if (sharded || world_.rank() == 0) src->verify_read(path, files);
    } catch (const InputError& e) {
      failure = e.what();
    }
    agree(world_, device, failure);
  }
  adamw_.set_steps(state.optimizer_steps);
  restore_rng(state_doc, device, path_in(path, kState));
  return state;
}

void CheckpointLoader::join_read_segments(Source& src, const std::string& path) {
  if (world_.size() == 1) return;
  const std::shared_ptr<dist::Store>& shared = world_.store();
  FSDP_ASSERT(shared != nullptr, "Checkpointer: a world without a rendezvous store");
  const std::string key = str("ckpt-load/", ++loads_, "/", path, "/rank");
  if (world_.rank() != 0) {
    shared->set(key + std::to_string(world_.rank()), src.read_segments());
    return;
  }
  for (int r = 1; r < world_.size(); ++r) src.add_read_segments(shared->get(key + std::to_string(r)));
}

}  // namespace fsdp::ckpt

#include "ckpt/checkpointer.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <thread>

#include "ckpt/checkpoint_commit.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/checkpoint_load.h"
#include "ckpt/checkpoint_plan.h"
#include "ckpt/checkpoint_stage.h"
#include "ckpt/checkpoint_write.h"
#include "dist/store.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

using json = nlohmann::json;

// 0, 1, ..., n - 1: every rank of a group, for new_host_group.
std::vector<int> every_rank(int n) {
  std::vector<int> ranks(static_cast<size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

}  // namespace

// The parts a save goes through: plan (checkpoint_plan.h), stage (checkpoint_stage.h), write
// (checkpoint_write.h), commit and prune (checkpoint_commit.h); and a load (checkpoint_load.h).
// Impl holds what they share and runs a save's writing part on the writer thread.
struct Checkpointer::Impl {
  ShardedModel& model;
  optim::ShardedAdamW& adamw;
  model::ModelDescription description;
  dist::ProcessGroup& world;
  CheckpointOptions options;
  FileSystem& fs;
  SaveRanks ranks;  // this rank's place in a save
  CommitSite site;  // checkpoint.dir, and rank 0's progress lines
  CheckpointLoader loader;
  std::unique_ptr<dist::Store> store;               // the writer thread's own connection (SHARDED, several shard ranks)
  dist::ProcessGroup host_group;                    // the writer thread's gathers (FULL): Gloo over the shard group
  std::optional<dist::ProcessGroup> tp_host_group;  // and over the tp group, for tensor-parallel blocks
  dist::ProcessGroup expert_host_group;             // expert parallel: over the experts' shard group
  std::optional<dist::ProcessGroup> ep_host_group;  // and over the ep group
  std::thread writer;
  std::exception_ptr error;
  Staging staging;  // this rank's part of the last save, in host memory

  Impl(ShardedModel& m, optim::ShardedAdamW& a, model::ModelDescription d, dist::ProcessGroup& w,
       CheckpointOptions opts)
      : model(m),
        adamw(a),
        description(std::move(d)),
        world(w),
        options(std::move(opts)),
        fs(options.fs ? *options.fs : local_file_system(options.direct_io)),
        ranks(save_ranks(m)),
        site{fs, options, w.rank() == 0 ? options.log : nullptr},
        loader(m, a, description, w, options),
        host_group(dist::make_single_process_group()),
        expert_host_group(dist::make_single_process_group()) {}

  // A FULL save whose ranks may each write their own rows into the files (when they also share a
  // machine: write_full checks).
  bool may_write_in_place() const {
    return options.full_rows_in_place && ranks.shard_size > 1 && ranks.tp_size == 1 && !model.mesh().ep;
  }
  uint64_t needed() const { return checkpoint_bytes(description.num_parameters); }

  void join() {
    if (writer.joinable()) writer.join();
    if (error) {
      std::exception_ptr e = error;
      error = nullptr;
      std::rethrow_exception(e);
    }
  }

  // SHARDED: this rank's shard file, planned and its rows placed in the staging buffer.
  ShardImage stage_shard() {
    ShardImage image = plan_shard_image(saved_slots(model, options.frozen_from_base), adamw, ranks.tp_rank);
    stage_shard_image(image, staging, model.options().device);
    return image;
  }
  // FULL: this rank's slices, planned and placed in the staging buffer.
  std::vector<HostSlice> stage_full() {
    FullSlices plan = plan_full_slices(saved_slots(model, options.frozen_from_base), adamw, may_write_in_place(),
                                       options.max_shard_bytes);
    return stage_full_slices(std::move(plan), staging, model.options().device);
  }
  // What write_full works with: this Impl's file system, staging buffer and host groups.
  FullWrite full_write() {
    return FullWrite{fs,
                     staging,
                     host_group,
                     tp_host_group,
                     expert_host_group,
                     ep_host_group,
                     ranks,
                     may_write_in_place(),
                     options.max_shard_bytes,
                     description.config_json};
  }

  // Runs a save's writing part on the writer thread (or here, without background writes). A full
  // disk is reported with what the save needed, what was free and checkpoint.keep; its .tmp folder
  // is removed so the space comes back.
  void run(std::function<void()> job, const std::string& final_dir) {
    auto guarded = [this, job = std::move(job), final_dir]() {
      try {
        job();
      } catch (const DiskFullError& e) {
        const uint64_t free = fs.available_bytes(options.dir);
        try {
          fs.remove_all(final_dir + ".tmp");
        } catch (const std::exception&) {
        }
        throw Error(str("[ckpt] the disk is full: saving ", final_dir, " needs about ",
                        format_bytes(static_cast<long long>(needed())), " and ",
                        format_bytes(static_cast<long long>(free)), " was free (", e.what(),
                        "). The previous checkpoint is intact. Free space, or set checkpoint.keep (now ", options.keep,
                        ") to keep fewer checkpoints: with keep >= 2 a save removes the oldest first when the disk "
                        "is short, so resuming with it continues"));
      }
    };
    if (!options.background) return guarded();
    writer = std::thread([this, guarded = std::move(guarded)]() {
      try {
        guarded();
      } catch (...) {
        error = std::current_exception();
      }
    });
  }

  // run() of a save's writing part with its copies (Staging::copy) on this thread: after them
  // without background writes; else before them, so the writer writes what has landed while the rest
  // is copied. Returns the seconds from `t0` until the copies were made: how long training waited.
  double run_staged(std::function<void()> job, const std::string& final_dir, Clock::time_point t0) {
    if (options.background) {
      run(std::move(job), final_dir);
      staging.copy();
      return seconds_since(t0);
    }
    staging.copy();
    const double blocked = seconds_since(t0);
    run(std::move(job), final_dir);
    return blocked;
  }

  uint64_t reserve() {
    if (!ranks.writer) return 0;
    try {
      if (options.format == Format::kFull)
        stage_full();
      else
        stage_shard();
      return staging.back_all();
    } catch (const std::exception& e) {
      throw Error(
          str("[ckpt] cannot allocate the host memory every save copies this rank's part of a checkpoint "
              "into (its parameters and AdamW state in fp32): ",
              e.what(),
              ". Free host memory, or shard the model over more ranks (each then holds less); a run "
              "without checkpoint.dir needs none"));
    }
  }
};

Checkpointer::Checkpointer(ShardedModel& model, optim::ShardedAdamW& adamw, model::ModelDescription description,
                           dist::ProcessGroup& world, CheckpointOptions options)
    : impl_(std::make_unique<Impl>(model, adamw, std::move(description), world, std::move(options))) {
  const std::optional<dist::ProcessGroup>& tp = model.mesh().tp;
  if (tp && tp->size() > 1 && impl_->options.format == Format::kFull)
    impl_->tp_host_group = tp->new_host_group(every_rank(tp->size()));
  if (impl_->ranks.file_count() > 1) {
    const auto& shared = world.store();
    FSDP_ASSERT(shared != nullptr, "Checkpointer: a sharded world without a rendezvous store");
    impl_->store = shared->new_client("ckpt/");
    if (impl_->options.format == Format::kFull && impl_->ranks.shard_size > 1)
      impl_->host_group = model.mesh().shard.new_host_group(every_rank(impl_->ranks.shard_size));
  }
  // Expert parallel: a FULL save gathers the experts over their own groups.
  if (const DeviceMesh& mesh = model.mesh(); mesh.experts && impl_->options.format == Format::kFull) {
    if (const int n = mesh.experts->shard.size(); n > 1)
      impl_->expert_host_group = mesh.experts->shard.new_host_group(every_rank(n));
    impl_->ep_host_group = mesh.ep->new_host_group(every_rank(mesh.ep->size()));
  }
}

Checkpointer::~Checkpointer() {
  try {
    impl_->join();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[ckpt] the last checkpoint was not saved: %s\n", e.what());
  }
}

uint64_t Checkpointer::reserve() {
  return impl_->reserve();
}

void Checkpointer::wait() {
  impl_->join();
}

namespace {

// "training waited X s" of a save's line, and when the last save was still writing at this one's
// start, how much of X was spent waiting for it.
std::string waited_note(double waited, double behind) {
  std::string note = "; training waited " + format_seconds(waited);
  if (behind >= 0.05)
    note += str(" (", format_seconds(behind),
                " of it for the last save to finish: saves come faster than the disk takes them; "
                "a longer checkpoint.interval hides them)");
  return note;
}

}  // namespace

double Checkpointer::save(const TrainingState& state) {
  Impl& m = *impl_;
  const Clock::time_point t0 = Clock::now();
  m.join();
  const double behind = seconds_since(t0);
  const std::string name = checkpoint_name(state.step);
  const std::string final_dir = path_in(m.options.dir, name), tmp = final_dir + ".tmp";
  if (m.world.rank() == 0) {
    m.fs.make_dirs(m.options.dir);
    FSDP_CHECK(!m.fs.exists(final_dir) || m.fs.exists(path_in(final_dir, kManifest)), "[ckpt] ", final_dir,
               " exists without manifest.json: a damaged checkpoint, which fsdptrain does not overwrite; move it "
               "away and resume");
    make_room(m.site, final_dir, m.needed());
    m.fs.remove_all(tmp);
    m.fs.make_dirs(tmp);
  }
  if (m.world.size() > 1) m.world.barrier().wait();
  const json state_doc = state_json(state, m.options.format, m.model.options().device);

  if (m.options.format == Format::kFull) {  // host copies now; the thread gathers them one tensor at a time
    std::vector<HostSlice> slices;
    if (m.ranks.writer) slices = m.stage_full();
    return m.run_staged(
        [&m, slices = std::move(slices), state_doc, tmp, final_dir, t0, behind]() {
          if (!m.ranks.writer) return;
          const FullWritten written = write_full(m.full_write(), slices, tmp, final_dir);
          if (written.commits)
            commit_checkpoint(m.site, {}, written.files, state_doc, m.description.config_json, tmp, final_dir);
          m.site.say(str("[ckpt] saved ", final_dir, " (FULL_STATE_DICT",
                         written.in_place ? str(", each of ", m.ranks.shard_size, " ranks wrote its rows") : "",
                         ") in ", format_seconds(seconds_since(t0)), waited_note(m.staging.copied_at(t0), behind),
                         "\n"));
        },
        final_dir, t0);
  }

  // SHARDED: the copies to host memory now, the writes on the thread as they land.
  ShardImage rows;
  if (m.ranks.writer) rows = m.stage_shard();
  auto job = [&m, rows = std::move(rows), state_doc, name, tmp, final_dir, t0, behind]() {
    if (!m.ranks.writer) return;
    json report = write_shard(rows, m.staging, m.fs, m.ranks, tmp);
    if (m.ranks.file_index() != 0) {
      m.store->set(str(name, "/shard", m.ranks.file_index()), report.dump());
      return;
    }
    if (m.world.rank() != 0) return;
    const std::vector<json> reports =
        collect_shard_reports(*m.store, name, std::move(report), m.ranks.file_count(), m.world.timeout());
    commit_checkpoint(m.site, reports, {}, state_doc, m.description.config_json, tmp, final_dir);
    m.site.say(str("[ckpt] saved ", final_dir, " (SHARDED_STATE_DICT, ", plural(m.ranks.file_count(), "shard file"),
                   ") in ", format_seconds(seconds_since(t0)), waited_note(m.staging.copied_at(t0), behind), "\n"));
  };
  return m.run_staged(std::move(job), final_dir, t0);
}

TrainingState Checkpointer::load(const std::string& path) {
  Impl& m = *impl_;
  const Clock::time_point t0 = Clock::now();
  m.join();
  const TrainingState state = m.loader.load(path);
  m.site.say(str("[ckpt] loaded ", path, " (step ", state.step, ", saved by ", plural(state.world_size, "rank"),
                 ") in ", format_seconds(seconds_since(t0)), "\n"));
  return state;
}

TrainingState Checkpointer::resume(const std::string& path, const TrainingState& now) {
  const TrainingState saved = load(path);
  check_resumable(saved, now, path);
  return saved;
}

}  // namespace fsdp::ckpt

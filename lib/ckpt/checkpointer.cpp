#include "ckpt/checkpointer.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/accumulate.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/hf.h"
#include "ckpt/safetensors_torch.h"
#include "ckpt/sources.h"
#include "dist/store.h"
#include "util/clock.h"
#include "util/crc32c.h"
#include "util/error.h"
#include "util/files.h"
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

// The full value of one parameter's padded shard slice (flat, shard_numel elements on every rank)
// on the CPU. Collective over the shard group.
at::Tensor gather_slice(dist::ProcessGroup shard, const at::Tensor& slice, const ShardLayout& layout,
                        const std::string& name) {
  return shard.all_gather_copies(slice, "save " + name).narrow(0, 0, layout.numel()).view(layout.shape).to(at::kCPU);
}

// Under tensor parallel, the whole tensor from every tp rank's block (collective over `tp`).
at::Tensor whole_of(std::optional<dist::ProcessGroup>& tp, const at::Tensor& block, const TpSlice& slice,
                    const std::string& name) {
  if (!tp || !slice.split()) return block;
  return whole_from_blocks(*tp, block, slice, "save " + name);
}

// `count` floats of host memory for a save's copies on CPU, in 2 MiB pages where the kernel has them
// (MADV_HUGEPAGE): fewer faults as the copies first touch it, each of which leaves a virtual machine
// for its hypervisor. Not touched here: Staging fills it in (populate) piece by piece as it copies,
// so a writer can write the first pieces while the later ones are still being backed.
at::Tensor mapped_host_floats(int64_t count) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(float);
  const size_t mapped = bytes + kHuge;  // room to start on a 2 MiB boundary
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return at::empty({count}, at::kFloat);
  const auto start = (reinterpret_cast<uintptr_t>(base) + kHuge - 1) & ~uintptr_t{kHuge - 1};
  void* data = reinterpret_cast<void*>(start);
#ifdef MADV_HUGEPAGE
  ::madvise(data, bytes, MADV_HUGEPAGE);
#endif
  return at::from_blob(
      data, {count}, [base, mapped](void*) { ::munmap(base, mapped); }, at::TensorOptions().dtype(at::kFloat));
}

// Has the kernel back [p, p + n) of a mapping with memory in one call (MADV_POPULATE_WRITE, Linux
// 5.14), not a fault per page as a copy first touches it. A C program mapping and copying 0.65 GB on
// a 2-core virtual machine took 0.12 s so and 0.35-0.44 s faulting the pages in; memory its
// hypervisor has not backed yet costs more either way. Advice: where the kernel declines, the copy
// faults the pages in as before.
void populate(void* p, size_t n) {
  constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE, which older headers lack
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n + page - 1) & ~(page - 1);
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, kPopulateWrite);
}

// Host memory a save copies this rank's part into: one buffer, allocated by reserve() before step 1
// (or else by the first save) and reused by every save (a save joins the previous save's writer
// first), pinned when the model is on a GPU so the copies run at the link's speed and queue behind
// the step instead of waiting for it. plan() says where each tensor goes; the writer thread starts; copy() then copies
// on the training thread in the buffer's order, and the writer writes each piece once ready() says it is there, so a
// save takes about the longer of the copies and the writes, not their sum (the first save's copies, into memory not yet
// backed, cost as much as the writes on a virtual machine). Training goes on after copy(); on a GPU the copies queue on
// the step's stream and the next optimizer step runs after them, so they read this step's values, and ready() waits for
// their event. Pinning the buffer costs 6.2 s for the 14.8 GB of a 1.24B model on an H200: reserve() pays it on the
// training thread before step 1, since pinning on a thread beside the steps only moved that cost into step 1 (7.8 s
// instead of 0.8 s, measured there; the driver serializes it with the step's launches).
class Staging {
 public:
  // Plans copying each source to `offsets[i]` bytes into the buffer (a multiple of 4), after
  // `prefix`'s bytes at its start; `bytes` in all. The buffer ends on a kDirectAlignment boundary
  // past them, so a file whose image it holds can be written with WritableFile::append_image.
  // Returns where each source will be; copy() fills them.
  std::vector<at::Tensor> plan(const std::string& prefix, const std::vector<at::Tensor>& sources,
                               const std::vector<uint64_t>& offsets, uint64_t bytes, const c10::Device& device) {
    const auto floats = static_cast<int64_t>(round_up_to_block(bytes) / 4);
    pinned_ = device.is_cuda();
    device_ = device;
    if (!buffer_.defined() || buffer_.numel() < floats) {
      buffer_ = at::Tensor();  // the old one goes first: both at once may not fit
      buffer_ = pinned_ ? at::empty({floats}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true))
                        : mapped_host_floats(floats);
      backed_ = pinned_ ? static_cast<uint64_t>(floats) * 4 : 0;
    }
    prefix_ = prefix;
    copies_.clear();
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < sources.size(); ++i) {
      const at::Tensor& t = sources[i];
      FSDP_ASSERT(offsets[i] % 4 == 0 && offsets[i] >= prefix.size(), "Staging: offset ", offsets[i]);
      at::Tensor dst = buffer_.narrow(0, static_cast<int64_t>(offsets[i] / 4), t.numel()).view(t.sizes());
      copies_.push_back({offsets[i], t, dst});
      out.push_back(dst);
    }
    std::sort(copies_.begin(), copies_.end(), [](const Copy& a, const Copy& b) { return a.offset < b.offset; });
    planned_ = true;
    const std::lock_guard<std::mutex> lock(mutex_);
    staged_ = 0;
    end_ = bytes;
    failed_ = false;
    copied_.reset();
    return out;
  }
  // The tensors one after another from the buffer's start.
  std::vector<at::Tensor> plan(const std::vector<at::Tensor>& sources, const c10::Device& device) {
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const at::Tensor& t : sources) {
      offsets.push_back(next);
      next += static_cast<uint64_t>(t.numel()) * 4;
    }
    return plan("", sources, offsets, next, device);
  }
  // Makes the copies plan() planned (none when it was not called since the last copy()), in the
  // buffer's order, telling ready() about each 32 MiB as it lands (on a GPU: queues them all, and
  // ready() waits for them). After a failure ready() throws, so a writer waiting for bytes that
  // never come ends.
  void copy() {
    if (!planned_) return;
    planned_ = false;
    try {
      char* base = static_cast<char*>(buffer_.data_ptr());
      std::memcpy(base, prefix_.data(), prefix_.size());
      if (!pinned_) publish(prefix_.size());
      constexpr int64_t kPiece = int64_t{32} << 20;
      for (const Copy& c : copies_) {
        const at::Tensor src = c.src.reshape({-1}), dst = c.dst.view({-1});
        for (int64_t at = 0; at < src.numel(); at += kPiece / 4) {
          const int64_t k = std::min(kPiece / 4, src.numel() - at);
          const uint64_t upto = c.offset + static_cast<uint64_t>(at + k) * 4;
          if (upto > backed_) {  // a piece ahead of the copy, in one call
            const uint64_t ahead = std::min<uint64_t>(static_cast<uint64_t>(buffer_.numel()) * 4, upto + kPiece);
            populate(base + backed_, ahead - backed_);
            backed_ = ahead;
          }
          dst.narrow(0, at, k).copy_(src.narrow(0, at, k), /*non_blocking=*/pinned_);
          if (!pinned_) publish(upto);
        }
      }
      if (pinned_) {  // before end_ is published: ready() reads it then
        copied_.emplace(device_.type());
        copied_->record(c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_));
      }
      publish(end_);
      copies_.clear();  // the sources are the model's: no reason to hold them here
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mutex_);
      failed_ = true;
      ready_.notify_all();
      throw;
    }
  }
  // Forgets the plan and has the whole buffer backed with memory now (pinned memory already is), so
  // the first save copies at the speed of the later ones. Returns its bytes.
  uint64_t back_all() {
    planned_ = false;
    copies_.clear();
    const auto size = static_cast<uint64_t>(buffer_.numel()) * 4;
    if (backed_ < size) populate(static_cast<char*>(buffer_.data_ptr()) + backed_, size - backed_);
    backed_ = size;
    return size;
  }
  // Seconds from `t0` until copy() had made every copy (the writer thread: after ready() of them all).
  double copied_at(Clock::time_point t0) {
    const std::lock_guard<std::mutex> lock(mutex_);
    return std::chrono::duration<double>(done_ - t0).count();
  }
  // The writer thread: waits until the buffer's first `upto` bytes hold this save's values; returns
  // the buffer's start.
  const char* ready(uint64_t upto) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return failed_ || staged_ >= upto; });
    FSDP_CHECK(!failed_, "[ckpt] the copy of this rank's part to host memory failed; the save was abandoned");
    if (copied_) {
      copied_->synchronize();
      copied_.reset();
    }
    return static_cast<const char*>(buffer_.data_ptr());
  }

 private:
  struct Copy {
    uint64_t offset;
    at::Tensor src, dst;
  };
  void publish(uint64_t upto) {
    const std::lock_guard<std::mutex> lock(mutex_);
    staged_ = upto;
    if (upto == end_) done_ = Clock::now();
    ready_.notify_all();
  }

  at::Tensor buffer_;    // fp32, host
  bool pinned_ = false;  // on a GPU: pinned memory, copies queued on the step's stream
  c10::Device device_{at::kCPU};
  uint64_t backed_ = 0;  // the bytes from the buffer's start populate() has backed
  std::string prefix_;
  std::vector<Copy> copies_;  // by offset
  bool planned_ = false;      // copy() has copies_ to make
  std::mutex mutex_;          // the rest, shared with the writer thread
  std::condition_variable ready_;
  uint64_t staged_ = 0, end_ = 0;
  Clock::time_point done_;
  bool failed_ = false;
  std::optional<c10::Event> copied_;
};

}  // namespace

struct Checkpointer::Impl {
  ShardedModel& model;
  optim::ShardedAdamW& adamw;
  model::ModelDescription description;
  dist::ProcessGroup& world;
  CheckpointOptions o;
  FileSystem& fs;
  std::unique_ptr<dist::Store> store;               // the writer thread's own connection (SHARDED, several shard ranks)
  dist::ProcessGroup host_group;                    // the writer thread's gathers (FULL): Gloo over the shard group
  std::optional<dist::ProcessGroup> tp_host_group;  // and over the tp group, for tensor-parallel blocks
  std::thread writer;
  std::exception_ptr error;
  Staging staging;  // this rank's part of the last save, in host memory

  Impl(ShardedModel& m, optim::ShardedAdamW& a, model::ModelDescription d, dist::ProcessGroup& w,
       CheckpointOptions opts)
      : model(m),
        adamw(a),
        description(std::move(d)),
        world(w),
        o(std::move(opts)),
        fs(o.fs ? *o.fs : local_file_system(o.direct_io)),
        host_group(dist::make_single_process_group()) {}

  int shard_rank() const { return model.mesh().shard.rank(); }
  int shard_size() const { return model.mesh().shard.size(); }
  // The ranks that take part in writing: one replica's (every tp rank of it gathers its blocks).
  bool is_writer() const { return !model.mesh().replicate || model.mesh().replicate->rank() == 0; }
  int tp_rank() const { return model.mesh().tp ? model.mesh().tp->rank() : 0; }
  int tp_size() const { return model.mesh().tp ? model.mesh().tp->size() : 1; }
  // A FULL save whose ranks may each write their own rows into the files (when they also share a
  // machine: every_rank_on_this_machine).
  bool may_write_in_place() const { return o.full_rows_in_place && shard_size() > 1 && tp_size() == 1; }
  // SHARDED: one file per rank of a replica, shard-major (under tp, each rank writes its blocks' rows).
  int file_index() const { return shard_rank() * tp_size() + tp_rank(); }
  int file_count() const { return shard_size() * tp_size(); }
  void say(const std::string& line) const {
    if (world.rank() == 0 && o.log != nullptr) *o.log << line << std::flush;
  }

  void join() {
    if (writer.joinable()) writer.join();
    if (error) {
      std::exception_ptr e = error;
      error = nullptr;
      std::rethrow_exception(e);
    }
  }

  // This rank's rows of every parameter and of its AdamW state, copied to host memory.
  struct HostRows {
    std::string name;
    std::vector<int64_t> shape;  // the full tensor's
    int64_t r0 = 0, r1 = 0;
    int64_t c0 = 0, c1 = 0;  // columns [c0, c1) when a tensor-parallel block splits dim 1; else 0, 0 (all)
    at::Tensor data;         // (r1 - r0, *shape[1:]) fp32, CPU; dim 1 is c1 - c0 when split there
  };
  std::vector<Slot> saved_slots() const {
    if (!o.frozen_from_base) return slots_of(model);
    return slots_of(model, [](const ShardedParam& p) { return p.trainable; });
  }

  // This rank's shard file: its tensors' rows, staged as the file's image (its header, then the
  // tensors where the layout puts them).
  struct ShardImage {
    std::vector<HostRows> rows;
    std::vector<uint64_t> offsets;  // where each of rows starts in the file
    SafetensorsLayout layout;
  };
  ShardImage snapshot() {
    ShardImage image;
    std::vector<HostRows>& out = image.rows;
    for (const Slot& s : saved_slots()) {
      const ShardedParam& p = *s.param;
      const auto [r0, r1] = stored_rows(p);
      const int64_t n = r1 - r0;  // the rank's rows that hold the parameter (not FSDP's or tp's padding)
      if (n == 0 || (!p.tp.split() && tp_rank() != 0)) continue;  // one tp rank writes what they all hold
      int64_t c0 = 0, c1 = 0;
      if (p.tp.split() && p.tp.dim == 1) {
        c0 = p.tp.start(p.layout.shape[1]);
        c1 = c0 + p.layout.shape[1];
      }
      auto add = [&](const std::string& name, const at::Tensor& rows) {
        out.push_back({name, p.full_shape(), r0, r0 + n, c0, c1, rows.narrow(0, 0, n)});
      };
      add(p.name, p.sharded);
      if (p.trainable) {
        const auto& st = adamw.state()[s.group];
        add(kExpAvg + p.name, state_rows(st.exp_avg, p));
        add(kExpAvgSq + p.name, state_rows(st.exp_avg_sq, p));
      }
    }
    std::vector<TensorBytes> specs;
    for (const HostRows& r : out) {
      std::vector<int64_t> shape = r.shape;
      shape[0] = r.r1 - r.r0;
      if (r.c1 > r.c0) shape[1] = r.c1 - r.c0;
      specs.push_back({r.name, Dtype::kF32, shape, nullptr, static_cast<size_t>(r.data.numel()) * 4});
    }
    image.layout = safetensors_layout(specs, {{"format", "pt"}});
    std::map<std::string, uint64_t> offset_of;
    for (size_t i = 0; i < image.layout.order.size(); ++i) offset_of[image.layout.order[i]] = image.layout.offsets[i];
    std::vector<at::Tensor> sources;
    for (const HostRows& r : out) {
      sources.push_back(r.data);
      image.offsets.push_back(offset_of.at(r.name));
    }
    const std::vector<at::Tensor> staged =
        staging.plan(image.layout.header, sources, image.offsets, image.layout.size, model.options().device);
    for (size_t i = 0; i < out.size(); ++i) out[i].data = staged[i];
    return image;
  }

  // Writes this rank's shard file from its staged image, 64 MiB at a time as the copies land;
  // returns its report for the index and the manifest.
  json write_shard(const ShardImage& image, const std::string& tmp) {
    const std::string file = shard_file_name(file_index(), file_count());
    auto out = fs.create(path_in(tmp, file));
    constexpr uint64_t kPiece = uint64_t{64} << 20;  // whole blocks, as append_image's pieces must be
    for (uint64_t at = 0; at < image.layout.size; at += kPiece) {
      const uint64_t n = std::min(kPiece, image.layout.size - at);
      out->append_image(staging.ready(at + n) + at, n);
    }
    out->sync();
    out->close();
    json tensors = json::object();
    for (size_t i = 0; i < image.rows.size(); ++i) {
      const HostRows& r = image.rows[i];
      const uint64_t at = image.offsets[i];
      tensors[r.name] = {{"shape", r.shape}, {"rows", {r.r0, r.r1}}, {"bytes", {at, at + r.data.numel() * 4}}};
      if (r.c1 > r.c0) tensors[r.name]["cols"] = {r.c0, r.c1};
    }
    return json{{"file", file}, {"bytes", out->bytes()}, {"crc32c", crc_hex(out->checksum())}, {"tensors", tensors}};
  }

  // Rank 0: the index, state, config and manifest, then the rename that makes the checkpoint exist.
  void commit(const std::vector<json>& shard_reports, std::vector<WrittenFile> written, const json& state,
              const std::string& tmp, const std::string& final_dir) {
    auto write = [&](const std::string& name, const std::string& text) {
      written.push_back({name, text.size(), write_whole_file(fs, path_in(tmp, name), text)});
    };
    if (!shard_reports.empty()) {
      json index = {{"format", "fsdptrain-sharded"}, {"version", kFormatVersion}, {"world_size", shard_reports.size()}};
      json files = json::array(), tensors = json::object();
      for (size_t k = 0; k < shard_reports.size(); ++k) {
        const json& r = shard_reports[k];
        files.push_back(r.at("file"));
        written.push_back({r.at("file").get<std::string>(), r.at("bytes").get<uint64_t>(),
                           static_cast<uint32_t>(std::stoul(r.at("crc32c").get<std::string>(), nullptr, 16))});
        for (const auto& [name, t] : r.at("tensors").items()) {
          json& e = tensors[name];
          e["dtype"] = "F32";
          e["shape"] = t.at("shape");
          json piece = {{"file", k}, {"rows", t.at("rows")}, {"bytes", t.at("bytes")}};
          if (t.contains("cols")) piece["cols"] = t.at("cols");
          e["pieces"].push_back(piece);
        }
      }
      // In order of (columns, rows): under tensor parallel the files hold the blocks shard-major.
      for (auto& [name, e] : tensors.items()) {
        auto key = [](const json& p) {
          return std::make_pair(p.contains("cols") ? p.at("cols").at(0).get<int64_t>() : 0,
                                p.at("rows").at(0).get<int64_t>());
        };
        std::vector<json> pieces(e.at("pieces").begin(), e.at("pieces").end());
        std::stable_sort(pieces.begin(), pieces.end(), [&](const json& a, const json& b) { return key(a) < key(b); });
        e["pieces"] = pieces;
      }
      index["files"] = files;
      index["tensors"] = tensors;
      write(kIndex, index.dump(1) + "\n");
      write(kConfig, description.config_json);
    }
    write(kState, state.dump(2) + "\n");
    json manifest = {{"format", "fsdptrain-manifest"}, {"version", kFormatVersion}, {"files", json::object()}};
    for (const WrittenFile& f : written)
      manifest["files"][f.name] = {{"bytes", f.bytes}, {"crc32c", crc_hex(f.crc32c)}};
    write_whole_file(fs, path_in(tmp, kManifest), manifest.dump(2) + "\n");
    fs.sync_dir(tmp);
    if (fs.exists(final_dir)) fs.remove_all(final_dir);  // an older run's checkpoint of the same step
    fs.rename(tmp, final_dir);
    fs.sync_dir(o.dir);
    prune(final_dir);
  }

  // Deletes complete checkpoints beyond `keep` (oldest first) and folders of saves that never finished.
  void prune(const std::string& just_written) {
    for (const std::string& e : fs.list(o.dir))
      if (e.size() > 4 && e.compare(e.size() - 4, 4, ".tmp") == 0 && step_of(e.substr(0, e.size() - 4)))
        fs.remove_all(path_in(o.dir, e));
    if (o.keep <= 0) return;
    auto all = complete_checkpoints(o.dir, fs);
    const std::string best = o.keep_best ? best_checkpoint(o.dir, fs) : "";
    // The newest `keep`, and the best besides them when it is older (Trainer's rule: a best that is
    // also among the newest takes no second place).
    for (size_t i = 0; i + static_cast<size_t>(o.keep) < all.size(); ++i)
      if (all[i] != just_written && all[i] != best) {
        fs.remove_all(all[i]);
        say(str("[ckpt] removed ", all[i], " (checkpoint.keep: ", o.keep,
                best.empty() ? "" : str("; the best by held-out loss, ", best, ", stays"), ")\n"));
      }
  }

  // Runs a save's writing part on the writer thread (or here, without background writes). A full
  // disk is reported with what the save needed, what was free and checkpoint.keep; its .tmp folder
  // is removed so the space comes back.
  void run(std::function<void()> job, const std::string& final_dir) {
    auto guarded = [this, job = std::move(job), final_dir]() {
      try {
        job();
      } catch (const DiskFullError& e) {
        const uint64_t free = fs.available_bytes(o.dir);
        try {
          fs.remove_all(final_dir + ".tmp");
        } catch (const std::exception&) {
        }
        throw Error(str("[ckpt] the disk is full: saving ", final_dir, " needs about ",
                        format_bytes(static_cast<long long>(needed())), " and ",
                        format_bytes(static_cast<long long>(free)), " was free (", e.what(),
                        "). The previous checkpoint is intact. Free space, or set checkpoint.keep (now ", o.keep,
                        ") to keep fewer checkpoints: with keep >= 2 a save removes the oldest first when the disk "
                        "is short, so resuming with it continues"));
      }
    };
    if (!o.background) return guarded();
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
    if (o.background) {
      run(std::move(job), final_dir);
      staging.copy();
      return seconds_since(t0);
    }
    staging.copy();
    const double blocked = seconds_since(t0);
    run(std::move(job), final_dir);
    return blocked;
  }

  uint64_t needed() const { return checkpoint_bytes(description.num_parameters); }

  uint64_t reserve() {
    if (!is_writer()) return 0;
    try {
      if (o.format == Format::kFull)
        snapshot_slices();
      else
        snapshot();
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

  // Rank 0, before a save: when the disk has less free than a checkpoint needs, removes the oldest
  // complete checkpoints that keep would prune after this save anyway (keep >= 2: one always stays).
  void make_room(const std::string& final_dir) {
    if (fs.available_bytes(o.dir) >= needed()) return;
    for (const std::string& old : removable_before_save(o.dir, o.keep, fs, o.keep_best)) {
      if (fs.available_bytes(o.dir) >= needed()) return;
      fs.remove_all(old);
      say(str("[ckpt] removed ", old, " before saving ", final_dir, ": the disk is short and checkpoint.keep is ",
              o.keep, "\n"));
    }
  }

  // FULL_STATE_DICT: this rank's padded shard slice of every parameter and AdamW state (the same
  // size on every rank), copied to host memory; the writer gathers them over host_group.
  struct HostSlice {
    std::string name;
    const ShardLayout* layout = nullptr;
    const TpSlice* tp = nullptr;
    at::Tensor slice;         // (shard_numel) fp32, CPU: in the staging buffer
    uint64_t staged_end = 0;  // Staging::ready(staged_end) before reading it
    std::vector<int64_t> full_shape() const { return tp->full_shape(layout->shape); }
  };
  std::vector<HostSlice> snapshot_slices() {
    std::vector<HostSlice> out;
    for (const Slot& s : saved_slots()) {
      const ShardedParam& p = *s.param;
      auto add = [&](const std::string& name, const at::Tensor& slice) {
        out.push_back({name, &p.layout, &p.tp, slice.reshape({-1}), 0});
      };
      add(p.name, p.sharded);
      if (p.trainable) {
        const auto& st = adamw.state()[s.group];
        add(kExpAvg + p.name, st.exp_avg.narrow(0, p.offset, p.layout.shard_numel()));
        add(kExpAvgSq + p.name, st.exp_avg_sq.narrow(0, p.offset, p.layout.shard_numel()));
      }
    }
    // One after another; where the save may be written in place (write_full_in_place), each placed
    // so that its address and the file offset its rows go to agree modulo the direct-I/O block:
    // those writes then go to the disk straight from the buffer, with no copy through an aligned one
    // (at most a block of padding each).
    const bool in_place = may_write_in_place();
    const InPlacePlan files = in_place ? plan_in_place(out) : InPlacePlan{};
    std::vector<at::Tensor> sources;
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const HostSlice& h : out) {
      if (in_place) {  // padding up to the address whose place in a block is that of the rows' file offset
        const uint64_t file_offset =
            files.offset.at(h.name) + static_cast<uint64_t>(h.layout->first_row() * h.layout->row_numel()) * 4;
        next += (file_offset % kDirectAlignment + kDirectAlignment - next % kDirectAlignment) % kDirectAlignment;
      }
      sources.push_back(h.slice);
      offsets.push_back(next);
      next += static_cast<uint64_t>(h.slice.numel()) * 4;
    }
    const std::vector<at::Tensor> staged = staging.plan("", sources, offsets, next, model.options().device);
    for (size_t i = 0; i < out.size(); ++i) {
      out[i].slice = staged[i];
      out[i].staged_end = offsets[i] + static_cast<uint64_t>(staged[i].numel()) * 4;
    }
    return out;
  }

  // FULL_STATE_DICT when every shard rank runs on shard rank 0's machine and nothing is split for
  // tensor parallel: each rank writes its own rows of every tensor straight into the files, as a
  // FULL load reads them, instead of sending them to shard rank 0, which then wrote the whole model
  // alone (half of a 125M FULL save's time was that gather on two ranks, and rank 0's inbound bytes
  // grow with the ranks). One machine, not merely a shared file system: its page cache makes
  // writes of neighbouring bytes by several processes safe, where a network file system's clients
  // may each write back whole pages. Collective over host_group: rank 0 leaves a marker named by a
  // random number in `tmp` holding its kernel's boot id, and every rank reads it and compares its
  // own.
  bool every_rank_on_this_machine(const std::string& tmp) {
    if (!may_write_in_place()) return false;
    at::Tensor token = at::zeros({1}, at::kLong);
    if (shard_rank() == 0) token.fill_(int64_t{std::random_device{}()} << 20 | (::getpid() & 0xFFFFF));
    host_group.broadcast(token, 0, "checkpoint folder check").wait();
    const std::string marker = path_in(tmp, str(".same-machine-", token.item<int64_t>()));
    const std::string boot_id = machine_boot_id();
    if (shard_rank() == 0) write_whole_file(fs, marker, boot_id);
    host_group.barrier("checkpoint folder check").wait();
    bool same = false;
    try {
      same = !boot_id.empty() && read_file(marker) == boot_id;
    } catch (const std::exception&) {  // not there: another machine's folder
    }
    at::Tensor count = at::full({1}, same ? 1 : 0, at::kLong);
    host_group.all_reduce(count, dist::ReduceOp::kSum, "checkpoint folder check").wait();
    if (shard_rank() == 0) fs.remove_all(marker);
    return count.item<int64_t>() == shard_size();
  }

  // This boot of this machine's kernel ("" where there is none to read).
  static std::string machine_boot_id() {
    try {
      return read_file("/proc/sys/kernel/random/boot_id");
    } catch (const std::exception&) {
      return "";
    }
  }

  // One file of a FULL save written in place: its name, layout and its tensors' slices in file order.
  struct InPlaceFile {
    std::string name;
    SafetensorsLayout layout;
    std::vector<const HostSlice*> slices;
  };
  // The files of an in-place FULL save from its slices' names and shapes alone: the Hugging Face
  // shards of the parameters, then optimizer.safetensors; where each tensor starts in its file.
  struct InPlacePlan {
    HfShardPlan hf;
    std::vector<InPlaceFile> files;
    std::map<std::string, uint64_t> offset;
  };
  InPlacePlan plan_in_place(const std::vector<HostSlice>& slices) const {
    std::map<std::string, const HostSlice*> by_name;
    std::vector<TensorSpec> params;
    std::vector<TensorBytes> optim;
    for (const HostSlice& h : slices) {
      by_name[h.name] = &h;
      if (h.name.rfind("optim.", 0) == 0)
        optim.push_back({h.name, Dtype::kF32, h.full_shape(), nullptr, static_cast<size_t>(h.layout->numel()) * 4});
      else
        params.push_back({h.name, h.full_shape()});
    }
    InPlacePlan out;
    out.hf = plan_hf_shards(params, Dtype::kF32, o.max_shard_bytes);
    auto add_file = [&](const std::string& name, const std::vector<TensorBytes>& specs) {
      InPlaceFile f{name, safetensors_layout(specs), {}};
      for (size_t i = 0; i < f.layout.order.size(); ++i) {
        f.slices.push_back(by_name.at(f.layout.order[i]));
        out.offset[f.layout.order[i]] = f.layout.offsets[i];
      }
      out.files.push_back(std::move(f));
    };
    for (size_t k = 0; k < out.hf.shards.size(); ++k) add_file(out.hf.shards[k].file, out.hf.specs_of(k));
    add_file(kOptimizer, optim);
    return out;
  }

  // The in-place FULL save: shard rank 0 creates every file at its full size with its header; every
  // rank writes its valid rows of each tensor at their offset, fsyncs its writes and sends the
  // CRC-32C of each piece to rank 0, which joins them into each file's checksum and commits.
  void write_full_in_place(const std::vector<HostSlice>& slices, const json& state_doc, const std::string& tmp,
                           const std::string& final_dir) {
    const bool lead = shard_rank() == 0;
    const InPlacePlan in_place = plan_in_place(slices);
    const HfShardPlan& plan = in_place.hf;
    const std::vector<InPlaceFile>& files = in_place.files;
    std::vector<uint32_t> header_crcs;
    if (lead)
      for (const InPlaceFile& f : files) {
        auto out = fs.create(path_in(tmp, f.name));
        out->append(f.layout.header.data(), f.layout.header.size());
        out->resize(f.layout.size);
        out->sync();
        out->close();
        header_crcs.push_back(out->checksum());
      }
    host_group.barrier("save " + final_dir + " (files created)").wait();
    // Each rank starts at a different file: writes into one file take its inode's lock in turn, so
    // ranks on different files copy at once.
    std::vector<std::vector<int64_t>> file_crcs(files.size());  // this rank's piece of each tensor
    for (size_t j = 0; j < files.size(); ++j) {
      const size_t k = (j + static_cast<size_t>(shard_rank())) % files.size();
      const InPlaceFile& f = files[k];
      auto out = fs.open_existing(path_in(tmp, f.name));
      for (size_t i = 0; i < f.slices.size(); ++i) {
        const ShardLayout& l = *f.slices[i]->layout;
        const size_t n = static_cast<size_t>(l.valid_rows() * l.row_numel()) * 4;
        staging.ready(f.slices[i]->staged_end);
        const void* rows = f.slices[i]->slice.data_ptr();
        if (n > 0)
          out->write_at(f.layout.offsets[i] + static_cast<uint64_t>(l.first_row() * l.row_numel()) * 4, rows, n);
        file_crcs[k].push_back(n > 0 ? crc32c(rows, n) : 0);
      }
      out->sync();
      out->close();
    }
    std::vector<int64_t> crcs;  // file after file
    for (const std::vector<int64_t>& c : file_crcs) crcs.insert(crcs.end(), c.begin(), c.end());
    // Every rank's pieces are on disk once this returns.
    const at::Tensor gathered =
        host_group.all_gather_copies(at::tensor(crcs, at::kLong), "save " + final_dir + " (checksums)");
    if (!lead) return;
    const at::Tensor by_rank = gathered.view({shard_size(), -1});
    const auto all = by_rank.accessor<int64_t, 2>();
    std::vector<WrittenFile> written;
    int64_t piece = 0;
    for (size_t k = 0; k < files.size(); ++k) {
      const InPlaceFile& f = files[k];
      uint32_t crc = header_crcs[k];
      for (const HostSlice* h : f.slices) {
        for (int r = 0; r < shard_size(); ++r) {
          const ShardLayout l{h->layout->shape, shard_size(), r};
          const uint64_t n = static_cast<uint64_t>(l.valid_rows() * l.row_numel()) * 4;
          if (n > 0) crc = crc32c_join(crc, static_cast<uint32_t>(all[r][piece]), n);
        }
        ++piece;
      }
      written.push_back({f.name, f.layout.size, crc});
    }
    for (WrittenFile& f : write_hf_side_files(plan, description.config_json, tmp, fs)) written.push_back(std::move(f));
    commit({}, written, state_doc, tmp, final_dir);
  }

  // Gathers every slice (collective over host_group, in name order) and, on shard rank 0, writes the
  // Hugging Face folder, optimizer.safetensors and the commit; or has every rank write its rows
  // (write_full_in_place), and then returns true.
  bool write_full(const std::vector<HostSlice>& slices, const json& state_doc, const std::string& tmp,
                  const std::string& final_dir) {
    if (every_rank_on_this_machine(tmp)) {
      write_full_in_place(slices, state_doc, tmp, final_dir);
      return true;
    }
    const bool writer = shard_rank() == 0 && tp_rank() == 0;
    auto full = [&](const HostSlice& h) {
      staging.ready(h.staged_end);
      return whole_of(tp_host_group, gather_slice(host_group, h.slice, *h.layout, h.name), *h.tp, h.name);
    };
    std::vector<const HostSlice*> params, optim;
    for (const HostSlice& h : slices) (h.name.rfind("optim.", 0) == 0 ? optim : params).push_back(&h);
    std::vector<TensorSpec> specs;
    for (const HostSlice* h : params) specs.push_back({h->name, h->full_shape()});
    std::vector<WrittenFile> written = write_hf_folder(
        specs, [&](size_t i) { return full(*params[i]); }, writer, description.config_json, tmp, o.max_shard_bytes, fs);
    std::sort(optim.begin(), optim.end(), [](const HostSlice* a, const HostSlice* b) { return a->name < b->name; });
    std::unique_ptr<SafetensorsWriter> out;
    if (writer) {
      std::vector<TensorBytes> tensors;
      for (const HostSlice* h : optim)
        tensors.push_back({h->name, Dtype::kF32, h->full_shape(), nullptr,
                           static_cast<size_t>(c10::multiply_integers(h->full_shape())) * 4});
      // All fp32: the writer's order is the name order, the order of the gathers below (append checks it).
      out = std::make_unique<SafetensorsWriter>(path_in(tmp, kOptimizer), tensors, std::map<std::string, std::string>{},
                                                fs);
    }
    for (const HostSlice* h : optim) {
      const at::Tensor t = full(*h);
      if (out) append_tensor(*out, h->name, t.to(at::kCPU).contiguous());
    }
    if (!writer) return false;
    out->finish();
    written.push_back({kOptimizer, out->bytes(), out->checksum()});
    commit({}, written, state_doc, tmp, final_dir);
    return false;
  }

  // A FULL load: every rank read its rows of the same files; rank 0 gets the others' segments (over
  // the rendezvous store) to join each file's checksum.
  void join_read_segments(Source& src, const std::string& path) {
    if (world.size() == 1) return;
    const std::shared_ptr<dist::Store>& shared = world.store();
    FSDP_ASSERT(shared != nullptr, "Checkpointer: a world without a rendezvous store");
    const std::string key = str("ckpt-load/", ++loads, "/", path, "/rank");
    if (world.rank() != 0) {
      shared->set(key + std::to_string(world.rank()), src.read_segments());
      return;
    }
    for (int r = 1; r < world.size(); ++r) src.add_read_segments(shared->get(key + std::to_string(r)));
  }
  int64_t loads = 0;  // FULL loads so far: each one's keys in the store are its own

  // Rank 0's writer thread: waits for every shard rank's report.
  std::vector<json> collect(const std::string& name, json mine) {
    std::vector<json> reports{std::move(mine)};
    for (int k = 1; k < file_count(); ++k) {
      const std::string key = str(name, "/shard", k);
      // A large shard on a slow disk takes long: wait the collective timeout (dist_timeout), at least
      // 30 minutes, then give up on this checkpoint (the previous one is untouched).
      const auto limit = std::max<std::chrono::milliseconds>(world.timeout(), std::chrono::minutes(30));
      if (!store->wait_for({key}, limit))
        throw Error(str("[ckpt] shard rank ", k, " did not report its file of ", name, " within ",
                        std::chrono::duration_cast<std::chrono::seconds>(limit).count(),
                        " s; that checkpoint was not committed (the previous one is intact). Check that rank's "
                        "output and the file system"));
      reports.push_back(json::parse(store->get(key)));
    }
    return reports;
  }
};

Checkpointer::Checkpointer(ShardedModel& model, optim::ShardedAdamW& adamw, model::ModelDescription description,
                           dist::ProcessGroup& world, CheckpointOptions options)
    : impl_(std::make_unique<Impl>(model, adamw, std::move(description), world, std::move(options))) {
  const std::optional<dist::ProcessGroup>& tp = model.mesh().tp;
  if (tp && tp->size() > 1 && impl_->o.format == Format::kFull)
    impl_->tp_host_group = tp->new_host_group(every_rank(tp->size()));
  if (impl_->file_count() > 1) {
    const auto& shared = world.store();
    FSDP_ASSERT(shared != nullptr, "Checkpointer: a sharded world without a rendezvous store");
    impl_->store = shared->new_client("ckpt/");
    if (impl_->o.format == Format::kFull && impl_->shard_size() > 1)
      impl_->host_group = model.mesh().shard.new_host_group(every_rank(impl_->shard_size()));
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
  const std::string final_dir = path_in(m.o.dir, name), tmp = final_dir + ".tmp";
  if (m.world.rank() == 0) {
    m.fs.make_dirs(m.o.dir);
    FSDP_CHECK(!m.fs.exists(final_dir) || m.fs.exists(path_in(final_dir, kManifest)), "[ckpt] ", final_dir,
               " exists without manifest.json: a damaged checkpoint, which fsdptrain does not overwrite; move it "
               "away and resume");
    m.make_room(final_dir);
    m.fs.remove_all(tmp);
    m.fs.make_dirs(tmp);
  }
  if (m.world.size() > 1) m.world.barrier().wait();
  const json state_doc = state_json(state, m.o.format, m.model.options().device);

  if (m.o.format == Format::kFull) {  // host copies now; the thread gathers them one tensor at a time
    std::vector<Impl::HostSlice> slices;
    if (m.is_writer()) slices = m.snapshot_slices();
    return m.run_staged(
        [&m, slices = std::move(slices), state_doc, tmp, final_dir, t0, behind]() {
          if (!m.is_writer()) return;
          const bool in_place = m.write_full(slices, state_doc, tmp, final_dir);
          m.say(str("[ckpt] saved ", final_dir, " (FULL_STATE_DICT",
                    in_place ? str(", each of ", m.shard_size(), " ranks wrote its rows") : "", ") in ",
                    format_seconds(seconds_since(t0)), waited_note(m.staging.copied_at(t0), behind), "\n"));
        },
        final_dir, t0);
  }

  // SHARDED: the copies to host memory now, the writes on the thread as they land.
  Impl::ShardImage rows;
  if (m.is_writer()) rows = m.snapshot();
  auto job = [&m, rows = std::move(rows), state_doc, name, tmp, final_dir, t0, behind]() {
    if (!m.is_writer()) return;
    json report = m.write_shard(rows, tmp);
    if (m.file_index() != 0) {
      m.store->set(str(name, "/shard", m.file_index()), report.dump());
      return;
    }
    if (m.world.rank() != 0) return;
    m.commit(m.collect(name, std::move(report)), {}, state_doc, tmp, final_dir);
    m.say(str("[ckpt] saved ", final_dir, " (SHARDED_STATE_DICT, ", plural(m.file_count(), "shard file"), ") in ",
              format_seconds(seconds_since(t0)), waited_note(m.staging.copied_at(t0), behind), "\n"));
  };
  return m.run_staged(std::move(job), final_dir, t0);
}

TrainingState Checkpointer::load(const std::string& path) {
  Impl& m = *impl_;
  const Clock::time_point t0 = Clock::now();
  m.join();
  const c10::Device device = m.model.options().device;
  // The small files first, on every rank: the same decision everywhere.
  std::string failure;
  std::unique_ptr<Source> src;
  TrainingState state;
  json state_doc;
  std::set<std::string> files;  // the big files this rank reads (FULL, rank 0: all of them)
  bool checksum_while_reading = false, sharded = false;
  const std::vector<Slot> slots = m.saved_slots();
  try {
    verify_checkpoint(path, {kState, kConfig});
    state_doc = parse_json_file(path_in(path, kState));
    state = parse_state(state_doc, path_in(path, kState));
    // The format the state names (a lost index.json is then reported as that, not as a missing
    // Hugging Face model file).
    sharded = state_doc.value("state_dict_type", "") == "SHARDED_STATE_DICT" || file_exists(path_in(path, kIndex));
    if (sharded) verify_checkpoint(path, {kIndex});
    check_state_matches_folder(state, path);
    FSDP_CHECK(m.description.canonical_config(path_in(path, kConfig)) == m.description.config_json, "[ckpt] ", path,
               "/config.json describes another model than this run's; resume with the model.config it was "
               "trained with, or start a new run in another checkpoint.dir");
    src = open_source(path);
    check_matches_model(*src, slots, /*optimizer=*/true, path, "");
    // The big files this rank will read (a FULL load's rank 0, which checks every file: all of them).
    const bool everything = !sharded && m.world.rank() == 0;
    for (const Slot& s : slots) {
      const ShardedParam& p = *s.param;
      const auto [first, last] = stored_rows(p);
      const int64_t r0 = everything ? 0 : first, r1 = everything ? p.full_shape()[0] : last;
      if (r0 == r1) continue;
      const std::string name = stored_name(*src, p);
      src->files(name, r0, r1, files);
      if (p.trainable) {
        src->files(kExpAvg + name, r0, r1, files);
        src->files(kExpAvgSq + name, r0, r1, files);
      }
    }
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
  agree(m.world, device, failure);

  for (const auto& g : m.model.groups()) g->reshard();
  fill(slots, m.model, &m.adamw, src.get(), m.world, /*efficient=*/false, m.o.direct_io);  // each rank its own rows
  if (checksum_while_reading) {
    try {
      if (!sharded) m.join_read_segments(*src, path);
      if (sharded || m.world.rank() == 0) src->verify_read(path, files);
    } catch (const InputError& e) {
      failure = e.what();
    }
    agree(m.world, device, failure);
  }
  m.adamw.set_steps(state.optimizer_steps);
  restore_rng(state_doc, device, path_in(path, kState));
  m.say(str("[ckpt] loaded ", path, " (step ", state.step, ", saved by ", plural(state.world_size, "rank"), ") in ",
            format_seconds(seconds_since(t0)), "\n"));
  return state;
}

TrainingState Checkpointer::resume(const std::string& path, const TrainingState& now) {
  const TrainingState saved = load(path);
  check_resumable(saved, now, path);
  return saved;
}

}  // namespace fsdp::ckpt

// Worker programs of the checkpoint tests, started by `fsdptrain launch ... -- ckpt_worker MODE`:
//
//   ckpt_worker train CONFIG [--set key=value]... [--fault crash|error|enospc --at-save K --after-bytes B
//                            --rank R] [--disk-bytes N] [--write-delay-ms D]
//     The built-in trainer, writing checkpoints through a file system that, on rank R, during its
//     K-th save, after B bytes, either kills the process (crash: _exit, as a power cut or the OOM
//     killer would), fails the write (error: an I/O error), or reports a full disk (enospc). With
//     --disk-bytes, checkpoint.dir lies on a simulated disk of N bytes. With --write-delay-ms, every
//     write of every rank takes D ms more: a slow disk.
//   ckpt_worker resave MODEL_CONFIG CHECKPOINT OUT_DIR sharded|full
//     Loads CHECKPOINT into the model sharded over this launch's ranks and saves it again to
//     OUT_DIR in the given format: what resharding W -> W' does to every tensor.
//   ckpt_worker reexport HF_DIR OUT_DIR efficient|plain
//     Loads a Hugging Face folder into the model sharded over this launch's ranks (with or without
//     cpu_ram_efficient_loading) and exports it again to OUT_DIR: import then export.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/checkpointer.h"
#include "ckpt/hf.h"
#include "ckpt/pretrained.h"
#include "config/loader.h"
#include "dist/process_group.h"
#include "model/layers/decoder.h"
#include "optim/adamw.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace {

using namespace fsdp;

class FaultyFile final : public ckpt::WritableFile {
 public:
  FaultyFile(std::unique_ptr<ckpt::WritableFile> inner, std::function<void(size_t)> before_write)
      : WritableFile(inner->path()), inner_(std::move(inner)), before_write_(std::move(before_write)) {}
  void append(const void* data, size_t n) override {
    before_write_(n);
    inner_->append(data, n);
    account(data, n);
  }
  void sync() override { inner_->sync(); }
  void close() override { inner_->close(); }
  void write_at(uint64_t offset, const void* data, size_t n) override {
    before_write_(n);
    inner_->write_at(offset, data, n);
  }
  void resize(uint64_t size) override { inner_->resize(size); }

 private:
  std::unique_ptr<ckpt::WritableFile> inner_;
  std::function<void(size_t)> before_write_;
};

// The bytes of the files under `path` (du), on the local file system.
uint64_t disk_usage(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return 0;
  if (!S_ISDIR(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  uint64_t total = 0;
  for (const std::string& e : ckpt::local_file_system().list(path)) total += disk_usage(path + "/" + e);
  return total;
}

// The local file system, until the fault: saves are counted by the step-N.tmp folders files are
// created in. With disk_bytes, a disk of that size that holds only `root` (checkpoint.dir): writes
// beyond it fail as a full disk does, and available_bytes reports what is left.
class FaultyFileSystem final : public ckpt::FileSystem {
 public:
  FaultyFileSystem(std::string fault, int at_save, uint64_t after_bytes, uint64_t disk_bytes, std::string root,
                   int write_delay_ms)
      : fault_(std::move(fault)),
        at_save_(at_save),
        after_bytes_(after_bytes),
        disk_bytes_(disk_bytes),
        root_(std::move(root)),
        write_delay_ms_(write_delay_ms) {}
  std::unique_ptr<ckpt::WritableFile> create(const std::string& path) override {
    const std::string dir = path.substr(0, path.rfind('/'));
    if (dir != current_dir_) {
      current_dir_ = dir;
      ++saves_;
    }
    return std::make_unique<FaultyFile>(local().create(path), [this, path](size_t n) { before_write(path, n); });
  }
  std::unique_ptr<ckpt::WritableFile> open_existing(const std::string& path) override {
    return std::make_unique<FaultyFile>(local().open_existing(path), [this, path](size_t n) { before_write(path, n); });
  }
  void rename(const std::string& a, const std::string& b) override { local().rename(a, b); }
  void sync_dir(const std::string& d) override { local().sync_dir(d); }
  void make_dirs(const std::string& d) override { local().make_dirs(d); }
  void remove_all(const std::string& p) override { local().remove_all(p); }
  std::vector<std::string> list(const std::string& d) override { return local().list(d); }
  bool exists(const std::string& p) override { return local().exists(p); }
  uint64_t available_bytes(const std::string& p) override {
    if (disk_bytes_ == 0) return local().available_bytes(p);
    const uint64_t used = disk_usage(root_);
    return used >= disk_bytes_ ? 0 : disk_bytes_ - used;
  }

 private:
  static ckpt::FileSystem& local() { return ckpt::local_file_system(); }
  void before_write(const std::string& path, size_t n) {
    if (write_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(write_delay_ms_));
    if (disk_bytes_ > 0 && n > available_bytes(root_))
      throw ckpt::DiskFullError(str("[ckpt] cannot write \"", path, "\": No space left on device"));
    if (saves_ != at_save_) return;
    if (written_ + n > after_bytes_) {
      if (fault_ == "crash") {
        std::cerr << "[ckpt_worker] injected crash during save " << saves_ << " after " << written_ << " bytes\n";
        _exit(9);
      }
      if (fault_ == "enospc")
        throw ckpt::DiskFullError(str("[ckpt] cannot write \"", path, "\": No space left on device"));
      throw Error(str("[ckpt_worker] injected I/O error during save ", saves_, " after ", written_, " bytes"));
    }
    written_ += n;
  }
  std::string fault_;
  int at_save_;
  uint64_t after_bytes_, disk_bytes_;
  std::string root_;
  int write_delay_ms_;
  std::string current_dir_;
  int saves_ = 0;
  uint64_t written_ = 0;
};

int train_mode(const std::vector<std::string>& args) {
  config::ConfigInputs in;
  in.file = args.at(0);
  in.text = read_file(in.file);
  in.has_file = true;
  std::string fault;
  int at_save = 0, fault_rank = 0, write_delay_ms = 0;
  uint64_t after_bytes = 0, disk_bytes = 0;
  for (size_t i = 1; i + 1 < args.size(); i += 2) {
    if (args[i] == "--set")
      in.sets.push_back(args[i + 1]);
    else if (args[i] == "--fault")
      fault = args[i + 1];
    else if (args[i] == "--at-save")
      at_save = std::stoi(args[i + 1]);
    else if (args[i] == "--after-bytes")
      after_bytes = std::stoull(args[i + 1]);
    else if (args[i] == "--disk-bytes")
      disk_bytes = std::stoull(args[i + 1]);
    else if (args[i] == "--write-delay-ms")
      write_delay_ms = std::stoi(args[i + 1]);
    else if (args[i] == "--rank")
      fault_rank = std::stoi(args[i + 1]);
    else
      throw InputError("ckpt_worker train: unknown argument " + args[i]);
  }
  const char* rank = std::getenv("RANK");
  const bool here = !fault.empty() && (rank ? std::atoi(rank) : 0) == fault_rank;
  const config::ResolvedConfig resolved = config::load_config_or_throw(in);
  FaultyFileSystem fs(fault, here ? at_save : -1, after_bytes, disk_bytes, resolved.typed.checkpoint.dir,
                      write_delay_ms);
  train::TrainHooks hooks;
  hooks.checkpoint_fs = &fs;
  train::run_training(dist::worker_context(resolved.typed.launch.use_cpu), resolved, std::cout, hooks);
  return 0;
}

int resave(const std::vector<std::string>& args) {
  const model::DecoderConfig mc = model::load_llama_config(args.at(0));
  dist::GroupOptions go;
  go.backend = "gloo";
  dist::ProcessGroup world = dist::init_process_group(go);
  model::CausalLM llama(mc, /*free_after_create=*/true);
  FsdpOptions options;
  options.init = [](const std::string&, at::IntArrayRef shape) { return at::zeros(shape); };
  auto sharded = fully_shard(*llama, model::decoder_traits(mc), make_mesh(world, 1, world.size()), options);
  optim::ShardedAdamW adamw(*sharded, optim::AdamWOptions{});
  ckpt::CheckpointOptions co;
  co.dir = args.at(2);
  // full: each rank writes its rows into the files (one machine); full-gathered: they go to rank 0,
  // which writes them all, as across machines.
  co.format = args.at(3).rfind("full", 0) == 0 ? ckpt::Format::kFull : ckpt::Format::kSharded;
  co.full_rows_in_place = args.at(3) != "full-gathered";
  if (args.size() > 4) co.max_shard_bytes = std::stoll(args.at(4));  // FULL: Hugging Face shards above this
  co.log = world.rank() == 0 ? &std::cout : nullptr;
  ckpt::Checkpointer checkpointer(*sharded, adamw, model::describe(mc), world, co);
  ckpt::TrainingState state = checkpointer.load(args.at(1));
  state.world_size = world.size();
  checkpointer.save(state);
  checkpointer.wait();
  return 0;
}

int reexport(const std::vector<std::string>& args) {
  const model::DecoderConfig mc = model::load_llama_config(args.at(0) + "/config.json");
  dist::GroupOptions go;
  go.backend = "gloo";
  dist::ProcessGroup world = dist::init_process_group(go);
  model::CausalLM llama(mc, /*free_after_create=*/true);
  FsdpOptions options;
  options.init = [](const std::string&, at::IntArrayRef shape) { return at::full(shape, 7.0f); };
  auto sharded = fully_shard(*llama, model::decoder_traits(mc), make_mesh(world, 1, world.size()), options);
  ckpt::load_pretrained(*sharded, args.at(0), world, args.at(2) == "efficient");
  ckpt::export_hf(*sharded, model::describe(mc), args.at(1));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    FSDP_CHECK(!args.empty(), "usage: ckpt_worker train|resave ...");
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    if (args[0] == "train") return train_mode(rest);
    if (args[0] == "resave") return resave(rest);
    if (args[0] == "reexport") return reexport(rest);
    throw InputError("ckpt_worker: unknown mode " + args[0]);
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return static_cast<int>(e.code());
  }
}

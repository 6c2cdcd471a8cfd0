#include "ckpt/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "ckpt/hf.h"
#include "ckpt/safetensors_torch.h"
#include "dist/store.h"
#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kManifest = "manifest.json";
constexpr const char* kIndex = "index.json";
constexpr const char* kState = "trainer_state.json";
constexpr const char* kConfig = "config.json";
constexpr const char* kOptimizer = "optimizer.safetensors";
constexpr const char* kExpAvg = "optim.exp_avg.";
constexpr const char* kExpAvgSq = "optim.exp_avg_sq.";
constexpr int kVersion = 1;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string path_in(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}

std::string shard_file_name(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05d-of-%05d.safetensors", k, n);
  return buf;
}

// "step-" and digits only: complete checkpoints and their .tmp folders are told apart by name.
std::optional<int64_t> step_of(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || i > 22) return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// Complete checkpoints under `dir`, oldest first.
std::vector<std::string> complete_checkpoints(std::string dir, FileSystem& fs) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::vector<std::pair<int64_t, std::string>> found;
  for (const std::string& e : fs.list(dir))
    if (auto s = step_of(e); s && fs.exists(path_in(path_in(dir, e), kManifest))) found.emplace_back(*s, e);
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [s, e] : found) out.push_back(path_in(dir, e));
  return out;
}

json parse_json_file(const std::string& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw InputError(str("[ckpt] ", path, ": not valid JSON (", e.what(), "); the checkpoint is corrupt"));
  }
}

int64_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

std::string config_text(const model::LlamaConfig& config) {
  model::LlamaConfig c = config;
  c.dtype = "float32";
  return model::llama_config_json(c);
}

std::string hex_of(const at::Tensor& bytes) {
  static const char* digits = "0123456789abcdef";
  const at::Tensor b = bytes.contiguous().to(at::kByte);
  const uint8_t* p = b.data_ptr<uint8_t>();
  std::string out;
  out.reserve(static_cast<size_t>(b.numel()) * 2);
  for (int64_t i = 0; i < b.numel(); ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

at::Tensor bytes_of_hex(const std::string& hex, const std::string& where) {
  FSDP_CHECK(hex.size() % 2 == 0, "[ckpt] ", where, ": odd-length hex string");
  at::Tensor out = at::empty({static_cast<int64_t>(hex.size() / 2)}, at::kByte);
  uint8_t* p = out.data_ptr<uint8_t>();
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw InputError(str("[ckpt] ", where, ": not a hex string"));
  };
  for (size_t i = 0; i < hex.size(); i += 2) p[i / 2] = static_cast<uint8_t>(nibble(hex[i]) * 16 + nibble(hex[i + 1]));
  return out;
}

// The default generators this process draws from: the CPU one, and the model device's.
std::vector<std::pair<std::string, at::Generator>> generators(const c10::Device& device) {
  std::vector<std::pair<std::string, at::Generator>> out{{"cpu", at::globalContext().defaultGenerator(c10::kCPU)}};
  if (device.is_cuda()) out.emplace_back("cuda", at::globalContext().defaultGenerator(device));
  return out;
}

json rng_json(const c10::Device& device) {
  json j = json::object();
  for (auto& [name, gen] : generators(device)) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    j[name] = hex_of(gen.get_state());
  }
  return j;
}

void restore_rng(const json& j, const c10::Device& device, const std::string& where) {
  for (auto& [name, gen] : generators(device)) {
    if (!j.contains(name)) continue;
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(bytes_of_hex(j[name].get<std::string>(), where + " rng." + name));
  }
}

json state_json(const TrainingState& s, Format format, const json& rng) {
  return json{{"format", "fsdptrain-checkpoint"},
              {"version", kVersion},
              {"state_dict_type", format == Format::kSharded ? "SHARDED_STATE_DICT" : "FULL_STATE_DICT"},
              {"step", s.step},
              {"optimizer_steps", s.optimizer_steps},
              {"loader", {{"epoch", s.loader_epoch}, {"offset", s.loader_offset}}},
              {"seed", s.seed},
              {"sequence_length", s.sequence_length},
              {"train_sequences", s.train_sequences},
              {"world_size", s.world_size},
              {"rng", rng}};
}

TrainingState parse_state(const json& j, const std::string& where) {
  try {
    TrainingState s;
    s.step = j.at("step").get<int64_t>();
    s.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    s.loader_epoch = j.at("loader").at("epoch").get<int64_t>();
    s.loader_offset = j.at("loader").at("offset").get<int64_t>();
    s.seed = j.at("seed").get<int64_t>();
    s.sequence_length = j.at("sequence_length").get<int64_t>();
    s.train_sequences = j.at("train_sequences").get<int64_t>();
    s.world_size = j.at("world_size").get<int>();
    return s;
  } catch (const json::exception& e) {
    throw InputError(str("[ckpt] ", where, ": ", e.what(), "; the checkpoint is corrupt or from another tool"));
  }
}

// The full value of one parameter's padded shard slice (flat, shard_numel elements on every rank)
// on the CPU. Collective over the shard group.
at::Tensor gather_slice(dist::ProcessGroup shard, const at::Tensor& slice, const ShardLayout& layout) {
  const at::Tensor mine = slice.contiguous();
  at::Tensor all = mine;
  if (shard.size() > 1) {
    all = at::empty({shard.size() * mine.numel()}, mine.options());
    shard.all_gather(all, mine).wait();
  }
  return all.narrow(0, 0, layout.numel()).view(layout.shape).to(at::kCPU);
}

// A parameter's slot: where it lives in the engine and under what names it is stored.
struct Slot {
  size_t group = 0, index = 0;
  const ShardedParam* param = nullptr;
};

std::vector<Slot> slots_of(const ShardedModel& model) {
  std::vector<Slot> out;
  for (size_t g = 0; g < model.groups().size(); ++g)
    for (size_t i = 0; i < model.groups()[g]->params().size(); ++i)
      out.push_back({g, i, &model.groups()[g]->params()[i]});
  return out;
}

// The rows of a parameter's AdamW state this rank holds: (chunk_rows, *shape[1:]) fp32.
at::Tensor state_rows(const at::Tensor& flat, const ShardedParam& p) {
  std::vector<int64_t> shape = p.layout.shape;
  shape[0] = p.layout.chunk_rows();
  return flat.narrow(0, p.offset, p.layout.shard_numel()).view(shape);
}

// ---- Reading: the tensors of a checkpoint (or a Hugging Face folder) by rows. ----

struct StoredInfo {
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
};

class Source {
 public:
  virtual ~Source() = default;
  // A stored tensor's dtype and global shape; null when there is none of that name.
  const StoredInfo* info(const std::string& name) const {
    auto it = infos_.find(name);
    return it == infos_.end() ? nullptr : &it->second;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, i] : infos_) out.push_back(n);
    return out;
  }
  virtual at::Tensor rows(const std::string& name, int64_t r0, int64_t r1) = 0;
  // The files rows [r0, r1) of `name` are read from.
  virtual void files(const std::string& name, int64_t r0, int64_t r1, std::set<std::string>& out) const = 0;

 protected:
  std::map<std::string, StoredInfo> infos_;
};

// SHARDED_STATE_DICT: index.json says which rows of which tensor are in which shard file; files
// are mapped when first read, so a rank opens only those holding its rows.
class ShardedSource final : public Source {
 public:
  explicit ShardedSource(const std::string& dir) : dir_(dir) {
    const std::string where = path_in(dir, kIndex);
    const json j = parse_json_file(where);
    try {
      FSDP_CHECK(j.at("format").get<std::string>() == "fsdptrain-sharded", "[ckpt] ", where,
                 ": not an fsdptrain sharded index");
      for (const auto& f : j.at("files")) files_.push_back(f.get<std::string>());
      for (const auto& [name, t] : j.at("tensors").items()) {
        Entry e;
        const auto dtype = dtype_from_name(t.at("dtype").get<std::string>());
        FSDP_CHECK(dtype, "[ckpt] ", where, ": ", name, " has an unknown dtype");
        e.info.dtype = *dtype;
        e.info.shape = t.at("shape").get<std::vector<int64_t>>();
        int64_t next = 0;
        for (const auto& p : t.at("pieces")) {
          Piece piece;
          piece.file = p.at("file").get<size_t>();
          piece.r0 = p.at("rows").at(0).get<int64_t>();
          piece.r1 = p.at("rows").at(1).get<int64_t>();
          piece.byte0 = p.at("bytes").at(0).get<uint64_t>();
          FSDP_CHECK(piece.file < files_.size() && piece.r0 == next && piece.r1 > piece.r0, "[ckpt] ", where, ": ",
                     name, "'s pieces do not cover its rows in order; the index is corrupt");
          next = piece.r1;
          e.pieces.push_back(piece);
        }
        const int64_t dim0 = e.info.shape.empty() ? 1 : e.info.shape[0];
        FSDP_CHECK(next == dim0, "[ckpt] ", where, ": ", name, "'s pieces cover ", next, " of ", dim0,
                   " rows; the index is corrupt");
        infos_[name] = e.info;
        entries_[name] = std::move(e);
      }
    } catch (const json::exception& e) {
      throw InputError(str("[ckpt] ", where, ": ", e.what(), "; the index is corrupt"));
    }
  }
  void files(const std::string& name, int64_t r0, int64_t r1, std::set<std::string>& out) const override {
    for (const Piece& p : entries_.at(name).pieces)
      if (p.r0 < r1 && r0 < p.r1) out.insert(files_[p.file]);
  }
  at::Tensor rows(const std::string& name, int64_t r0, int64_t r1) override {
    const Entry& e = entries_.at(name);
    std::vector<int64_t> shape = e.info.shape;
    if (shape.empty()) shape.push_back(1);
    shape[0] = r1 - r0;
    at::Tensor out = at::empty(shape, at::kFloat);
    for (const Piece& p : e.pieces) {
      const int64_t lo = std::max(r0, p.r0), hi = std::min(r1, p.r1);
      if (lo >= hi) continue;
      const SafetensorsFile& f = open(p.file);
      const TensorInfo* t = f.header().find(name);
      FSDP_CHECK(t != nullptr && f.header().data_start + t->begin == p.byte0 &&
                     (t->shape.empty() ? 1 : t->shape[0]) == p.r1 - p.r0,
                 "[ckpt] ", f.path(), " does not hold rows [", p.r0, ", ", p.r1, ") of ", name,
                 " where index.json says; the checkpoint is corrupt");
      out.narrow(0, lo - r0, hi - lo).copy_(read_rows_fp32(f, *t, lo - p.r0, hi - p.r0));
    }
    return out;
  }

 private:
  struct Piece {
    size_t file = 0;
    int64_t r0 = 0, r1 = 0;
    uint64_t byte0 = 0;
  };
  struct Entry {
    StoredInfo info;
    std::vector<Piece> pieces;
  };
  const SafetensorsFile& open(size_t file) {
    auto& f = open_[file];
    if (!f) f = std::make_unique<SafetensorsFile>(path_in(dir_, files_[file]));
    return *f;
  }
  std::string dir_;
  std::vector<std::string> files_;
  std::map<std::string, Entry> entries_;
  std::map<size_t, std::unique_ptr<SafetensorsFile>> open_;
};

// FULL_STATE_DICT (and any Hugging Face folder): whole tensors in the model files, and the AdamW
// state in optimizer.safetensors when there is one.
class FullSource final : public Source {
 public:
  explicit FullSource(const std::string& dir) : hf_(dir) {
    for (const auto& [name, where] : hf_.tensors()) add(*where.first, *where.second);
    if (file_exists(path_in(dir, kOptimizer))) {
      optimizer_ = std::make_unique<SafetensorsFile>(path_in(dir, kOptimizer));
      for (const TensorInfo& t : optimizer_->header().tensors) add(*optimizer_, t);
    }
  }
  void files(const std::string& name, int64_t, int64_t, std::set<std::string>& out) const override {
    const std::string& path = entries_.at(name).file->path();
    out.insert(path.substr(path.rfind('/') + 1));
  }
  at::Tensor rows(const std::string& name, int64_t r0, int64_t r1) override {
    const Entry& e = entries_.at(name);
    return read_rows_fp32(*e.file, *e.tensor, r0, r1);
  }

 private:
  struct Entry {
    const SafetensorsFile* file = nullptr;
    const TensorInfo* tensor = nullptr;
  };
  void add(const SafetensorsFile& f, const TensorInfo& t) {
    infos_[t.name] = StoredInfo{t.dtype, t.shape};
    entries_[t.name] = {&f, &t};
  }
  HfCheckpoint hf_;
  std::unique_ptr<SafetensorsFile> optimizer_;
  std::map<std::string, Entry> entries_;
};

std::unique_ptr<Source> open_source(const std::string& dir) {
  if (file_exists(path_in(dir, kIndex))) return std::make_unique<ShardedSource>(dir);
  return std::make_unique<FullSource>(dir);
}

// The stored name of a parameter: its own, or one of its aliases (a tied head saved under the
// other name).
std::string stored_name(const Source& src, const ShardedParam& p) {
  if (src.info(p.name)) return p.name;
  for (const std::string& a : p.aliases)
    if (src.info(a)) return a;
  return p.name;
}

// Throws InputError listing every mismatch between the stored tensors and the model's parameters
// (and their AdamW state when `optimizer`; otherwise stored optimizer state is ignored).
void check_matches_model(const Source& src, const std::vector<Slot>& slots, bool optimizer, const std::string& where,
                         const std::string& hint) {
  std::map<std::string, std::vector<int64_t>> stored;
  for (const std::string& name : src.names()) stored[name] = src.info(name)->shape;
  std::vector<ExpectedTensor> expected;
  for (const Slot& s : slots) {
    const ShardedParam& p = *s.param;
    expected.push_back({p.name, p.layout.shape, p.aliases});
    if (optimizer && p.trainable)
      for (const char* prefix : {kExpAvg, kExpAvgSq}) expected.push_back({prefix + p.name, p.layout.shape, {}});
  }
  check_tensors_match(where, stored, expected, hint, optimizer ? "" : "optim.");
}

// Copies every parameter's rows (and AdamW state) this rank owns from `src`. efficient: rank 0
// of `world` reads whole tensors and broadcasts them, one at a time; the others read nothing.
void fill(ShardedModel& model, optim::ShardedAdamW* adamw, Source* src, dist::ProcessGroup& world, bool efficient) {
  const c10::Device device = model.options().device;
  auto copy_rows = [&](const std::string& name, const ShardLayout& layout, const at::Tensor& dest) {
    const int64_t n = layout.valid_rows();
    if (!efficient || world.size() == 1) {
      if (n > 0) dest.narrow(0, 0, n).copy_(src->rows(name, layout.first_row(), layout.first_row() + n));
      return;
    }
    at::Tensor full = world.rank() == 0 ? src->rows(name, 0, layout.dim0()).to(device)
                                        : at::empty(layout.shape, at::TensorOptions().dtype(at::kFloat).device(device));
    world.broadcast(full, 0).wait();
    if (n > 0) dest.narrow(0, 0, n).copy_(full.narrow(0, layout.first_row(), n));
  };
  c10::NoGradGuard no_grad;
  for (const Slot& s : slots_of(model)) {
    const ShardedParam& p = *s.param;
    const std::string name = stored_name(*src, p);
    copy_rows(name, p.layout, p.sharded);
    if (adamw != nullptr && p.trainable) {
      auto& st = adamw->mutable_state()[s.group];
      copy_rows(kExpAvg + name, p.layout, state_rows(st.exp_avg, p));
      copy_rows(kExpAvgSq + name, p.layout, state_rows(st.exp_avg_sq, p));
    }
  }
}

// Throws on every rank when any rank's check failed: the failing rank with its reason, the others
// pointing at it. Collective over `world`.
void agree(dist::ProcessGroup& world, const c10::Device& device, const std::string& failure) {
  if (world.size() == 1) {
    if (!failure.empty()) throw InputError(failure);
    return;
  }
  at::Tensor flag = at::full({1}, failure.empty() ? 0 : 1, at::TensorOptions().dtype(at::kInt).device(device));
  world.all_reduce(flag).wait();  // the number of ranks that refused
  if (!failure.empty()) throw InputError(failure);
  if (flag.item<int>() != 0)
    throw InputError("[ckpt] another rank refused the checkpoint; that rank's error says which file and why");
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string latest_checkpoint(const std::string& dir, FileSystem& fs) {
  const auto all = complete_checkpoints(dir, fs);
  return all.empty() ? "" : all.back();
}

void verify_checkpoint(const std::string& path, const std::vector<std::string>& files) {
  FSDP_CHECK(file_exists(path), "[ckpt] checkpoint ", quoted(path), " does not exist");
  const bool hf_folder =
      file_exists(path_in(path, "model.safetensors")) || file_exists(path_in(path, "model.safetensors.index.json"));
  FSDP_CHECK(file_exists(path_in(path, kManifest)) || !hf_folder, "[ckpt] ", quoted(path),
             " is a Hugging Face model folder, not a training checkpoint (no manifest.json, optimizer state or "
             "step); fine-tune from it with model.pretrained instead of checkpoint.resume");
  FSDP_CHECK(file_exists(path_in(path, kManifest)), "[ckpt] ", quoted(path),
             " has no manifest.json, so it is not a complete checkpoint (a save that was cut off leaves its "
             "files without one); resume from an earlier step-N folder or from checkpoint.resume: latest");
  const json m = parse_json_file(path_in(path, kManifest));
  FSDP_CHECK(m.contains("files") && m["files"].is_object(), "[ckpt] ", path, "/manifest.json has no files table");
  std::set<std::string> wanted(files.begin(), files.end());
  for (const std::string& f : files)
    FSDP_CHECK(m["files"].contains(f), "[ckpt] ", path, "/manifest.json does not list ", f,
               "; the checkpoint is incomplete");
  for (const auto& [name, entry] : m["files"].items()) {
    if (!wanted.empty() && !wanted.count(name)) continue;
    const std::string file = path_in(path, name);
    const int64_t size = file_size(file);
    const int64_t expected = entry.at("bytes").get<int64_t>();
    FSDP_CHECK(size >= 0, "[ckpt] ", file, " is missing; the checkpoint is incomplete. Resume from another one");
    FSDP_CHECK(size == expected, "[ckpt] ", file, " is ", size, " bytes but the manifest records ", expected,
               ": the file is truncated or was changed. Resume from another checkpoint");
    const std::string crc = crc_hex(crc32c_of_file(file));
    FSDP_CHECK(crc == entry.at("crc32c").get<std::string>(), "[ckpt] ", file, " has CRC-32C ", crc,
               " but the manifest records ", entry.at("crc32c").get<std::string>(),
               ": the file is corrupt. Resume from another checkpoint");
  }
}

// ---- Checkpointer ----

struct Checkpointer::Impl {
  ShardedModel& model;
  optim::ShardedAdamW& adamw;
  model::LlamaConfig config;
  dist::ProcessGroup& world;
  CheckpointOptions o;
  FileSystem& fs;
  std::unique_ptr<dist::Store> store;  // the writer thread's own connection (SHARDED, several shard ranks)
  dist::ProcessGroup host_group;       // the writer thread's gathers (FULL): Gloo over the shard group
  std::thread writer;
  std::exception_ptr error;

  Impl(ShardedModel& m, optim::ShardedAdamW& a, const model::LlamaConfig& c, dist::ProcessGroup& w,
       CheckpointOptions opts)
      : model(m),
        adamw(a),
        config(c),
        world(w),
        o(std::move(opts)),
        fs(o.fs ? *o.fs : local_file_system()),
        host_group(dist::make_single_process_group()) {}

  int shard_rank() const { return model.mesh().shard.rank(); }
  int shard_size() const { return model.mesh().shard.size(); }
  bool is_writer() const { return !model.mesh().replicate || model.mesh().replicate->rank() == 0; }
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
    at::Tensor data;  // (r1 - r0, *shape[1:]) fp32, CPU
  };
  std::vector<HostRows> snapshot() const {
    std::vector<HostRows> out;
    for (const Slot& s : slots_of(model)) {
      const ShardedParam& p = *s.param;
      const int64_t n = p.layout.valid_rows(), r0 = p.layout.first_row();
      if (n == 0) continue;
      auto add = [&](const std::string& name, const at::Tensor& rows) {
        out.push_back({name, p.layout.shape, r0, r0 + n, rows.narrow(0, 0, n).to(at::kCPU, false, true).contiguous()});
      };
      add(p.name, p.sharded);
      if (p.trainable) {
        const auto& st = adamw.state()[s.group];
        add(kExpAvg + p.name, state_rows(st.exp_avg, p));
        add(kExpAvgSq + p.name, state_rows(st.exp_avg_sq, p));
      }
    }
    return out;
  }

  // Writes this rank's shard file; returns its report for the index and the manifest.
  json write_shard(const std::vector<HostRows>& rows, const std::string& tmp) {
    const std::string file = shard_file_name(shard_rank(), shard_size());
    std::vector<TensorBytes> specs;
    std::map<std::string, const HostRows*> by_name;
    for (const HostRows& r : rows) {
      std::vector<int64_t> shape = r.shape;
      shape[0] = r.r1 - r.r0;
      specs.push_back({r.name, Dtype::kF32, shape, nullptr, static_cast<size_t>(r.data.numel()) * 4});
      by_name[r.name] = &r;
    }
    SafetensorsWriter out(path_in(tmp, file), specs, {{"format", "pt"}}, fs);
    json tensors = json::object();
    for (size_t i = 0; i < out.order().size(); ++i) {
      const HostRows& r = *by_name.at(out.order()[i]);
      out.append(r.name, r.data.data_ptr(), static_cast<size_t>(r.data.numel()) * 4);
      tensors[r.name] = {{"shape", r.shape},
                         {"rows", {r.r0, r.r1}},
                         {"bytes", {out.file_offset(i), out.file_offset(i) + r.data.numel() * 4}}};
    }
    out.finish();
    return json{{"file", file}, {"bytes", out.bytes()}, {"crc32c", crc_hex(out.checksum())}, {"tensors", tensors}};
  }

  // Rank 0: the index, state, config and manifest, then the rename that makes the checkpoint exist.
  void commit(const std::vector<json>& shard_reports, std::vector<WrittenFile> written, const json& state,
              const std::string& tmp, const std::string& final_dir) {
    auto write = [&](const std::string& name, const std::string& text) {
      written.push_back({name, text.size(), write_whole_file(fs, path_in(tmp, name), text)});
    };
    if (!shard_reports.empty()) {
      json index = {{"format", "fsdptrain-sharded"}, {"version", kVersion}, {"world_size", shard_reports.size()}};
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
          e["pieces"].push_back({{"file", k}, {"rows", t.at("rows")}, {"bytes", t.at("bytes")}});
        }
      }
      index["files"] = files;
      index["tensors"] = tensors;
      write(kIndex, index.dump(1) + "\n");
      write(kConfig, config_text(config));
    }
    write(kState, state.dump(2) + "\n");
    json manifest = {{"format", "fsdptrain-manifest"}, {"version", kVersion}, {"files", json::object()}};
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
    for (size_t i = 0; i + static_cast<size_t>(o.keep) < all.size(); ++i)
      if (all[i] != just_written) {
        fs.remove_all(all[i]);
        say(str("[ckpt] removed ", all[i], " (checkpoint.keep: ", o.keep, ")\n"));
      }
  }

  // Runs a save's writing part on the writer thread (or here, without background writes).
  void run(std::function<void()> job) {
    if (!o.background) return job();
    writer = std::thread([this, job = std::move(job)]() {
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
    });
  }

  // FULL_STATE_DICT: this rank's padded shard slice of every parameter and AdamW state (the same
  // size on every rank), copied to host memory; the writer gathers them over host_group.
  struct HostSlice {
    std::string name;
    const ShardLayout* layout = nullptr;
    at::Tensor slice;  // (shard_numel) fp32, CPU
  };
  std::vector<HostSlice> snapshot_slices() const {
    std::vector<HostSlice> out;
    for (const Slot& s : slots_of(model)) {
      const ShardedParam& p = *s.param;
      auto add = [&](const std::string& name, const at::Tensor& slice) {
        out.push_back({name, &p.layout, slice.reshape({-1}).to(at::kCPU, false, true)});
      };
      add(p.name, p.sharded);
      if (p.trainable) {
        const auto& st = adamw.state()[s.group];
        add(kExpAvg + p.name, st.exp_avg.narrow(0, p.offset, p.layout.shard_numel()));
        add(kExpAvgSq + p.name, st.exp_avg_sq.narrow(0, p.offset, p.layout.shard_numel()));
      }
    }
    return out;
  }

  // Gathers every slice (collective over host_group, in name order) and, on shard rank 0, writes the
  // Hugging Face folder, optimizer.safetensors and the commit.
  void write_full(const std::vector<HostSlice>& slices, const json& state_doc, const std::string& tmp,
                  const std::string& final_dir) {
    const bool writer = shard_rank() == 0;
    auto full = [&](const HostSlice& h) { return gather_slice(host_group, h.slice, *h.layout); };
    std::vector<const HostSlice*> params, optim;
    for (const HostSlice& h : slices) (h.name.rfind("optim.", 0) == 0 ? optim : params).push_back(&h);
    std::vector<TensorSpec> specs;
    for (const HostSlice* h : params) specs.push_back({h->name, h->layout->shape});
    std::vector<WrittenFile> written = write_hf_folder(
        specs, [&](size_t i) { return full(*params[i]); }, writer, config, tmp, o.max_shard_bytes, fs);
    std::sort(optim.begin(), optim.end(), [](const HostSlice* a, const HostSlice* b) { return a->name < b->name; });
    std::unique_ptr<SafetensorsWriter> out;
    if (writer) {
      std::vector<TensorBytes> tensors;
      for (const HostSlice* h : optim)
        tensors.push_back(
            {h->name, Dtype::kF32, h->layout->shape, nullptr, static_cast<size_t>(h->layout->numel()) * 4});
      // All fp32: the writer's order is the name order, the order of the gathers below (append checks it).
      out = std::make_unique<SafetensorsWriter>(path_in(tmp, kOptimizer), tensors, std::map<std::string, std::string>{},
                                                fs);
    }
    for (const HostSlice* h : optim) {
      const at::Tensor t = full(*h);
      if (out) out->append(h->name, t.data_ptr(), static_cast<size_t>(t.numel()) * 4);
    }
    if (!writer) return;
    out->finish();
    written.push_back({kOptimizer, out->bytes(), out->checksum()});
    commit({}, written, state_doc, tmp, final_dir);
  }

  // Rank 0's writer thread: waits for every shard rank's report.
  std::vector<json> collect(const std::string& name, json mine) {
    std::vector<json> reports{std::move(mine)};
    for (int k = 1; k < shard_size(); ++k) {
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

Checkpointer::Checkpointer(ShardedModel& model, optim::ShardedAdamW& adamw, const model::LlamaConfig& config,
                           dist::ProcessGroup& world, CheckpointOptions options)
    : impl_(std::make_unique<Impl>(model, adamw, config, world, std::move(options))) {
  if (impl_->shard_size() > 1) {
    const auto& shared = world.store();
    FSDP_ASSERT(shared != nullptr, "Checkpointer: a sharded world without a rendezvous store");
    dist::StoreOptions so = shared->options();
    so.is_server = false;
    so.port = shared->port();
    so.prefix += "ckpt/";
    impl_->store = std::make_unique<dist::Store>(so);
    if (impl_->o.format == Format::kFull) {
      std::vector<int> all(static_cast<size_t>(impl_->shard_size()));
      for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
      impl_->host_group = model.mesh().shard.new_host_group(all);
    }
  }
}

Checkpointer::~Checkpointer() {
  try {
    impl_->join();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[ckpt] the last checkpoint was not saved: %s\n", e.what());
  }
}

void Checkpointer::wait() {
  impl_->join();
}

double Checkpointer::save(const TrainingState& state) {
  Impl& m = *impl_;
  const Clock::time_point t0 = Clock::now();
  m.join();
  const std::string name = checkpoint_name(state.step);
  const std::string final_dir = path_in(m.o.dir, name), tmp = final_dir + ".tmp";
  if (m.world.rank() == 0) {
    m.fs.make_dirs(m.o.dir);
    m.fs.remove_all(tmp);
    m.fs.make_dirs(tmp);
  }
  if (m.world.size() > 1) m.world.barrier().wait();
  const json state_doc = state_json(state, m.o.format, rng_json(m.model.options().device));

  if (m.o.format == Format::kFull) {  // host copies now; the thread gathers them one tensor at a time
    std::vector<Impl::HostSlice> slices;
    if (m.is_writer()) slices = m.snapshot_slices();
    const double blocked = seconds_since(t0);
    m.run([&m, slices = std::move(slices), state_doc, tmp, final_dir, t0, blocked]() {
      if (!m.is_writer()) return;
      m.write_full(slices, state_doc, tmp, final_dir);
      m.say(str("[ckpt] saved ", final_dir, " (FULL_STATE_DICT) in ", seconds_since(t0), " s; training waited ",
                blocked, " s\n"));
    });
    return blocked;
  }

  // SHARDED: copy to host now, write on the thread.
  std::vector<Impl::HostRows> rows;
  if (m.is_writer()) rows = m.snapshot();
  const double blocked = seconds_since(t0);
  auto job = [&m, rows = std::move(rows), state_doc, name, tmp, final_dir, t0, blocked]() {
    if (!m.is_writer()) return;
    json report = m.write_shard(rows, tmp);
    if (m.shard_rank() != 0) {
      m.store->set(str(name, "/shard", m.shard_rank()), report.dump());
      return;
    }
    if (m.world.rank() != 0) return;
    m.commit(m.collect(name, std::move(report)), {}, state_doc, tmp, final_dir);
    m.say(str("[ckpt] saved ", final_dir, " (SHARDED_STATE_DICT, ", m.shard_size(), " shard file(s)) in ",
              seconds_since(t0), " s; training waited ", blocked, " s\n"));
  };
  m.run(std::move(job));
  return blocked;
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
  const std::vector<Slot> slots = slots_of(m.model);
  // FULL with cpu_ram_efficient_loading: rank 0 reads every tensor and broadcasts it.
  bool efficient = false;
  try {
    const bool sharded = file_exists(path_in(path, kIndex));
    efficient = !sharded && m.o.cpu_ram_efficient_loading;
    verify_checkpoint(
        path, sharded ? std::vector<std::string>{kState, kConfig, kIndex} : std::vector<std::string>{kState, kConfig});
    state_doc = parse_json_file(path_in(path, kState));
    state = parse_state(state_doc, path_in(path, kState));
    const model::LlamaConfig saved = model::load_llama_config(path_in(path, kConfig));
    FSDP_CHECK(config_text(saved) == config_text(m.config), "[ckpt] ", path,
               "/config.json describes another model than this run's; resume with the model.config it was "
               "trained with, or start a new run in another checkpoint.dir");
    src = open_source(path);
    check_matches_model(*src, slots, /*optimizer=*/true, path, "");
    // The big files this rank will read: their sizes and checksums.
    if (!efficient || m.world.rank() == 0) {
      std::set<std::string> files;
      for (const Slot& s : slots) {
        const ShardedParam& p = *s.param;
        const int64_t r0 = efficient ? 0 : p.layout.first_row(),
                      r1 = efficient ? p.layout.dim0() : p.layout.first_row() + p.layout.valid_rows();
        if (r0 == r1) continue;
        const std::string name = stored_name(*src, p);
        src->files(name, r0, r1, files);
        if (p.trainable) {
          src->files(kExpAvg + name, r0, r1, files);
          src->files(kExpAvgSq + name, r0, r1, files);
        }
      }
      verify_checkpoint(path, std::vector<std::string>(files.begin(), files.end()));
    }
  } catch (const InputError& e) {
    failure = e.what();
  }
  agree(m.world, device, failure);

  for (const auto& g : m.model.groups()) g->reshard();
  fill(m.model, &m.adamw, src.get(), m.world, efficient);
  m.adamw.set_steps(state.optimizer_steps);
  if (state_doc.contains("rng")) restore_rng(state_doc["rng"], device, path_in(path, kState));
  m.say(str("[ckpt] loaded ", path, " (step ", state.step, ", saved by ", state.world_size, " rank(s)) in ",
            seconds_since(t0), " s\n"));
  return state;
}

void load_pretrained(ShardedModel& model, const std::string& dir, dist::ProcessGroup& world, bool efficient) {
  FullSource src(dir);
  check_matches_model(src, slots_of(model), /*optimizer=*/false, dir,
                      "check that model.config describes the same architecture as " + dir + "/config.json");
  fill(model, nullptr, &src, world, efficient);
}

std::string merge_weights(const std::string& checkpoint, const std::string& out, int64_t max_shard_bytes,
                          std::ostream& log) {
  FileSystem& fs = local_file_system();
  std::string path = checkpoint;
  if (!file_exists(path_in(path, kManifest))) {
    path = latest_checkpoint(checkpoint, fs);
    FSDP_CHECK(!path.empty(), "[merge-weights] ", quoted(checkpoint),
               " is neither a checkpoint (a folder with manifest.json) nor a folder holding step-N checkpoints");
    log << "[merge-weights] the newest checkpoint in " << checkpoint << " is " << path << "\n";
  }
  FSDP_CHECK(!file_exists(out), "[merge-weights] ", quoted(out), " already exists; give a new output folder");
  verify_checkpoint(path);
  const model::LlamaConfig config = model::load_llama_config(path_in(path, kConfig));
  auto src = open_source(path);
  std::vector<std::string> names;
  for (const std::string& n : src->names())
    if (n.rfind("optim.", 0) != 0) names.push_back(n);
  std::sort(names.begin(), names.end());

  std::vector<TensorSpec> specs;
  int64_t total = 0;
  for (const std::string& n : names) {
    specs.push_back({n, src->info(n)->shape});
    int64_t bytes = 4;
    for (int64_t d : specs.back().shape) bytes *= d;
    total += bytes;
  }
  const std::string tmp = out + ".tmp";
  fs.remove_all(tmp);
  fs.make_dirs(tmp);
  const auto written = write_hf_folder(
      specs, [&](size_t i) { return src->rows(specs[i].name, 0, specs[i].shape.empty() ? 1 : specs[i].shape[0]); },
      /*writer=*/true, config, tmp, max_shard_bytes, fs);
  for (const WrittenFile& f : written)
    log << "[merge-weights] wrote " << f.name << " (" << format_bytes(f.bytes) << ")\n";
  fs.sync_dir(tmp);
  fs.rename(tmp, out);
  log << "[merge-weights] " << out << ": a Hugging Face folder of " << names.size() << " tensors ("
      << format_bytes(total) << ") from " << path << "\n";
  return path;
}

}  // namespace fsdp::ckpt

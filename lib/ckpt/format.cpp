#include "ckpt/format.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>

#include "ckpt/safetensors.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

using json = nlohmann::json;

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

}  // namespace

void restore_rng(const json& state, const c10::Device& device, const std::string& where) {
  if (!state.contains("rng")) return;
  const json& j = state["rng"];
  for (auto& [name, gen] : generators(device)) {
    if (!j.contains(name)) continue;
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(bytes_of_hex(j[name].get<std::string>(), where + " rng." + name));
  }
}

json state_json(const TrainingState& s, Format format, const c10::Device& device) {
  json j{{"format", "fsdptrain-checkpoint"},
         {"version", kFormatVersion},
         {"state_dict_type", format == Format::kSharded ? "SHARDED_STATE_DICT" : "FULL_STATE_DICT"},
         {"step", s.step},
         {"optimizer_steps", s.optimizer_steps},
         {"loader", {{"epoch", s.loader_epoch}, {"offset", s.loader_offset}}},
         {"seed", s.seed},
         {"sequence_length", s.sequence_length},
         {"train_sequences", s.train_sequences},
         {"world_size", s.world_size},
         {"global_batch", s.global_batch},
         {"rng", rng_json(device)}};
  if (s.eval_loss) j["eval_loss"] = *s.eval_loss;
  if (!s.expert_bias.empty()) j["expert_bias"] = s.expert_bias;
  if (!s.lora.empty()) j["lora"] = s.lora;
  return j;
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
    s.global_batch = j.value("global_batch", int64_t{0});
    if (j.contains("eval_loss") && j["eval_loss"].is_number()) s.eval_loss = j["eval_loss"].get<double>();
    if (j.contains("expert_bias")) s.expert_bias = j["expert_bias"].get<std::vector<std::vector<double>>>();
    s.lora = j.value("lora", std::string());
    return s;
  } catch (const json::exception& e) {
    throw InputError(str("[ckpt] ", where, ": ", e.what(), "; the checkpoint is corrupt or from another tool"));
  }
}

void check_state_matches_folder(const TrainingState& s, const std::string& path) {
  const std::string where = path_in(path, kState);
  const std::string folder = base_name(path);
  if (const auto named = step_of(folder))
    FSDP_CHECK(*named == s.step, "[ckpt] ", where, " says step ", s.step, " but the folder is ", folder,
               ": the state belongs to another checkpoint (copied or edited). Resume from another checkpoint");
  FSDP_CHECK(s.step >= 0 && s.optimizer_steps >= 0 && s.optimizer_steps <= s.step && s.loader_epoch >= 0 &&
                 s.loader_offset >= 0 && s.world_size >= 1 && s.sequence_length >= 1 && s.train_sequences >= 1,
             "[ckpt] ", where, " holds impossible values (step ", s.step, ", optimizer_steps ", s.optimizer_steps,
             ", loader epoch ", s.loader_epoch, " offset ", s.loader_offset, ", world_size ", s.world_size,
             "): the checkpoint is corrupt. Resume from another checkpoint");
}

void check_resumable(const TrainingState& saved, const TrainingState& now, const std::string& path) {
  auto same = [&](const char* key, int64_t was, int64_t is) {
    FSDP_CHECK(was == is, "[train] ", path, " was saved with ", key, " ", was, "; this run has ", is,
               ", so the data would not continue where it stopped. Set ", key, " back to ", was,
               ", or start a new run (empty checkpoint.resume, another checkpoint.dir)");
  };
  same("train.seed", saved.seed, now.seed);
  same("train.sequence_length", saved.sequence_length, now.sequence_length);
  FSDP_CHECK(saved.train_sequences == now.train_sequences, "[train] ", path, " was saved from data with ",
             saved.train_sequences, " training sequences; data.path now gives ", now.train_sequences,
             ", so the data would not continue where it stopped. Resume with the same data.path and "
             "data.eval_fraction, or start a new run");
  FSDP_CHECK(saved.lora.empty() || saved.lora == now.lora, "[train] ", path, " was saved by a LoRA run of ", saved.lora,
             "; this run has ", now.lora.empty() ? std::string("no LoRA (lora.r 0)") : now.lora,
             ", so its adapters would not continue at the scale they trained at. Set them back, or start a new run");
  FSDP_CHECK(saved.loader_offset <= saved.train_sequences, "[ckpt] ", path_in(path, kState),
             ": the data loader's offset ", saved.loader_offset, " lies beyond the data's ", saved.train_sequences,
             " training sequences: the checkpoint is corrupt. Resume from another checkpoint");
}

std::string path_in(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}

std::string shard_file_name(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05d-of-%05d.safetensors", k, n);
  return buf;
}

std::optional<int64_t> step_of(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || i > 22) return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

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
    return read_json_file(path);
  } catch (const InputError& e) {
    throw InputError(str("[ckpt] ", e.what(), "; the checkpoint is corrupt"));
  }
}

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string latest_checkpoint(const std::string& dir, FileSystem& fs) {
  const auto all = complete_checkpoints(dir, fs);
  return all.empty() ? "" : all.back();
}

namespace {

void check_crc(const std::string& file, const std::string& recorded, uint32_t crc) {
  FSDP_CHECK(crc_hex(crc) == recorded, "[ckpt] ", file, " has CRC-32C ", crc_hex(crc), " but the manifest records ",
             recorded, ": the file is corrupt. Resume from another checkpoint");
}

}  // namespace

void check_recorded_crc(const std::string& path, const std::string& file, uint32_t crc) {
  const std::string where = "[ckpt] " + path_in(path, kManifest);
  const json m = parse_json_file(path_in(path, kManifest));
  const json& entry = json_field(json_field(m, "files", where), file, where + ": files");
  check_crc(path_in(path, file), json_string(entry, "crc32c", str(where, ": files.", file)), crc);
}

void verify_checkpoint(const std::string& path, const std::vector<std::string>& files, bool checksums) {
  FSDP_CHECK(file_exists(path), "[ckpt] checkpoint ", quoted(path), " does not exist");
  const bool hf_folder =
      file_exists(path_in(path, "model.safetensors")) || file_exists(path_in(path, "model.safetensors.index.json"));
  FSDP_CHECK(file_exists(path_in(path, kManifest)) || !hf_folder, "[ckpt] ", quoted(path),
             " is a Hugging Face model folder, not a training checkpoint (no manifest.json, optimizer state or "
             "step); fine-tune from it with model.pretrained instead of checkpoint.resume");
  FSDP_CHECK(file_exists(path_in(path, kManifest)), "[ckpt] ", quoted(path),
             " has no manifest.json, so it is not a complete checkpoint (a save that was cut off leaves its "
             "files without one); resume from an earlier step-N folder or from checkpoint.resume: latest");
  const std::string where = "[ckpt] " + path_in(path, kManifest);
  const json m = parse_json_file(path_in(path, kManifest));
  FSDP_CHECK(m.is_object() && m.contains("files") && m["files"].is_object(), where, " has no files table");
  std::set<std::string> wanted(files.begin(), files.end());
  for (const std::string& f : files)
    FSDP_CHECK(m["files"].contains(f), "[ckpt] ", path, "/manifest.json does not list ", f,
               "; the checkpoint is incomplete");
  for (const auto& [name, entry] : m["files"].items()) {
    if (!wanted.empty() && !wanted.count(name)) continue;
    const std::string file = confined_path(path, name, "[ckpt] " + path + "/manifest.json");
    const int64_t size = file_size(file);
    const std::string at = str(where, ": files.", name);
    json_object(entry, at);
    const int64_t expected = json_int(entry, "bytes", at);
    const std::string recorded = checksums ? json_string(entry, "crc32c", at) : "";
    FSDP_CHECK(size >= 0, "[ckpt] ", file, " is missing; the checkpoint is incomplete. Resume from another one");
    FSDP_CHECK(size == expected, "[ckpt] ", file, " is ", size, " bytes but the manifest records ", expected,
               ": the file is truncated or was changed. Resume from another checkpoint");
    if (checksums) check_crc(file, recorded, crc32c_of_file(file));
  }
}

}  // namespace fsdp::ckpt

#include "ckpt/hf.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "ckpt/safetensors_torch.h"
#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

// Buffers HF's own code keeps in old checkpoints and that are not parameters.
bool ignorable(const std::string& name) {
  return name.find("rotary_emb.inv_freq") != std::string::npos;
}

}  // namespace

std::vector<WrittenFile> write_hf_model(const ShardedModel& model, const model::LlamaConfig& config,
                                        const std::string& dir, int64_t max_shard_bytes, FileSystem& fs) {
  const bool writer =
      model.mesh().shard.rank() == 0 && (!model.mesh().replicate || model.mesh().replicate->rank() == 0);
  // Every parameter by name: (group, index). The same order on every rank: the order of gathers.
  std::vector<std::tuple<std::string, size_t, size_t>> params;
  for (size_t g = 0; g < model.groups().size(); ++g)
    for (size_t i = 0; i < model.groups()[g]->params().size(); ++i)
      params.emplace_back(model.groups()[g]->params()[i].name, g, i);
  std::sort(params.begin(), params.end());

  // Greedy shards in name order (huggingface_hub's rule): a new file when the next tensor would
  // pass the limit; a tensor above the limit gets a file of its own.
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const auto& p = model.groups()[std::get<1>(params[k])]->params()[std::get<2>(params[k])];
    const int64_t bytes = p.layout.numel() * 4;
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(k);
    in_shard += bytes;
    total += bytes;
  }
  std::vector<WrittenFile> written;
  if (writer) {
    model::LlamaConfig c = config;
    c.dtype = "float32";
    const std::string text = model::llama_config_json(c);
    written.push_back({"config.json", text.size(), write_whole_file(fs, dir + "/config.json", text)});
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string file = shards.size() == 1 ? "model.safetensors" : name;
    std::unique_ptr<SafetensorsWriter> out;
    if (writer) {
      std::vector<TensorBytes> specs;
      for (size_t k : shards[s]) {
        const auto& p = model.groups()[std::get<1>(params[k])]->params()[std::get<2>(params[k])];
        specs.push_back(
            TensorBytes{p.name, Dtype::kF32, p.layout.shape, nullptr, static_cast<size_t>(p.layout.numel() * 4)});
        weight_map[p.name] = file;
      }
      // fp32 only: the writer's order is the name order, the order of the gathers below (append checks it).
      out = std::make_unique<SafetensorsWriter>(dir + "/" + file, specs, std::map<std::string, std::string>{}, fs);
    }
    for (size_t k : shards[s]) {
      const at::Tensor full = model.groups()[std::get<1>(params[k])]->gather_full_parameter(std::get<2>(params[k]));
      if (out) out->append(std::get<0>(params[k]), full.data_ptr(), static_cast<size_t>(full.numel()) * 4);
    }
    if (out) {
      out->finish();
      written.push_back({file, out->bytes(), out->checksum()});
    }
  }
  if (writer && shards.size() > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const std::string text = index.dump(2) + "\n";
    written.push_back({"model.safetensors.index.json", text.size(),
                       write_whole_file(fs, dir + "/model.safetensors.index.json", text)});
  }
  return written;
}

void export_hf(const ShardedModel& model, const model::LlamaConfig& config, const std::string& dir,
               int64_t max_shard_bytes) {
  const bool writer =
      model.mesh().shard.rank() == 0 && (!model.mesh().replicate || model.mesh().replicate->rank() == 0);
  FileSystem& fs = local_file_system();
  const std::string tmp = dir + ".tmp";
  if (writer) {
    FSDP_CHECK(!file_exists(dir), "[ckpt] ", quoted(dir), " already exists; export into a new folder");
    fs.remove_all(tmp);
    fs.make_dirs(tmp);
  }
  write_hf_model(model, config, tmp, max_shard_bytes, fs);
  if (!writer) return;
  fs.sync_dir(tmp);
  fs.rename(tmp, dir);
}

HfCheckpoint::HfCheckpoint(const std::string& dir) : dir_(dir) {
  FSDP_CHECK(file_exists(dir + "/config.json"), "[ckpt] ", quoted(dir),
             " has no config.json; give a Hugging Face model folder (config.json + *.safetensors)");
  config_ = model::load_llama_config(dir + "/config.json");
  std::vector<std::string> files;
  if (file_exists(dir + "/model.safetensors.index.json")) {
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(read_file(dir + "/model.safetensors.index.json"));
    } catch (const std::exception& e) {
      throw InputError(str("[ckpt] ", dir, "/model.safetensors.index.json: not valid JSON: ", e.what()));
    }
    FSDP_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), "[ckpt] ", dir,
               "/model.safetensors.index.json has no weight_map");
    for (const auto& [name, file] : index["weight_map"].items())
      if (std::find(files.begin(), files.end(), file.get<std::string>()) == files.end()) files.push_back(file);
  } else {
    FSDP_CHECK(file_exists(dir + "/model.safetensors"), "[ckpt] ", quoted(dir),
               " has neither model.safetensors nor model.safetensors.index.json (fsdptrain reads safetensors only; "
               "convert .bin weights with transformers' save_pretrained(safe_serialization=True))");
    files.push_back("model.safetensors");
  }
  for (const std::string& f : files) {
    files_.push_back(std::make_unique<SafetensorsFile>(dir + "/" + f));
    for (const TensorInfo& t : files_.back()->header().tensors) tensors_[t.name] = {files_.back().get(), &t};
  }
}

void HfCheckpoint::check_matches(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params) const {
  std::vector<std::string> problems;
  std::map<std::string, bool> wanted;
  for (const auto& [name, shape] : params) {
    wanted[name] = true;
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      problems.push_back(str("missing ", name, " ", shape_text(shape)));
    } else if (it->second.second->shape != shape) {
      problems.push_back(
          str(name, ": the checkpoint has ", shape_text(it->second.second->shape), ", the model ", shape_text(shape)));
    }
  }
  for (const auto& [name, where] : tensors_) {
    const bool tied_head = name == "lm_head.weight" && config_.tie_word_embeddings;
    if (!wanted.count(name) && !ignorable(name) && !tied_head) problems.push_back(str("unexpected ", name));
  }
  if (problems.empty()) return;
  std::string msg = str("[ckpt] ", dir_, " does not match the model (", problems.size(), " problem(s)):");
  for (const std::string& p : problems) msg += "\n  " + p;
  throw InputError(msg + "\n  check that model.config describes the same architecture as " + dir_ + "/config.json");
}

const TensorInfo* HfCheckpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.second;
}

at::Tensor HfCheckpoint::read_rows(const std::string& name, int64_t r0, int64_t r1) const {
  auto it = tensors_.find(name);
  FSDP_CHECK(it != tensors_.end(), "[ckpt] ", dir_, " has no tensor ", quoted(name));
  return read_rows_fp32(*it->second.first, *it->second.second, r0, r1);
}

at::Tensor HfCheckpoint::read(const std::string& name) const {
  auto it = tensors_.find(name);
  FSDP_CHECK(it != tensors_.end(), "[ckpt] ", dir_, " has no tensor ", quoted(name));
  return read_tensor(*it->second.first, *it->second.second).to(at::kFloat);
}

}  // namespace fsdp::ckpt

#include "ckpt/hf.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <set>

#include "ckpt/safetensors_torch.h"
#include "model/layers/lora_layer.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/strings.h"

namespace fsdp::ckpt {

void check_tensors_match(const std::string& where, const std::map<std::string, std::vector<int64_t>>& stored,
                         const std::vector<ExpectedTensor>& expected, const std::string& hint,
                         const std::string& skip_prefix) {
  std::vector<std::string> problems;
  std::set<std::string> claimed;
  for (const ExpectedTensor& e : expected) {
    claimed.insert(e.name);
    claimed.insert(e.aliases.begin(), e.aliases.end());
    auto it = stored.find(e.name);
    for (size_t i = 0; it == stored.end() && i < e.aliases.size(); ++i) it = stored.find(e.aliases[i]);
    if (it == stored.end())
      problems.push_back(str("missing ", e.name, " ", shape_text(e.shape)));
    else if (it->second != e.shape)
      problems.push_back(
          str(it->first, ": the checkpoint has ", shape_text(it->second), ", the model ", shape_text(e.shape)));
  }
  for (const auto& [name, shape] : stored) {
    // Buffers HF's own code keeps in old checkpoints and that are not parameters.
    const bool ignorable = name.find("rotary_emb.inv_freq") != std::string::npos ||
                           (!skip_prefix.empty() && name.rfind(skip_prefix, 0) == 0);
    if (!claimed.count(name) && !ignorable) problems.push_back(str("unexpected ", name));
  }
  if (problems.empty()) return;
  std::string msg = str("[ckpt] ", where, " does not match the model (", problems.size(), " problem(s)):");
  for (const std::string& p : problems) msg += "\n  " + p;
  throw InputError(hint.empty() ? msg : msg + "\n  " + hint);
}

HfShardPlan plan_hf_shards(const std::vector<TensorSpec>& tensors, Dtype dtype, int64_t max_shard_bytes) {
  auto dtype_of = [&](size_t i) { return tensors[i].fp32 ? Dtype::kF32 : dtype; };
  auto element = [&](size_t i) -> int64_t { return dtype_of(i) == Dtype::kF32 ? 4 : 2; };
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
  HfShardPlan plan;
  // Greedy shards in name order (huggingface_hub's rule): a new file when the next tensor would
  // pass the limit; a tensor above the limit gets a file of its own.
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0;
  for (size_t i : order) {
    int64_t bytes = element(i);
    for (int64_t d : tensors[i].shape) bytes *= d;
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
    plan.total_bytes += bytes;
  }
  // Within a file, the safetensors writer's order: fp32 tensors (model::kept_in_fp32's) before 16-bit ones.
  for (std::vector<size_t>& shard : shards)
    std::stable_sort(shard.begin(), shard.end(), [&](size_t a, size_t b) { return element(a) > element(b); });
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    plan.shards.push_back({shards.size() == 1 ? "model.safetensors" : name, std::move(shards[s])});
  }
  for (const HfShard& shard : plan.shards)
    for (size_t i : shard.tensors)
      plan.specs.push_back({tensors[i].name, dtype_of(i), tensors[i].shape, nullptr,
                            static_cast<size_t>(element(i) * c10::multiply_integers(tensors[i].shape))});
  return plan;
}

std::vector<TensorBytes> HfShardPlan::specs_of(size_t shard) const {
  size_t first = 0;
  for (size_t s = 0; s < shard; ++s) first += shards[s].tensors.size();
  return {specs.begin() + static_cast<std::ptrdiff_t>(first),
          specs.begin() + static_cast<std::ptrdiff_t>(first + shards[shard].tensors.size())};
}

std::vector<WrittenFile> write_hf_side_files(const HfShardPlan& plan, const std::string& config_json,
                                             const std::string& dir, FileSystem& fs) {
  std::vector<WrittenFile> written;
  written.push_back({"config.json", config_json.size(), write_whole_file(fs, dir + "/config.json", config_json)});
  if (plan.shards.size() < 2) return written;
  nlohmann::json weight_map = nlohmann::json::object();
  size_t k = 0;  // specs are in shard order
  for (const HfShard& shard : plan.shards)
    for (size_t n = 0; n < shard.tensors.size(); ++n) weight_map[plan.specs[k++].name] = shard.file;
  nlohmann::json index = {{"metadata", {{"total_size", plan.total_bytes}}}, {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";
  written.push_back(
      {"model.safetensors.index.json", text.size(), write_whole_file(fs, dir + "/model.safetensors.index.json", text)});
  return written;
}

std::vector<WrittenFile> write_hf_folder(const std::vector<TensorSpec>& tensors,
                                         const std::function<at::Tensor(size_t)>& full, bool writer,
                                         const std::string& config_json, const std::string& dir,
                                         int64_t max_shard_bytes, FileSystem& fs, Dtype dtype) {
  FSDP_ASSERT(dtype == Dtype::kF32 || dtype == Dtype::kBF16 || dtype == Dtype::kF16, "an export in ",
              dtype_name(dtype));
  const at::ScalarType scalar = scalar_type_of(dtype, "an export");
  const HfShardPlan plan = plan_hf_shards(tensors, dtype, max_shard_bytes);
  std::vector<WrittenFile> written;
  for (size_t s = 0; s < plan.shards.size(); ++s) {
    const HfShard& shard = plan.shards[s];
    std::unique_ptr<SafetensorsWriter> out;
    // The writer's order (by name, fp32 tensors first) is the order of full() below (append checks it).
    if (writer)
      out = std::make_unique<SafetensorsWriter>(dir + "/" + shard.file, plan.specs_of(s),
                                                std::map<std::string, std::string>{}, fs);
    // Each tensor comes to host memory as it is written (full() may give a device tensor, and every
    // rank calls it: it gathers), so the host holds one tensor at a time, never the model.
    for (size_t i : shard.tensors) {
      const at::Tensor t = full(i);
      if (out) append_tensor(*out, tensors[i].name, t.to(at::kCPU, tensors[i].fp32 ? at::kFloat : scalar).contiguous());
    }
    if (out) {
      out->finish();
      written.push_back({shard.file, out->bytes(), out->checksum()});
    }
  }
  if (!writer) return written;
  for (WrittenFile& f : write_hf_side_files(plan, config_json, dir, fs)) written.push_back(std::move(f));
  return written;
}

ExtraFiles model_text_files(const std::vector<std::string>& folders) {
  std::vector<std::string> names = {"tokenizer.json",
                                    "tokenizer_config.json",
                                    "special_tokens_map.json",
                                    "added_tokens.json",
                                    "chat_template.jinja",
                                    "chat_template.json",
                                    "generation_config.json",
                                    "tokenizer.model",
                                    "vocab.json",
                                    "merges.txt"};
  for (const std::string& folder : folders)  // transformers 5 keeps named templates in a folder of their own
    for (const std::string& f : glob_paths(folder + "/additional_chat_templates/*.jinja"))
      names.push_back("additional_chat_templates/" + base_name(f));
  ExtraFiles out;
  for (const std::string& name : names)
    for (const std::string& folder : folders)
      if (file_problem(folder + "/" + name).empty()) {
        out.emplace_back(name, folder + "/" + name);
        break;
      }
  return out;
}

bool writes_exports(const ShardedModel& model) {
  const DeviceMesh& m = model.mesh();
  return m.shard.rank() == 0 && (!m.replicate || m.replicate->rank() == 0) && (!m.tp || m.tp->rank() == 0);
}

std::string config_with_dtype(const std::string& config_json, Dtype dtype) {
  nlohmann::json j = nlohmann::json::parse(config_json);
  const char* name = dtype == Dtype::kBF16 ? "bfloat16" : dtype == Dtype::kF16 ? "float16" : "float32";
  j["torch_dtype"] = name;
  j["dtype"] = name;
  return j.dump(2) + "\n";
}

std::vector<WrittenFile> write_hf_model(const ShardedModel& model, const model::ModelDescription& description,
                                        const std::string& dir, int64_t max_shard_bytes, FileSystem& fs, Dtype dtype,
                                        const ParamValue& value) {
  const bool writer = writes_exports(model);
  std::map<std::string, std::pair<size_t, size_t>> slot;  // a parameter's (group, index)
  for (size_t g = 0; g < model.groups().size(); ++g)
    for (size_t i = 0; i < model.groups()[g]->params().size(); ++i)
      if (!model::is_lora_parameter(model.groups()[g]->params()[i].name))
        slot[model.groups()[g]->params()[i].name] = {g, i};
  // Each tensor the folder holds: a parameter, or (description.layout.fused) several end to end.
  std::vector<TensorSpec> specs;
  std::vector<std::vector<std::pair<size_t, size_t>>> parts;  // specs[k]'s parameters
  std::set<std::string> in_fused;
  for (const model::FusedTensor& f : description.layout.fused) {
    std::vector<std::pair<size_t, size_t>> of;
    for (const auto& [name, rows] : f.parts)
      if (slot.count(name)) of.push_back(slot.at(name));
    if (of.size() != f.parts.size()) continue;  // a part this model lacks: its parameters as they are
    std::vector<int64_t> shape = model.groups()[of[0].first]->params()[of[0].second].full_shape();
    shape[0] = 0;
    for (const auto& [g, i] : of) shape[0] += model.groups()[g]->params()[i].full_shape()[0];
    for (const auto& [name, rows] : f.parts) in_fused.insert(name);
    specs.push_back({f.name, shape});
    parts.push_back(std::move(of));
  }
  // A stacked parameter (description.layout.stacked: experts) as the Hub holds it: each row's parts
  // apart, of equal rows.
  struct Piece {
    int64_t row = 0, first = 0, rows = 0;
  };
  std::vector<std::optional<Piece>> pieces(specs.size());
  std::map<std::pair<size_t, size_t>, int64_t> pieces_of;  // per stacked parameter: its pieces not yet written
  for (const model::StackedTensor& st : description.layout.stacked) {
    const auto it = slot.find(st.name);
    if (it == slot.end()) continue;
    const std::vector<int64_t> shape = model.groups()[it->second.first]->params()[it->second.second].full_shape();
    FSDP_ASSERT(static_cast<int64_t>(st.rows.size()) == shape.at(0), st.name, ": ", st.rows.size(), " rows listed");
    for (size_t r = 0; r < st.rows.size(); ++r) {
      const auto n = static_cast<int64_t>(st.rows[r].size());
      const int64_t rows = shape.at(1) / n;
      for (int64_t k = 0; k < n; ++k) {
        std::vector<int64_t> part(shape.begin() + 1, shape.end());
        part[0] = rows;
        specs.push_back({st.rows[r][static_cast<size_t>(k)], part});
        parts.push_back({it->second});
        pieces.push_back(Piece{static_cast<int64_t>(r), k * rows, rows});
        ++pieces_of[it->second];
      }
    }
    in_fused.insert(st.name);
  }
  for (const auto& [name, at] : slot)
    if (!in_fused.count(name)) {
      specs.push_back({description.layout.stored_name(name), model.groups()[at.first]->params()[at.second].full_shape(),
                       model::kept_in_fp32(name)});
      parts.push_back({at});
      pieces.emplace_back();
    }
  // A stacked parameter is gathered once and held until its last piece is written (the pieces come
  // in name order, which interleaves parameters).
  std::map<std::pair<size_t, size_t>, at::Tensor> held;
  auto gathered = [&](size_t g, size_t i) {
    return value ? value(model.groups()[g]->params()[i].name) : model.groups()[g]->gather_full_parameter(i);
  };
  return write_hf_folder(
      specs,
      [&](size_t k) {
        if (const std::optional<Piece>& p = pieces[k]) {
          const std::pair<size_t, size_t> at = parts[k][0];
          if (!held.count(at)) held[at] = gathered(at.first, at.second);  // every rank, in the same order
          const at::Tensor piece = held[at][p->row].narrow(0, p->first, p->rows).clone();
          if (--pieces_of[at] == 0) held.erase(at);
          return piece;
        }
        std::vector<at::Tensor> whole;  // every rank gathers each part (collective), in the same order
        for (const auto& [g, i] : parts[k]) whole.push_back(gathered(g, i));
        return whole.size() == 1 ? whole[0] : at::cat(whole, 0);
      },
      writer, config_with_dtype(description.config_json, dtype), dir, max_shard_bytes, fs, dtype);
}

void export_folder(const ShardedModel& model, const std::string& dir, const ExtraFiles& extra,
                   const std::function<void(const std::string& tmp, FileSystem& fs)>& write) {
  const bool writer = writes_exports(model);
  FileSystem& fs = local_file_system();
  const std::string tmp = dir + ".tmp";
  if (writer) {
    FSDP_CHECK(!file_exists(dir), "[ckpt] ", quoted(dir), " already exists; export into a new folder");
    fs.remove_all(tmp);
    fs.make_dirs(tmp);
  }
  try {
    write(tmp, fs);
    if (!writer) return;
    for (const auto& [name, from] : extra) {
      if (name.find('/') != std::string::npos) fs.make_dirs(tmp + "/" + parent_folder(name));
      write_whole_file(fs, tmp + "/" + name, read_file(from));
    }
    fs.sync_dir(tmp);
    fs.rename(tmp, dir);
  } catch (...) {
    if (writer) fs.remove_all(tmp);  // a half-written export never lingers as .tmp
    throw;
  }
}

void export_hf(const ShardedModel& model, const model::ModelDescription& description, const std::string& dir,
               const ExtraFiles& extra, int64_t max_shard_bytes, Dtype dtype) {
  export_folder(model, dir, extra, [&](const std::string& tmp, FileSystem& fs) {
    write_hf_model(model, description, tmp, max_shard_bytes, fs, dtype);
  });
}

HfCheckpoint::HfCheckpoint(const std::string& dir) : dir_(dir) {
  FSDP_CHECK(file_exists(dir + "/config.json"), "[ckpt] ", quoted(dir),
             " has no config.json; give a Hugging Face model folder (config.json + *.safetensors)");
  std::vector<std::string> files;
  if (file_exists(dir + "/model.safetensors.index.json")) {
    const nlohmann::json index = read_json_file(dir + "/model.safetensors.index.json");
    FSDP_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), "[ckpt] ", dir,
               "/model.safetensors.index.json has no weight_map");
    for (const auto& [name, file] : index["weight_map"].items()) {
      FSDP_CHECK(file.is_string(), "[ckpt] ", dir, "/model.safetensors.index.json: weight_map[", quoted(name),
                 "] is not a file name");
      if (std::find(files.begin(), files.end(), file.get<std::string>()) == files.end()) files.push_back(file);
    }
  } else {
    FSDP_CHECK(file_exists(dir + "/model.safetensors"), "[ckpt] ", quoted(dir),
               " has neither model.safetensors nor model.safetensors.index.json (fsdptrain reads safetensors only; "
               "convert .bin weights with transformers' save_pretrained(safe_serialization=True))");
    files.push_back("model.safetensors");
  }
  for (const std::string& f : files) {
    const std::string path = confined_path(dir, f, "[ckpt] " + dir + "/model.safetensors.index.json");
    files_.push_back(std::make_unique<SafetensorsFile>(path));
    for (const TensorInfo& t : files_.back()->header().tensors) tensors_[t.name] = {files_.back().get(), &t};
  }
}

void HfCheckpoint::check_matches(const model::ModelDescription& description) const {
  // The folder's tensors under the model's names, as open_hf_source reads them (FolderLayout::places).
  std::map<std::string, std::vector<int64_t>> shapes, stored;
  for (const auto& [name, where] : tensors_) shapes[name] = where.second->shape;
  for (const auto& [mine, place] : description.layout.places(shapes)) stored[mine] = place.shape;
  const std::vector<model::ParamSpec>& params = description.params;
  // A tied head is the embedding (its alias): HF writes it once, but a folder may hold both names.
  std::vector<ExpectedTensor> expected;
  for (const model::ParamSpec& p : params) expected.push_back({p.name, p.shape, p.aliases});
  const bool unread_scales =
      description.layout.fp8_block.empty() &&
      std::any_of(shapes.begin(), shapes.end(), [](const auto& s) { return ends_with(s.first, "_scale_inv"); });
  check_tensors_match(dir_, stored, expected,
                      unread_scales
                          ? str("its *_scale_inv tensors are block FP8 weights' scales, which config.json's "
                                "quantization_config {\"quant_method\": \"fp8\", \"weight_block_size\": "
                                "[128, 128]} says how to read; it has none: restore the folder's config.json "
                                "as it was published")
                          : "check that model.config describes the same architecture as " + dir_ + "/config.json");
}

at::Tensor HfCheckpoint::read(const std::string& name) const {
  auto it = tensors_.find(name);
  FSDP_CHECK(it != tensors_.end(), "[ckpt] ", dir_, " has no tensor ", quoted(name));
  return read_tensor(*it->second.first, *it->second.second).to(at::kFloat);
}

}  // namespace fsdp::ckpt

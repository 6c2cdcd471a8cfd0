#include "ckpt/merge_weights.h"

#include <algorithm>
#include <functional>
#include <map>
#include <vector>

#include "ckpt/format.h"
#include "ckpt/hf.h"
#include "ckpt/peft.h"
#include "ckpt/sources.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hub_cache.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

// Writes `specs` (full(i) gives each tensor, one at a time) with `config_json` as a Hugging Face
// folder `out`, with a copy of each `extra` file, through out.tmp and a rename; returns the bytes written.
int64_t write_folder(const std::vector<TensorSpec>& specs, const std::function<at::Tensor(size_t)>& full,
                     const std::string& config_json, const std::string& out, int64_t max_shard_bytes, std::ostream& log,
                     const ExtraFiles& extra = {}) {
  FileSystem& fs = local_file_system();
  const std::string tmp = out + ".tmp";
  fs.remove_all(tmp);
  fs.make_dirs(tmp);
  int64_t total = 0;
  try {
    for (const WrittenFile& f : write_hf_folder(specs, full, /*writer=*/true, config_json, tmp, max_shard_bytes, fs)) {
      log << "[merge-weights] wrote " << f.name << " (" << format_bytes(f.bytes) << ")\n";
      total += static_cast<int64_t>(f.bytes);
    }
    for (const auto& [name, from] : extra) {
      if (name.find('/') != std::string::npos) fs.make_dirs(tmp + "/" + parent_folder(name));
      write_whole_file(fs, tmp + "/" + name, read_file(from));
      log << "[merge-weights] copied " << name << " from " << parent_folder(from) << "\n";
    }
    fs.sync_dir(tmp);
    fs.rename(tmp, out);
  } catch (...) {
    fs.remove_all(tmp);  // a full disk leaves nothing behind
    throw;
  }
  return total;
}

std::vector<TensorSpec> specs_of(const Source& src, const std::vector<std::string>& names) {
  std::vector<TensorSpec> specs;
  for (const std::string& n : names) specs.push_back({n, src.info(n)->shape});
  return specs;
}

at::Tensor whole(Source& src, const TensorSpec& t) {
  return src.rows(t.name, 0, t.shape.empty() ? 1 : t.shape[0]);
}

}  // namespace

std::string merge_weights(const std::string& checkpoint, const std::string& out, int64_t max_shard_bytes,
                          std::ostream& log, const std::string& base) {
  FSDP_CHECK(!file_exists(out), "[merge-weights] ", quoted(out), " already exists; give a new output folder");
  if (const std::string cached = hub::model_folder(checkpoint); file_exists(cached + "/adapter_config.json"))
    return merge_adapter(cached, base, out, max_shard_bytes, log);  // an adapter folder, or its Hub id
  FSDP_CHECK(base.empty(), "[merge-weights] --base is for merging a LoRA adapter folder, and ", quoted(checkpoint),
             " has no adapter_config.json");
  FileSystem& fs = local_file_system();
  std::string path = checkpoint;
  if (!file_exists(path_in(path, kManifest))) {
    path = latest_checkpoint(checkpoint, fs);
    FSDP_CHECK(!path.empty(), "[merge-weights] ", quoted(checkpoint),
               " is neither a checkpoint (a folder with manifest.json) nor a folder holding step-N checkpoints");
    log << "[merge-weights] the newest checkpoint in " << checkpoint << " is " << path << "\n";
  }
  verify_checkpoint(path);
  const std::string config_json = read_file(path_in(path, kConfig));  // the checkpoint's own, fp32
  auto src = open_source(path);
  std::vector<std::string> names;
  for (const std::string& n : src->names())
    if (n.rfind("optim.", 0) != 0) names.push_back(n);
  std::sort(names.begin(), names.end());
  refuse_adapters_only(names, path, "[merge-weights]",
                       "Resume it (checkpoint.resume) to have the run export a PEFT folder, then merge that: "
                       "fsdptrain merge-weights ADAPTER_DIR OUTPUT_DIR");
  const std::vector<TensorSpec> specs = specs_of(*src, names);
  const int64_t total = write_folder(
      specs, [&](size_t i) { return whole(*src, specs[i]); }, config_json, out, max_shard_bytes, log);
  log << "[merge-weights] " << out << ": a Hugging Face folder of " << names.size() << " tensors ("
      << format_bytes(total) << ") from " << path << "\n";
  return path;
}

std::string merge_adapter(const std::string& adapter_dir, const std::string& base_dir, const std::string& out,
                          int64_t max_shard_bytes, std::ostream& log) {
  const PeftAdapter adapter = read_peft_adapter(adapter_dir);
  FSDP_CHECK(adapter.settings.target_parameters.empty(), "[merge-weights] ", adapter_dir,
             " adapts a mixture of experts' stacked weights (target_parameters ", join(adapter.settings.target_parameters, ", "),
             "), which merge-weights does not fold into a checkpoint's tensors yet; run it with fsdptrain generate "
             "--adapter, or export the merged model from the training run (checkpoint.export_merged: true)");
  const std::string named = base_dir.empty() ? adapter.base_model : base_dir;
  const std::string base = hub::model_folder(named);  // a Hub id: its snapshot in the Hugging Face cache
  FSDP_CHECK(!(base == named && !is_directory(base) && hub::is_repo_id(base)), "[merge-weights] ", adapter_dir,
             " adapts ", quoted(base), ", which is no folder here, and ",
             hub::not_cached(hub::RepoType::kModel, base, "main"),
             "; or give the base model's folder with --base MODEL_DIR");
  FSDP_CHECK(!base.empty() && file_exists(base + "/config.json"), "[merge-weights] ", adapter_dir,
             "/adapter_config.json names ",
             base.empty() ? std::string("no base model") : str("the base ", fsdp::quoted(base)),
             base.empty() ? "" : ", which is not a Hugging Face folder here",
             "; give the model it adapts with --base MODEL_DIR");
  FSDP_CHECK(!file_exists(out), "[merge-weights] ", quoted(out), " already exists; give a new output folder");
  auto src = open_hf_source(base);
  std::vector<std::string> names = src->names();
  std::sort(names.begin(), names.end());
  std::map<std::string, at::Tensor> tensors = adapter.tensors;
  if (src->info("lm_head.weight") == nullptr && src->info("model.embed_tokens.weight") != nullptr)
    tie_saved_head(tensors, adapter_dir);  // a tied base: its head is the embedding
  for (const auto& [name, t] : tensors) {
    const std::string adapted = model::is_lora_parameter(name) ? model::adapted_weight_name(name) : name;
    FSDP_CHECK(src->info(adapted) != nullptr, "[merge-weights] ", adapter_dir, " adapts ", adapted, ", which ", base,
               " does not have; give the base model it was trained on with --base");
  }
  const std::vector<TensorSpec> specs = specs_of(*src, names);
  const double scaling = adapter.settings.scaling();
  const int64_t total = write_folder(
      specs,
      [&](size_t i) {
        const std::string& name = specs[i].name;
        const auto saved = tensors.find(name);  // a module to save: its trained value
        if (saved != tensors.end()) return saved->second;
        const auto a = adapter.tensors.find(model::lora_a_name(name));
        if (!ends_with(name, ".weight") || a == adapter.tensors.end()) return whole(*src, specs[i]);
        return model::merged_weight(whole(*src, specs[i]), a->second, adapter.tensors.at(model::lora_b_name(name)),
                                    scaling, name);
      },
      read_file(base + "/config.json"), out, max_shard_bytes, log,
      model_text_files({adapter_dir, base}));  // so generate --chat and transformers find the tokenizer
  log << "[merge-weights] " << out << ": " << base << " with the adapter " << adapter_dir << " folded in ("
      << format_bytes(total) << ")\n";
  return adapter_dir;
}

}  // namespace fsdp::ckpt

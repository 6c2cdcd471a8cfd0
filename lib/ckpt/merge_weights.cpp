#include "ckpt/merge_weights.h"

#include <algorithm>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "ckpt/format.h"
#include "ckpt/hf.h"
#include "ckpt/peft.h"
#include "ckpt/sources.h"
#include "model/config/hf_config.h"
#include "model/layers/lora_layer.h"
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

// The base folder's config.json, read once: its family's form when fsdptrain models it, else why not (its
// tensors then merge under their own names).
struct BaseConfig {
  std::string text;
  std::optional<model::DecoderConfig> config;
  std::string unread;  // the error that refused it
};

BaseConfig read_base_config(const std::string& base) {
  BaseConfig b;
  b.text = read_file(base + "/config.json");
  try {
    b.config = model::parse_decoder_config(b.text, base + "/config.json");
  } catch (const InputError& e) {
    b.unread = e.what();
  }
  return b;
}

// The model's name of each tensor the base folder stores, as an adapter names it (Mixtral's
// block_sparse_moe.gate.weight is mlp.gate.weight; "" for one the model leaves out). A base of a family
// fsdptrain does not model keeps its own names: its adapters merge by name.
std::map<std::string, std::string> model_names(const BaseConfig& b, const std::vector<std::string>& stored) {
  const std::optional<model::FolderLayout> layout =
      b.config ? std::optional<model::FolderLayout>(model::describe(*b.config).layout) : std::nullopt;
  std::map<std::string, std::string> out;
  for (const std::string& s : stored) out[s] = layout ? layout->ours(s) : s;
  return out;
}

// The base folder's tensors as merge reads them: under their stored names, block FP8 ones (config.json's
// quantization_config "fp8") dequantized, so the merged folder holds unquantized weights throughout. A
// quantized base whose config.json fsdptrain does not read is refused with the reason.
model::FolderLayout stored_layout(const BaseConfig& b, const std::string& base) {
  model::FolderLayout layout;
  if (b.config) {
    layout.fp8_block = b.config->fp8_block;
    return layout;
  }
  const nlohmann::json j = nlohmann::json::parse(b.text, nullptr, /*allow_exceptions=*/false);
  const bool quantized = j.is_object() && j.contains("quantization_config") && !j["quantization_config"].is_null();
  FSDP_CHECK(!quantized, "[merge-weights] ", base,
             "'s weights are quantized (config.json has a quantization_config), "
             "and its config.json is not one fsdptrain reads: ",
             b.unread, ". Give the unquantized base (or a bf16 copy of it) with --base");
  return layout;
}

// The base's config.json without its quantization_config: the merged weights are unquantized.
std::string unquantized_config(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text);
  j.erase("quantization_config");
  return j.dump(2) + "\n";
}

// A stored tensor a stacked expert weight's adapter changes (target_parameters): the whole stacked
// weight (expert -1), or one expert's part of it as the Hub stores them (rows [first, first + rows)
// of its (out, in) weight: Qwen3-MoE's gate_proj of gate_up_proj, Mixtral's w1).
struct ExpertPiece {
  std::string weight;  // the stacked weight's name, PEFT's key for the adapter's rank and alpha
  std::string prefix;  // the adapter's ("...experts." or "...experts.base_layer.")
  int64_t experts = 0, expert = -1, first = 0;
  bool transposed = false;  // gpt-oss: (E, in, out)
  at::Tensor merged(const at::Tensor& stored, const std::map<std::string, at::Tensor>& tensors,
                    const model::LoraScaling& scaling_of) const {
    const at::Tensor& a = tensors.at(prefix + "lora_A.weight");
    const at::Tensor& b = tensors.at(prefix + "lora_B.weight");
    const double scaling = scaling_of(weight, a.size(0) / experts);
    if (expert < 0) return model::merged_expert_weight(stored, a, b, scaling, transposed, prefix);
    const at::Tensor delta = model::expert_delta(a, b, scaling, experts, expert).narrow(0, first, stored.size(0));
    FSDP_CHECK(delta.sizes() == stored.sizes(), "[merge-weights] the adapter ", prefix, "lora_A/B gives expert ", expert,
               " a change of ", delta.sizes(), " where the base holds ", stored.sizes());
    return (stored.to(at::kFloat) + delta).to(stored.scalar_type());
  }
};

struct ExpertPieces {
  std::map<std::string, ExpertPiece> pieces;  // by stored name
  std::set<std::string> adapters;             // the adapter tensors they read
};

// Where the adapter's stacked expert weights lie in the base folder: under their own names, or one
// tensor per expert and part as the Hub stores them (the family's layout, from its config.json).
ExpertPieces expert_pieces(const Source& src, const std::string& base, const BaseConfig& b,
                           const PeftAdapter& adapter) {
  ExpertPieces out;
  if (adapter.settings.target_parameters.empty()) return out;
  FSDP_CHECK(b.config, b.unread);  // stacked experts: only in a family fsdptrain models
  const model::DecoderConfig& config = *b.config;
  const model::ModelDescription description = model::describe(config);
  // The stacked weights: those the folder holds whole (gpt-oss's; transformers v5's), and those it
  // holds one expert at a time (the family's layout).
  std::vector<std::string> stacked = src.names();
  for (const model::StackedTensor& st : description.layout.stacked) stacked.push_back(st.name);
  const auto is_stacked = [&](const std::string& n) { return src.info(n) == nullptr || src.info(n)->shape.size() == 3; };
  const auto prefixes = model::expert_adapter_prefixes(stacked, is_stacked, adapter.settings.target_parameters);
  // A router's weight (2-D, named as the model names it) is adapted as a linear layer's: only an adapter
  // whose items name some other weight needs stacked ones.
  const std::vector<std::string> stored = src.names();
  const bool routers_only = std::all_of(
      adapter.settings.target_parameters.begin(), adapter.settings.target_parameters.end(), [&](const std::string& t) {
        return std::any_of(stored.begin(), stored.end(), [&](const std::string& n) {
          return src.info(n)->shape.size() == 2 && model::names_parameter(t, description.layout.ours(n));
        });
      });
  FSDP_CHECK(!prefixes.empty() || routers_only, "[merge-weights] ", adapter.dir, "'s target_parameters (",
             join(adapter.settings.target_parameters, ", "), ") name none of ", base,
             "'s stacked expert weights or routers' weights");
  for (const auto& [weight, prefix] : prefixes) {
    for (const char* leaf : {"lora_A.weight", "lora_B.weight"}) {
      FSDP_CHECK(adapter.tensors.count(prefix + leaf), "[merge-weights] ", adapter.dir, " adapts ", weight,
                 " (target_parameters) but holds no ", prefix, leaf);
      out.adapters.insert(prefix + leaf);
    }
    if (src.info(weight) != nullptr)  // stored stacked
      out.pieces[weight] = {weight, prefix, src.info(weight)->shape[0], -1, 0, config.moe.gpt_oss};
  }
  for (const model::StackedTensor& st : description.layout.stacked) {
    const auto p = prefixes.find(st.name);
    if (p == prefixes.end() || src.info(st.name) != nullptr) continue;
    const auto E = static_cast<int64_t>(st.rows.size());
    for (int64_t e = 0; e < E; ++e) {
      int64_t first = 0;
      for (const std::string& part : st.rows[static_cast<size_t>(e)]) {
        const StoredInfo* info = src.info(part);
        FSDP_CHECK(info != nullptr && info->shape.size() == 2 && !config.moe.gpt_oss, "[merge-weights] ", base,
                   " holds ", st.name, " neither whole nor as ", part,
                   config.moe.gpt_oss ? " (gpt-oss's Hub weights are MXFP4 blocks, which an adapter cannot be added to: "
                                        "give a bf16 copy of the base with --base)"
                                      : "");
        out.pieces[part] = {st.name, p->second, E, e, first, false};
        first += info->shape[0];
      }
    }
  }
  return out;
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
  const BaseConfig config = read_base_config(base);
  const model::FolderLayout stored = stored_layout(config, base);
  auto src = open_hf_source(base, stored);  // block FP8 weights read dequantized, and written so
  std::vector<std::string> names = src->names();
  std::sort(names.begin(), names.end());
  const std::map<std::string, std::string> ours = model_names(config, names);
  std::set<std::string> held;  // the base's tensors by the model's names, as the adapter names them
  for (const auto& [stored, mine] : ours) held.insert(mine);
  std::map<std::string, at::Tensor> tensors = adapter.tensors;
  if (!held.count("lm_head.weight") && held.count("model.embed_tokens.weight"))
    tie_saved_head(tensors, adapter_dir);  // a tied base: its head is the embedding
  const ExpertPieces experts = expert_pieces(*src, base, config, adapter);
  for (const auto& [name, t] : tensors) {
    if (experts.adapters.count(name)) continue;  // a stacked expert weight's (expert_pieces checked it)
    const std::string adapted = model::is_lora_parameter(name) ? model::adapted_weight_name(name) : name;
    FSDP_CHECK(held.count(adapted), "[merge-weights] ", adapter_dir, " adapts ", adapted, ", which ", base,
               " does not have; give the base model it was trained on with --base");
  }
  const std::vector<TensorSpec> specs = specs_of(*src, names);
  const model::LoraScaling scaling = adapter.settings.scaling_for("[merge-weights] " + adapter_dir);
  const int64_t total = write_folder(
      specs,
      [&](size_t i) {
        const std::string& stored = specs[i].name;
        const std::string& name = ours.at(stored).empty() ? stored : ours.at(stored);
        const auto saved = tensors.find(name);  // a module to save: its trained value
        if (saved != tensors.end()) return saved->second;
        if (const auto piece = experts.pieces.find(stored); piece != experts.pieces.end())
          return piece->second.merged(whole(*src, specs[i]), adapter.tensors, scaling);
        const auto a = adapter.tensors.find(model::lora_a_name(name));
        if (!ends_with(name, ".weight") || a == adapter.tensors.end()) return whole(*src, specs[i]);
        const std::string key = model::adapter_key(name, a->first, adapter.settings.target_parameters);
        return model::merged_weight(whole(*src, specs[i]), a->second, adapter.tensors.at(model::lora_b_name(name)),
                                    scaling(key, a->second.size(0)), name);
      },
      stored.fp8_block.empty() ? config.text : unquantized_config(config.text), out, max_shard_bytes, log,
      model_text_files({adapter_dir, base}));  // so generate --chat and transformers find the tokenizer
  log << "[merge-weights] " << out << ": " << base << " with the adapter " << adapter_dir << " folded in ("
      << format_bytes(total) << ")\n";
  return adapter_dir;
}

}  // namespace fsdp::ckpt

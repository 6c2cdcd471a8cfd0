#include "ckpt/peft.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/file_system.h"
#include "ckpt/safetensors_torch.h"
#include "model/layers/moe.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/regex.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

using json = nlohmann::json;

constexpr const char* kAdapterConfig = "adapter_config.json";
constexpr const char* kAdapterWeights = "adapter_model.safetensors";

// Refuses the PEFT settings fsdptrain does not compute.
void check_supported(const json& c, const std::string& where) {
  auto refuse_if = [&](bool bad, const std::string& what) {
    FSDP_CHECK(!bad, "[lora] ", where, ": ", what, " is not supported by fsdptrain; train this adapter with PEFT");
  };
  const std::string type = json_string_or(c, "peft_type", "(none)", where);
  refuse_if(type != "LORA", str("peft_type ", quoted(type), " (only LORA)"));
  refuse_if(json_bool_or(c, "use_dora", false, where), "use_dora (DoRA)");
  const std::string bias = json_string_or(c, "bias", "none", where);
  refuse_if(bias != "none", "bias " + quoted(bias));
  refuse_if(json_bool_or(c, "fan_in_fan_out", false, where), "fan_in_fan_out");
}

// rank_pattern / alpha_pattern of adapter_config.json, in the file's order (PEFT takes the first key that
// matches): an object of numbers, or null.
template <typename T>
std::vector<std::pair<std::string, T>> read_patterns(const nlohmann::ordered_json& c, const char* key,
                                                     const std::string& where) {
  std::vector<std::pair<std::string, T>> out;
  if (!c.contains(key) || c[key].is_null()) return out;
  FSDP_CHECK(c[key].is_object(), where, ": ", key, " must be an object of module patterns and numbers, got ",
             c[key].dump());
  for (const auto& [pattern, value] : c[key].items()) {
    const bool whole = value.is_number_integer() || value.is_number_unsigned();
    FSDP_CHECK(value.is_number() && (std::is_floating_point_v<T> || whole) && value.template get<double>() > 0, where,
               ": ", key, "'s ", quoted(pattern), " is ", value.dump(), "; it must be ",
               std::is_floating_point_v<T> ? "a number above 0" : "a whole number above 0");
    Regex("(?:.*\\.)?(?:" + pattern + ")", str(where, ": ", key, "'s ", quoted(pattern)));  // refused here, by name
    out.emplace_back(pattern, value.template get<T>());
  }
  return out;
}

// layers_to_transform (a number or a list of them) and layers_pattern (a string or a list), or null.
void read_layers(const nlohmann::ordered_json& c, model::LoraSettings& s, const std::string& where) {
  if (c.contains("layers_to_transform") && !c["layers_to_transform"].is_null()) {
    const auto& v = c["layers_to_transform"];
    for (const auto& n : v.is_array() ? v : nlohmann::ordered_json::array({v})) {
      FSDP_CHECK(n.is_number_integer() || n.is_number_unsigned(), where,
                 ": layers_to_transform must be a layer number or a list of them, got ", v.dump());
      s.layers_to_transform.push_back(n.get<int64_t>());
    }
  }
  if (c.contains("layers_pattern") && !c["layers_pattern"].is_null()) {
    const auto& v = c["layers_pattern"];
    for (const auto& p : v.is_array() ? v : nlohmann::ordered_json::array({v})) {
      FSDP_CHECK(p.is_string(), where, ": layers_pattern must be a string or a list of them, got ", v.dump());
      if (!p.get<std::string>().empty()) s.layers_pattern.push_back(p.get<std::string>());
    }
  }
}

constexpr const char* kEmbedding = "model.embed_tokens.weight";
constexpr const char* kHead = "lm_head.weight";

// The model's head is its embedding (tie_word_embeddings): it has no lm_head parameter of its own.
bool tied_head(const ShardedModel& model) {
  bool embedding = false, head = false;
  for (const auto& g : model.groups())
    for (const ShardedParam& p : g->params()) {
      embedding = embedding || p.name == kEmbedding;
      head = head || p.name == kHead;
    }
  return embedding && !head;
}

std::string adapter_config_json(const model::LoraSettings& s, const std::vector<std::string>& targets,
                                const std::string& base_model, const std::string& revision, bool tied_saved) {
  std::vector<std::string> sorted = targets;
  std::sort(sorted.begin(), sorted.end());
  json c = {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"r", s.r},
            {"lora_alpha", s.alpha},
            {"lora_dropout", s.dropout},
            {"use_rslora", s.use_rslora},
            {"target_modules", sorted},
            {"modules_to_save", s.modules_to_save.empty() ? json(nullptr) : json(s.modules_to_save)},
            {"base_model_name_or_path", base_model.empty() ? json(nullptr) : json(base_model)},
            {"revision", revision.empty() ? json(nullptr) : json(revision)},
            {"bias", "none"},
            {"fan_in_fan_out", false},
            {"inference_mode", true},
            {"init_lora_weights", true},
            {"use_dora", false}};
  // PEFT reads the patterns in the file's order, taking the first that matches: written as given.
  nlohmann::ordered_json ranks = nlohmann::ordered_json::object(), alphas = nlohmann::ordered_json::object();
  for (const auto& [pattern, r] : s.rank_pattern) ranks[pattern] = r;
  for (const auto& [pattern, a] : s.alpha_pattern) alphas[pattern] = a;
  c["rank_pattern"] = json::object();  // placed below, in that order
  c["alpha_pattern"] = json::object();
  c["layers_to_transform"] = s.layers_to_transform.empty() ? json(nullptr) : json(s.layers_to_transform);
  c["layers_pattern"] = s.layers_pattern.empty() ? json(nullptr) : json(s.layers_pattern);
  if (!s.target_parameters.empty()) {  // PEFT writes them as a sorted list
    std::vector<std::string> parameters = s.target_parameters;
    std::sort(parameters.begin(), parameters.end());
    parameters.erase(std::unique(parameters.begin(), parameters.end()), parameters.end());
    c["target_parameters"] = parameters;
  }
  if (tied_saved) c["ensure_weight_tying"] = true;  // PEFT keeps the head tied to the trained embedding
  nlohmann::ordered_json out;  // the keys sorted, as PEFT writes them; the patterns' entries as given
  for (const auto& [key, value] : c.items())
    out[key] = key == "rank_pattern" ? ranks : key == "alpha_pattern" ? alphas : nlohmann::ordered_json(value);
  return out.dump(2) + "\n";
}

// Every adapter of `model` has the rank and alpha under `settings` that the adapter's config gives it
// (r, lora_alpha and their patterns, read for each adapter as PEFT reads them: equal patterns written
// apart, {gate_up_proj: 4} and {.*\.gate_up_proj: 4}, agree). The shapes check the ranks again; the
// alphas only this does.
void check_same_ranks_and_alphas(const ShardedModel& model, const model::LoraSettings& settings,
                                 const PeftAdapter& adapter) {
  std::vector<std::string> names;
  std::set<std::string> stacked;
  for (const auto& g : model.groups())
    for (const ShardedParam& p : g->params()) {
      names.push_back(p.name);
      if (p.full_shape().size() == 3) stacked.insert(p.name);
    }
  std::vector<std::string> keys;  // PEFT's key of each adapter
  std::set<std::string> expert_adapters;
  for (const auto& [weight, prefix] : model::expert_adapter_prefixes(
           names, [&](const std::string& n) { return stacked.count(n) > 0; }, settings.target_parameters)) {
    keys.push_back(weight);
    expert_adapters.insert(prefix + "lora_A.weight");
  }
  for (const std::string& n : names)
    if (ends_with(n, ".lora_A.weight") && !expert_adapters.count(n))
      keys.push_back(model::adapter_key(model::adapted_weight_name(n), n, settings.target_parameters));
  const model::LoraSettings& a = adapter.settings;
  for (const std::string& key : keys)
    FSDP_CHECK(a.rank_of(key) == settings.rank_of(key) && a.alpha_of(key) == settings.alpha_of(key), "[lora] ",
               adapter.dir, "/", kAdapterConfig, " gives the adapter of ", key, " rank ", a.rank_of(key), " and alpha ",
               a.alpha_of(key), " (as ", a.scales(), " would) where the settings give it rank ", settings.rank_of(key),
               " and alpha ", settings.alpha_of(key),
               "; set lora.r, lora.alpha, lora.rank_pattern and lora.alpha_pattern as the adapter's to start from it");
}

}  // namespace

// An adapter of a tied model holds the trained embedding under both names (PEFT's ensure_weight_tying),
// or the head alone: the embedding's, as a model whose head is its embedding reads it. A head that
// differs from the embedding beside it was trained untied (PEFT without ensure_weight_tying), which a
// tied model cannot hold.
void tie_saved_head(std::map<std::string, at::Tensor>& tensors, const std::string& dir) {
  const auto head = tensors.find(kHead);
  if (head == tensors.end()) return;
  const auto embedding = tensors.find(kEmbedding);
  if (embedding == tensors.end()) {
    tensors[kEmbedding] = head->second;
  } else {
    FSDP_CHECK(at::equal(head->second, embedding->second), "[lora] ", dir, " holds lm_head.weight and ",
               "model.embed_tokens.weight trained apart (PEFT's modules_to_save without ensure_weight_tying), but ",
               "this model's head is its embedding (tie_word_embeddings): train the adapter with "
               "ensure_weight_tying=True, or give a model with an untied head");
  }
  tensors.erase(kHead);
}

PeftAdapter read_peft_adapter(const std::string& dir) {
  FSDP_CHECK(is_directory(dir), "[lora] no adapter folder at ", quoted(dir),
             "; give the folder PEFT's save_pretrained (or an fsdptrain LoRA export) wrote");
  const std::string config_path = dir + "/" + kAdapterConfig, weights_path = dir + "/" + kAdapterWeights;
  FSDP_CHECK(file_exists(config_path), "[lora] ", quoted(dir), " has no ", kAdapterConfig,
             "; give the folder PEFT's save_pretrained (or an fsdptrain LoRA export) wrote");
  FSDP_CHECK(file_exists(weights_path), "[lora] ", quoted(dir), " has no ", kAdapterWeights,
             " (fsdptrain reads safetensors adapters, not adapter_model.bin)");
  const json c = read_json_file(config_path);
  const std::string where = "[lora] " + config_path;
  json_object(c, where);
  check_supported(c, where);
  PeftAdapter a;
  a.dir = dir;
  a.settings.r = json_int(c, "r", where);
  a.settings.alpha = json_number_or(c, "lora_alpha", 8.0, where);
  a.settings.dropout = json_number_or(c, "lora_dropout", 0.0, where);
  a.settings.use_rslora = json_bool_or(c, "use_rslora", false, where);
  a.settings.target_modules = json_strings_or_empty(c, "target_modules", where);
  a.settings.modules_to_save = json_strings_or_empty(c, "modules_to_save", where);
  a.settings.target_parameters = json_strings_or_empty(c, "target_parameters", where);
  const nlohmann::ordered_json ordered = parse_ordered_json(read_file(config_path), where);
  a.settings.rank_pattern = read_patterns<int64_t>(ordered, "rank_pattern", where);
  a.settings.alpha_pattern = read_patterns<double>(ordered, "alpha_pattern", where);
  read_layers(ordered, a.settings, where);
  if (c.contains("base_model_name_or_path") && c["base_model_name_or_path"].is_string())
    a.base_model = c["base_model_name_or_path"].get<std::string>();
  FSDP_CHECK(a.settings.r > 0 && a.settings.r <= (int64_t{1} << 20), where, ": r must be between 1 and 1048576, got ",
             a.settings.r);
  for (auto& [name, t] : load_safetensors(weights_path)) {
    FSDP_CHECK(name.rfind(kPeftPrefix, 0) == 0, "[lora] ", weights_path, ": tensor ", quoted(name),
               " does not start with ", kPeftPrefix, " (not a PEFT model's adapter)");
    a.tensors[name.substr(std::string(kPeftPrefix).size())] = t.to(at::kFloat);
  }
  // The config's r (or its rank_pattern's) is the tensors' rank: lora_A (r, in) and lora_B (out, r), or r per
  // expert for a stacked expert weight's (target_parameters: (r E, in), (out, r E); those the merges check, where
  // the weight and its experts are known). Merging with another r's scaling would change the model silently.
  for (const auto& [name, t] : a.tensors) {
    const size_t down = name.find(".lora_A."), up = name.find(".lora_B.");
    if (down == std::string::npos && up == std::string::npos) continue;
    const bool stacked = !a.settings.target_parameters.empty() && name.find(".experts.") != std::string::npos;
    const int64_t rank = t.dim() == 2 ? t.size(down != std::string::npos ? 0 : 1) : 0;
    const std::string module = name.substr(0, std::min(down, up));
    const int64_t expected = stacked
                                 ? a.settings.r
                                 : a.settings.rank_of(model::adapter_key(module + ".weight", module + ".lora_A.weight",
                                                                         a.settings.target_parameters));
    FSDP_CHECK(rank > 0 && (stacked ? !a.settings.rank_pattern.empty() || rank % expected == 0 : rank == expected),
               "[lora] ", weights_path, ": ", name, " is ", t.sizes(), ", which is not rank ", expected,
               stacked ? " per expert" : "", " as ", kAdapterConfig, "'s ",
               a.settings.rank_pattern.empty() ? "r says" : "r and rank_pattern say",
               "; the config and the weights are of different adapters");
  }
  return a;
}

void export_peft(const ShardedModel& model, const model::LoraSettings& settings,
                 const std::vector<std::string>& targets, const std::string& base_model,
                 const std::string& base_revision, const std::string& dir, const ExtraFiles& extra) {
  const bool writer = writes_exports(model);
  export_folder(model, dir, extra, [&](const std::string& tmp, FileSystem& fs) {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    const bool tied = tied_head(model);
    bool tied_saved = false;
    for (const auto& g : model.groups())
      for (size_t i = 0; i < g->params().size(); ++i) {
        if (!g->params()[i].trainable) continue;
        at::Tensor full = g->gather_full_parameter(i);  // collective: every rank, the same order
        if (!writer) continue;
        tensors.emplace_back(kPeftPrefix + g->params()[i].name, full);
        if (tied && g->params()[i].name == kEmbedding) {  // PEFT saves the tied head under its own name too
          tensors.emplace_back(std::string(kPeftPrefix) + kHead, full.clone());  // a file of its own bytes
          tied_saved = true;
        }
      }
    if (!writer) return;
    std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    save_safetensors(tmp + "/" + kAdapterWeights, tensors, {{"format", "pt"}});
    write_whole_file(fs, tmp + "/" + kAdapterConfig, adapter_config_json(settings, targets, base_model, base_revision, tied_saved));
  });
}

void export_merged(const ShardedModel& model, const model::ModelDescription& description,
                   const model::LoraSettings& lora, bool transposed_experts, const std::string& dir,
                   const ExtraFiles& extra, Dtype dtype) {
  const model::LoraScaling scaling = lora.scaling_for("[lora] the merged export");
  std::map<std::string, std::pair<size_t, size_t>> where;  // every parameter: (group, index)
  for (size_t g = 0; g < model.groups().size(); ++g)
    for (size_t i = 0; i < model.groups()[g]->params().size(); ++i) where[model.groups()[g]->params()[i].name] = {g, i};
  auto param = [&](const std::string& name) -> const ShardedParam& {
    const auto [g, i] = where.at(name);
    return model.groups()[g]->params()[i];
  };
  auto full = [&](const std::string& name) {
    const auto [g, i] = where.at(name);
    return model.groups()[g]->gather_full_parameter(i);
  };
  auto has = [&](const std::string& name) { return where.count(name) > 0; };
  auto rows = [&](const std::string& name) { return param(name).full_shape()[0]; };
  std::vector<std::string> names;
  for (const auto& [name, at] : where) names.push_back(name);
  const std::map<std::string, std::string> experts = model::expert_adapter_prefixes(
      names, [&](const std::string& n) { return param(n).full_shape().size() == 3; }, lora.target_parameters);
  export_folder(model, dir, extra, [&](const std::string& tmp, FileSystem& fs) {
    // Each weight with its adapter folded in: its own, its rows of a fused projection's (Phi-3), or
    // each expert's of a stacked weight's (target_parameters).
    write_hf_model(model, description, tmp, kDefaultMaxShardBytes, fs, dtype, [&](const std::string& name) {
      if (const auto e = experts.find(name); e != experts.end()) {
        const at::Tensor w = full(name), a = full(e->second + "lora_A.weight");
        return model::merged_expert_weight(w, a, full(e->second + "lora_B.weight"),
                                           scaling(name, a.size(0) / w.size(0)), transposed_experts, name);
      }
      const std::optional<model::AdapterSlice> s = model::adapter_of(name, has, rows);
      if (!s) return full(name);
      const at::Tensor w = full(name), a = full(s->a);
      const std::string key = model::adapter_key(name, s->a, lora.target_parameters);
      return model::merged_weight(w, a, full(s->b).narrow(0, s->begin, w.size(0)), scaling(key, a.size(0)), name);
    });
  });
}

void load_adapter(ShardedModel& model, const model::LoraSettings& settings, const PeftAdapter& adapter) {
  const std::string config_path = adapter.dir + "/" + kAdapterConfig;
  const model::LoraSettings& a = adapter.settings;
  if (!a.has_patterns() && !settings.has_patterns()) {
    FSDP_CHECK(a.r == settings.r, "[lora] lora.r is ", settings.r, " but ", config_path, " has r ", a.r,
               "; set lora.r: ", a.r, " to start from this adapter");
    FSDP_CHECK(a.alpha == settings.alpha, "[lora] lora.alpha is ", settings.alpha, " but ", config_path,
               " has lora_alpha ", a.alpha, "; set lora.alpha: ", a.alpha, " to start from this adapter");
  }
  FSDP_CHECK(a.use_rslora == settings.use_rslora, "[lora] lora.use_rslora is ", settings.use_rslora ? "true" : "false",
             " but ", config_path, " has use_rslora ", a.use_rslora ? "true" : "false");
  check_same_ranks_and_alphas(model, settings, adapter);
  std::map<std::string, at::Tensor> tensors = adapter.tensors;
  if (tied_head(model)) tie_saved_head(tensors, adapter.dir);
  std::map<std::string, std::vector<int64_t>> stored;
  for (const auto& [name, t] : tensors) stored[name] = t.sizes().vec();
  std::vector<ExpectedTensor> expected;
  for (const auto& g : model.groups())
    for (const ShardedParam& p : g->params())
      if (p.trainable) expected.push_back({p.name, p.layout.shape, {}});
  check_tensors_match(adapter.dir + "/" + kAdapterWeights, stored, expected,
                      "lora.target_modules, lora.target_parameters, lora.layers_to_transform, lora.rank_pattern and "
                      "lora.modules_to_save must give what the adapter adapts and saves (its " +
                          std::string(kAdapterConfig) + ")");
  c10::NoGradGuard no_grad;
  for (const auto& g : model.groups())
    for (const ShardedParam& p : g->params()) {
      if (!p.trainable) continue;
      const int64_t n = p.layout.valid_rows();
      if (n > 0) p.sharded.narrow(0, 0, n).copy_(tensors.at(p.name).narrow(0, p.layout.first_row(), n));
    }
}

void refuse_adapters_only(const std::vector<std::string>& names, const std::string& folder, const std::string& prefix,
                          const std::string& what_to_do) {
  FSDP_CHECK(std::none_of(names.begin(), names.end(), model::is_lora_parameter), prefix, " ", folder,
             " is a LoRA run's checkpoint: it holds the adapters, not the model they adapt. ", what_to_do);
}

void apply_adapter(torch::nn::Module& module, const PeftAdapter& adapter) {
  std::map<std::string, at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& p : module.named_parameters()) {
    params[p.key()] = p.value().detach().to(at::kFloat);
    names.push_back(p.key());
  }
  bool transposed = false;  // gpt-oss holds its experts (E, in, out)
  for (const auto& m : module.modules())
    if (const auto* e = m->as<model::ExpertsImpl>()) transposed = e->gpt_oss;
  std::map<std::string, at::Tensor> tensors = adapter.tensors;
  if (params.count(kEmbedding) && !params.count(kHead)) tie_saved_head(tensors, adapter.dir);
  std::set<std::string> expert_adapters;  // the names the stacked weights' adapters have (target_parameters)
  const auto stacked = [&](const std::string& n) { return params.at(n).dim() == 3; };
  for (const auto& [weight, prefix] : model::expert_adapter_prefixes(names, stacked, adapter.settings.target_parameters))
    for (const char* leaf : {"lora_A.weight", "lora_B.weight"}) expert_adapters.insert(prefix + leaf);
  for (const auto& [name, t] : tensors) {
    if (expert_adapters.count(name)) {  // merge_lora checks their shapes against the weights'
      params[name] = t;
      continue;
    }
    const bool lora = model::is_lora_parameter(name);
    std::string base = lora ? model::adapted_weight_name(name) : name;
    if (lora && !params.count(base)) {  // a fused projection's adapter (Phi-3): its first part stands for it
      const std::string leaf = base.substr(0, base.size() - std::string(".weight").size());
      const std::vector<std::string> parts = model::fused_projection_parts(leaf.substr(leaf.rfind('.') + 1));
      if (!parts.empty()) base = leaf.substr(0, leaf.rfind('.') + 1) + parts[0] + ".weight";
    }
    auto it = params.find(base);
    FSDP_CHECK(it != params.end(), "[lora] ", adapter.dir, " adapts ", base,
               ", which the model does not have; give "
               "the adapter of this base model");
    if (lora) {
      params[name] = t;
    } else {
      FSDP_CHECK(it->second.sizes() == t.sizes(), "[lora] ", adapter.dir, ": ", name, " has shape ", t.sizes(),
                 " but the model's is ", it->second.sizes());
      it->second = t;
    }
  }
  model::merge_lora(params, adapter.settings.scaling_for("[lora] " + adapter.dir), adapter.settings.target_parameters,
                    transposed);
  c10::NoGradGuard no_grad;
  for (const auto& p : module.named_parameters()) p.value().copy_(params.at(p.key()));
}

}  // namespace fsdp::ckpt

#include "model/hf_config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "util/error.h"
#include "util/json.h"
#include "util/strings.h"

namespace fsdp::model {

namespace {

using json = nlohmann::json;

template <typename T>
T field(const json& j, const char* key, T fallback, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const std::exception&) {
    throw InputError(str(where, ": \"", key, "\": expected a ", std::is_same_v<T, bool> ? "boolean" : "number",
                         ", got ", it->dump()));
  }
}

// The fields that fix the model's shapes: a config.json without one of them is refused.
const char* const kRequiredFields[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                       "num_attention_heads"};

// Every other top-level field fsdptrain reads, and those Hugging Face configs carry that do not
// change what the model computes (ids, bookkeeping, generation defaults).
const std::set<std::string>& known_fields() {
  static const std::set<std::string> known = {
      "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
      "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "attention_bias", "mlp_bias",
      "tie_word_embeddings", "initializer_range", "dtype", "torch_dtype", "hidden_act", "rope_theta", "rope_scaling",
      "rope_parameters", "model_type", "attention_dropout", "sliding_window", "use_sliding_window", "max_window_layers",
      "layer_types",
      // Read by nobody here, and harmless:
      "architectures", "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
      "decoder_start_token_id", "use_cache", "pretraining_tp", "_name_or_path", "output_attentions",
      "output_hidden_states", "return_dict", "torchscript", "id2label", "label2id", "problem_type", "tokenizer_class",
      "prefix", "task_specific_params", "finetuning_task", "is_decoder", "is_encoder_decoder", "add_cross_attention",
      "tie_encoder_decoder", "chunk_size_feed_forward", "max_length", "min_length", "do_sample", "temperature", "top_k",
      "top_p", "num_beams", "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "early_stopping",
      "num_return_sequences", "bad_words_ids", "use_bfloat16", "quantization_config"};
  return known;
}

// Refuses a config.json without a required field (pointing at a near-miss spelling when there is
// one); returns a warning for each field nobody knows, with the closest known one.
std::vector<std::string> check_fields(const json& j, const std::string& where) {
  std::vector<std::string> unknown;
  for (const auto& item : j.items())
    if (!known_fields().count(item.key())) unknown.push_back(item.key());
  for (const char* required : kRequiredFields) {
    if (j.contains(required)) continue;
    const auto typo = closest_match(required, unknown);
    throw InputError(str(where, ": ", required, " is missing; a model needs it",
                         typo ? str(" (", quoted(*typo), " is there: a misspelling?)") : std::string()));
  }
  const std::vector<std::string> known(known_fields().begin(), known_fields().end());
  std::vector<std::string> warnings;
  for (const std::string& u : unknown) {
    const auto near = closest_match(u, known);
    warnings.push_back(str(where, ": unknown field ", quoted(u),
                           near ? str(" (did you mean ", *near, "?)") : std::string(" (not read by fsdptrain)")));
  }
  return warnings;
}

// Shape fields are counts: each must be >= 1 (num_hidden_layers: -1 is not "as many as possible").
void check_positive(const std::string& where, std::initializer_list<std::pair<const char*, int64_t>> fields) {
  for (const auto& [name, value] : fields)
    FSDP_CHECK(value >= 1, where, ": ", name, " is ", value, "; it must be a whole number >= 1");
}

// RoPE: rope_theta + rope_scaling, or (transformers v5) one rope_parameters object; "default" or
// Llama 3's "llama3" scaling, any other type refused by name.
void parse_rope(const json& j, const std::string& where, LlamaConfig& c) {
  json rope = j.value("rope_parameters", json());
  json scaling = j.value("rope_scaling", json());
  c.rope_theta = field<double>(j, "rope_theta", c.rope_theta, where);
  if (rope.is_object()) {
    c.rope_theta = field<double>(rope, "rope_theta", c.rope_theta, where);
    if (scaling.is_null()) scaling = rope;
  }
  if (scaling.is_object()) {
    const std::string type = scaling.value("rope_type", scaling.value("type", std::string("default")));
    if (type == "llama3") {
      RopeScaling s;
      s.factor = field<double>(scaling, "factor", s.factor, where);
      s.low_freq_factor = field<double>(scaling, "low_freq_factor", s.low_freq_factor, where);
      s.high_freq_factor = field<double>(scaling, "high_freq_factor", s.high_freq_factor, where);
      s.original_max_position_embeddings =
          field<int64_t>(scaling, "original_max_position_embeddings", s.original_max_position_embeddings, where);
      c.rope_scaling = s;
    } else {
      FSDP_CHECK(type == "default", where, ": rope type ", quoted(type),
                 " is not supported; fsdptrain implements \"default\" and \"llama3\"");
    }
  }
}

// The family of a config.json: model_type, else the first of architectures.
Family family_of(const json& j, const std::string& where) {
  static const Family all[] = {Family::kLlama, Family::kMistral, Family::kQwen2, Family::kQwen3};
  std::string type = j.value("model_type", std::string());
  if (type.empty() && j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty())
    for (Family f : all)
      if (j["architectures"][0] == family_names(f).architecture) type = family_names(f).model_type;
  if (type.empty()) return Family::kLlama;
  for (Family f : all)
    if (type == family_names(f).model_type) return f;
  throw InputError(str(where, ": model_type ", quoted(type), " is not supported; fsdptrain trains llama ",
                       "(LlamaForCausalLM), mistral (MistralForCausalLM), qwen2 (Qwen2ForCausalLM: Qwen2 and Qwen2.5) "
                       "and qwen3 (Qwen3ForCausalLM)"));
}

// Which layers attend through a sliding window, as transformers decides: Mistral's every layer when
// sliding_window is set; Qwen2/Qwen3's layer_types, else (use_sliding_window) the layers from
// max_window_layers on.
void parse_sliding_window(const json& j, const std::string& where, LlamaConfig& c) {
  const int64_t n = c.num_hidden_layers;
  c.use_sliding_window = field<bool>(j, "use_sliding_window", false, where);
  c.max_window_layers = field<int64_t>(j, "max_window_layers", n, where);
  const int64_t window = field<int64_t>(j, "sliding_window", 0, where);
  if (c.family == Family::kLlama) {
    FSDP_CHECK(window == 0, where,
               ": sliding_window is not a field of LlamaForCausalLM (transformers ignores it); "
               "remove it, or set model_type to mistral");
    return;
  }
  const bool qwen = c.family == Family::kQwen2 || c.family == Family::kQwen3;
  if (qwen && !c.use_sliding_window) return;  // sliding_window is then written but unused
  if (window == 0) return;
  FSDP_CHECK(window >= 1, where, ": sliding_window is ", window, "; it must be >= 1 (or null for none)");
  c.sliding_window = window;
  c.sliding_layers.assign(static_cast<size_t>(n), !qwen);
  if (!qwen) return;
  const json types = j.value("layer_types", json());
  FSDP_CHECK(types.is_null() || (types.is_array() && static_cast<int64_t>(types.size()) == n), where,
             ": layer_types must list one type per layer (", n, ")");
  for (int64_t i = 0; i < n; ++i) {
    if (types.is_null()) {
      c.sliding_layers[i] = i >= c.max_window_layers;
      continue;
    }
    const std::string t = types[i].is_string() ? types[i].get<std::string>() : types[i].dump();
    FSDP_CHECK(t == "sliding_attention" || t == "full_attention", where, ": layer_types[", i, "] is ", quoted(t),
               "; fsdptrain knows \"full_attention\" and \"sliding_attention\"");
    c.sliding_layers[i] = t == "sliding_attention";
  }
}

}  // namespace

FamilyNames family_names(Family f) {
  switch (f) {
    case Family::kMistral:
      return {"mistral", "MistralForCausalLM", "MistralDecoderLayer"};
    case Family::kQwen2:
      return {"qwen2", "Qwen2ForCausalLM", "Qwen2DecoderLayer"};
    case Family::kQwen3:
      return {"qwen3", "Qwen3ForCausalLM", "Qwen3DecoderLayer"};
    case Family::kLlama:
      break;
  }
  return {"llama", "LlamaForCausalLM", "LlamaDecoderLayer"};
}

namespace {

// "Qwen2" for Qwen2ForCausalLM: the prefix of transformers' class names in that family.
std::string class_prefix(Family f) {
  const std::string arch = family_names(f).architecture;
  return arch.substr(0, arch.size() - std::string("ForCausalLM").size());
}

// Ours that transformers names differently than by the family prefix.
const std::pair<const char*, const char*> kPlainTorchNames[] = {
    {"torch::nn::LinearImpl", "Linear"}, {"torch::nn::ModuleListImpl", "ModuleList"}, {"LlamaEmbedding", "Embedding"}};

}  // namespace

std::string hf_class_name(const std::string& ours, Family f) {
  for (const auto& [mine, theirs] : kPlainTorchNames)
    if (ours == mine) return theirs;
  if (ours.rfind("Llama", 0) == 0) return class_prefix(f) + ours.substr(5);
  return ours;
}

std::string our_class_name(const std::string& hf, Family f) {
  for (const auto& [mine, theirs] : kPlainTorchNames)
    if (hf == theirs) return mine;
  const std::string prefix = class_prefix(f);
  // The decoder layer carries the family's own name already (family_names().layer_class).
  if (hf.rfind(prefix, 0) == 0 && hf != family_names(f).layer_class) return "Llama" + hf.substr(prefix.size());
  return hf;
}

double LlamaConfig::parameter_count() const {
  const double c = static_cast<double>(hidden_size), d = static_cast<double>(head_dim),
               h = static_cast<double>(num_attention_heads), k = static_cast<double>(num_key_value_heads),
               f = static_cast<double>(intermediate_size);
  double attn = c * h * d + 2 * c * k * d + h * d * c;
  if (attention_bias) attn += h * d + 2 * k * d + c;
  if (qkv_bias) attn += h * d + 2 * k * d;
  if (qk_norm) attn += 2 * d;
  double mlp = 3 * c * f;
  if (mlp_bias) mlp += 2 * f + c;
  const double layer = attn + mlp + 2 * c;
  return static_cast<double>(vocab_size) * c * (tie_word_embeddings ? 1 : 2) +
         static_cast<double>(num_hidden_layers) * layer + c;
}

int64_t LlamaConfig::num_parameters() const {
  return static_cast<int64_t>(parameter_count());  // exact: parse_llama_config keeps it below 2^53
}

double LlamaConfig::flops_per_token(int64_t seq_len) const {
  const double n = static_cast<double>(num_parameters() - (tie_word_embeddings ? 0 : vocab_size * hidden_size));
  return 6.0 * n + 12.0 * num_hidden_layers * num_attention_heads * head_dim * static_cast<double>(seq_len);
}

LlamaConfig parse_llama_config(const std::string& text, const std::string& where, std::vector<std::string>* warnings) {
  const json j = parse_json(text, where);
  FSDP_CHECK(j.is_object(), where, ": expected a JSON object (a Hugging Face config.json)");
  LlamaConfig c;
  c.family = family_of(j, where);
  c.vocab_size = field<int64_t>(j, "vocab_size", c.vocab_size, where);
  c.hidden_size = field<int64_t>(j, "hidden_size", c.hidden_size, where);
  c.intermediate_size = field<int64_t>(j, "intermediate_size", c.intermediate_size, where);
  c.num_hidden_layers = field<int64_t>(j, "num_hidden_layers", c.num_hidden_layers, where);
  c.num_attention_heads = field<int64_t>(j, "num_attention_heads", c.num_attention_heads, where);
  c.num_key_value_heads = field<int64_t>(j, "num_key_value_heads", c.num_attention_heads, where);
  check_positive(where, {{"vocab_size", c.vocab_size},
                         {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size},
                         {"num_hidden_layers", c.num_hidden_layers},
                         {"num_attention_heads", c.num_attention_heads},
                         {"num_key_value_heads", c.num_key_value_heads}});
  // As transformers' LlamaConfig: the heads split hidden_size evenly, head_dim given or not. Its
  // relatives take head_dim as given (Qwen3's is independent of hidden_size).
  const bool explicit_head_dim = c.family != Family::kLlama && j.contains("head_dim") && !j["head_dim"].is_null();
  FSDP_CHECK(explicit_head_dim || c.hidden_size % c.num_attention_heads == 0, where, ": hidden_size ", c.hidden_size,
             " is not a multiple of num_attention_heads ", c.num_attention_heads,
             "; transformers refuses this config too. Change one of the two");
  c.head_dim = field<int64_t>(j, "head_dim", c.hidden_size / c.num_attention_heads, where);
  c.max_position_embeddings = field<int64_t>(j, "max_position_embeddings", c.max_position_embeddings, where);
  c.rms_norm_eps = field<double>(j, "rms_norm_eps", c.rms_norm_eps, where);
  c.attention_bias = field<bool>(j, "attention_bias", false, where);
  c.mlp_bias = field<bool>(j, "mlp_bias", false, where);
  c.qkv_bias = c.family == Family::kQwen2;
  c.qk_norm = c.family == Family::kQwen3;
  if (c.family == Family::kMistral || c.family == Family::kQwen2)  // fields their classes do not have
    FSDP_CHECK(!c.attention_bias && !c.mlp_bias, where, ": attention_bias/mlp_bias are not fields of ",
               family_names(c.family).architecture, "; transformers ignores them, so remove them");
  parse_sliding_window(j, where, c);
  c.tie_word_embeddings = field<bool>(j, "tie_word_embeddings", false, where);
  c.initializer_range = field<double>(j, "initializer_range", c.initializer_range, where);
  if (auto d = j.find("dtype"); d != j.end() && d->is_string())
    c.dtype = *d;
  else if (auto t = j.find("torch_dtype"); t != j.end() && t->is_string())
    c.dtype = *t;
  if (auto act = j.find("hidden_act"); act != j.end() && act->is_string())
    FSDP_CHECK(*act == "silu", where, ": hidden_act ", act->dump(), " is not supported; Llama uses \"silu\"");

  parse_rope(j, where, c);
  check_positive(where, {{"head_dim", c.head_dim}, {"max_position_embeddings", c.max_position_embeddings}});
  FSDP_CHECK(c.rms_norm_eps > 0 && c.rope_theta > 0 && c.initializer_range >= 0, where, ": rms_norm_eps (",
             c.rms_norm_eps, ") and rope_theta (", c.rope_theta, ") must be > 0 and initializer_range (",
             c.initializer_range, ") >= 0");
  if (c.rope_scaling)
    FSDP_CHECK(c.rope_scaling->factor > 0 && c.rope_scaling->low_freq_factor > 0 &&
                   c.rope_scaling->high_freq_factor > c.rope_scaling->low_freq_factor &&
                   c.rope_scaling->original_max_position_embeddings > 0,
               where,
               ": rope_scaling needs factor, low_freq_factor and original_max_position_embeddings > 0 and "
               "high_freq_factor > low_freq_factor");
  FSDP_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, where, ": num_attention_heads ", c.num_attention_heads,
             " must be a multiple of num_key_value_heads ", c.num_key_value_heads);
  FSDP_CHECK(c.head_dim % 2 == 0, where, ": head_dim ", c.head_dim, " must be even for rotary embeddings");
  FSDP_CHECK(field<double>(j, "attention_dropout", 0.0, where) == 0.0, where, ": attention_dropout ",
             j["attention_dropout"].dump(), " is not supported; fsdptrain trains without dropout (set it to 0.0)");
  // Far past any model (a quadrillion parameters), and past what a double counts exactly: sizes
  // this large are a mistake, refused before anything is built from them.
  FSDP_CHECK(c.parameter_count() < 1e15, where, ": these sizes make ", c.parameter_count(), " parameters (hidden_size ",
             c.hidden_size, ", intermediate_size ", c.intermediate_size, ", num_hidden_layers ", c.num_hidden_layers,
             ", vocab_size ", c.vocab_size, "); no model is that large. Check those fields");
  std::vector<std::string> unknown = check_fields(j, where);  // after the fields' own type errors
  if (warnings) warnings->insert(warnings->end(), unknown.begin(), unknown.end());
  return c;
}

LlamaConfig load_llama_config(const std::string& path, std::vector<std::string>* warnings) {
  std::ifstream in(path);
  FSDP_CHECK(in.good(), "[model] cannot read ", quoted(path),
             "; give a Hugging Face config.json (see configs/models/)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_llama_config(ss.str(), path, warnings);
}

std::string llama_config_json(const LlamaConfig& c) {
  const FamilyNames names = family_names(c.family);
  json j = {{"architectures", {names.architecture}},
            {"model_type", names.model_type},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"head_dim", c.head_dim},
            {"hidden_act", "silu"},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"attention_bias", c.attention_bias},
            {"attention_dropout", 0.0},
            {"mlp_bias", c.mlp_bias},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"initializer_range", c.initializer_range},
            {"torch_dtype", c.dtype},
            {"dtype", c.dtype}};
  if (c.family == Family::kMistral || c.family == Family::kQwen2) {
    j.erase("attention_bias");
    j.erase("mlp_bias");
  }
  if (c.family != Family::kLlama) j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  if (c.family == Family::kQwen2 || c.family == Family::kQwen3) {
    j["use_sliding_window"] = c.use_sliding_window;
    j["max_window_layers"] = c.max_window_layers;
    json types = json::array();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      types.push_back(c.window_of(i) > 0 ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  if (c.rope_scaling)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling->factor},
                         {"low_freq_factor", c.rope_scaling->low_freq_factor},
                         {"high_freq_factor", c.rope_scaling->high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling->original_max_position_embeddings}};
  else
    j["rope_scaling"] = nullptr;
  return j.dump(2) + "\n";
}

namespace {

// config.json as checkpoints and exports write it: fp32, so two configs compare as text.
std::string canonical_json(LlamaConfig c) {
  c.dtype = "float32";
  return llama_config_json(c);
}

}  // namespace

ModelDescription describe(const LlamaConfig& c) {
  ModelDescription d;
  d.architecture = family_names(c.family).architecture;
  d.config_json = canonical_json(c);
  d.canonical_config = [](const std::string& path) { return canonical_json(load_llama_config(path)); };
  d.num_parameters = c.num_parameters();
  const int64_t C = c.hidden_size, D = c.head_dim, H = c.num_attention_heads, K = c.num_key_value_heads;
  const int64_t F = c.intermediate_size;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) { d.params.push_back({name, shape, {}}); };
  auto linear = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
    add(name + ".weight", {out, in});
    if (bias) add(name + ".bias", {out});
  };
  add("model.embed_tokens.weight", {c.vocab_size, C});
  if (c.tie_word_embeddings) d.params.back().aliases.push_back("lm_head.weight");
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = str("model.layers.", l, ".");
    linear(p + "self_attn.q_proj", C, H * D, qkv_bias);
    linear(p + "self_attn.k_proj", C, K * D, qkv_bias);
    linear(p + "self_attn.v_proj", C, K * D, qkv_bias);
    linear(p + "self_attn.o_proj", H * D, C, c.attention_bias);
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {D});
      add(p + "self_attn.k_norm.weight", {D});
    }
    linear(p + "mlp.gate_proj", C, F, c.mlp_bias);
    linear(p + "mlp.up_proj", C, F, c.mlp_bias);
    linear(p + "mlp.down_proj", F, C, c.mlp_bias);
    add(p + "input_layernorm.weight", {C});
    add(p + "post_attention_layernorm.weight", {C});
  }
  add("model.norm.weight", {C});
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, C});
  return d;
}

}  // namespace fsdp::model

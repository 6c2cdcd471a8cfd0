#include "model/config/hf_config.h"

#include <algorithm>
#include <cmath>
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

// Qwen3.5/3.6 and Qwen3-Next: Gated DeltaNet layers among gated full-attention ones.
bool is_hybrid(Family f) {
  return f == Family::kQwen3_5 || f == Family::kQwen3Next || f == Family::kQwen3_5Moe;
}

// DeepSeek-V2, DeepSeek-V3 and GLM-4.7-Flash: latent attention (LatentAttention) before DeepSeek's mixture of experts.
bool is_latent(Family f) {
  return f == Family::kDeepseekV2 || f == Family::kDeepseekV3 || f == Family::kGlm4MoeLite;
}

// The families whose experts DeepSeek's router chooses (MoeConfig::grouped_router): GLM-4.5's and the latent ones.
bool has_grouped_router(Family f) {
  return f == Family::kGlm4Moe || is_latent(f);
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
      "layer_types", "hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
      "sliding_window_pattern", "_sliding_window_pattern", "rope_local_base_freq", "use_bidirectional_attention",
      "no_rope_layers", "no_rope_layer_interval", "embedding_multiplier", "attention_multiplier", "residual_multiplier",
      "logits_scaling", "partial_rotary_factor", "original_max_position_embeddings", "resid_pdrop", "embd_pdrop",
      "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
      "decoder_sparse_step", "mlp_only_layers", "shared_expert_intermediate_size", "router_aux_loss_coef",
      "output_router_logits", "router_jitter_noise", "qkv_bias", "linear_conv_kernel_dim", "linear_key_head_dim",
      "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads", "full_attention_interval",
      "attn_output_gate", "swiglu_limit", "swiglu_alpha",
      // Gemma 4's: its full-attention layers' heads and values, E2B's and E4B's per-layer embeddings, shared
      // keys and values and double-wide MLPs, and the mixture of experts.
      "per_layer_config", "global_head_dim", "num_global_key_value_heads", "attention_k_eq_v",
      "hidden_size_per_layer_input", "vocab_size_per_layer_input", "num_kv_shared_layers", "use_double_wide_mlp",
      "enable_moe_block", "top_k_experts",
      // GLM-4.5's (glm4_moe): its router's groups and scale, shared experts, dense first layers, per-head q/k norms,
      // and its multi-token-prediction layers (which the model leaves out, as transformers does).
      "n_routed_experts", "n_shared_experts", "routed_scaling_factor", "n_group", "topk_group", "first_k_dense_replace",
      "use_qk_norm", "num_nextn_predict_layers", "num_mtp_layers",
      // DeepSeek-V3's and GLM-4.7-Flash's latent attention and GLM-4.7-Flash's dense and sparse layers; the rest are
      // what DeepSeek's own code read and transformers does not (its router is always this one).
      "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_interleave",
      "qk_head_dim", "mlp_layer_types", "topk_method", "scoring_func", "moe_layer_freq", "aux_loss_alpha", "seq_aux",
      "ep_size",
      // gpt-oss's: its context before YaRN (rope_scaling's original_max_position_embeddings holds it) and
      // num_experts_per_tok's older name, as the released configs write them.
      "initial_context_length", "experts_per_token",
      // Qwen3.5's multi-token-prediction head (its folder's mtp.* tensors, which the model leaves out, as
      // transformers does) and its state dtype for other kernels:
      "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings", "mamba_ssm_dtype",
      // Read by nobody here, and harmless:
      // auto_map names a folder's own Python classes (trust_remote_code), which fsdptrain never runs.
      "architectures", "auto_map", "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id",
      "sep_token_id", "decoder_start_token_id", "use_cache", "pretraining_tp", "_name_or_path", "output_attentions",
      "output_hidden_states", "return_dict", "torchscript", "id2label", "label2id", "problem_type", "tokenizer_class",
      "prefix", "task_specific_params", "finetuning_task", "is_decoder", "is_encoder_decoder", "add_cross_attention",
      "tie_encoder_decoder", "chunk_size_feed_forward", "max_length", "min_length", "do_sample", "temperature", "top_k",
      "top_p", "num_beams", "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "early_stopping",
      "num_return_sequences", "bad_words_ids", "use_bfloat16", "quantization_config", "cache_implementation"};
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

// The most decoder layers a config.json may ask for (parse_decoder_config): the deepest models have
// a few hundred, and every per-layer pass over a mistyped count would run that many times first.
constexpr int64_t kMaxLayers = 1 << 16;

// Shape fields are counts: each must be >= 1 (num_hidden_layers: -1 is not "as many as possible").
void check_positive(const std::string& where, std::initializer_list<std::pair<const char*, int64_t>> fields) {
  for (const auto& [name, value] : fields)
    FSDP_CHECK(value >= 1, where, ": ", name, " is ", value, "; it must be a whole number >= 1");
}

// A list of numbers (longrope's short_factor and long_factor), one per rotated frequency.
std::vector<double> factor_list(const json& scaling, const char* key, int64_t count, const std::string& where) {
  const json v = scaling.value(key, json());
  FSDP_CHECK(v.is_array() && static_cast<int64_t>(v.size()) == count, where, ": rope_scaling's ", key, " must list ",
             count, " numbers (one per rotated frequency: the rotated dimensions / 2), got ", v.dump());
  std::vector<double> out;
  for (const json& x : v) {
    FSDP_CHECK(x.is_number() && x.get<double>() > 0, where, ": rope_scaling's ", key, " holds ", x.dump(),
               "; each is a number > 0");
    out.push_back(x.get<double>());
  }
  return out;
}

// One rope_scaling / rope_parameters object's scaling: "default" (none), "llama3", "linear",
// "dynamic", "yarn" or "longrope" (Phi-3's older "su" and "yarn" are its longrope, as transformers
// reads them); another type refused by name. The scaled types' original_max_position_embeddings
// default to max_position_embeddings (Phi-3's top-level field first), as transformers' do.
std::optional<RopeScaling> parse_scaling(const json& scaling, const json& j, const std::string& where,
                                         const DecoderConfig& c) {
  if (!scaling.is_object()) return std::nullopt;
  std::string type = scaling.value("rope_type", scaling.value("type", std::string("default")));
  if (c.family == Family::kPhi3 && (type == "su" || type == "yarn")) type = "longrope";
  if (type == "default") return std::nullopt;
  RopeScaling s;
  if (type == "proportional") {  // Gemma 4's full-attention layers
    FSDP_CHECK(c.family == Family::kGemma4, where, ": rope type \"proportional\" is Gemma 4's; ",
               family_names(c.family).architecture, " does not read it");
    s.type = RopeScaling::Type::kProportional;
    s.factor_written = scaling.contains("factor") && !scaling["factor"].is_null();
    s.factor = field<double>(scaling, "factor", 1.0, where);
    s.rotated_share = field<double>(scaling, "partial_rotary_factor", 1.0, where);
    FSDP_CHECK(s.factor > 0 && s.rotated_share >= 0 && s.rotated_share <= 1, where,
               ": the proportional rope's factor (", s.factor, ") must be > 0 and partial_rotary_factor (",
               s.rotated_share, ") in [0, 1]");
    return s;
  }
  const bool phi3 = c.family == Family::kPhi3;
  FSDP_CHECK(!phi3 || type == "longrope", where, ": rope type ", quoted(type),
             " is not one of Phi3ForCausalLM's (\"default\", \"longrope\")");
  s.factor_written = scaling.contains("factor") && !scaling["factor"].is_null();
  s.factor = field<double>(scaling, "factor", 0.0, where);
  // yarn's and longrope's common part: the original positions, the factor from them when not
  // written, the attention factor as written.
  auto read_extension = [&](RopeScaling::Type t) {
    s.type = t;
    const int64_t top = phi3 ? field<int64_t>(j, "original_max_position_embeddings", 0, where) : 0;
    s.original_max_position_embeddings =
        top > 0 ? top : field<int64_t>(scaling, "original_max_position_embeddings", c.max_position_embeddings, where);
    FSDP_CHECK(s.original_max_position_embeddings > 0, where, ": original_max_position_embeddings (",
               s.original_max_position_embeddings, ") must be > 0");
    if (!s.factor_written)
      s.factor =
          static_cast<double>(c.max_position_embeddings) / static_cast<double>(s.original_max_position_embeddings);
    if (scaling.contains("attention_factor") && !scaling["attention_factor"].is_null())
      s.attention_factor = field<double>(scaling, "attention_factor", 1.0, where);
    FSDP_CHECK(s.factor > 0 && (!s.attention_factor || *s.attention_factor > 0), where, ": rope_scaling's factor (",
               s.factor, ") and attention_factor (", s.attention_factor ? *s.attention_factor : 1.0, ") must be > 0");
  };
  if (type == "longrope") {
    read_extension(RopeScaling::Type::kLongRope);
    const int64_t frequencies = c.rotary_dim() / 2;
    s.short_factor = factor_list(scaling, "short_factor", frequencies, where);
    s.long_factor = factor_list(scaling, "long_factor", frequencies, where);
    return s;
  }
  FSDP_CHECK(s.factor_written || type == "yarn", where, ": rope type ", quoted(type), " needs a factor");
  if (type == "linear" || type == "dynamic") {
    s.type = type == "linear" ? RopeScaling::Type::kLinear : RopeScaling::Type::kDynamic;
    FSDP_CHECK(s.factor > 0, where, ": rope_scaling's factor (", s.factor, ") must be > 0");
    return s;
  }
  if (type == "yarn") {
    read_extension(RopeScaling::Type::kYarn);
    // transformers takes 0 (or null) as "not given" for the betas, as `or` does in Python.
    if (const double b = field<double>(scaling, "beta_fast", 0.0, where); b != 0) s.beta_fast = b;
    if (const double b = field<double>(scaling, "beta_slow", 0.0, where); b != 0) s.beta_slow = b;
    s.truncate = field<bool>(scaling, "truncate", true, where);
    s.mscale = field<double>(scaling, "mscale", 0.0, where);
    s.mscale_all_dim = field<double>(scaling, "mscale_all_dim", 0.0, where);
    return s;
  }
  FSDP_CHECK(type == "llama3", where, ": rope type ", quoted(type),
             " is not supported; fsdptrain implements \"default\", \"linear\", \"dynamic\", \"llama3\", \"yarn\", "
             "\"longrope\" and (Gemma 4's) \"proportional\"");
  s.low_freq_factor = field<double>(scaling, "low_freq_factor", s.low_freq_factor, where);
  s.high_freq_factor = field<double>(scaling, "high_freq_factor", s.high_freq_factor, where);
  s.original_max_position_embeddings =
      field<int64_t>(scaling, "original_max_position_embeddings", s.original_max_position_embeddings, where);
  FSDP_CHECK(s.factor > 0 && s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor &&
                 s.original_max_position_embeddings > 0,
             where,
             ": rope_scaling needs factor, low_freq_factor and original_max_position_embeddings > 0 and "
             "high_freq_factor > low_freq_factor");
  return s;
}

// Ministral 3's query scale (Ministral3Attention): the rope object's llama_4_scaling_beta and
// original_max_position_embeddings, which transformers reads without a default.
void parse_query_scale(const json& rope, const std::string& where, DecoderConfig& c) {
  const bool given = rope.is_object() && rope.contains("llama_4_scaling_beta") &&
                     rope["llama_4_scaling_beta"].is_number() && rope.contains("original_max_position_embeddings") &&
                     rope["original_max_position_embeddings"].is_number_integer();
  FSDP_CHECK(given, where,
             ": ministral3's rope_parameters needs llama_4_scaling_beta and "
             "original_max_position_embeddings (Ministral3Attention scales each query by them); it has ",
             rope.dump(), ". Write them as the released folders do");
  c.query_scale_beta = rope["llama_4_scaling_beta"].get<double>();
  c.query_scale_positions = rope["original_max_position_embeddings"].get<int64_t>();
  FSDP_CHECK(c.query_scale_beta >= 0 && c.query_scale_positions > 0, where, ": llama_4_scaling_beta (",
             c.query_scale_beta, ") must be >= 0 and original_max_position_embeddings (", c.query_scale_positions,
             ") > 0");
}

// RoPE: rope_theta + rope_scaling, or (transformers v5) one rope_parameters object. Gemma 3 and 4 and
// OLMo 3 have two tables: rope_parameters keyed by layer type, or rope_theta + rope_scaling for the full
// layers and, for the sliding ones, Gemma 3's rope_local_base_freq (OLMo 3's 500000, its default, whatever
// rope_theta says: Olmo3Config gives the top-level rope_theta to the full layers alone); the local one unscaled.
void parse_rope(const json& j, const std::string& where, DecoderConfig& c) {
  json rope = j.value("rope_parameters", json());
  json scaling = j.value("rope_scaling", json());
  const bool gemma4 = c.family == Family::kGemma4, olmo3 = c.family == Family::kOlmo3;
  const bool gemma3 = c.family == Family::kGemma3 || gemma4, gpt_oss = c.family == Family::kGptOss;
  // Gemma4TextConfig's tables when rope_parameters is not written.
  if (gemma4 && rope.is_null())
    rope = {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}},
            {"full_attention", {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1e6}}}};
  // GptOssConfig's, with neither object written: YaRN (factor 32 over 4096 positions, betas 32 and 1, not
  // truncated), on its rope_theta of 150000 (class_defaults).
  if (gpt_oss && rope.is_null() && scaling.is_null())
    scaling = {{"rope_type", "yarn"},  {"factor", 32.0},   {"beta_fast", 32.0},
               {"beta_slow", 1.0},     {"truncate", false}, {"original_max_position_embeddings", 4096}};
  if (c.family == Family::kMinistral3) {  // Ministral3Config's when neither is written
    if (rope.is_null() && scaling.is_null())
      rope = {{"rope_type", "yarn"},
              {"rope_theta", 1e6},
              {"factor", 16.0},
              {"beta_fast", 32.0},
              {"beta_slow", 1.0},
              {"mscale_all_dim", 1.0},
              {"mscale", 1.0},
              {"llama_4_scaling_beta", 0.1},
              {"original_max_position_embeddings", 16384}};
    parse_query_scale(rope.is_object() ? rope : scaling, where, c);
  }
  c.rope_theta = field<double>(j, "rope_theta", c.rope_theta, where);  // absent: the family's (class_defaults)
  if (gemma3 || olmo3) {
    c.local_rope_theta = olmo3 ? 500000.0 : field<double>(j, "rope_local_base_freq", 1e4, where);
    FSDP_CHECK(!olmo3 || !rope.is_object() || rope.contains("full_attention") || rope.contains("sliding_attention"),
               where,
               ": rope_parameters of olmo3 holds a table per layer type (full_attention, sliding_attention); "
               "Olmo3Config ignores a single table such as this one (",
               rope.dump(),
               ") and rotates every layer at rope_theta 500000. Key it by layer type, or write rope_theta and "
               "rope_scaling (the full-attention layers') at the top level");
    if (rope.is_object() && (rope.contains("full_attention") || rope.contains("sliding_attention"))) {
      const json local = rope.value("sliding_attention", json());
      if (local.is_object()) {
        c.local_rope_theta = field<double>(local, "rope_theta", c.local_rope_theta, where);
        FSDP_CHECK(!parse_scaling(local, j, where, c), where,
                   ": rope_parameters.sliding_attention is scaled; fsdptrain scales only the full-attention "
                   "layers' rotary (as transformers' released configs do)");
      }
      rope = rope.value("full_attention", json());
    }
    FSDP_CHECK(c.local_rope_theta > 0, where, ": the sliding layers' rope_theta (", c.local_rope_theta,
               ") must be > 0");
  }
  if (rope.is_object()) {
    c.rope_theta = field<double>(rope, "rope_theta", c.rope_theta, where);
    if (scaling.is_null()) scaling = rope;
  }
  c.rope_scaling = parse_scaling(scaling, j, where, c);
}

// Phi-3/4's partial rotation: partial_rotary_factor at the top level or (transformers v5) in the
// rope parameters. Other families' transformers classes rotate the whole head whatever it says.
void parse_partial_rotary(const json& j, const std::string& where, DecoderConfig& c) {
  // Qwen3.5/3.6 and Qwen3-Next turn a quarter of each head unless told otherwise, GLM-4.5 half.
  const bool glm = c.family == Family::kGlm4Moe;
  double partial = field<double>(j, "partial_rotary_factor", is_hybrid(c.family) ? 0.25 : glm ? 0.5 : 1.0, where);
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (const json r = j.value(key, json()); r.is_object() && r.contains("partial_rotary_factor"))
      partial = field<double>(r, "partial_rotary_factor", partial, where);
  FSDP_CHECK(partial == 1.0 || c.family == Family::kPhi3 || is_hybrid(c.family) || glm, where,
             ": partial_rotary_factor ", partial, " is not supported for ", family_names(c.family).architecture,
             " (transformers' class rotates the whole head); only Phi-3/4, Qwen3.5/3.6, Qwen3-Next and GLM-4.5 rotate "
             "a share of it");
  FSDP_CHECK(partial > 0 && partial <= 1.0, where, ": partial_rotary_factor (", partial, ") must be in (0, 1]");
  c.partial_rotary_factor = partial;
  FSDP_CHECK(c.rotary_dim() >= 2 && c.rotary_dim() % 2 == 0, where, ": head_dim ", c.head_dim,
             " times partial_rotary_factor ", partial, " gives ", c.rotary_dim(),
             " rotated dimensions; the rotation needs an even number >= 2");
}

constexpr Family kAllFamilies[] = {Family::kLlama,      Family::kMistral,    Family::kQwen2,       Family::kQwen3,
                                   Family::kGemma2,     Family::kGemma3,     Family::kOlmo2,       Family::kOlmo3,
                                   Family::kSmolLM3,    Family::kGranite,    Family::kPhi3,        Family::kQwen3Moe,
                                   Family::kQwen2Moe,   Family::kMixtral,    Family::kQwen3_5,     Family::kQwen3Next,
                                   Family::kQwen3_5Moe, Family::kGptOss,     Family::kGemma4,      Family::kGlm4Moe,
                                   Family::kDeepseekV2, Family::kDeepseekV3, Family::kGlm4MoeLite, Family::kMinistral3};

// The family of a config.json: model_type, else the first of architectures.
Family family_of(const json& j, const std::string& where) {
  std::string type = j.value("model_type", std::string());
  if (type.empty() && j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty())
    for (Family f : kAllFamilies)
      if (j["architectures"][0] == family_names(f).architecture) type = family_names(f).model_type;
  if (type.empty()) return Family::kLlama;
  for (Family f : kAllFamilies)
    if (type == family_names(f).model_type) return f;
  std::string known;
  for (Family f : kAllFamilies)
    known += str(known.empty() ? "" : ", ", family_names(f).model_type, " (", family_names(f).architecture, ")");
  throw InputError(str(where, ": model_type ", quoted(type), " is not supported; fsdptrain trains ", known));
}

// Gemma 2 and 3 (Gemma 4 differs in its norms and scale: parse_gemma4).
bool is_gemma(Family f) {
  return f == Family::kGemma2 || f == Family::kGemma3;
}

// Gemma 2, 3 and 4: their activation's and tied head's defaults.
bool is_any_gemma(Family f) {
  return is_gemma(f) || f == Family::kGemma4;
}

// Whether the family's sliding_window, when set, is every layer's (Mistral, Phi-3, Mixtral).
bool window_is_uniform(Family f) {
  return f == Family::kMistral || f == Family::kMinistral3 || f == Family::kPhi3 || f == Family::kMixtral;
}

// Whether the family's sliding window is switched by use_sliding_window (Qwen2, Qwen3, SmolLM3, the Qwen MoEs).
bool window_is_switched(Family f) {
  return f == Family::kQwen2 || f == Family::kQwen3 || f == Family::kSmolLM3 || f == Family::kQwen3Moe ||
         f == Family::kQwen2Moe;
}

bool is_qwen_moe(Family f) {
  return f == Family::kQwen3Moe || f == Family::kQwen2Moe;
}

// The layer's type when layer_types is not written, as transformers' config fills it in.
bool default_sliding(const DecoderConfig& c, const json& j, int64_t i, const std::string& where) {
  switch (c.family) {
    case Family::kGemma2:
    case Family::kGptOss:
      return (i + 1) % 2 != 0;
    case Family::kGemma3:
    case Family::kGemma4: {
      const int64_t pattern =
          field<int64_t>(j, "sliding_window_pattern", field<int64_t>(j, "_sliding_window_pattern", 6, where), where);
      FSDP_CHECK(pattern >= 1, where, ": sliding_window_pattern is ", pattern, "; it must be >= 1");
      return (i + 1) % pattern != 0;
    }
    case Family::kOlmo3:
      return (i + 1) % 4 != 0;
    case Family::kSmolLM3:
      return !c.plan(i).rotary;
    default:
      return i >= c.max_window_layers;
  }
}

// Which layers attend through a sliding window, as transformers decides: Mistral's and Phi-3's every
// layer when sliding_window is set; Qwen2/Qwen3/SmolLM3's layer_types when use_sliding_window (else, without
// layer_types, Qwen's layers from max_window_layers on and SmolLM3's NoPE layers); Gemma's
// layer_types, else every second layer (Gemma 2) or five of each six (Gemma 3).
void parse_sliding_window(const json& j, const std::string& where, DecoderConfig& c) {
  const int64_t n = c.num_hidden_layers;
  c.use_sliding_window = field<bool>(j, "use_sliding_window", false, where);
  c.max_window_layers = field<int64_t>(j, "max_window_layers", n, where);
  // Absent, the family's (class_defaults); null, none.
  const int64_t window = field<int64_t>(j, "sliding_window", 0, where);
  if (c.family == Family::kLlama || c.family == Family::kOlmo2 || c.family == Family::kGranite || is_hybrid(c.family) ||
      has_grouped_router(c.family)) {
    FSDP_CHECK(window == 0, where, ": sliding_window is not a field of ", family_names(c.family).architecture,
               " (transformers ignores it); remove it",
               c.family == Family::kLlama ? ", or set model_type to mistral" : "");
    return;
  }
  if (window_is_switched(c.family) && !c.use_sliding_window) return;  // sliding_window is then written but unused
  if (window_is_uniform(c.family) && window == 0) return;
  FSDP_CHECK(window == 0 || !is_qwen_moe(c.family), where,
             ": use_sliding_window is true; fsdptrain does not implement ", family_names(c.family).architecture,
             "'s sliding windows yet (its released models set it false)");
  FSDP_CHECK(window >= 0, where, ": sliding_window is ", window, "; it must be >= 1 (or null for none)");
  c.sliding_window = window;
  c.sliding_layers.assign(static_cast<size_t>(n), window_is_uniform(c.family));
  if (window_is_uniform(c.family)) return;
  const json types = j.value("layer_types", json());
  FSDP_CHECK(types.is_null() || (types.is_array() && static_cast<int64_t>(types.size()) == n), where,
             ": layer_types must list one type per layer (", n, ")");
  for (int64_t i = 0; i < n; ++i) {
    if (types.is_null()) {
      c.sliding_layers[i] = default_sliding(c, j, i, where);
      continue;
    }
    const std::string t = types[i].is_string() ? types[i].get<std::string>() : types[i].dump();
    FSDP_CHECK(t == "sliding_attention" || t == "full_attention", where, ": layer_types[", i, "] is ", quoted(t),
               "; fsdptrain knows \"full_attention\" and \"sliding_attention\"");
    c.sliding_layers[i] = t == "sliding_attention";
  }
  // Gemma4TextConfig makes its last layer full attention whatever layer_types says (with a warning).
  if (c.family == Family::kGemma4) c.sliding_layers[n - 1] = false;
  // transformers builds a sliding mask for any sliding layer, and refuses a null window.
  FSDP_CHECK(window > 0 || std::find(c.sliding_layers.begin(), c.sliding_layers.end(), true) == c.sliding_layers.end(),
             where, ": sliding_window is ", j.value("sliding_window", json()).is_null() ? "null" : "0",
             ", yet layer_types",
             types.is_null() ? str(" (as ", family_names(c.family).architecture, " fills it in)") : std::string(),
             " holds sliding_attention layers; transformers cannot run this config either. Set sliding_window, or "
             "make every layer full_attention");
}

// SmolLM3's NoPE layers: no_rope_layers (1 where a layer rotates), else one layer in each
// no_rope_layer_interval without.
void parse_rope_layers(const json& j, const std::string& where, DecoderConfig& c) {
  if (c.family != Family::kSmolLM3) {
    FSDP_CHECK(!j.contains("no_rope_layers") || j["no_rope_layers"].is_null(), where,
               ": no_rope_layers is a field of SmolLM3ForCausalLM, not of ", family_names(c.family).architecture,
               "; remove it, or set model_type to smollm3");
    return;
  }
  const int64_t n = c.num_hidden_layers;
  c.no_rope_layer_interval = field<int64_t>(j, "no_rope_layer_interval", 4, where);
  const json layers = j.value("no_rope_layers", json());
  if (layers.is_null()) {
    FSDP_CHECK(c.no_rope_layer_interval >= 1, where, ": no_rope_layer_interval is ", c.no_rope_layer_interval,
               "; it must be >= 1");
    for (int64_t i = 0; i < n; ++i) c.rope_layers.push_back((i + 1) % c.no_rope_layer_interval != 0 ? 1 : 0);
    return;
  }
  FSDP_CHECK(layers.is_array() && static_cast<int64_t>(layers.size()) == n, where,
             ": no_rope_layers must list one 0 or 1 per layer (", n, ")");
  for (const json& v : layers) {
    FSDP_CHECK(v.is_number_integer() && (v == 0 || v == 1), where, ": no_rope_layers holds ", v.dump(),
               "; each entry is 1 (the layer rotates) or 0 (it does not)");
    c.rope_layers.push_back(v.get<int64_t>());
  }
}

// The MLP's activation: hidden_act, or Gemma's hidden_activation.
Activation parse_activation(const json& j, const std::string& where, Family family) {
  const char* key =
      j.contains("hidden_activation") && !j["hidden_activation"].is_null() ? "hidden_activation" : "hidden_act";
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return is_any_gemma(family) ? Activation::kGeluTanh : Activation::kSilu;
  if (*it == "silu") return Activation::kSilu;
  if (*it == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  throw InputError(str(where, ": ", key, " ", it->dump(),
                       " is not supported; fsdptrain implements \"silu\" and \"gelu_pytorch_tanh\""));
}

// The layer's form and the multipliers: the defaults transformers gives each family, then the
// fields that change them.
void parse_form(const json& j, const std::string& where, DecoderConfig& c) {
  c.activation = parse_activation(j, where, c.family);
  if (is_gemma(c.family)) {
    c.norms = NormPlacement::kSandwich;
    c.norm_unit_offset = c.norm_fp32_product = true;
    c.embedding_scale = std::sqrt(static_cast<double>(c.hidden_size));
    c.embed_scale_in_dtype = true;
    c.query_pre_attn_scalar = field<double>(j, "query_pre_attn_scalar", 256.0, where);
    FSDP_CHECK(c.query_pre_attn_scalar > 0, where, ": query_pre_attn_scalar (", c.query_pre_attn_scalar,
               ") must be > 0");
    c.attention_scale = 1.0 / std::sqrt(c.query_pre_attn_scalar);
    const bool two = c.family == Family::kGemma2;
    // null is no cap (transformers tests `is not None`); absent is the family's default.
    auto cap = [&](const char* key, double fallback) {
      return j.contains(key) && j[key].is_null() ? 0.0 : field<double>(j, key, fallback, where);
    };
    c.attn_softcap = cap("attn_logit_softcapping", two ? 50.0 : 0.0);
    c.final_softcap = cap("final_logit_softcapping", two ? 30.0 : 0.0);
    FSDP_CHECK(c.attn_softcap >= 0 && c.final_softcap >= 0, where,
               ": attn_logit_softcapping and final_logit_softcapping must be > 0 (or null for none)");
    FSDP_CHECK(!field<bool>(j, "use_bidirectional_attention", false, where), where,
               ": use_bidirectional_attention makes an encoder (EmbeddingGemma); fsdptrain trains causal decoders");
  } else if (c.family == Family::kGemma4) {  // Gemma4RMSNorm: w times the normed in fp32; scores unscaled
    c.norms = NormPlacement::kSandwich;
    c.norm_fp32_product = c.v_norm = c.layer_scalar = true;
    c.embedding_scale = std::sqrt(static_cast<double>(c.hidden_size));
    c.embed_scale_in_dtype = true;
    c.attention_scale = 1.0;
    c.final_softcap = j.contains("final_logit_softcapping") && !j["final_logit_softcapping"].is_null()
                          ? field<double>(j, "final_logit_softcapping", 0.0, where)
                          : 0.0;
    FSDP_CHECK(c.final_softcap >= 0, where, ": final_logit_softcapping must be > 0 (or null for none)");
  } else if (is_hybrid(c.family)) {  // Qwen3_5RMSNorm: (1 + w), in fp32, then the cast
    c.norm_unit_offset = c.norm_fp32_product = true;
  } else if (c.family == Family::kGptOss) {  // GptOssRMSNorm: w times the normed in fp32, then the cast
    c.norm_fp32_product = c.attention_sinks = true;
  } else if (c.family == Family::kOlmo2 || c.family == Family::kOlmo3) {
    c.norms = NormPlacement::kPost;
    c.norm_fp32_product = c.qk_norm_whole = true;
  } else if (c.family == Family::kGranite) {
    c.embedding_scale = field<double>(j, "embedding_multiplier", 1.0, where);
    c.attention_scale = field<double>(j, "attention_multiplier", 1.0, where);
    c.residual_multiplier = field<double>(j, "residual_multiplier", 1.0, where);
    c.logits_scaling = field<double>(j, "logits_scaling", 1.0, where);
    FSDP_CHECK(c.embedding_scale > 0 && c.attention_scale > 0 && c.residual_multiplier > 0 && c.logits_scaling > 0,
               where,
               ": embedding_multiplier, attention_multiplier, residual_multiplier and logits_scaling must be > 0");
  }
  for (const char* key : {"query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"})
    FSDP_CHECK(is_gemma(c.family) || (c.family == Family::kGemma4 && std::string(key) == "final_logit_softcapping") ||
                   !j.contains(key) || j[key].is_null(),
               where, ": ", key, " is a field of Gemma 2 and 3, not of ", family_names(c.family).architecture,
               "; remove it, or set model_type to gemma2 or gemma3_text");
  for (const char* key : {"embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"})
    FSDP_CHECK(c.family == Family::kGranite || !j.contains(key) || j[key].is_null(), where, ": ", key,
               " is a field of GraniteForCausalLM, not of ", family_names(c.family).architecture,
               "; remove it, or set model_type to granite");
}

// gpt-oss's experts: num_local_experts (as num_experts), num_experts_per_tok (or experts_per_token,
// as its released configs also write), intermediate_size per expert, every layer sparse, the router's
// bias, the clamped SwiGLU's limit and gain (GptOssConfig's defaults).
void parse_gpt_oss_moe(const json& j, const std::string& where, DecoderConfig& c) {
  MoeConfig& m = c.moe;
  m.gpt_oss = true;
  m.num_experts = field<int64_t>(j, j.contains("num_local_experts") ? "num_local_experts" : "num_experts", 128, where);
  const char* k = j.contains("num_experts_per_tok") || !j.contains("experts_per_token") ? "num_experts_per_tok"
                                                                                      : "experts_per_token";
  m.experts_per_token = field<int64_t>(j, k, 4, where);
  m.intermediate_size = c.intermediate_size;
  m.router_aux_loss_coef = field<double>(j, "router_aux_loss_coef", 0.001, where);
  m.output_router_logits = field<bool>(j, "output_router_logits", false, where);
  m.swiglu_alpha = field<double>(j, "swiglu_alpha", 1.702, where);
  m.swiglu_limit = field<double>(j, "swiglu_limit", 7.0, where);
  check_positive(where, {{"num_local_experts", m.num_experts}, {k, m.experts_per_token}});
  FSDP_CHECK(m.experts_per_token <= m.num_experts, where, ": ", k, " (", m.experts_per_token,
             ") is more than the experts (", m.num_experts, ")");
  FSDP_CHECK(m.router_aux_loss_coef >= 0 && m.swiglu_limit > 0 && m.swiglu_alpha > 0, where,
             ": router_aux_loss_coef must be >= 0, swiglu_limit and swiglu_alpha > 0");
}

// GLM-4.7-Flash's dense and sparse layers: mlp_layer_types ("dense" or "sparse", one a layer; Glm4MoeLiteConfig's
// default: the first dense), as MoeConfig::mlp_only_layers. Its class has no first_k_dense_replace (the released
// config.json writes one, which transformers ignores): where written, it must name the same dense layers.
void parse_mlp_layer_types(const json& j, const std::string& where, DecoderConfig& c) {
  MoeConfig& m = c.moe;
  const json types = j.value("mlp_layer_types", json());
  FSDP_CHECK(types.is_null() || (types.is_array() && static_cast<int64_t>(types.size()) == c.num_hidden_layers), where,
             ": mlp_layer_types must list one of \"dense\" or \"sparse\" for each of the ", c.num_hidden_layers,
             " layers, got ", types.dump());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const json t = types.is_null() ? json(l == 0 ? "dense" : "sparse") : types[static_cast<size_t>(l)];
    FSDP_CHECK(t == "dense" || t == "sparse", where, ": mlp_layer_types[", l, "] is ", t.dump(),
               "; each is \"dense\" or \"sparse\"");
    if (t == "dense") m.mlp_only_layers.push_back(l);
  }
  if (!j.contains("first_k_dense_replace") || j["first_k_dense_replace"].is_null()) return;
  const int64_t k = field<int64_t>(j, "first_k_dense_replace", 0, where);
  bool same = true;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    same = same &&
           (l < k) == (std::find(m.mlp_only_layers.begin(), m.mlp_only_layers.end(), l) != m.mlp_only_layers.end());
  FSDP_CHECK(same, where, ": first_k_dense_replace ", k, " is not what Glm4MoeLiteForCausalLM builds: its class reads ",
             types.is_null() ? "mlp_layer_types (absent: the first layer dense, the rest sparse)" : "mlp_layer_types",
             " and ignores first_k_dense_replace. Write mlp_layer_types for the layers you mean, and remove "
             "first_k_dense_replace");
}

// DeepSeek-V2's choice (DeepseekV2TopkRouter): topk_method greedy, the top k of all the experts (n_group and
// topk_group, as written, unread), or group_limited_greedy, within the topk_group best of n_group groups (both then
// needed: the class has no defaults for them). Its norm_topk_prob is never read: the chosen scores are not
// renormalised, so true is refused rather than ignored.
void parse_v2_choice(const json& j, const std::string& where, MoeConfig& m) {
  const json method = j.value("topk_method", json("greedy"));
  FSDP_CHECK(method == json("greedy") || method == json("group_limited_greedy"), where, ": topk_method ", method.dump(),
             " is not one DeepseekV2ForCausalLM computes: it chooses experts by \"greedy\" (the top k of all) or "
             "\"group_limited_greedy\" (within the best groups). Write one of the two",
             method == json("noaux_tc") ? ", or set model_type to deepseek_v3 for DeepSeek-V3's router" : "");
  m.group_limited = method == json("group_limited_greedy");
  for (const char* key : {"n_group", "topk_group"})
    FSDP_CHECK(
        !m.group_limited || (j.contains(key) && !j[key].is_null()), where, ": ", key,
        " is missing; topk_method group_limited_greedy chooses within groups of experts (DeepSeek-V2: n_group 8, "
        "topk_group 3). Write it, or set topk_method to greedy");
  m.n_group = field<int64_t>(j, "n_group", 0, where);  // 0: null
  m.topk_group = field<int64_t>(j, "topk_group", 0, where);
  const bool renormalised = field<bool>(j, "norm_topk_prob", false, where);
  FSDP_CHECK(!renormalised, where,
             ": norm_topk_prob is true, but DeepseekV2ForCausalLM never renormalises the chosen experts' scores "
             "(transformers ignores the field, and DeepSeek-V2's own folders write false). Remove it, or set it to "
             "false");
}

// DeepSeek-V3's router and experts, in GLM-4.5 (Glm4MoeConfig), DeepSeek-V3 (DeepseekV3Config), GLM-4.7-Flash
// (Glm4MoeLiteConfig) and DeepSeek-V2 (DeepseekV2Config: softmax scores, parse_v2_choice), with each class's defaults:
// n_routed_experts (or num_local_experts), num_experts_per_tok, moe_intermediate_size, n_shared_experts,
// routed_scaling_factor, n_group, topk_group, norm_topk_prob, and the dense layers (first_k_dense_replace;
// GLM-4.7-Flash's mlp_layer_types); num_nextn_predict_layers (or num_mtp_layers) counts the folder's
// multi-token-prediction layers. Other families refuse these fields by name.
void parse_grouped_router(const json& j, const std::string& where, DecoderConfig& c) {
  static const char* const kOwn[] = {
      "n_routed_experts",      "n_shared_experts", "routed_scaling_factor",    "n_group",       "topk_group",
      "first_k_dense_replace", "use_qk_norm",      "num_nextn_predict_layers", "num_mtp_layers"};
  if (!has_grouped_router(c.family)) {
    for (const char* key : kOwn)
      FSDP_CHECK(!j.contains(key) || j[key].is_null(), where, ": ", key,
                 " is a field of Glm4MoeForCausalLM and the DeepSeek classes, not of ",
                 family_names(c.family).architecture,
                 "; remove it, or set model_type to glm4_moe, deepseek_v2 or deepseek_v3");
    FSDP_CHECK(!j.contains("mlp_layer_types") || j["mlp_layer_types"].is_null(), where,
               ": mlp_layer_types is a field of Glm4MoeLiteForCausalLM, not of ", family_names(c.family).architecture,
               "; remove it, or set model_type to glm4_moe_lite");
    return;
  }
  const bool deepseek = c.family == Family::kDeepseekV3, lite = c.family == Family::kGlm4MoeLite,
             v2 = c.family == Family::kDeepseekV2;
  FSDP_CHECK(c.family == Family::kGlm4Moe || !j.contains("use_qk_norm") || j["use_qk_norm"].is_null(), where,
             ": use_qk_norm is a field of Glm4MoeForCausalLM, not of ", family_names(c.family).architecture,
             "; remove it");
  FSDP_CHECK(lite || !j.contains("mlp_layer_types") || j["mlp_layer_types"].is_null(), where,
             ": mlp_layer_types is a field of Glm4MoeLiteForCausalLM, not of ", family_names(c.family).architecture,
             "; write first_k_dense_replace, or set model_type to glm4_moe_lite");
  MoeConfig& m = c.moe;
  m.grouped_router = true;
  m.softmax_scores = v2;
  const char* experts_key =
      j.contains("n_routed_experts") || !j.contains("num_local_experts") ? "n_routed_experts" : "num_local_experts";
  m.num_experts = field<int64_t>(j, experts_key, deepseek ? 256 : lite || v2 ? 64 : 128, where);
  FSDP_CHECK(
      !v2 || (j.contains("num_experts_per_tok") && !j["num_experts_per_tok"].is_null()), where,
      ": num_experts_per_tok is missing; DeepseekV2ForCausalLM's router has no default for it. Write the experts "
      "each token takes (DeepSeek-V2 and DeepSeek-V2-Lite: 6)");
  m.experts_per_token = field<int64_t>(j, "num_experts_per_tok", lite ? 4 : 8, where);
  const int64_t width = deepseek ? 2048 : lite ? 1536 : v2 ? 1407 : 1408;  // each class's moe_intermediate_size
  m.intermediate_size = field<int64_t>(j, "moe_intermediate_size", width, where);
  const int64_t shared = field<int64_t>(j, "n_shared_experts", v2 ? 2 : 1, where);
  if (v2) {
    parse_v2_choice(j, where, m);
  } else {
    m.n_group = field<int64_t>(j, "n_group", deepseek ? 8 : 1, where);
    m.topk_group = field<int64_t>(j, "topk_group", deepseek ? 4 : 1, where);
  }
  if (lite)
    parse_mlp_layer_types(j, where, c);
  else
    m.first_k_dense_replace = field<int64_t>(j, "first_k_dense_replace", deepseek ? 3 : v2 ? 0 : 1, where);
  m.routed_scaling_factor = field<double>(j, "routed_scaling_factor", deepseek ? 2.5 : lite ? 1.8 : 1.0, where);
  m.norm_topk_prob = !v2 && field<bool>(j, "norm_topk_prob", true, where);
  m.router_aux_loss_coef = 0;  // none of these classes adds one
  m.output_router_logits = false;
  const char* mtp_key = j.contains("num_mtp_layers") && !j.contains("num_nextn_predict_layers")
                            ? "num_mtp_layers"
                            : "num_nextn_predict_layers";
  // Glm4MoeLiteConfig has no such field (its folder's is model.layers.47, which transformers leaves out): as written.
  c.mtp_layers = field<int64_t>(j, mtp_key, lite || v2 ? 0 : 1, where);
  check_positive(where, {{experts_key, m.num_experts},
                         {"num_experts_per_tok", m.experts_per_token},
                         {"moe_intermediate_size", m.intermediate_size},
                         {"n_shared_experts", shared}});
  m.shared_expert_intermediate_size = m.intermediate_size * shared;
  FSDP_CHECK(m.first_k_dense_replace >= 0 && c.mtp_layers >= 0, where,
             ": first_k_dense_replace and num_nextn_predict_layers must be >= 0");
  FSDP_CHECK(m.routed_scaling_factor > 0, where, ": routed_scaling_factor (", m.routed_scaling_factor, ") must be > 0");
  if (!m.group_limited) {  // DeepSeek-V2's greedy choice: n_group and topk_group unread
    FSDP_CHECK(m.experts_per_token <= m.num_experts, where, ": num_experts_per_tok ", m.experts_per_token,
               " is more than the ", m.num_experts, " experts (", experts_key, ")");
    return;
  }
  check_positive(where, {{"n_group", m.n_group}, {"topk_group", m.topk_group}});
  // As transformers' router needs them: groups of equal size, each with two experts to score it (DeepSeek-V2's: one,
  // its best), and enough experts in the chosen groups for the top k.
  const int64_t scored_by = m.softmax_scores ? 1 : 2;
  FSDP_CHECK(m.num_experts % m.n_group == 0 && m.num_experts / m.n_group >= scored_by, where, ": n_group ", m.n_group,
             " must divide ", experts_key, " ", m.num_experts, " into groups of at least ",
             scored_by == 2 ? "two experts (a group is scored by its two best)" : "one expert");
  FSDP_CHECK(m.topk_group <= m.n_group && m.experts_per_token <= m.topk_group * (m.num_experts / m.n_group), where,
             ": topk_group ", m.topk_group, " of n_group ", m.n_group, " groups of ", m.num_experts / m.n_group,
             " experts leave fewer than num_experts_per_tok ", m.experts_per_token,
             " to choose from; topk_group must be <= n_group and hold that many experts");
}

// Latent attention's fields (DeepseekV3Config's, DeepseekV2Config's and Glm4MoeLiteConfig's defaults), refused by name
// in other families. head_dim, where written, is qk_rope_head_dim (as DeepseekV3Config sets it); the model's head_dim
// is the width attention computes at, max(qk_nope_head_dim + qk_rope_head_dim, v_head_dim).
void parse_latent_attention(const json& j, const std::string& where, DecoderConfig& c) {
  static const char* const kOwn[] = {"q_lora_rank", "kv_lora_rank",    "qk_nope_head_dim", "qk_rope_head_dim",
                                     "v_head_dim",  "rope_interleave", "qk_head_dim"};
  if (!is_latent(c.family)) {
    for (const char* key : kOwn)
      FSDP_CHECK(!j.contains(key) || j[key].is_null(), where, ": ", key,
                 " is a field of latent attention (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, "
                 "Glm4MoeLiteForCausalLM), not of ",
                 family_names(c.family).architecture,
                 "; remove it, or set model_type to deepseek_v2, deepseek_v3 or glm4_moe_lite");
    return;
  }
  const bool lite = c.family == Family::kGlm4MoeLite;
  LatentAttention& a = c.mla;
  a.q_rank = j.contains("q_lora_rank") && j["q_lora_rank"].is_null()
                 ? 0
                 : field<int64_t>(j, "q_lora_rank", lite ? 768 : 1536, where);
  a.kv_rank = field<int64_t>(j, "kv_lora_rank", 512, where);
  a.nope_dim = field<int64_t>(j, "qk_nope_head_dim", lite ? 192 : 128, where);
  a.rope_dim = field<int64_t>(j, "qk_rope_head_dim", 64, where);
  a.v_dim = field<int64_t>(j, "v_head_dim", lite ? 256 : 128, where);
  a.interleave = field<bool>(j, "rope_interleave", true, where);
  a.fp32_rotation = c.family == Family::kDeepseekV2;
  FSDP_CHECK(a.interleave || c.family != Family::kDeepseekV2, where,
             ": rope_interleave is false, but DeepseekV2ForCausalLM always turns adjacent pairs of the rotated "
             "dimensions (the field is not its class's, and transformers ignores it). Remove it");
  check_positive(where, {{"kv_lora_rank", a.kv_rank},
                         {"qk_nope_head_dim", a.nope_dim},
                         {"qk_rope_head_dim", a.rope_dim},
                         {"v_head_dim", a.v_dim}});
  FSDP_CHECK(a.q_rank >= 1 || (j.contains("q_lora_rank") && j["q_lora_rank"].is_null()), where, ": q_lora_rank is ",
             a.q_rank, "; it must be a whole number >= 1, or null for a q_proj without a latent");
  FSDP_CHECK(a.rope_dim % 2 == 0, where, ": qk_rope_head_dim ", a.rope_dim,
             " must be even: the rotation turns its dimensions in pairs");
  // transformers' configs save qk_head_dim, their sum, which its model recomputes and never reads.
  const int64_t qk = field<int64_t>(j, "qk_head_dim", a.nope_dim + a.rope_dim, where);
  FSDP_CHECK(qk == a.nope_dim + a.rope_dim, where, ": qk_head_dim ", qk, " is not qk_nope_head_dim ", a.nope_dim,
             " + qk_rope_head_dim ", a.rope_dim,
             "; each head's query and key are that wide. Remove qk_head_dim, or make ", "it ", a.nope_dim + a.rope_dim);
  const int64_t written = field<int64_t>(j, "head_dim", a.rope_dim, where);
  FSDP_CHECK(written == a.rope_dim, where, ": head_dim ", written, " is not qk_rope_head_dim ", a.rope_dim, "; ",
             family_names(c.family).architecture,
             " takes head_dim as qk_rope_head_dim (the rotated share of each head). Remove head_dim, or make "
             "them equal");
  const json kv = j.value("num_key_value_heads", json());
  FSDP_CHECK(kv.is_null() || kv == json(c.num_attention_heads), where, ": num_key_value_heads ", kv.dump(),
             " is not num_attention_heads ", c.num_attention_heads,
             "; latent attention gives every head a key and value of its own (kv_b_proj), so transformers' "
             "attention needs them equal. Set num_key_value_heads to ",
             c.num_attention_heads);
  c.num_key_value_heads = c.num_attention_heads;
  c.head_dim = std::max(a.qk_dim(), a.v_dim);
}

// The mixture of experts: Qwen3-MoE's and Qwen2-MoE's fields (num_experts, moe_intermediate_size,
// decoder_sparse_step, mlp_only_layers, norm_topk_prob; Qwen2-MoE's shared expert), Mixtral's
// (num_local_experts, intermediate_size per expert, the top-k always renormalised). Dense families
// refuse the fields.
void parse_moe(const json& j, const std::string& where, DecoderConfig& c) {
  MoeConfig& m = c.moe;
  // Qwen3-Next and Qwen3.5-MoE: Qwen2-MoE's shared expert; Qwen3.5-MoE's every layer sparse and its
  // top-k always renormalised (its class has no decoder_sparse_step, mlp_only_layers or norm_topk_prob).
  const bool mixtral = c.family == Family::kMixtral, next = c.family == Family::kQwen3Next,
             moe35 = c.family == Family::kQwen3_5Moe;
  parse_grouped_router(j, where, c);
  if (has_grouped_router(c.family)) return;
  if (c.family == Family::kGptOss) return parse_gpt_oss_moe(j, where, c);
  if (c.family == Family::kGemma4) return;  // parse_gemma4_moe: enable_moe_block and its fields
  if (!mixtral && !is_qwen_moe(c.family) && !next && !moe35) {
    for (const char* key : {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                            "shared_expert_intermediate_size"})
      FSDP_CHECK(!j.contains(key) || j[key].is_null(), where, ": ", key, " is a mixture-of-experts field, not one of ",
                 family_names(c.family).architecture,
                 "; remove it, or set model_type to qwen3_moe, qwen2_moe, mixtral, gpt_oss, qwen3_next, "
                 "qwen3_5_moe_text, glm4_moe, deepseek_v3 or glm4_moe_lite");
    return;
  }
  const bool qwen2 = c.family == Family::kQwen2Moe;
  // The Hub's Qwen configs write num_experts; transformers 5 saves them as num_local_experts, as Mixtral's.
  const char* experts_key = !mixtral && j.contains("num_experts") ? "num_experts" : "num_local_experts";
  // Qwen3-Next: num_experts 0 makes every layer dense, as in transformers.
  m.num_experts = field<int64_t>(j, experts_key, mixtral ? 8 : qwen2 ? 60 : next ? 512 : moe35 ? 256 : 128, where);
  if (next && m.num_experts == 0) return;
  m.experts_per_token = field<int64_t>(j, "num_experts_per_tok", mixtral ? 2 : qwen2 ? 4 : next ? 10 : 8, where);
  m.intermediate_size =
      mixtral ? c.intermediate_size
              : field<int64_t>(j, "moe_intermediate_size", qwen2 ? 1408 : next || moe35 ? 512 : 768, where);
  if (moe35)
    for (const char* key : {"norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"})
      FSDP_CHECK(!j.contains(key) || j[key].is_null() || j[key] == json(true) || j[key] == json(1) ||
                     j[key] == json::array(),
                 where, ": ", key, " ", j[key].dump(), " is not a field of Qwen3_5MoeForCausalLM, whose every layer "
                 "is sparse with its top-k renormalised (transformers ignores it); remove it");
  m.norm_topk_prob = mixtral || moe35 || field<bool>(j, "norm_topk_prob", next, where);
  m.router_aux_loss_coef = field<double>(j, "router_aux_loss_coef", 0.001, where);
  m.output_router_logits = field<bool>(j, "output_router_logits", false, where);
  check_positive(where, {{experts_key, m.num_experts},
                         {"num_experts_per_tok", m.experts_per_token},
                         {mixtral ? "intermediate_size" : "moe_intermediate_size", m.intermediate_size}});
  FSDP_CHECK(m.experts_per_token <= m.num_experts, where, ": num_experts_per_tok (", m.experts_per_token,
             ") is more than the experts (", m.num_experts, ")");
  FSDP_CHECK(m.router_aux_loss_coef >= 0, where, ": router_aux_loss_coef (", m.router_aux_loss_coef, ") must be >= 0");
  if (mixtral) {
    FSDP_CHECK(field<double>(j, "router_jitter_noise", 0.0, where) == 0.0, where, ": router_jitter_noise ",
               j["router_jitter_noise"].dump(),
               " is not supported; fsdptrain routes without noise (set it to 0.0, as Mixtral's released configs do)");
    return;
  }
  if (moe35) {
    m.shared_expert_intermediate_size = field<int64_t>(j, "shared_expert_intermediate_size", 512, where);
    check_positive(where, {{"shared_expert_intermediate_size", m.shared_expert_intermediate_size}});
    return;
  }
  m.decoder_sparse_step = field<int64_t>(j, "decoder_sparse_step", 1, where);
  check_positive(where, {{"decoder_sparse_step", m.decoder_sparse_step}});
  if (const json only = j.value("mlp_only_layers", json()); !only.is_null()) {
    FSDP_CHECK(only.is_array(), where, ": mlp_only_layers must list layer indices, got ", only.dump());
    for (const json& v : only) {
      FSDP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < c.num_hidden_layers, where,
                 ": mlp_only_layers holds ", v.dump(), "; each is a layer index in [0, ", c.num_hidden_layers, ")");
      m.mlp_only_layers.push_back(v.get<int64_t>());
    }
  }
  if (qwen2 || next) {
    m.shared_expert_intermediate_size = field<int64_t>(j, "shared_expert_intermediate_size", qwen2 ? 5632 : 512, where);
    check_positive(where, {{"shared_expert_intermediate_size", m.shared_expert_intermediate_size}});
  }
}

// Gemma 4's mixture of experts (enable_moe_block): num_experts, top_k_experts and
// moe_intermediate_size, which Gemma4TextConfig leaves unset (so each must be written).
void parse_gemma4_moe(const json& j, const std::string& where, DecoderConfig& c) {
  if (!field<bool>(j, "enable_moe_block", false, where)) return;
  MoeConfig& m = c.moe;
  m.gemma4 = true;
  for (const char* key : {"num_experts", "top_k_experts", "moe_intermediate_size"})
    FSDP_CHECK(j.contains(key) && j[key].is_number_integer(), where, ": enable_moe_block is true but ", key, " is ",
               j.contains(key) ? j[key].dump() : "not written",
               "; Gemma4TextConfig has no default for it: write the model's (gemma-4-26B-A4B: num_experts 128, "
               "top_k_experts 8, moe_intermediate_size 704)");
  m.num_experts = j["num_experts"].get<int64_t>();
  m.experts_per_token = j["top_k_experts"].get<int64_t>();
  m.intermediate_size = j["moe_intermediate_size"].get<int64_t>();
  m.norm_topk_prob = true;
  m.router_aux_loss_coef = 0;  // Gemma4ForCausalLM adds none
  m.output_router_logits = false;
  check_positive(where, {{"num_experts", m.num_experts},
                         {"top_k_experts", m.experts_per_token},
                         {"moe_intermediate_size", m.intermediate_size}});
  FSDP_CHECK(m.experts_per_token <= m.num_experts, where, ": top_k_experts (", m.experts_per_token,
             ") is more than the experts (", m.num_experts, ")");
}

// Gemma 4 E2B/E4B's parts: per-layer embeddings (hidden_size_per_layer_input, whose default 256 is on;
// vocab_size_per_layer_input), the last num_kv_shared_layers layers attending with earlier layers' keys
// and values, their MLPs twice as wide (use_double_wide_mlp), as Gemma4TextConfig reads them.
void parse_gemma4_small(const json& j, const std::string& where, DecoderConfig& c) {
  FSDP_CHECK(!j.contains("hidden_size_per_layer_input") || !j["hidden_size_per_layer_input"].is_null(), where,
             ": hidden_size_per_layer_input is null, which Gemma4TextConfig refuses (it is a width); write 0 for no "
             "per-layer embeddings (the dense models), or the width (Gemma 4 E2B's and E4B's: 256)");
  for (const char* key : {"vocab_size_per_layer_input", "num_kv_shared_layers", "use_double_wide_mlp"})
    FSDP_CHECK(!j.contains(key) || !j[key].is_null(), where, ": ", key,
               " is null, which Gemma4TextConfig refuses; write its value, or leave the field out for its default");
  c.per_layer_input_dim = field<int64_t>(j, "hidden_size_per_layer_input", 256, where);
  FSDP_CHECK(c.per_layer_input_dim >= 0, where, ": hidden_size_per_layer_input is ", c.per_layer_input_dim,
             "; it must be 0 (no per-layer embeddings) or a width >= 1");
  if (c.per_layer_input_dim > 0) {
    c.per_layer_vocab = field<int64_t>(j, "vocab_size_per_layer_input", 262144, where);
    FSDP_CHECK(c.per_layer_vocab >= c.vocab_size, where, ": vocab_size_per_layer_input (", c.per_layer_vocab,
               ") is smaller than vocab_size (", c.vocab_size,
               "): every token id looks its per-layer embedding up there; set it to at least vocab_size (Gemma 4 "
               "E2B's and E4B's: 262144)");
  }
  const int64_t n = c.num_hidden_layers;
  c.kv_shared_layers = field<int64_t>(j, "num_kv_shared_layers", 0, where);
  FSDP_CHECK(c.kv_shared_layers >= 0 && c.kv_shared_layers < n, where, ": num_kv_shared_layers is ", c.kv_shared_layers,
             "; it must be from 0 to num_hidden_layers - 1 (", n - 1,
             "): the layers before the shared ones make the keys and values");
  c.double_wide_mlp = field<bool>(j, "use_double_wide_mlp", false, where);
  for (int64_t l = n - c.kv_shared_layers; l < n; ++l)
    FSDP_CHECK(c.plan(l).kv_source >= 0, where, ": layer ", l, " (", c.window_of(l) > 0 ? "sliding" : "full",
               " attention) is among the last num_kv_shared_layers (", c.kv_shared_layers,
               ") but no earlier layer of its kind makes keys and values for it; lower num_kv_shared_layers or "
               "check layer_types");
}

// Gemma 4: its full-attention layers' head width and kv heads (per_layer_config as transformers 5
// saves it, else global_head_dim (512) and, with attention_k_eq_v, num_global_key_value_heads), their
// values (attention_k_eq_v), its mixture of experts (parse_gemma4_moe), E2B's and E4B's parts
// (parse_gemma4_small). Refused by name: attention both ways for every token. Other families refuse
// the fields.
void parse_gemma4(const json& j, const std::string& where, DecoderConfig& c) {
  if (c.family != Family::kGemma4) {
    for (const char* key : {"per_layer_config", "global_head_dim", "num_global_key_value_heads", "attention_k_eq_v",
                            "hidden_size_per_layer_input", "vocab_size_per_layer_input", "num_kv_shared_layers",
                            "use_double_wide_mlp", "enable_moe_block"})
      FSDP_CHECK(!j.contains(key) || j[key].is_null(), where, ": ", key, " is a field of Gemma 4, not of ",
                 family_names(c.family).architecture, "; remove it, or set model_type to gemma4_text");
    return;
  }
  parse_gemma4_small(j, where, c);
  // "vision": a multimodal model's image tokens attend both ways among themselves; text attends
  // causally, as Gemma4TextModel computes it (the Hub's 31B and 26B-A4B configs write it).
  const json both_ways = j.value("use_bidirectional_attention", json());
  FSDP_CHECK(both_ways.is_null() || both_ways == json("vision"), where, ": use_bidirectional_attention ",
             both_ways.dump(),
             " makes every token attend both ways (an encoder); fsdptrain trains causal decoders: set it to null, "
             "or \"vision\" (text stays causal)");
  parse_gemma4_moe(j, where, c);
  c.attention_k_eq_v = field<bool>(j, "attention_k_eq_v", false, where);
  c.global_head_dim = field<int64_t>(j, "global_head_dim", 512, where);
  c.global_kv_heads = c.attention_k_eq_v ? field<int64_t>(j, "num_global_key_value_heads", 0, where) : 0;
  const json per_layer = j.value("per_layer_config", json());
  if (!per_layer.is_null()) {  // transformers 5's saved form: each full-attention layer's overrides
    FSDP_CHECK(per_layer.is_object(), where, ": per_layer_config must map layer indices to their fields, got ",
               per_layer.dump());
    c.global_head_dim = 0;
    int64_t full = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) full += c.window_of(l) == 0 ? 1 : 0;
    for (const auto& [key, fields] : per_layer.items()) {
      const std::string at = str(where, ": per_layer_config[", quoted(key), "]");
      int64_t layer = -1;
      try {
        layer = std::stoll(key);
      } catch (const std::exception&) {
      }
      FSDP_CHECK(layer >= 0 && layer < c.num_hidden_layers && c.window_of(layer) == 0 && fields.is_object(), at,
                 ": fsdptrain reads overrides of Gemma 4's full-attention layers only (a layer index whose "
                 "layer_types entry is \"full_attention\", mapped to its head_dim and num_key_value_heads)");
      for (const auto& item : fields.items())
        FSDP_CHECK(item.key() == "head_dim" || item.key() == "num_key_value_heads", at, ": ", quoted(item.key()),
                   " is not read; fsdptrain reads head_dim and num_key_value_heads here");
      const int64_t d = field<int64_t>(fields, "head_dim", c.head_dim, at);
      const int64_t k = field<int64_t>(fields, "num_key_value_heads", c.num_key_value_heads, at);
      FSDP_CHECK((c.global_head_dim == 0 || (d == c.global_head_dim && k == c.global_kv_heads)) && d > 0 && k > 0, at,
                 ": every full-attention layer must have the same head_dim and num_key_value_heads (>= 1), as "
                 "Gemma 4's do; this one has ",
                 d, " and ", k);
      c.global_head_dim = d;
      c.global_kv_heads = k;
      --full;
    }
    FSDP_CHECK(full == 0 || c.global_head_dim == 0, where,
               ": per_layer_config lists some full-attention layers and "
               "not others; list each one (as transformers saves it) or none");
  }
  if (c.global_head_dim == 0) c.global_head_dim = c.head_dim;
  if (c.global_kv_heads == 0) c.global_kv_heads = c.num_key_value_heads;
  check_positive(where, {{"global_head_dim", c.global_head_dim}, {"num_global_key_value_heads", c.global_kv_heads}});
  FSDP_CHECK(c.num_attention_heads % c.global_kv_heads == 0 && c.global_head_dim % 2 == 0, where,
             ": the full-attention layers' num_key_value_heads (", c.global_kv_heads,
             ") must divide num_attention_heads (", c.num_attention_heads, ") and their head_dim (", c.global_head_dim,
             ") be even");
}

// Qwen3.5/3.6 and Qwen3-Next: which layers are Gated DeltaNet (layer_types, else every layer but each
// full_attention_interval-th), its heads and widths, and the gated full attention of the others.
// Other families refuse the fields.
void parse_linear_attention(const json& j, const std::string& where, DecoderConfig& c) {
  if (!is_hybrid(c.family)) {
    for (const char* key : {"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                            "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval"})
      FSDP_CHECK(!j.contains(key) || j[key].is_null(), where, ": ", key, " is a field of the hybrid models (",
                 "Gated DeltaNet), not of ", family_names(c.family).architecture,
                 "; remove it, or set model_type to qwen3_5_text, qwen3_5_moe_text or qwen3_next");
    return;
  }
  LinearAttentionConfig& l = c.linear_attention;
  l.key_heads = field<int64_t>(j, "linear_num_key_heads", l.key_heads, where);
  l.value_heads = field<int64_t>(j, "linear_num_value_heads", l.value_heads, where);
  l.key_head_dim = field<int64_t>(j, "linear_key_head_dim", l.key_head_dim, where);
  l.value_head_dim = field<int64_t>(j, "linear_value_head_dim", l.value_head_dim, where);
  l.conv_kernel = field<int64_t>(j, "linear_conv_kernel_dim", l.conv_kernel, where);
  l.fused_projections = c.family == Family::kQwen3Next;
  check_positive(where, {{"linear_num_key_heads", l.key_heads},
                         {"linear_num_value_heads", l.value_heads},
                         {"linear_key_head_dim", l.key_head_dim},
                         {"linear_value_head_dim", l.value_head_dim},
                         {"linear_conv_kernel_dim", l.conv_kernel}});
  FSDP_CHECK(l.value_heads % l.key_heads == 0, where, ": linear_num_value_heads ", l.value_heads,
             " must be a multiple of linear_num_key_heads ", l.key_heads, " (each key head serves as many value heads)");
  c.attn_output_gate = true;  // transformers' classes gate whatever attn_output_gate says
  const int64_t n = c.num_hidden_layers;
  const json types = j.value("layer_types", json());
  if (types.is_null()) {
    const int64_t every = field<int64_t>(j, "full_attention_interval", 4, where);
    check_positive(where, {{"full_attention_interval", every}});
    for (int64_t i = 0; i < n; ++i) c.linear_layers.push_back((i + 1) % every != 0);
    return;
  }
  FSDP_CHECK(types.is_array() && static_cast<int64_t>(types.size()) == n, where,
             ": layer_types must list one type per layer (", n, ")");
  for (int64_t i = 0; i < n; ++i) {
    const std::string t = types[i].is_string() ? types[i].get<std::string>() : types[i].dump();
    FSDP_CHECK(t == "linear_attention" || t == "full_attention", where, ": layer_types[", i, "] is ", quoted(t),
               "; ", family_names(c.family).architecture, " has \"linear_attention\" and \"full_attention\" layers");
    c.linear_layers.push_back(t == "linear_attention");
  }
}

}  // namespace

FamilyNames family_names(Family f) {
  switch (f) {
    case Family::kMistral:
      return {"mistral", "MistralForCausalLM", "MistralDecoderLayer"};
    case Family::kMinistral3:
      return {"ministral3", "Ministral3ForCausalLM", "Ministral3DecoderLayer"};
    case Family::kQwen2:
      return {"qwen2", "Qwen2ForCausalLM", "Qwen2DecoderLayer"};
    case Family::kQwen3:
      return {"qwen3", "Qwen3ForCausalLM", "Qwen3DecoderLayer"};
    case Family::kGemma2:
      return {"gemma2", "Gemma2ForCausalLM", "Gemma2DecoderLayer"};
    case Family::kGemma3:
      return {"gemma3_text", "Gemma3ForCausalLM", "Gemma3DecoderLayer"};
    case Family::kOlmo2:
      return {"olmo2", "Olmo2ForCausalLM", "Olmo2DecoderLayer"};
    case Family::kOlmo3:
      return {"olmo3", "Olmo3ForCausalLM", "Olmo3DecoderLayer"};
    case Family::kSmolLM3:
      return {"smollm3", "SmolLM3ForCausalLM", "SmolLM3DecoderLayer"};
    case Family::kGranite:
      return {"granite", "GraniteForCausalLM", "GraniteDecoderLayer"};
    case Family::kPhi3:
      return {"phi3", "Phi3ForCausalLM", "Phi3DecoderLayer"};
    case Family::kQwen3Moe:
      return {"qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeDecoderLayer"};
    case Family::kQwen2Moe:
      return {"qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeDecoderLayer"};
    case Family::kMixtral:
      return {"mixtral", "MixtralForCausalLM", "MixtralDecoderLayer"};
    case Family::kQwen3_5:
      return {"qwen3_5_text", "Qwen3_5ForCausalLM", "Qwen3_5DecoderLayer"};
    case Family::kQwen3Next:
      return {"qwen3_next", "Qwen3NextForCausalLM", "Qwen3NextDecoderLayer"};
    case Family::kQwen3_5Moe:
      return {"qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeDecoderLayer"};
    case Family::kGptOss:
      return {"gpt_oss", "GptOssForCausalLM", "GptOssDecoderLayer"};
    case Family::kGemma4:
      return {"gemma4_text", "Gemma4ForCausalLM", "Gemma4TextDecoderLayer"};
    case Family::kGlm4Moe:
      return {"glm4_moe", "Glm4MoeForCausalLM", "Glm4MoeDecoderLayer"};
    case Family::kDeepseekV2:
      return {"deepseek_v2", "DeepseekV2ForCausalLM", "DeepseekV2DecoderLayer"};
    case Family::kDeepseekV3:
      return {"deepseek_v3", "DeepseekV3ForCausalLM", "DeepseekV3DecoderLayer"};
    case Family::kGlm4MoeLite:
      return {"glm4_moe_lite", "Glm4MoeLiteForCausalLM", "Glm4MoeLiteDecoderLayer"};
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

// Our module classes and transformers' names for them: the family's prefix and a suffix ("GatedMlp"
// is "Qwen2MLP" in a Qwen2 model), or LibTorch's and ours that transformers names without a prefix.
struct ClassName {
  const char* ours;
  const char* theirs;
  bool prefixed;
};
const ClassName kClassNames[] = {{"RmsNorm", "RMSNorm", true},
                                 {"Attention", "Attention", true},
                                 {"GatedMlp", "MLP", true},
                                 {"MoeBlock", "SparseMoeBlock", true},
                                 {"GatedDeltaNet", "GatedDeltaNet", true},
                                 {"RMSNormGated", "RMSNormGated", true},
                                 {"Experts", "Experts", true},
                                 {"Router", "Router", true},
                                 {"Decoder", "Model", true},
                                 {"CausalLM", "ForCausalLM", true},
                                 {"TokenEmbedding", "Embedding", false},
                                 {"torch::nn::LinearImpl", "Linear", false},
                                 {"torch::nn::ModuleListImpl", "ModuleList", false}};

// DeepSeek's router's block: DeepseekV2Moe, DeepseekV3MoE, Glm4MoeMoE.
const char* moe_class_suffix(Family f) {
  return f == Family::kDeepseekV2 ? "Moe" : "MoE";
}

}  // namespace

// Gemma 4's text classes are Gemma4TextAttention, Gemma4TextMLP, Gemma4TextRouter, Gemma4TextExperts,
// Gemma4TextModel (its norm Gemma4RMSNorm).
std::string prefix_of(const ClassName& n, Family f) {
  const std::string theirs = n.theirs;
  const bool text = f == Family::kGemma4 && (theirs == "Attention" || theirs == "MLP" || theirs == "Model" ||
                                             theirs == "Router" || theirs == "Experts");
  return class_prefix(f) + (text ? "Text" : "");
}

std::string hf_class_name(const std::string& ours, Family f) {
  if (f == Family::kGptOss && ours == "MoeBlock") return "GptOssMLP";  // its feed-forward is always sparse
  if (has_grouped_router(f) && ours == "MoeBlock") return class_prefix(f) + moe_class_suffix(f);
  for (const ClassName& n : kClassNames)
    if (ours == n.ours) return n.prefixed ? prefix_of(n, f) + n.theirs : std::string(n.theirs);
  return ours;
}

std::string our_class_name(const std::string& hf, Family f) {
  if (f == Family::kGptOss && hf == "GptOssMLP") return "MoeBlock";
  if (has_grouped_router(f) && hf == class_prefix(f) + moe_class_suffix(f)) return "MoeBlock";
  for (const ClassName& n : kClassNames)
    if (hf == (n.prefixed ? prefix_of(n, f) + n.theirs : std::string(n.theirs))) return n.ours;
  return hf;  // the decoder layer carries the family's own name already (family_names().layer_class)
}

std::vector<const char*> layer_norm_names(NormPlacement placement) {
  switch (placement) {
    case NormPlacement::kPost:
      return {"post_attention_layernorm", "post_feedforward_layernorm"};
    case NormPlacement::kSandwich:
      return {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"};
    case NormPlacement::kPre:
      break;
  }
  return {"input_layernorm", "post_attention_layernorm"};
}

int64_t DecoderConfig::rotary_dim() const {
  if (latent()) return mla.rope_dim;  // the rotated share of each query and the key every head shares
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

int64_t DecoderConfig::positions_computed() const {
  return query_scale_beta > 0 ? std::min(max_position_embeddings, query_scale_positions) : max_position_embeddings;
}

double DecoderConfig::rope_attention_factor() const {
  if (!rope_scaling) return 1.0;
  const RopeScaling& s = *rope_scaling;
  if (s.attention_factor) return *s.attention_factor;
  if (s.type == RopeScaling::Type::kLongRope)
    return s.factor <= 1.0
               ? 1.0
               : std::sqrt(1 + std::log(s.factor) / std::log(static_cast<double>(s.original_max_position_embeddings)));
  if (s.type != RopeScaling::Type::kYarn) return 1.0;
  auto mscale = [&](double m) { return s.factor <= 1 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0; };
  return s.mscale != 0 && s.mscale_all_dim != 0 ? mscale(s.mscale) / mscale(s.mscale_all_dim) : mscale(1.0);
}

bool DecoderConfig::is_moe(int64_t layer) const {
  return moe.num_experts > 0 && layer >= moe.first_k_dense_replace && (layer + 1) % moe.decoder_sparse_step == 0 &&
         std::find(moe.mlp_only_layers.begin(), moe.mlp_only_layers.end(), layer) == moe.mlp_only_layers.end();
}

LayerPlan DecoderConfig::plan(int64_t layer) const {
  LayerPlan p;
  p.moe = is_moe(layer);
  p.linear = is_linear(layer);
  p.window = window_of(layer);
  p.rotary = layer >= static_cast<int64_t>(rope_layers.size()) || rope_layers[layer] != 0;
  p.rope = local_rope_theta > 0 && p.window > 0 ? 1 : 0;
  const bool global = family == Family::kGemma4 && p.window == 0;  // Gemma 4's full-attention layers
  p.head_dim = global ? global_head_dim : head_dim;
  p.kv_heads = global ? global_kv_heads : num_key_value_heads;
  p.k_eq_v = global && attention_k_eq_v;
  // Gemma 4 E2B/E4B: a shared layer takes the last layer of its kind before the shared ones; that
  // layer keeps its keys and values for it.
  const int64_t first_shared = num_hidden_layers - kv_shared_layers;
  auto kind = [&](int64_t l) { return window_of(l) > 0; };
  if (kv_shared_layers > 0 && layer >= first_shared) {
    for (int64_t l = first_shared - 1; l >= 0 && p.kv_source < 0; --l)
      if (kind(l) == kind(layer)) p.kv_source = l;
  } else if (kv_shared_layers > 0) {
    int64_t last = first_shared - 1, takers = 0;
    while (last > layer && kind(last) != kind(layer)) --last;
    for (int64_t l = first_shared; l < num_hidden_layers; ++l) takers += kind(l) == kind(layer) ? 1 : 0;
    p.kv_kept = last == layer && takers > 0;
  }
  p.mlp_width = intermediate_size * (double_wide_mlp && p.kv_source >= 0 ? 2 : 1);
  return p;
}

namespace {

// A layer's latent attention: the query's latent (q_a_proj, its norm, q_b_proj) or q_proj; kv_a_proj_with_mqa, its
// norm, kv_b_proj; o_proj; biases on q_a_proj, kv_a_proj_with_mqa and o_proj with attention_bias.
double latent_attention_parameters(const DecoderConfig& dc) {
  const LatentAttention& a = dc.mla;
  const double c = static_cast<double>(dc.hidden_size), h = static_cast<double>(dc.num_attention_heads);
  const double qr = static_cast<double>(a.q_rank), kvr = static_cast<double>(a.kv_rank),
               rope = static_cast<double>(a.rope_dim), qk = static_cast<double>(a.qk_dim()),
               nope = static_cast<double>(a.nope_dim), v = static_cast<double>(a.v_dim);
  double n = a.q_rank > 0 ? c * qr + qr + qr * h * qk : c * h * qk;
  n += c * (kvr + rope) + kvr + kvr * h * (nope + v) + h * v * c;
  if (dc.attention_bias) n += (a.q_rank > 0 ? qr : 0) + kvr + rope + c;
  return n;
}

// The parameters of the model `c`, each sparse layer's experts counted `experts` at a time.
double count_parameters(const DecoderConfig& dc, double experts) {
  const double c = static_cast<double>(dc.hidden_size), h = static_cast<double>(dc.num_attention_heads);
  // A layer's attention: its heads' width and kv heads, and whether it has a v_proj (Gemma 4's differ).
  auto attention = [&](const LayerPlan& plan) {
    if (dc.latent()) return latent_attention_parameters(dc);
    const double d = static_cast<double>(plan.head_dim), k = static_cast<double>(plan.kv_heads);
    const double kv = plan.kv_source >= 0 ? 0 : plan.k_eq_v ? 1 : 2;  // a layer sharing keys has neither
    const double q_rows = h * d * (dc.attn_output_gate ? 2 : 1);  // a gate beside each head's query
    double attn = c * q_rows + kv * c * k * d + h * d * c;
    if (dc.attention_bias) attn += q_rows + kv * k * d + c;
    if (dc.qkv_bias) attn += h * d + 2 * k * d;
    if (dc.qk_norm) attn += (plan.kv_source >= 0 ? 1 : 2) * d;
    if (dc.qk_norm_whole) attn += h * d + k * d;
    if (dc.attention_sinks) attn += h;
    return attn;
  };
  // A dense MLP of the layer's width (twice intermediate_size in Gemma 4 E2B/E4B's sharing layers).
  auto mlp_of = [&](const LayerPlan& plan) {
    const double width = static_cast<double>(plan.mlp_width);
    return 3 * c * width + (dc.mlp_bias ? 2 * width + c : 0);
  };
  const MoeConfig& m = dc.moe;
  double sparse = static_cast<double>(m.num_experts) * c + experts * 3 * c * static_cast<double>(m.intermediate_size);
  if (m.gpt_oss)  // the router's bias, each expert's biases
    sparse += static_cast<double>(m.num_experts) + experts * (2 * static_cast<double>(m.intermediate_size) + c);
  // The shared expert and its gate (GLM-4.5's shared experts have none; its router's stored bias is a buffer in
  // transformers, not counted).
  if (m.shared_expert_intermediate_size > 0)
    sparse += 3 * c * static_cast<double>(m.shared_expert_intermediate_size) + (m.grouped_router ? 0 : c);
  // Gemma 4's: router.scale and per_expert_scale, three norms of its own (the dense MLP beside it: per layer).
  if (m.gemma4) sparse += c + static_cast<double>(m.num_experts) + 3 * c;
  const double norms = (dc.norms == NormPlacement::kSandwich ? 4 : 2) * c;
  const LinearAttentionConfig& la = dc.linear_attention;
  const double conv = static_cast<double>(la.conv_dim()), values = static_cast<double>(la.value_dim()),
               vh = static_cast<double>(la.value_heads);
  // in_proj_qkv, _z, _b, _a (or qkvz, ba: as many), the convolution, dt_bias, A_log, the gated norm, out_proj
  const double linear = c * (conv + values + 2 * vh) + conv * static_cast<double>(la.conv_kernel) + 2 * vh +
                        static_cast<double>(la.value_head_dim) + values * c;
  // Gemma 4 E2B/E4B's per-layer embeddings: a layer's gate, projection and norm; the table, the
  // projection of the embedding and its norm.
  const double p = static_cast<double>(dc.per_layer_input_dim), n = static_cast<double>(dc.num_hidden_layers);
  const double per_layer = p > 0 ? 2 * c * p + c : 0;
  double layers = p > 0 ? static_cast<double>(dc.per_layer_vocab) * n * p + c * n * p + p : 0;
  for (int64_t l = 0; l < dc.num_hidden_layers; ++l) {
    const LayerPlan plan = dc.plan(l);
    layers += (plan.linear ? linear : attention(plan)) + norms + per_layer + (plan.moe ? sparse : 0) +
              (!plan.moe || m.gemma4 ? mlp_of(plan) : 0);
  }
  return static_cast<double>(dc.vocab_size) * c * (dc.tie_word_embeddings ? 1 : 2) + layers + c;
}

}  // namespace

std::string tensor_parallel_unsplit_parts(const DecoderConfig& c) {
  std::vector<std::string> parts;
  if (c.per_layer_input_dim > 0) parts.push_back("per-layer embeddings (hidden_size_per_layer_input)");
  if (c.kv_shared_layers > 0) parts.push_back("layers sharing keys and values (num_kv_shared_layers)");
  return join(parts, " and ");
}

double DecoderConfig::parameter_count() const {
  return count_parameters(*this, static_cast<double>(moe.num_experts));
}

double DecoderConfig::active_parameter_count() const {
  return count_parameters(*this, static_cast<double>(moe.experts_per_token));
}

int64_t DecoderConfig::num_parameters() const {
  return static_cast<int64_t>(parameter_count());  // exact: parse_decoder_config keeps it below 2^53
}

double DecoderConfig::flops_per_token(int64_t seq_len) const {
  // The input embeddings are looked up, not multiplied (Gemma 4 E2B/E4B's per-layer table too).
  const double n = active_parameter_count() -
                   (tie_word_embeddings ? 0 : static_cast<double>(vocab_size) * static_cast<double>(hidden_size)) -
                   static_cast<double>(per_layer_vocab) * static_cast<double>(num_hidden_layers) *
                       static_cast<double>(per_layer_input_dim);
  double attention = 0;  // a sliding layer's query attends to at most its window's keys
  const LinearAttentionConfig& la = linear_attention;
  const double chunk = static_cast<double>(LinearAttentionConfig::kChunk), dk = static_cast<double>(la.key_head_dim),
               dv = static_cast<double>(la.value_head_dim);
  const double delta_rule = 3.0 * static_cast<double>(la.value_heads) * (chunk * (5 * dk + 3 * dv) + 6 * dk * dv);
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    if (is_linear(l)) {
      attention += delta_rule;
      continue;
    }
    const int64_t w = window_of(l);
    // Each head's scores at its query-key width and their sum at its value width (latent attention's differ).
    const double widths = latent() ? static_cast<double>(mla.qk_dim() + mla.v_dim) : 2.0 * head_dim_of(l);
    attention += 6.0 * num_attention_heads * widths * static_cast<double>(w > 0 ? std::min(w, seq_len) : seq_len);
  }
  return 6.0 * n + attention;
}

namespace {

// What each family's transformers config class gives the fields a config.json leaves out, where that is not what
// the parser takes for an absent field (Llama's: rms_norm_eps 1e-6, max_position_embeddings 2048, rope_theta 10000,
// as many kv heads as heads, head_dim hidden_size / heads, no token ids). Filled in before the file is read, so the
// model is the one transformers builds from the same file, and the export writes them.
json class_defaults(Family f) {
  switch (f) {
    case Family::kLlama:
    case Family::kGranite:
      return {{"bos_token_id", 1}, {"eos_token_id", 2}};
    case Family::kMistral:
      return {{"max_position_embeddings", 131072},
              {"num_key_value_heads", 8},
              {"sliding_window", 4096},
              {"bos_token_id", 1},
              {"eos_token_id", 2}};
    case Family::kMinistral3:  // its rope_parameters' (YaRN and the query scale): parse_rope
      return {{"max_position_embeddings", 262144},
              {"num_key_value_heads", 8},
              {"head_dim", 128},
              {"rms_norm_eps", 1e-5},
              {"pad_token_id", 11},
              {"bos_token_id", 1},
              {"eos_token_id", 2}};
    case Family::kQwen2:
      return {{"max_position_embeddings", 32768}, {"max_window_layers", 28}, {"num_key_value_heads", 32}};
    case Family::kQwen2Moe:
      return {{"max_position_embeddings", 32768}, {"max_window_layers", 28}, {"num_key_value_heads", 16}};
    case Family::kQwen3:
      return {{"max_position_embeddings", 32768},
              {"max_window_layers", 28},
              {"num_key_value_heads", 32},
              {"head_dim", 128}};
    case Family::kGemma2:
      return {{"max_position_embeddings", 8192},
              {"num_key_value_heads", 4},
              {"head_dim", 256},
              {"sliding_window", 4096},
              {"pad_token_id", 0},
              {"bos_token_id", 2},
              {"eos_token_id", 1}};
    case Family::kGemma3:
    case Family::kGemma4:
      return {{"max_position_embeddings", 131072},
              {"num_key_value_heads", 4},
              {"head_dim", 256},
              {"sliding_window", f == Family::kGemma3 ? 4096 : 512},
              {"rope_theta", 1e6},
              {"pad_token_id", 0},
              {"bos_token_id", 2},
              {"eos_token_id", 1}};
    case Family::kOlmo2:
      return {{"rms_norm_eps", 1e-5}, {"pad_token_id", 1}, {"eos_token_id", 50279}};
    case Family::kOlmo3:
      return {{"rms_norm_eps", 1e-5},
              {"sliding_window", 4096},
              {"rope_theta", 500000.0},
              {"pad_token_id", 1},
              {"eos_token_id", 50279}};
    case Family::kSmolLM3:
      return {{"max_position_embeddings", 32768}, {"num_key_value_heads", 4}, {"rope_theta", 2e6},
              {"pad_token_id", 128004},           {"bos_token_id", 128000},   {"eos_token_id", 128001}};
    case Family::kPhi3:
      return {{"rms_norm_eps", 1e-5},
              {"max_position_embeddings", 4096},
              {"pad_token_id", 32000},
              {"bos_token_id", 1},
              {"eos_token_id", 32000}};
    case Family::kQwen3Moe:
      return {{"max_position_embeddings", 32768}, {"num_key_value_heads", 4}};
    case Family::kMixtral:
      return {{"rms_norm_eps", 1e-5},     {"max_position_embeddings", 131072},
              {"num_key_value_heads", 8}, {"rope_theta", 1e6},
              {"bos_token_id", 1},        {"eos_token_id", 2}};
    case Family::kQwen3_5:
      return {{"max_position_embeddings", 32768}, {"num_key_value_heads", 4}, {"head_dim", 256}};
    case Family::kQwen3Next:
    case Family::kQwen3_5Moe:
      return {{"max_position_embeddings", 32768}, {"num_key_value_heads", 2}, {"head_dim", 256}};
    case Family::kGptOss:
      return {{"rms_norm_eps", 1e-5},     {"max_position_embeddings", 131072},
              {"num_key_value_heads", 8}, {"head_dim", 64},
              {"sliding_window", 128},    {"rope_theta", 150000.0}};
    case Family::kGlm4Moe:  // its head_dim, not a field of the class, is hidden_size / heads unless written
      return {{"rms_norm_eps", 1e-5}, {"max_position_embeddings", 131072}, {"num_key_value_heads", 8}};
    // Their kv heads are the heads (parse_latent_attention), whatever the class's default.
    case Family::kDeepseekV2:
      return {{"bos_token_id", 1}, {"eos_token_id", 2}};
    case Family::kDeepseekV3:
      return {{"max_position_embeddings", 4096}, {"bos_token_id", 0}, {"eos_token_id", 1}};
    case Family::kGlm4MoeLite:
      return {{"rms_norm_eps", 1e-5}, {"max_position_embeddings", 202752}, {"bos_token_id", 0}, {"eos_token_id", 1}};
  }
  return json::object();
}

// Gemma3TextConfig's defaults for the fields a Gemma3ForConditionalGeneration folder's text_config
// may leave out (the released ones write only what differs from them).
const std::pair<const char*, json> kGemma3TextDefaults[] = {
    {"vocab_size", 262208},      {"hidden_size", 2304},
    {"intermediate_size", 9216}, {"num_hidden_layers", 26},
    {"num_attention_heads", 8},  {"num_key_value_heads", 4},
    {"head_dim", 256},           {"max_position_embeddings", 131072},
    {"pad_token_id", 0},         {"bos_token_id", 2},
    {"eos_token_id", 1}};

// Qwen3_5TextConfig's, likewise, for a Qwen3_5ForConditionalGeneration folder's text_config.
const std::pair<const char*, json> kQwen3_5TextDefaults[] = {
    {"vocab_size", 248320},      {"hidden_size", 4096},          {"intermediate_size", 12288},
    {"num_hidden_layers", 32},   {"num_attention_heads", 16},    {"num_key_value_heads", 4},
    {"head_dim", 256},           {"max_position_embeddings", 32768}};

// Qwen3_5MoeTextConfig's.
const std::pair<const char*, json> kQwen3_5MoeTextDefaults[] = {
    {"vocab_size", 248320},      {"hidden_size", 2048},          {"num_hidden_layers", 40},
    {"num_attention_heads", 16}, {"num_key_value_heads", 2},     {"head_dim", 256},
    {"max_position_embeddings", 32768}};

// Gemma4TextConfig's (per-layer embeddings on: a dense model's text_config turns them off).
const std::pair<const char*, json> kGemma4TextDefaults[] = {
    {"vocab_size", 262144},      {"hidden_size", 2304},
    {"intermediate_size", 9216}, {"num_hidden_layers", 30},
    {"num_attention_heads", 8},  {"num_key_value_heads", 4},
    {"head_dim", 256},           {"max_position_embeddings", 131072},
    {"pad_token_id", 0},         {"bos_token_id", 2},
    {"eos_token_id", 1},         {"hidden_size_per_layer_input", 256}};

// A multimodal folder whose text model fsdptrain trains: its model_type and architecture, the text
// model's model_type and the defaults its text_config may leave out.
struct Multimodal {
  const char* model_type;
  const char* architecture;
  const char* text_model_type;
  const std::pair<const char*, json>* defaults;
  size_t n_defaults;
  const char* other_text_model_type = nullptr;  // another its text_config may be (its own defaults)
};
const Multimodal kMultimodal[] = {
    {"gemma3", "Gemma3ForConditionalGeneration", "gemma3_text", kGemma3TextDefaults, std::size(kGemma3TextDefaults)},
    {"gemma4", "Gemma4ForConditionalGeneration", "gemma4_text", kGemma4TextDefaults, std::size(kGemma4TextDefaults)},
    {"qwen3_5", "Qwen3_5ForConditionalGeneration", "qwen3_5_text", kQwen3_5TextDefaults,
     std::size(kQwen3_5TextDefaults)},
    {"qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe_text", kQwen3_5MoeTextDefaults,
     std::size(kQwen3_5MoeTextDefaults)},
    // Mistral Small 3.1/3.2, Magistral Small: a MistralConfig text_config; Ministral 3's, a Ministral3Config (each
    // its class's defaults).
    {"mistral3", "Mistral3ForConditionalGeneration", "mistral", nullptr, 0, "ministral3"}};

const Multimodal* multimodal_of(const json& j) {
  const std::string type = j.value("model_type", std::string());
  const json arch = j.value("architectures", json());
  for (const Multimodal& m : kMultimodal) {
    if (type == m.model_type) return &m;
    if (type.empty() && arch.is_array() && !arch.empty() && arch[0] == m.architecture) return &m;
  }
  return nullptr;
}

// A multimodal folder's config: its text_config (with the ids and dtype written beside it, and the
// text config class's defaults for what it leaves out) as the text model's.
DecoderConfig parse_text_config(const json& j, const Multimodal& mm, const std::string& where,
                                std::vector<std::string>* warnings) {
  json t = j.value("text_config", json());
  FSDP_CHECK(t.is_object(), where, ": a ", mm.architecture, " config.json (model_type \"", mm.model_type,
             "\") needs its text_config");
  const std::string text_type = t.value("model_type", std::string(mm.text_model_type));
  const bool other = mm.other_text_model_type != nullptr && text_type == mm.other_text_model_type;
  FSDP_CHECK(text_type == mm.text_model_type || other, where, ": a ", mm.architecture, " folder whose text_config is ",
             quoted(text_type), ": fsdptrain reads its text model when it is ", quoted(mm.text_model_type),
             mm.other_text_model_type ? str(" or ", quoted(mm.other_text_model_type)) : std::string(),
             " (the text models of the families in the README's Model families)");
  t["model_type"] = text_type;
  t.erase("architectures");
  for (const char* key : {"tie_word_embeddings", "pad_token_id", "bos_token_id", "eos_token_id", "torch_dtype", "dtype",
                          "quantization_config"})
    if (!t.contains(key) && j.contains(key)) t[key] = j[key];
  for (size_t i = 0; i < (other ? 0 : mm.n_defaults); ++i)
    if (!t.contains(mm.defaults[i].first)) t[mm.defaults[i].first] = mm.defaults[i].second;
  DecoderConfig c = parse_decoder_config(t.dump(), where + " (text_config)", warnings);
  c.text_of_multimodal = true;
  c.multimodal_architecture = mm.architecture;
  return c;
}

// Latent attention's scores' factor: (qk_nope_head_dim + qk_rope_head_dim)^-1/2, times yarn's mscale_all_dim term
// squared (0.1 mscale_all_dim ln(factor) + 1) when the scaling has one, as transformers' yarn_apply_mscale.
double latent_scale(const DecoderConfig& c) {
  double scale = 1.0 / std::sqrt(static_cast<double>(c.mla.qk_dim()));
  if (const auto& s = c.rope_scaling; s && s->mscale_all_dim != 0 && s->factor > 1) {
    const double m = 0.1 * s->mscale_all_dim * std::log(s->factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

// How the folder's weights are stored: torch_dtype (either spelling), and quantization_config. Block FP8 and
// gpt-oss's MXFP4 experts are read dequantized; no other method's weights can be read.
void parse_storage(const json& j, const std::string& where, DecoderConfig& c) {
  if (auto d = j.find("dtype"); d != j.end() && d->is_string())
    c.dtype = *d;
  else if (auto t = j.find("torch_dtype"); t != j.end() && t->is_string())
    c.dtype = *t;
  const auto q = j.find("quantization_config");
  if (q == j.end() || q->is_null()) return;
  const std::string method = q->is_object() && q->contains("quant_method") && q->at("quant_method").is_string()
                                 ? q->at("quant_method").get<std::string>()
                                 : "";
  if (method == "mxfp4" && c.moe.gpt_oss) return;  // the experts' *_blocks and *_scales (FolderLayout::mxfp4)
  FSDP_CHECK(method == "fp8", where, ": quantization_config ", q->dump(),
             " is not a format fsdptrain reads: it reads unquantized weights (bf16, fp16, fp32), block FP8 "
             "(quant_method \"fp8\", as DeepSeek-V3's and the Qwen *-FP8 folders) and gpt-oss's MXFP4 experts. Give "
             "the unquantized model's folder (its name without the quantization's suffix, such as -GPTQ or -AWQ)");
  const json scheme = q->value("activation_scheme", json("dynamic"));  // any JSON: quoted as it is when refused
  FSDP_CHECK(scheme == "dynamic", where, ": quantization_config's activation_scheme ", scheme.dump(),
             " is not read: fsdptrain trains the FP8 folders whose activations are scaled as they run (\"dynamic\"), "
             "as DeepSeek-V3's and Qwen's are");
  const json block = q->value("weight_block_size", json::array({128, 128}));  // FineGrainedFP8Config's default
  const bool valid =
      block.is_array() && block.size() == 2 &&
      std::all_of(block.begin(), block.end(), [](const json& b) { return b.is_number_integer() && b > 0; });
  FSDP_CHECK(valid, where, ": quantization_config's weight_block_size ", block.dump(),
             " must be two positive integers, the rows and columns each scale covers ([128, 128] in DeepSeek-V3's and "
             "Qwen's folders)");
  c.fp8_block = {block[0].get<int64_t>(), block[1].get<int64_t>()};
}

}  // namespace

DecoderConfig parse_decoder_config(const std::string& text, const std::string& where,
                                   std::vector<std::string>* warnings) {
  json j = parse_json(text, where);
  FSDP_CHECK(j.is_object(), where, ": expected a JSON object (a Hugging Face config.json)");
  if (const Multimodal* mm = multimodal_of(j)) return parse_text_config(j, *mm, where, warnings);
  DecoderConfig c;
  c.family = family_of(j, where);
  const json defaults = class_defaults(c.family);
  for (const auto& [key, value] : defaults.items())
    if (!j.contains(key)) j[key] = value;
  if (c.family == Family::kQwen3_5Moe && !j.contains("intermediate_size")) {
    // Its class has no dense MLP (every layer is sparse) and no intermediate_size: the expert's width stands in.
    json filled = j;
    filled["intermediate_size"] = j.value("moe_intermediate_size", json(512));
    return parse_decoder_config(filled.dump(), where, warnings);
  }
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
  // At once: 2^31 layers took the launcher 100 s to refuse by memory, walking every layer.
  FSDP_CHECK(c.num_hidden_layers <= kMaxLayers, where, ": num_hidden_layers is ", c.num_hidden_layers,
             "; no model is that large (the deepest decoders have a few hundred layers; fsdptrain takes up to ",
             kMaxLayers, "). Check the field");
  // As transformers' LlamaConfig: the heads split hidden_size evenly, head_dim given or not. Its
  // relatives take head_dim as given (Qwen3's is independent of hidden_size).
  // Latent attention's heads have widths of their own (parse_latent_attention).
  // DeepseekV2Config refuses heads that do not split hidden_size, though its attention never splits it.
  const bool explicit_head_dim =
      c.family != Family::kDeepseekV2 &&
      (is_latent(c.family) || (c.family != Family::kLlama && j.contains("head_dim") && !j["head_dim"].is_null()));
  FSDP_CHECK(explicit_head_dim || c.hidden_size % c.num_attention_heads == 0, where, ": hidden_size ", c.hidden_size,
             " is not a multiple of num_attention_heads ", c.num_attention_heads,
             "; transformers refuses this config too. Change one of the two");
  c.head_dim = field<int64_t>(j, "head_dim", c.hidden_size / c.num_attention_heads, where);
  parse_latent_attention(j, where, c);
  c.max_position_embeddings = field<int64_t>(j, "max_position_embeddings", c.max_position_embeddings, where);
  c.rms_norm_eps = field<double>(j, "rms_norm_eps", c.rms_norm_eps, where);
  c.attention_bias = field<bool>(j, "attention_bias", c.family == Family::kGptOss, where);
  c.mlp_bias = field<bool>(j, "mlp_bias", false, where);
  c.qkv_bias = c.family == Family::kQwen2 ||
               (c.family == Family::kQwen2Moe && field<bool>(j, "qkv_bias", true, where));
  FSDP_CHECK(c.family == Family::kQwen2Moe || !j.contains("qkv_bias") || j["qkv_bias"].is_null(), where,
             ": qkv_bias is a field of Qwen2MoeForCausalLM, not of ", family_names(c.family).architecture,
             "; remove it");
  c.qk_norm = c.family == Family::kQwen3 || c.family == Family::kGemma3 || c.family == Family::kGemma4 ||
              c.family == Family::kQwen3Moe || is_hybrid(c.family) ||
              (c.family == Family::kGlm4Moe && field<bool>(j, "use_qk_norm", false, where));
  if (c.family == Family::kGlm4Moe) {  // its attention_bias is q/k/v's alone (o_proj has none), as Qwen2's
    c.qkv_bias = c.attention_bias;
    c.attention_bias = false;
  }
  c.fused_projections = c.family == Family::kPhi3;
  if (c.family == Family::kMistral || c.family == Family::kMinistral3 || c.family == Family::kQwen2 ||
      c.family == Family::kPhi3 || c.family == Family::kQwen2Moe || c.family == Family::kMixtral)  // not their fields
    FSDP_CHECK(!c.attention_bias && !c.mlp_bias, where, ": attention_bias/mlp_bias are not fields of ",
               family_names(c.family).architecture, "; transformers ignores them, so remove them");
  FSDP_CHECK(!(is_hybrid(c.family) || has_grouped_router(c.family)) || !c.mlp_bias, where,
             ": mlp_bias is not a field of ", family_names(c.family).architecture,
             "; transformers ignores it, so remove it");
  parse_rope_layers(j, where, c);
  parse_sliding_window(j, where, c);
  parse_gemma4(j, where, c);
  parse_moe(j, where, c);
  parse_linear_attention(j, where, c);
  parse_form(j, where, c);
  const bool tied_by_default = is_any_gemma(c.family) || c.family == Family::kSmolLM3;
  c.tie_word_embeddings = field<bool>(j, "tie_word_embeddings", tied_by_default, where);
  c.initializer_range = field<double>(j, "initializer_range", c.initializer_range, where);
  // The ids as written, or the class's (class_defaults); a pad id past the vocabulary pads no row.
  if (const int64_t pad = field<int64_t>(j, "pad_token_id", -1, where); pad >= 0 && pad < c.vocab_size)
    c.pad_token_id = pad;
  for (const auto& [key, text] :
       {std::pair{"pad_token_id", &c.pad_token_id_json}, std::pair{"bos_token_id", &c.bos_token_id_json},
        std::pair{"eos_token_id", &c.eos_token_id_json}})
    if (const auto it = j.find(key); it != j.end() && !it->is_null()) *text = it->dump();
  parse_storage(j, where, c);
  check_positive(where, {{"head_dim", c.head_dim}, {"max_position_embeddings", c.max_position_embeddings}});
  parse_partial_rotary(j, where, c);
  parse_rope(j, where, c);
  if (c.latent()) c.attention_scale = latent_scale(c);
  FSDP_CHECK(c.rms_norm_eps > 0 && c.rope_theta > 0 && c.initializer_range >= 0, where, ": rms_norm_eps (",
             c.rms_norm_eps, ") and rope_theta (", c.rope_theta, ") must be > 0 and initializer_range (",
             c.initializer_range, ") >= 0");
  FSDP_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, where, ": num_attention_heads ", c.num_attention_heads,
             " must be a multiple of num_key_value_heads ", c.num_key_value_heads);
  FSDP_CHECK(c.head_dim % 2 == 0, where, ": head_dim ", c.head_dim, " must be even for rotary embeddings");
  for (const char* key : {"attention_dropout", "resid_pdrop", "embd_pdrop"})
    FSDP_CHECK(field<double>(j, key, 0.0, where) == 0.0, where, ": ", key, " ", j[key].dump(),
               " is not supported; fsdptrain trains without dropout (set it to 0.0)");
  // Far past any model (a quadrillion parameters), and past what a double counts exactly: sizes
  // this large are a mistake, refused before anything is built from them.
  FSDP_CHECK(c.parameter_count() < 1e15, where, ": these sizes make ", c.parameter_count(), " parameters (hidden_size ",
             c.hidden_size, ", intermediate_size ", c.intermediate_size, ", num_hidden_layers ", c.num_hidden_layers,
             ", vocab_size ", c.vocab_size, "); no model is that large. Check those fields");
  std::vector<std::string> unknown = check_fields(j, where);  // after the fields' own type errors
  if (warnings) warnings->insert(warnings->end(), unknown.begin(), unknown.end());
  return c;
}

DecoderConfig load_llama_config(const std::string& path, std::vector<std::string>* warnings) {
  std::ifstream in(path);
  FSDP_CHECK(in.good(), "[model] cannot read ", quoted(path),
             "; give a Hugging Face config.json (see configs/models/)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_decoder_config(ss.str(), path, warnings);
}

namespace {

// The family's own fields of the layer's form: Gemma's caps and scale, Granite's multipliers, the
// windows and their switches, SmolLM3's NoPE layers.
void write_form(json& j, const DecoderConfig& c) {
  if (is_gemma(c.family)) {
    j.erase("mlp_bias");
    j["hidden_activation"] = j["hidden_act"];
    j.erase("hidden_act");
    // An int in transformers' GemmaConfig classes (a float is refused there): written as one when whole.
    const double scalar = c.query_pre_attn_scalar;
    j["query_pre_attn_scalar"] =
        scalar == std::floor(scalar) && scalar < 1e15 ? json(static_cast<int64_t>(scalar)) : json(scalar);
    j["attn_logit_softcapping"] = c.attn_softcap > 0 ? json(c.attn_softcap) : json(nullptr);
    j["final_logit_softcapping"] = c.final_softcap > 0 ? json(c.final_softcap) : json(nullptr);
  }
  if (c.family == Family::kGemma4) {  // its switches as transformers saves them
    j.erase("mlp_bias");
    j["hidden_activation"] = j["hidden_act"];
    j.erase("hidden_act");
    j["final_logit_softcapping"] = c.final_softcap > 0 ? json(c.final_softcap) : json(nullptr);
    j["attention_k_eq_v"] = c.attention_k_eq_v;
    j["hidden_size_per_layer_input"] = c.per_layer_input_dim;
    if (c.per_layer_input_dim > 0) j["vocab_size_per_layer_input"] = c.per_layer_vocab;
    j["num_kv_shared_layers"] = c.kv_shared_layers;
    j["enable_moe_block"] = c.moe.gemma4;
    if (c.moe.gemma4) {
      j["num_experts"] = c.moe.num_experts;
      j["top_k_experts"] = c.moe.experts_per_token;
      j["moe_intermediate_size"] = c.moe.intermediate_size;
    }
    j["use_double_wide_mlp"] = c.double_wide_mlp;
    j["use_bidirectional_attention"] = nullptr;
    json per_layer = json::object();
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      if (c.window_of(l) == 0)
        per_layer[std::to_string(l)] = {{"head_dim", c.global_head_dim}, {"num_key_value_heads", c.global_kv_heads}};
    j["per_layer_config"] = per_layer;
  }
  if (c.family == Family::kGranite) {
    j["embedding_multiplier"] = c.embedding_scale;
    j["attention_multiplier"] = c.attention_scale;
    j["residual_multiplier"] = c.residual_multiplier;
    j["logits_scaling"] = c.logits_scaling;
  }
  const bool windowed = c.family != Family::kLlama && c.family != Family::kOlmo2 && c.family != Family::kGranite &&
                        !has_grouped_router(c.family);
  if (windowed) j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  if (window_is_switched(c.family)) j["use_sliding_window"] = c.use_sliding_window;
  if (c.family == Family::kQwen2 || c.family == Family::kQwen3 || c.family == Family::kQwen2Moe)
    j["max_window_layers"] = c.max_window_layers;
  if (windowed && !window_is_uniform(c.family)) {
    json types = json::array();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      types.push_back(c.window_of(i) > 0 ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  if (is_hybrid(c.family)) {
    const LinearAttentionConfig& l = c.linear_attention;
    j["linear_num_key_heads"] = l.key_heads;
    j["linear_num_value_heads"] = l.value_heads;
    j["linear_key_head_dim"] = l.key_head_dim;
    j["linear_value_head_dim"] = l.value_head_dim;
    j["linear_conv_kernel_dim"] = l.conv_kernel;
    json types = json::array();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) types.push_back(c.is_linear(i) ? "linear_attention" : "full_attention");
    j["layer_types"] = types;
  }
  if (c.family == Family::kGlm4Moe) {  // its attention_bias is q/k/v's; its q/k norms switched
    j["attention_bias"] = c.qkv_bias;
    j["use_qk_norm"] = c.qk_norm;
  }
  if (c.latent()) {  // head_dim is qk_rope_head_dim in these classes
    const LatentAttention& a = c.mla;
    j["q_lora_rank"] = a.q_rank > 0 ? json(a.q_rank) : json(nullptr);
    j["kv_lora_rank"] = a.kv_rank;
    j["qk_nope_head_dim"] = a.nope_dim;
    j["qk_rope_head_dim"] = a.rope_dim;
    j["v_head_dim"] = a.v_dim;
    if (c.family != Family::kDeepseekV2) j["rope_interleave"] = a.interleave;  // not its class's: always pairs
    j["head_dim"] = a.rope_dim;
  }
  if (c.family == Family::kSmolLM3) {
    j["no_rope_layers"] = c.rope_layers;
    j["no_rope_layer_interval"] = c.no_rope_layer_interval;
  }
}

// The mixture of experts' fields, as the family names them.
void write_moe(json& j, const DecoderConfig& c) {
  const MoeConfig& m = c.moe;
  if (c.family == Family::kMixtral) {
    j["num_local_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.experts_per_token;
    j["router_jitter_noise"] = 0.0;
  } else if (c.family == Family::kGptOss) {
    j["num_local_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.experts_per_token;
    j["swiglu_limit"] = m.swiglu_limit;
    j["swiglu_alpha"] = m.swiglu_alpha;
  } else if (has_grouped_router(c.family)) {  // no auxiliary loss: the classes have neither field
    j["n_routed_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.experts_per_token;
    j["moe_intermediate_size"] = m.intermediate_size;
    j["n_shared_experts"] = m.shared_expert_intermediate_size / m.intermediate_size;
    j["routed_scaling_factor"] = m.routed_scaling_factor;
    j["n_group"] = m.n_group > 0 ? json(m.n_group) : json(nullptr);  // DeepSeek-V2's greedy: as written
    j["topk_group"] = m.topk_group > 0 ? json(m.topk_group) : json(nullptr);
    if (m.softmax_scores) j["topk_method"] = m.group_limited ? "group_limited_greedy" : "greedy";
    if (c.family == Family::kGlm4MoeLite) {  // its class reads the layers' kinds
      json types = json::array();
      for (int64_t l = 0; l < c.num_hidden_layers; ++l) types.push_back(c.is_moe(l) ? "sparse" : "dense");
      j["mlp_layer_types"] = types;
    } else {
      j["first_k_dense_replace"] = m.first_k_dense_replace;
    }
    j["norm_topk_prob"] = m.norm_topk_prob;
    // An export holds no multi-token-prediction layers (DeepSeek-V2 has none).
    if (!m.softmax_scores) j["num_nextn_predict_layers"] = 0;
    return;
  } else if (c.family == Family::kQwen3Next && m.num_experts == 0) {
    j["num_experts"] = 0;
    return;
  } else if (c.family == Family::kQwen3_5Moe) {
    j["num_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.experts_per_token;
    j["moe_intermediate_size"] = m.intermediate_size;
    j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
    j.erase("intermediate_size");  // not a field of its class: every layer is sparse
  } else if (is_qwen_moe(c.family) || c.family == Family::kQwen3Next) {
    j["num_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.experts_per_token;
    j["moe_intermediate_size"] = m.intermediate_size;
    j["norm_topk_prob"] = m.norm_topk_prob;
    j["decoder_sparse_step"] = m.decoder_sparse_step;
    j["mlp_only_layers"] = m.mlp_only_layers;
    if (c.family == Family::kQwen2Moe) j["qkv_bias"] = c.qkv_bias;
    if (m.shared_expert_intermediate_size > 0)
      j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
  } else {
    return;
  }
  j["router_aux_loss_coef"] = m.router_aux_loss_coef;
  j["output_router_logits"] = m.output_router_logits;
}

// One scaling as rope_scaling holds it: the type's own fields, as they were given.
json scaling_json(const RopeScaling& s) {
  using T = RopeScaling::Type;
  const char* type = s.type == T::kLinear         ? "linear"
                     : s.type == T::kDynamic      ? "dynamic"
                     : s.type == T::kYarn         ? "yarn"
                     : s.type == T::kLongRope     ? "longrope"
                     : s.type == T::kProportional ? "proportional"
                                                  : "llama3";
  json out = {{"rope_type", type}};
  if (s.type == T::kProportional) {
    out["partial_rotary_factor"] = s.rotated_share;
    if (s.factor_written) out["factor"] = s.factor;
    return out;
  }
  if (s.factor_written) out["factor"] = s.factor;
  if (s.type == T::kLinear || s.type == T::kDynamic) return out;
  out["original_max_position_embeddings"] = s.original_max_position_embeddings;
  if (s.attention_factor) out["attention_factor"] = *s.attention_factor;
  if (s.type == T::kLlama3) {
    out["low_freq_factor"] = s.low_freq_factor;
    out["high_freq_factor"] = s.high_freq_factor;
  } else if (s.type == T::kYarn) {
    out["beta_fast"] = s.beta_fast;
    out["beta_slow"] = s.beta_slow;
    out["truncate"] = s.truncate;
    if (s.mscale != 0) out["mscale"] = s.mscale;
    if (s.mscale_all_dim != 0) out["mscale_all_dim"] = s.mscale_all_dim;
  } else {
    out["short_factor"] = s.short_factor;
    out["long_factor"] = s.long_factor;
  }
  return out;
}

// RoPE as the family writes it: rope_theta + rope_scaling, or Gemma 3's table per layer type;
// Phi-3's partial rotation and its top-level original_max_position_embeddings (which its config
// class reads before the scaling's).
void write_rope(json& j, const DecoderConfig& c) {
  const json scaling = c.rope_scaling ? scaling_json(*c.rope_scaling) : json(nullptr);
  if (c.family == Family::kPhi3) {
    j["partial_rotary_factor"] = c.partial_rotary_factor;
    if (c.rope_scaling) j["original_max_position_embeddings"] = c.rope_scaling->original_max_position_embeddings;
  }
  if (c.family == Family::kMinistral3) {  // v5's one object, with the query scale Ministral3Attention reads from it
    json rope = scaling.is_null() ? json{{"rope_type", "default"}} : scaling;
    rope["rope_theta"] = c.rope_theta;
    rope["llama_4_scaling_beta"] = c.query_scale_beta;
    rope["original_max_position_embeddings"] = c.query_scale_positions;
    j.erase("rope_theta");
    j["rope_parameters"] = rope;
    return;
  }
  // transformers v5's one object, the partial rotation in it
  if (is_hybrid(c.family) || has_grouped_router(c.family)) {
    json rope = scaling.is_null() ? json{{"rope_type", "default"}} : scaling;
    rope["rope_theta"] = c.rope_theta;
    if (!c.latent()) rope["partial_rotary_factor"] = c.partial_rotary_factor;  // latent attention rotates its share
    j.erase("rope_theta");
    j["rope_parameters"] = rope;
  } else if (c.family == Family::kGemma3 || c.family == Family::kGemma4 ||
             c.family == Family::kOlmo3) {  // one table per layer type, as v5 writes them
    json full = scaling.is_null() ? json{{"rope_type", "default"}} : scaling;
    full["rope_theta"] = c.rope_theta;
    j.erase("rope_theta");
    j["rope_parameters"] = {{"full_attention", full},
                            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", c.local_rope_theta}}}};
  } else {
    j["rope_scaling"] = scaling;
  }
}

}  // namespace

std::string decoder_config_json(const DecoderConfig& c) {
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
            {"hidden_act", c.activation == Activation::kSilu ? "silu" : "gelu_pytorch_tanh"},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"attention_bias", c.attention_bias},
            {"attention_dropout", 0.0},
            {"mlp_bias", c.mlp_bias},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"initializer_range", c.initializer_range},
            {"pad_token_id", !c.pad_token_id_json.empty() ? json::parse(c.pad_token_id_json)
                             : c.pad_token_id >= 0        ? json(c.pad_token_id)
                                                          : json(nullptr)},
            {"bos_token_id", c.bos_token_id_json.empty() ? json(nullptr) : json::parse(c.bos_token_id_json)},
            {"eos_token_id", c.eos_token_id_json.empty() ? json(nullptr) : json::parse(c.eos_token_id_json)},
            {"torch_dtype", c.dtype},
            {"dtype", c.dtype}};
  if (c.family == Family::kMistral || c.family == Family::kMinistral3 || c.family == Family::kQwen2 ||
      c.family == Family::kPhi3 || c.family == Family::kQwen2Moe || c.family == Family::kMixtral) {
    j.erase("attention_bias");
    j.erase("mlp_bias");
  }
  if (is_hybrid(c.family) || c.family == Family::kGptOss || has_grouped_router(c.family)) j.erase("mlp_bias");
  write_moe(j, c);
  write_form(j, c);
  write_rope(j, c);
  return j.dump(2) + "\n";
}

namespace {

// config.json as checkpoints and exports write it: fp32, so two configs compare as text.
std::string canonical_json(DecoderConfig c) {
  c.dtype = "float32";
  return decoder_config_json(c);
}

// A layer's latent attention, in the order AttentionImpl registers it.
void describe_latent_attention(ModelDescription& d, const DecoderConfig& c, const std::string& a) {
  const LatentAttention& m = c.mla;
  const int64_t C = c.hidden_size, H = c.num_attention_heads;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) { d.params.push_back({name, shape, {}}); };
  auto linear = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
    add(name + ".weight", {out, in});
    if (bias) add(name + ".bias", {out});
  };
  if (m.q_rank > 0) {
    linear(a + "q_a_proj", C, m.q_rank, c.attention_bias);
    add(a + "q_a_layernorm.weight", {m.q_rank});
    linear(a + "q_b_proj", m.q_rank, H * m.qk_dim(), false);
  } else {
    linear(a + "q_proj", C, H * m.qk_dim(), false);
  }
  linear(a + "kv_a_proj_with_mqa", C, m.kv_rank + m.rope_dim, c.attention_bias);
  add(a + "kv_a_layernorm.weight", {m.kv_rank});
  linear(a + "kv_b_proj", m.kv_rank, H * (m.nope_dim + m.v_dim), false);
  linear(a + "o_proj", H * m.v_dim, C, c.attention_bias);
}

// A layer's feed-forward, in the order the modules register them: Gemma 4's dense MLP, router and
// stacked experts beside it (its norms follow the layer's); gpt-oss's router and experts as
// transformers holds them (the Hub's MXFP4 blocks and scales read dequantized); the router, the
// experts stacked (the Hub's folders hold them one by one) and a shared expert; or the dense MLP.
void describe_feed_forward(ModelDescription& d, const DecoderConfig& c, int64_t l, const std::string& p) {
  const int64_t C = c.hidden_size, F = c.plan(l).mlp_width;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) { d.params.push_back({name, shape, {}}); };
  auto linear = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
    add(name + ".weight", {out, in});
    if (bias) add(name + ".bias", {out});
  };
  if (c.is_moe(l) && c.moe.gemma4) {  // the dense MLP, then the router and the experts beside it, as stored
    const int64_t E = c.moe.num_experts, I = c.moe.intermediate_size;
    linear(p + "mlp.gate_proj", C, F, false);
    linear(p + "mlp.up_proj", C, F, false);
    linear(p + "mlp.down_proj", F, C, false);
    add(p + "router.scale", {C});
    add(p + "router.per_expert_scale", {E});
    linear(p + "router.proj", C, E, false);
    add(p + "experts.gate_up_proj", {E, 2 * I, C});
    add(p + "experts.down_proj", {E, C, I});
  } else if (c.is_moe(l) && c.moe.gpt_oss) {  // as transformers holds them: (in, out), with biases
    const int64_t E = c.moe.num_experts, I = c.moe.intermediate_size;
    const std::string m = p + "mlp.", x = m + "experts.";
    linear(m + "router", C, E, true);
    add(x + "gate_up_proj", {E, C, 2 * I});
    add(x + "gate_up_proj_bias", {E, 2 * I});
    add(x + "down_proj", {E, I, C});
    add(x + "down_proj_bias", {E, C});
    d.layout.mxfp4.push_back(x + "gate_up_proj");  // the Hub's checkpoints: MXFP4 blocks and scales
    d.layout.mxfp4.push_back(x + "down_proj");
  } else if (c.is_moe(l)) {
    // The router, the experts stacked (the Hub's folders hold them one by one), a shared expert.
    const int64_t E = c.moe.num_experts, I = c.moe.intermediate_size;
    const std::string m = p + "mlp.", x = m + "experts.";
    linear(m + "gate", C, E, false);
    // GLM-4.5's and DeepSeek-V3's: stored, never trained (DeepSeek-V2's softmax scores take none).
    if (c.moe.grouped_router && !c.moe.softmax_scores) add(m + "gate.e_score_correction_bias", {E});
    add(x + "gate_up_proj", {E, 2 * I, C});
    add(x + "down_proj", {E, C, I});
    // The Hub's names: experts.N.{gate,up,down}_proj (Qwen), block_sparse_moe.experts.N.{w1,w3,w2} (Mixtral).
    const bool mixtral = c.family == Family::kMixtral;
    const std::string hub = mixtral ? p + "block_sparse_moe.experts." : x;
    StackedTensor gate_up{x + "gate_up_proj", {}}, down{x + "down_proj", {}};
    for (int64_t e = 0; e < E; ++e) {
      const std::string n = str(hub, e, ".");
      gate_up.rows.push_back({n + (mixtral ? "w1" : "gate_proj") + ".weight", n + (mixtral ? "w3" : "up_proj") + ".weight"});
      down.rows.push_back({n + (mixtral ? "w2" : "down_proj") + ".weight"});
    }
    d.layout.stacked.push_back(std::move(gate_up));
    d.layout.stacked.push_back(std::move(down));
    if (mixtral) d.layout.renamed.push_back({m + "gate.weight", p + "block_sparse_moe.gate.weight"});
    if (const int64_t S = c.moe.shared_expert_intermediate_size; S > 0) {  // GLM-4.5's: shared_experts, ungated
      const std::string shared = m + (c.moe.grouped_router ? "shared_experts." : "shared_expert.");
      linear(shared + "gate_proj", C, S, false);
      linear(shared + "up_proj", C, S, false);
      linear(shared + "down_proj", S, C, false);
      if (!c.moe.grouped_router) linear(m + "shared_expert_gate", C, 1, false);
    }
  } else {
    linear(p + "mlp.gate_proj", C, F, c.mlp_bias);
    linear(p + "mlp.up_proj", C, F, c.mlp_bias);
    linear(p + "mlp.down_proj", F, C, c.mlp_bias);
  }
}

// What a folder of `c` holds beside the model, left out as transformers leaves it: a multimodal folder's other towers
// (the text model under its own prefixes), multi-token-prediction layers, the keys and values shared layers drop.
void describe_left_out(ModelDescription& d, const DecoderConfig& c, const std::vector<std::string>& shared_kv) {
  if (c.text_of_multimodal) {  // the text model's names in the folder (older and newer transformers), the rest left out
    d.layout.prefixes = {{"model.", "language_model.model."},
                         {"model.", "model.language_model."},
                         {"lm_head.", "language_model.lm_head."}};
    d.layout.left_out = {
        "vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.",
        "model.visual.", "model.audio_tower.",     "model.embed_vision.", "model.embed_audio."};
  }
  if (is_hybrid(c.family)) d.layout.left_out.push_back("mtp.");  // Qwen3.5's multi-token prediction, unused
  // GLM-4.5's and DeepSeek-V3's multi-token prediction, as the layers after the decoder's
  for (int64_t i = 0; i < c.mtp_layers; ++i)
    d.layout.left_out.push_back(str("model.layers.", c.num_hidden_layers + i, "."));
  for (const std::string& name : shared_kv) {  // under each name the folder may give them
    d.layout.left_out.push_back(name);
    for (const auto& [ours, theirs] : d.layout.prefixes)
      if (name.rfind(ours, 0) == 0) d.layout.left_out.push_back(theirs + name.substr(ours.size()));
  }
}

}  // namespace

ModelDescription describe(const DecoderConfig& c) {
  ModelDescription d;
  d.architecture = family_names(c.family).architecture;
  d.config_json = canonical_json(c);
  d.canonical_config = [](const std::string& path) { return canonical_json(load_llama_config(path)); };
  d.layout.fp8_block = c.fp8_block;
  d.num_parameters = c.num_parameters();
  const int64_t C = c.hidden_size, H = c.num_attention_heads, F = c.intermediate_size;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) { d.params.push_back({name, shape, {}}); };
  auto linear = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
    add(name + ".weight", {out, in});
    if (bias) add(name + ".bias", {out});
  };
  add("model.embed_tokens.weight", {c.vocab_size, C});
  if (c.tie_word_embeddings) d.params.back().aliases.push_back("lm_head.weight");
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  std::vector<std::string> shared_kv;  // the shared layers' keys' and values' modules (Gemma 4 E2B/E4B)
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = str("model.layers.", l, ".");
    if (c.layer_scalar) add(p + "layer_scalar", {1});  // Gemma 4's, stored and never trained: the layer's own first
    if (c.is_linear(l)) {  // in the order GatedDeltaNet registers them
      const LinearAttentionConfig& la = c.linear_attention;
      const std::string a = p + "linear_attn.";
      if (la.fused_projections) {
        linear(a + "in_proj_qkvz", C, la.conv_dim() + la.value_dim(), false);
        linear(a + "in_proj_ba", C, 2 * la.value_heads, false);
      } else {
        linear(a + "in_proj_qkv", C, la.conv_dim(), false);
        linear(a + "in_proj_z", C, la.value_dim(), false);
        linear(a + "in_proj_b", C, la.value_heads, false);
        linear(a + "in_proj_a", C, la.value_heads, false);
      }
      add(a + "conv1d.weight", {la.conv_dim(), 1, la.conv_kernel});
      add(a + "dt_bias", {la.value_heads});
      add(a + "A_log", {la.value_heads});
      add(a + "norm.weight", {la.value_head_dim});
      linear(a + "out_proj", la.value_dim(), C, false);
    }
    const LayerPlan plan = c.plan(l);
    const int64_t D = plan.head_dim, K = plan.kv_heads;
    if (c.latent()) {
      describe_latent_attention(d, c, p + "self_attn.");
    } else if (!c.is_linear(l)) {
      const bool own_kv = plan.kv_source < 0;  // else an earlier layer's keys and values (Gemma 4 E2B/E4B)
      linear(p + "self_attn.q_proj", C, H * D * (c.attn_output_gate ? 2 : 1), qkv_bias);
      if (own_kv) linear(p + "self_attn.k_proj", C, K * D, qkv_bias);
      if (own_kv && !plan.k_eq_v) linear(p + "self_attn.v_proj", C, K * D, qkv_bias);
      linear(p + "self_attn.o_proj", H * D, C, c.attention_bias);
      if (c.attention_sinks) add(p + "self_attn.sinks", {H});
      if (!own_kv)  // checkpoints made before transformers dropped them may hold them: left out, as it does
        for (const char* part : {"k_proj.", "v_proj.", "k_norm.", "v_norm."})
          shared_kv.push_back(p + "self_attn." + part);
      if (c.qk_norm) {
        add(p + "self_attn.q_norm.weight", {D});
        if (own_kv) add(p + "self_attn.k_norm.weight", {D});
      } else if (c.qk_norm_whole) {
        add(p + "self_attn.q_norm.weight", {H * D});
        add(p + "self_attn.k_norm.weight", {K * D});
      }
    }
    describe_feed_forward(d, c, l, p);
    for (const char* norm : layer_norm_names(c.norms)) add(p + norm + ".weight", {C});
    if (c.is_moe(l) && c.moe.gemma4)
      for (const char* norm : kGemma4MoeNorms) add(p + norm + ".weight", {C});
    if (const int64_t P = c.per_layer_input_dim; P > 0) {  // Gemma 4 E2B/E4B's, as DecoderLayer registers them
      linear(p + "per_layer_input_gate", C, P, false);
      linear(p + "per_layer_projection", P, C, false);
      add(p + "post_per_layer_input_norm.weight", {C});
    }
    if (c.fused_projections) {  // Phi-3: the folder's qkv_proj and gate_up_proj (no biases in the family)
      const std::string a = p + "self_attn.", m = p + "mlp.";
      d.layout.fused.push_back(
          {a + "qkv_proj.weight",
           {{a + "q_proj.weight", H * D}, {a + "k_proj.weight", K * D}, {a + "v_proj.weight", K * D}}});
      d.layout.fused.push_back({m + "gate_up_proj.weight", {{m + "gate_proj.weight", F}, {m + "up_proj.weight", F}}});
    }
  }
  add("model.norm.weight", {C});
  if (const int64_t P = c.per_layer_input_dim; P > 0) {  // as Decoder registers them
    add("model.embed_tokens_per_layer.weight", {c.per_layer_vocab, c.num_hidden_layers * P});
    linear("model.per_layer_model_projection", C, c.num_hidden_layers * P, false);
    add("model.per_layer_projection_norm.weight", {P});
  }
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, C});
  describe_left_out(d, c, shared_kv);
  return d;
}

}  // namespace fsdp::model

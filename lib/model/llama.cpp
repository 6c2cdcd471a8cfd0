#include "model/llama.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "fsdp/param_group.h"
#include "fsdp/unit_call.h"
#include "model/chunked_loss.h"
#include "util/error.h"
#include "util/log.h"
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

// 64-bit FNV-1a of the name, mixed with the seed: a parameter's own random stream.
uint64_t stream_of(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL ^ (seed * 0x9E3779B97F4A7C15ULL);
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
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
      "rope_parameters", "model_type", "attention_dropout", "sliding_window", "use_sliding_window",
      "max_window_layers", "layer_types",
      // Read by nobody here, and harmless:
      "architectures", "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
      "decoder_start_token_id", "use_cache", "pretraining_tp", "_name_or_path", "output_attentions",
      "output_hidden_states", "return_dict", "torchscript", "id2label", "label2id", "problem_type", "tokenizer_class",
      "prefix", "task_specific_params", "finetuning_task", "is_decoder", "is_encoder_decoder", "add_cross_attention",
      "tie_encoder_decoder", "chunk_size_feed_forward", "max_length", "min_length", "do_sample", "temperature",
      "top_k", "top_p", "num_beams", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
      "early_stopping", "num_return_sequences", "bad_words_ids", "use_bfloat16", "quantization_config"};
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
    FSDP_CHECK(window == 0, where, ": sliding_window is not a field of LlamaForCausalLM (transformers ignores it); "
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

int64_t LlamaConfig::num_parameters() const {
  const int64_t c = hidden_size, d = head_dim, h = num_attention_heads, k = num_key_value_heads;
  int64_t attn = c * h * d + 2 * c * k * d + h * d * c;
  if (attention_bias) attn += h * d + 2 * k * d + c;
  if (qkv_bias) attn += h * d + 2 * k * d;
  if (qk_norm) attn += 2 * d;
  int64_t mlp = 3 * c * intermediate_size;
  if (mlp_bias) mlp += 2 * intermediate_size + c;
  const int64_t layer = attn + mlp + 2 * c;
  return vocab_size * c * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * layer + c;
}

double LlamaConfig::flops_per_token(int64_t seq_len) const {
  const double n = static_cast<double>(num_parameters() - (tie_word_embeddings ? 0 : vocab_size * hidden_size));
  return 6.0 * n + 12.0 * num_hidden_layers * num_attention_heads * head_dim * static_cast<double>(seq_len);
}

LlamaConfig parse_llama_config(const std::string& text, const std::string& where, std::vector<std::string>* warnings) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw InputError(str(where, ": not valid JSON: ", e.what()));
  }
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
  FSDP_CHECK(c.rms_norm_eps > 0 && c.rope_theta > 0 && c.initializer_range >= 0, where,
             ": rms_norm_eps (", c.rms_norm_eps, ") and rope_theta (", c.rope_theta,
             ") must be > 0 and initializer_range (", c.initializer_range, ") >= 0");
  if (c.rope_scaling)
    FSDP_CHECK(c.rope_scaling->factor > 0 && c.rope_scaling->low_freq_factor > 0 &&
                   c.rope_scaling->high_freq_factor > c.rope_scaling->low_freq_factor &&
                   c.rope_scaling->original_max_position_embeddings > 0,
               where, ": rope_scaling needs factor, low_freq_factor and original_max_position_embeddings > 0 and "
               "high_freq_factor > low_freq_factor");
  FSDP_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, where, ": num_attention_heads ", c.num_attention_heads,
             " must be a multiple of num_key_value_heads ", c.num_key_value_heads);
  FSDP_CHECK(c.head_dim % 2 == 0, where, ": head_dim ", c.head_dim, " must be even for rotary embeddings");
  FSDP_CHECK(field<double>(j, "attention_dropout", 0.0, where) == 0.0, where, ": attention_dropout ",
             j["attention_dropout"].dump(), " is not supported; fsdptrain trains without dropout (set it to 0.0)");
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

// --- rotary embeddings ---

at::Tensor rope_inv_freq(const LlamaConfig& c) {
  // inv_freq[i] = theta^(-2i/D), with Llama 3's frequency-dependent scaling when configured.
  const int64_t d = c.head_dim;
  at::Tensor inv_freq = 1.0 / at::pow(c.rope_theta, at::arange(0, d, 2, at::kDouble) / static_cast<double>(d));
  if (c.rope_scaling) {
    const RopeScaling& s = *c.rope_scaling;
    const double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    const double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    const at::Tensor wavelen = 2 * M_PI / inv_freq;
    const at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
    const at::Tensor smooth =
        (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    const at::Tensor blended = (1 - smooth) * scaled / s.factor + smooth * scaled;
    const at::Tensor medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
    inv_freq = at::where(medium, blended, scaled);
  }
  return inv_freq.to(at::kFloat);
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, int64_t seq_len, const at::Tensor& like) {
  // fp32 angles, duplicated halves (HF's layout), cast to the activation dtype last.
  const at::Tensor pos = at::arange(seq_len, at::TensorOptions().dtype(at::kFloat).device(like.device()));
  const at::Tensor freqs = at::outer(pos, inv_freq.to(like.device()));
  const at::Tensor emb = at::cat({freqs, freqs}, -1);  // (T, D)
  return {emb.cos().to(like.scalar_type()), emb.sin().to(like.scalar_type())};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + rotate_half(x) * sin;
}

// --- modules -----------------------------------------------------------------------------------

LlamaRMSNormImpl::LlamaRMSNormImpl(int64_t dim, double e) : torch::nn::Module("LlamaRMSNorm"), eps(e) {
  weight = register_parameter("weight", at::ones({dim}));
}

bool fused_kernels_enabled() {
  static const bool enabled = !env_is("FSDPTRAIN_FUSED", "0");
  return enabled;
}

at::Tensor LlamaRMSNormImpl::forward(const at::Tensor& x) {
  if (x.is_cuda() && x.scalar_type() == weight.scalar_type() && fused_kernels_enabled())
    return at::rms_norm(x, {weight.size(0)}, weight, eps);
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor normed = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c, int64_t layer)
    : torch::nn::Module("LlamaAttention"),
      heads(c.num_attention_heads),
      kv_heads(c.num_key_value_heads),
      head_dim(c.head_dim),
      window(c.window_of(layer)) {
  auto linear = [&](int64_t in, int64_t out, bool bias) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  q_proj = register_module("q_proj", linear(c.hidden_size, heads * head_dim, qkv_bias));
  k_proj = register_module("k_proj", linear(c.hidden_size, kv_heads * head_dim, qkv_bias));
  v_proj = register_module("v_proj", linear(c.hidden_size, kv_heads * head_dim, qkv_bias));
  o_proj = register_module("o_proj", linear(heads * head_dim, c.hidden_size, c.attention_bias));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", LlamaRMSNorm(head_dim, c.rms_norm_eps));
    k_norm = register_module("k_norm", LlamaRMSNorm(head_dim, c.rms_norm_eps));
  }
}

namespace {

// Queries i (absolute positions start + i) and keys j: j <= start + i, and within the window.
at::Tensor attention_mask(int64_t queries, int64_t keys, int64_t start, int64_t window, const c10::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor i = at::arange(start, start + queries, opts).unsqueeze(1);
  const at::Tensor j = at::arange(keys, opts).unsqueeze(0);
  at::Tensor mask = j <= i;
  if (window > 0) mask = mask & (j > i - window);
  return mask;
}

}  // namespace

LlamaAttentionImpl::Projected LlamaAttentionImpl::project(const at::Tensor& x, const at::Tensor& cos,
                                                          const at::Tensor& sin) {
  const int64_t b = x.size(0), t = x.size(1);
  at::Tensor q = q_proj(x).view({b, t, heads, head_dim});  // (B, T, H, D)
  at::Tensor k = k_proj(x).view({b, t, kv_heads, head_dim});
  if (q_norm) {  // Qwen3: each head normalized before the rotation
    q = q_norm(q);
    k = k_norm(k);
  }
  return {apply_rotary(q.transpose(1, 2), cos, sin),  // (B, H, T, D)
          apply_rotary(k.transpose(1, 2), cos, sin),  // (B, K, T, D)
          v_proj(x).view({b, t, kv_heads, head_dim}).transpose(1, 2)};
}

// softmax(q k^T / sqrt(D)) v over the keys each query may see; queries start at position `start`.
at::Tensor LlamaAttentionImpl::attend(const at::Tensor& q, at::Tensor k, at::Tensor v, int64_t start) {
  const int64_t b = q.size(0), t = q.size(2), keys = k.size(2);
  if (kv_heads != heads) {  // query head j uses kv head j / (H / K)
    k = k.repeat_interleave(heads / kv_heads, 1);
    v = v.repeat_interleave(heads / kv_heads, 1);
  }
  at::Tensor y;
  if (start == 0 && (window == 0 || t <= window))  // plain causal attention
    y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
  else
    y = at::scaled_dot_product_attention(q, k, v, attention_mask(t, keys, start, window, q.device()), 0.0, false);
  return o_proj(y.transpose(1, 2).reshape({b, t, heads * head_dim}));
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const Projected p = project(x, cos, sin);
  return attend(p.q, p.k, p.v, 0);
}

at::Tensor LlamaAttentionImpl::forward_cached(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                              LayerCache& cache) {
  const Projected p = project(x, cos, sin);
  const int64_t start = cache.k.defined() ? cache.k.size(2) : 0;
  cache.k = cache.k.defined() ? at::cat({cache.k, p.k}, 2) : p.k;
  cache.v = cache.v.defined() ? at::cat({cache.v, p.v}, 2) : p.v;
  return attend(p.q, cache.k, cache.v, start);
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c) : torch::nn::Module("LlamaMLP") {
  auto linear = [&](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(c.mlp_bias));
  };
  gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size));
  up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size));
  down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) {
  return down_proj(at::silu(gate_proj(x)) * up_proj(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c, int64_t layer)
    : torch::nn::Module(family_names(c.family).layer_class) {
  self_attn = register_module("self_attn", LlamaAttention(c, layer));
  mlp = register_module("mlp", LlamaMLP(c));
  input_layernorm = register_module("input_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor h = x + self_attn->forward(input_layernorm(x), cos, sin);
  return h + mlp->forward(post_attention_layernorm(h));
}

at::Tensor LlamaDecoderLayerImpl::forward_cached(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                                 LayerCache& cache) {
  const at::Tensor h = x + self_attn->forward_cached(input_layernorm(x), cos, sin, cache);
  return h + mlp->forward(post_attention_layernorm(h));
}

LlamaEmbeddingImpl::LlamaEmbeddingImpl(int64_t vocab, int64_t dim) : torch::nn::Module("LlamaEmbedding") {
  weight = register_parameter("weight", at::empty({vocab, dim}));
}

at::Tensor LlamaEmbeddingImpl::forward(const at::Tensor& tokens) {
  return at::embedding(weight, tokens);
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c) : torch::nn::Module("LlamaModel") {
  embed_tokens = register_module("embed_tokens", LlamaEmbedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  norm = register_module("norm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c, bool free_after_create)
    : torch::nn::Module("LlamaForCausalLM"), config(c) {
  auto release = [&](torch::nn::Module& m) {
    if (free_after_create)
      for (auto& p : m.parameters()) fsdp::free_storage(p);
  };
  model = register_module("model", LlamaModel(c));
  release(*model);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {  // one layer exists at a time
    LlamaDecoderLayer layer(c, i);
    release(*layer);
    model->layers->push_back(layer);
  }
  if (!c.tie_word_embeddings) {
    lm_head = register_module("lm_head",
                              torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
    release(*lm_head);
  }
  inv_freq_ = rope_inv_freq(c);
}

at::Tensor LlamaForCausalLMImpl::hidden_states(const at::Tensor& tokens) {
  LlamaEmbeddingImpl* embed = model->embed_tokens.get();
  // Tied: the embedding also computes the logits, so it stays in the root with the head.
  at::Tensor x = config.tie_word_embeddings
                     ? embed->forward(tokens)
                     : fsdp::call(*embed, tokens, [embed](const at::Tensor& t) { return embed->forward(t); });
  auto [cos, sin] = rope_cos_sin(inv_freq_, tokens.size(1), x);
  for (const auto& m : *model->layers) {
    auto* layer = m->as<LlamaDecoderLayerImpl>();
    x = fsdp::call(*layer, TensorList{x, cos, sin},
                   [layer](const TensorList& in) { return TensorList{layer->forward(in[0], in[1], in[2])}; })[0];
  }
  return model->norm(x);
}

const at::Tensor& LlamaForCausalLMImpl::head_weight() const {
  return config.tie_word_embeddings ? model->embed_tokens->weight : lm_head->weight;
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& tokens) {
  return at::linear(hidden_states(tokens), head_weight());
}

at::Tensor LlamaForCausalLMImpl::forward_cached(const at::Tensor& tokens, std::vector<LayerCache>& cache) {
  cache.resize(static_cast<size_t>(config.num_hidden_layers));
  const int64_t start = cache[0].k.defined() ? cache[0].k.size(2) : 0, t = tokens.size(1);
  at::Tensor x = model->embed_tokens->forward(tokens);
  auto [cos, sin] = rope_cos_sin(inv_freq_, start + t, x);
  cos = cos.narrow(0, start, t);
  sin = sin.narrow(0, start, t);
  for (size_t i = 0; i < cache.size(); ++i)
    x = model->layers[i]->as<LlamaDecoderLayerImpl>()->forward_cached(x, cos, sin, cache[i]);
  return at::linear(model->norm(x), head_weight());
}

at::Tensor LlamaForCausalLMImpl::loss_sum(const at::Tensor& tokens, const at::Tensor& targets) {
  const at::Tensor x = hidden_states(tokens);
  return chunked_linear_cross_entropy_sum(x.reshape({-1, config.hidden_size}), head_weight(), targets.reshape({-1}));
}

at::Tensor LlamaForCausalLMImpl::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  return loss_sum(tokens, targets) / targets.ne(-100).sum().clamp_min(1).to(at::kFloat);
}

ModelTraits llama_traits(const LlamaConfig& c) {
  const std::string layer = family_names(c.family).layer_class;
  if (c.tie_word_embeddings) return ModelTraits{{layer}, {layer}};
  return ModelTraits{{layer}, {layer, "LlamaEmbedding"}};
}

at::Tensor init_parameter(const LlamaConfig& c, uint64_t seed, const std::string& name, at::IntArrayRef shape) {
  if (ends_with(name, "layernorm.weight") || ends_with(name, "norm.weight")) return at::ones(shape);
  if (ends_with(name, ".bias")) return at::zeros(shape);
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(stream_of(seed, name));
  return at::normal(0.0, c.initializer_range, shape, g);
}

void init_parameters(LlamaForCausalLMImpl& model, uint64_t seed) {
  c10::NoGradGuard no_grad;
  for (const auto& p : model.named_parameters()) {
    at::Tensor v = init_parameter(model.config, seed, p.key(), p.value().sizes());
    if (p.value().storage().nbytes() == 0)
      p.value().set_data(v);
    else
      p.value().copy_(v);
  }
}

}  // namespace fsdp::model

// The Hugging Face config.json of every family fsdptrain trains (Llama, Mistral, Qwen2/2.5, Qwen3,
// Gemma 2, Gemma 3, Gemma 4 (its dense text model), OLMo 2, SmolLM3, Granite 3, Phi-3/3.5/4, the mixtures of experts
// Qwen3-MoE, Qwen2-MoE, Mixtral, gpt-oss, GLM-4.5, and DeepSeek-V3 and GLM-4.7-Flash with latent attention, and the
// hybrids Qwen3.5/3.6, Qwen3.5-MoE and Qwen3-Next): read into one DecoderConfig, written back for exports, and
// described for the checkpoint layer (model/config/description.h). No LibTorch.
//
// A family is data, not code: the config gives the decoder its form (where the norms sit, the
// activation, the scores' scale and soft cap, the multipliers) and each layer its plan (LayerPlan:
// window, rotary or not, which rotary table, attention or Gated DeltaNet, dense or mixture-of-experts feed-forward).
// The modules (model/layers/decoder.h) read these, never the family; the family only names things (family_names) and
// picks the defaults transformers picks.
//
// Shapes use one vocabulary: C hidden_size, H query heads, K kv heads, D head_dim,
// F intermediate_size, V vocab_size, L layers, E experts, I an expert's intermediate size.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/config/description.h"

namespace fsdp::model {

// Scaled RoPE, as transformers' rope types compute it (absent: plain RoPE, "default"):
//   - kLlama3 "llama3": frequency-dependent, between low_freq_factor and high_freq_factor;
//   - kLinear "linear": every frequency / factor;
//   - kDynamic "dynamic" (NTK): plain within max_position_embeddings, which no sequence passes here
//     (training and generate refuse longer ones), so plain RoPE exactly;
//   - kYarn "yarn": frequencies blended between interpolated and not by a ramp over the dimensions
//     (beta_fast, beta_slow, truncate), cos and sin times attention_factor;
//   - kLongRope "longrope" (Phi-3/3.5/4): frequencies divided by short_factor, or long_factor for a
//     sequence longer than original_max_position_embeddings, cos and sin times attention_factor;
//   - kProportional "proportional" (Gemma 4's full-attention layers): theta^(-2i/D) / factor over the
//     whole head D for the first D * rotated_share / 2 frequencies, 0 (no turn) for the rest.
struct RopeScaling {
  enum class Type { kLlama3, kLinear, kDynamic, kYarn, kLongRope, kProportional };
  Type type = Type::kLlama3;
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  double beta_fast = 32, beta_slow = 1;           // yarn
  bool truncate = true;                           // yarn
  double mscale = 0, mscale_all_dim = 0;          // yarn's attention_factor from these when both are set
  std::optional<double> attention_factor;         // as written; none: from factor (yarn, longrope)
  bool factor_written = true;                     // longrope: false when factor comes from the positions' ratio
  std::vector<double> short_factor, long_factor;  // longrope, one per rotated frequency
  double rotated_share = 1.0;                     // proportional: partial_rotary_factor, as written
};

enum class Family {
  kLlama,
  kMistral,
  kQwen2,
  kQwen3,
  kGemma2,
  kGemma3,
  kOlmo2,
  kOlmo3,
  kSmolLM3,
  kGranite,
  kPhi3,
  kQwen3Moe,
  kQwen2Moe,
  kMixtral,
  kQwen3_5,
  kQwen3Next,
  kQwen3_5Moe,
  kGptOss,
  kGemma4,
  kGlm4Moe,
  kDeepseekV2,
  kDeepseekV3,
  kGlm4MoeLite,
  kMinistral3
};

// Where a decoder layer's norms sit. kPre (Llama): input_layernorm before attention,
// post_attention_layernorm before the MLP. kPost (OLMo 2): post_attention_layernorm on attention's
// output, post_feedforward_layernorm on the MLP's, before each residual sum. kSandwich (Gemma): both,
// four a layer (input, post_attention, pre_feedforward, post_feedforward).
enum class NormPlacement { kPre, kPost, kSandwich };
// The MLP's gate activation: SiLU (hidden_act "silu") or GELU's tanh form ("gelu_pytorch_tanh").
enum class Activation { kSilu, kGeluTanh };

// A decoder layer's norms' names, in the order the layer registers them.
std::vector<const char*> layer_norm_names(NormPlacement placement);
// Gemma 4's sparse layers' three norms of their own (MoeConfig::gemma4), registered after those.
inline constexpr const char* kGemma4MoeNorms[] = {"post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                                                  "pre_feedforward_layernorm_2"};

// One decoder layer's attention, as the config plans it.
struct LayerPlan {
  int64_t window = 0;  // 0: full causal attention; else a query sees keys at most window - 1 back
  bool rotary = true;  // false: no position rotation (SmolLM3's NoPE layers)
  int rope = 0;        // the rotary table: 0 the global one (rope_theta), 1 the local (Gemma 3's sliding layers)
  bool moe = false;    // the feed-forward is a mixture of experts (MoeConfig), else the dense GatedMlp
  bool linear = false; // the token mixer is Gated DeltaNet (LinearAttentionConfig), not attention
  // Attention's heads: the layer's head width and kv heads (Gemma 4's full-attention layers have their
  // own), and whether its values are k_proj's output (Gemma 4's attention_k_eq_v: no v_proj).
  int64_t head_dim = 0, kv_heads = 0;
  bool k_eq_v = false;
  // Gemma 4 E2B/E4B (num_kv_shared_layers): the earlier layer whose keys and values this one attends
  // with (-1: its own; it then has no k_proj, v_proj or k_norm), whether a later layer takes this one's,
  // and the dense MLP's width (use_double_wide_mlp: twice intermediate_size in the layers that share).
  int64_t kv_source = -1;
  bool kv_kept = false;
  int64_t mlp_width = 0;
};

// Gated DeltaNet, the linear attention of Qwen3.5/3.6 and Qwen3-Next (model/layers/gated_deltanet.h),
// as transformers computes it: key and value heads of their own widths (each key head serves
// value_heads / key_heads value heads), a depthwise causal convolution of conv_kernel taps.
struct LinearAttentionConfig {
  int64_t key_heads = 16, value_heads = 32;        // linear_num_key_heads, linear_num_value_heads
  int64_t key_head_dim = 128, value_head_dim = 128;  // linear_key_head_dim, linear_value_head_dim
  int64_t conv_kernel = 4;                           // linear_conv_kernel_dim
  // Qwen3-Next's projections: in_proj_qkvz and in_proj_ba, each key head's q, k, v, z (and b, a) side
  // by side; Qwen3.5's: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a.
  bool fused_projections = false;
  // The chunked rule's chunk (model/kernels/delta_rule.h's kDeltaChunk), for its FLOPs.
  static constexpr int64_t kChunk = 64;
  int64_t key_dim() const { return key_heads * key_head_dim; }
  int64_t value_dim() const { return value_heads * value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// A mixture-of-experts feed-forward (Qwen3-MoE, Qwen2-MoE, Mixtral), as transformers computes it: a
// router (a bias-free linear C -> E) scores each token, the top experts_per_token of the softmax
// (renormalised to sum 1 when norm_topk_prob) weigh their experts' SwiGLU outputs (each of width
// intermediate_size); Qwen2-MoE adds a shared expert (its own width) times sigmoid(shared_expert_gate(x)).
struct MoeConfig {
  int64_t num_experts = 0;  // 0: every layer dense
  int64_t experts_per_token = 0;
  int64_t intermediate_size = 0;  // an expert's I (moe_intermediate_size; Mixtral's intermediate_size)
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;  // layer l is sparse when (l + 1) % step == 0 and not in mlp_only_layers
  std::vector<int64_t> mlp_only_layers;
  int64_t shared_expert_intermediate_size = 0;  // Qwen2-MoE; 0: none
  // The auxiliary load-balancing loss (transformers' load_balancing_loss_func) times this is added
  // to the loss when output_router_logits, as transformers adds it.
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;
  // gpt-oss: a router with a bias (mlp.router), the softmax over the top-k logits; experts with biases,
  // stored (in, out) as transformers holds them (experts.gate_up_proj (E, C, 2I), its gate and up
  // columns interleaved; experts.down_proj (E, I, C)), and the clamped SwiGLU: gate clamped above at
  // swiglu_limit, up to +-swiglu_limit, (up + 1) * gate * sigmoid(swiglu_alpha * gate).
  bool gpt_oss = false;
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;
  // Gemma 4's (enable_moe_block; gemma-4-26B-A4B): the experts beside each layer's dense MLP, not in its
  // place. The router (router.proj, router.scale (C), router.per_expert_scale (E)) scores the layer's
  // input, RMS-normed without a weight, times scale and C^-1/2; the top k of the softmax, renormalised,
  // are each times its expert's per_expert_scale; the experts (GELU-gated, stacked as transformers holds
  // them) take pre_feedforward_layernorm_2 of the input, their sum is normed by post_feedforward_layernorm_2
  // and added to the MLP's, normed by post_feedforward_layernorm_1, before post_feedforward_layernorm.
  // transformers adds no auxiliary loss (router_aux_loss_coef 0).
  bool gemma4 = false;
  // GLM-4.5's, DeepSeek-V3's and GLM-4.7-Flash's (glm4_moe, deepseek_v3, glm4_moe_lite): the router (mlp.gate, no bias)
  // scores each expert by the sigmoid of its logit, computed in fp32; the experts are chosen by the scores plus
  // e_score_correction_bias (mlp.gate's (E) tensor, stored and never trained: an fp32 buffer in transformers; here a
  // frozen parameter held in fp32, model::kept_in_fp32), first the topk_group of the n_group groups of experts whose
  // two best biased scores sum highest, then the top experts_per_token within them; each chosen expert's weight is its
  // unbiased score, renormalised (over the sum plus 1e-20) when norm_topk_prob, times routed_scaling_factor. The shared
  // experts (mlp.shared_experts, moe_intermediate_size x n_shared_experts wide) are added ungated, and the first
  // first_k_dense_replace layers are dense (GLM-4.7-Flash: the "dense" ones of mlp_layer_types, as mlp_only_layers). No
  // auxiliary loss. DeepSeek-V2's (deepseek_v2; softmax_scores): the softmax of the logits instead, no stored bias,
  // each group scored by its best expert (topk_method group_limited_greedy; greedy: the top k of all, group_limited
  // false), the chosen scores never renormalised.
  bool grouped_router = false;
  bool softmax_scores = false;
  bool group_limited = true;  // DeepSeek-V2's topk_method greedy: false (n_group, topk_group as written; 0: null)
  int64_t n_group = 1, topk_group = 1, first_k_dense_replace = 0;
  double routed_scaling_factor = 1.0;
};

// DeepSeek-V3's multi-head latent attention (MLA; deepseek_v3, deepseek_v2, GLM-4.7-Flash's glm4_moe_lite), as
// transformers computes it: each head's query (q_proj, or q_b_proj(q_a_layernorm(q_a_proj(x))) through a q_rank-wide
// latent) is nope_dim dimensions without rotation and rope_dim rotated; kv_a_proj_with_mqa gives a kv_rank-wide latent,
// normed by kv_a_layernorm, whose kv_b_proj gives each head's unrotated key (nope_dim) and value (v_dim), and rope_dim
// more that every head shares as its rotated key. The scores' factor is (nope_dim + rope_dim)^-1/2 times yarn's
// mscale_all_dim squared. With interleave (rope_interleave; DeepSeek-V2's always), the rotated dimensions turn in
// adjacent pairs (x0, x1), (x2, x3), ... The latents' norms take eps 1e-6 whatever rms_norm_eps says, as transformers
// makes them.
struct LatentAttention {
  int64_t q_rank = 0;                             // q_lora_rank; 0 (null): q_proj
  int64_t kv_rank = 0;                            // kv_lora_rank; 0: not latent attention
  int64_t nope_dim = 0, rope_dim = 0, v_dim = 0;  // qk_nope_head_dim, qk_rope_head_dim, v_head_dim
  bool interleave = true;
  // DeepSeek-V2's: the rotation in fp32 from fp32 angles whatever the compute dtype, rounded once (transformers'
  // DeepseekV2 multiplies complex fp32 angles, which no cast to the compute dtype touches); the others' angles and
  // rotation in the activations' dtype, as apply_rotary_pos_emb.
  bool fp32_rotation = false;
  static constexpr double kLatentNormEps = 1e-6;
  int64_t qk_dim() const { return nope_dim + rope_dim; }
};

// A family's Hugging Face names: config.json's model_type and architectures, the decoder layer class.
struct FamilyNames {
  const char* model_type;
  const char* architecture;
  const char* layer_class;
};
FamilyNames family_names(Family f);
// transformers' name for one of our module classes in a model of family `f` ("LlamaMLP" is
// "Qwen2MLP" in a Qwen2 model, "torch::nn::LinearImpl" is "Linear"), and ours for one of its.
// Names that are neither come back unchanged.
std::string hf_class_name(const std::string& ours, Family f);
std::string our_class_name(const std::string& hf, Family f);

// HF config.json fields (transformers' LlamaConfig and its relatives'), with their defaults.
struct DecoderConfig {
  Family family = Family::kLlama;
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 128;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  // Phi-3/4: the share of each head the rotation turns (its first rotary_dim() dimensions); the rest
  // passes through.
  double partial_rotary_factor = 1.0;
  int64_t rotary_dim() const;  // head_dim * partial_rotary_factor, as transformers rounds it
  // The rotary tables' factor on cos and sin (yarn's and longrope's attention_factor; else 1).
  double rope_attention_factor() const;
  // Ministral 3 (rope_parameters' llama_4_scaling_beta and original_max_position_embeddings): transformers scales
  // each query by 1 + beta ln(1 + floor(position / query_scale_positions)), which is 1 below query_scale_positions.
  // fsdptrain computes the model there alone: sequences longer are refused (positions_computed()).
  double query_scale_beta = 0;
  int64_t query_scale_positions = 0;
  // The positions fsdptrain computes the model at: max_position_embeddings, or Ministral 3's unscaled ones.
  int64_t positions_computed() const;
  // Phi-3/4 checkpoints hold q, k and v as one qkv_proj and gate and up as one gate_up_proj.
  bool fused_projections = false;
  // Read from a multimodal config.json (Gemma 3's and 4's, Qwen3.5's, Mistral 3's *ForConditionalGeneration: text and
  // vision): this is its text model (text_config), stored under that model's prefixes beside a vision tower it leaves
  // out.
  bool text_of_multimodal = false;
  std::string multimodal_architecture;  // then: the folder's ("Gemma3ForConditionalGeneration", ...)
  bool attention_bias = false, mlp_bias = false, tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: biases on q_proj, k_proj, v_proj (not o_proj)
  bool qk_norm = false;   // Qwen3, Gemma 3: q_norm and k_norm, RMSNorm over head_dim before the rotation
  // gpt-oss: a learned logit per head (self_attn.sinks) joins each query's softmax, its weight given to no value.
  bool attention_sinks = false;
  // Gemma 4: the full-attention layers' head width and kv heads (its per_layer_config, or
  // global_head_dim and num_global_key_value_heads; 0: head_dim, num_key_value_heads), whether their
  // values are k_proj's output (attention_k_eq_v: they have no v_proj), the values RMS-normed per head
  // without a weight (v_norm), and each layer's output times its layer_scalar: a stored (1) tensor
  // that does not train (a buffer in transformers).
  int64_t global_head_dim = 0, global_kv_heads = 0;
  bool attention_k_eq_v = false, v_norm = false, layer_scalar = false;
  // Gemma 4 E2B/E4B: per-layer embeddings when per_layer_input_dim (hidden_size_per_layer_input, P) > 0:
  // a (per_layer_vocab, L P) table looked up by token, scaled by sqrt(P), and a projection of the
  // embedding (C -> L P, times C^-1/2) RMS-normed over P, summed and times 2^-1/2, give each layer a
  // P-wide input; after its MLP, each layer adds post_per_layer_input_norm(per_layer_projection(
  // act(per_layer_input_gate(h)) * its input)) to the residual. kv_shared_layers (num_kv_shared_layers):
  // the last ones attend with the keys and values of the last earlier layer of their kind (LayerPlan::kv_source),
  // their MLPs twice as wide with double_wide_mlp (use_double_wide_mlp).
  int64_t per_layer_input_dim = 0, per_layer_vocab = 0, kv_shared_layers = 0;
  // GLM-4.5's and DeepSeek-V3's multi-token prediction layers (num_nextn_predict_layers): a folder holds them after the
  // decoder's (model.layers.L, ...); left out, as transformers leaves them.
  int64_t mtp_layers = 0;
  bool double_wide_mlp = false;
  // DeepSeek-V3's, GLM-4.7-Flash's latent attention (mla.kv_rank > 0). head_dim is then the width attention computes
  // at: max(qk_dim, v_dim), the narrower of queries and keys or values padded with zeros to it.
  LatentAttention mla;
  bool latent() const { return mla.kv_rank > 0; }
  int64_t head_dim_of(int64_t layer) const { return plan(layer).head_dim; }
  int64_t kv_heads_of(int64_t layer) const { return plan(layer).kv_heads; }
  MoeConfig moe;          // the sparse layers' feed-forward (LayerPlan::moe)
  // Qwen3.5/3.6, Qwen3-Next: the layers whose token mixer is Gated DeltaNet (layer_types'
  // "linear_attention"; empty: none), and its shape.
  std::vector<bool> linear_layers;
  LinearAttentionConfig linear_attention;
  bool is_linear(int64_t layer) const {
    return layer < static_cast<int64_t>(linear_layers.size()) && linear_layers[layer];
  }
  // Qwen3.5/3.6, Qwen3-Next: q_proj gives each head's query and a gate side by side, and attention's
  // output is times sigmoid(gate) before o_proj.
  bool attn_output_gate = false;
  bool is_moe(int64_t layer) const;
  // Sliding-window attention: a query sees the keys at most sliding_window - 1 positions back, in
  // the layers marked in sliding_layers (one per layer; empty: none).
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  bool use_sliding_window = false;  // Qwen2/Qwen3's switch and its first sliding layer, as written
  int64_t max_window_layers = 0;
  int64_t window_of(int64_t layer) const {  // 0: full causal attention
    return layer < static_cast<int64_t>(sliding_layers.size()) && sliding_layers[layer] ? sliding_window : 0;
  }
  // SmolLM3's no_rope_layers as written: 1 where a layer rotates (empty: every layer does).
  std::vector<int64_t> rope_layers;
  int64_t no_rope_layer_interval = 0;  // as written, for the export
  // Gemma 3 and 4, OLMo 3: the sliding layers' rotary base (rope_local_base_freq); 0: every layer takes rope_theta.
  double local_rope_theta = 0;
  LayerPlan plan(int64_t layer) const;

  // The layer's form (each as transformers computes it for the family):
  NormPlacement norms = NormPlacement::kPre;
  bool norm_unit_offset = false;   // Gemma 2 and 3: normed * (1 + weight), the weights starting at 0
  bool norm_fp32_product = false;  // Gemma, OLMo 2/3: normed * weight in fp32, then the cast (Llama: the cast first)
  bool qk_norm_whole = false;      // OLMo 2/3: q_norm/k_norm over the whole projection (H*D, K*D) before heads split
  Activation activation = Activation::kSilu;
  // The attention scores' factor: 0 for 1/sqrt(head_dim); Gemma's query_pre_attn_scalar^-1/2,
  // Granite's attention_multiplier.
  double attention_scale = 0;
  double query_pre_attn_scalar = 0;  // Gemma's, as written
  double attn_softcap = 0;           // attn_logit_softcapping: scores -> cap * tanh(scores / cap); 0: none
  double final_softcap = 0;          // final_logit_softcapping, the same on the logits
  // The embedding's output times embedding_scale: Gemma's sqrt(hidden_size), rounded to the
  // activations' dtype first (embed_scale_in_dtype); Granite's embedding_multiplier.
  double embedding_scale = 1.0;
  bool embed_scale_in_dtype = false;
  double residual_multiplier = 1.0;  // Granite: x + block(x) * residual_multiplier
  double logits_scaling = 1.0;       // Granite: logits / logits_scaling
  double initializer_range = 0.02;
  // pad_token_id: the embedding row lookups give no gradient (nn.Embedding's padding_idx, which
  // transformers sets from it in every family); -1: none (also for an id outside the vocabulary).
  int64_t pad_token_id = -1;
  // pad_token_id, bos_token_id and eos_token_id as written or as the family's config class fills them in (JSON
  // text: a number or, for eos, a list; empty: none), carried into exports so transformers reads the ids the
  // folder had, a pad id outside the vocabulary too.
  std::string pad_token_id_json, bos_token_id_json, eos_token_id_json;
  std::string dtype = "float32";  // torch_dtype / dtype as written (informational)
  // Block FP8 weights (quantization_config "fp8": DeepSeek-V3's, the Qwen *-FP8 folders): a scale's block
  // (weight_block_size), read dequantized (FolderLayout::fp8_block); empty: none. Exports write unquantized
  // weights, without quantization_config.
  std::vector<int64_t> fp8_block;

  int64_t num_parameters() const;  // distinct parameters (a tied head counted once)
  double parameter_count() const;  // the same in floating point: no overflow for any sizes
  // The parameters a token passes through (a sparse layer's experts_per_token experts of num_experts).
  double active_parameter_count() const;
  // Training FLOPs per token, the PaLM/torchtitan convention: 6 * N' + 12 * H * D * T per layer (latent attention:
  // 6 * H * (qk_dim + v_dim) * T, its scores' and values' widths differing), where
  // N' is the active parameters without the input embedding unless it is tied, and a sliding
  // layer's T is at most its window. A Gated DeltaNet layer's mixer counts the chunked rule's
  // products instead, three times their forward (as 6 N' is 3 x 2 N'): per value head,
  // L (5 Dk + 3 Dv) + 6 Dk Dv with L the chunk (k k^T, q k^T and the scores times the values, 2 L D
  // each; the two unit triangular solves, L D each; three products with the state, 2 Dk Dv each).
  double flops_per_token(int64_t seq_len) const;
};

// Gemma 4 E2B/E4B's parts that tensor parallel does not split, named with their
// fields ("per-layer embeddings (hidden_size_per_layer_input)"); empty for other models.
std::string tensor_parallel_unsplit_parts(const DecoderConfig& c);

// Parses a config.json text: model_type (else architectures) picks the family (llama, mistral, qwen2,
// qwen3, gemma2, gemma3_text, gemma4_text, olmo2, olmo3, smollm3, granite, phi3, qwen3_moe, qwen2_moe, mixtral,
// qwen3_5_text, qwen3_next, qwen3_5_moe_text, gpt_oss, glm4_moe, deepseek_v2, deepseek_v3, glm4_moe_lite; another is
// refused listing these; gemma3, gemma4, qwen3_5 and qwen3_5_moe (their *ForConditionalGeneration) give their
// text_config's model, text_of_multimodal). Accepts torch_dtype or dtype, rope_theta/rope_scaling or the newer
// rope_parameters, legacy "type" for rope_type, sliding_window / use_sliding_window / max_window_layers / layer_types.
// Throws InputError naming `where` and the field, also for a missing shape field (vocab_size, hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads) and for settings that change the math and are not
// implemented. warnings (optional): one line per field it does not know, with the closest known field.
DecoderConfig parse_decoder_config(const std::string& json_text, const std::string& where,
                               std::vector<std::string>* warnings = nullptr);
DecoderConfig load_llama_config(const std::string& path, std::vector<std::string>* warnings = nullptr);
// The config.json text for `c` (its family's names and fields, both dtype spellings, rope_theta +
// rope_scaling), for exports.
std::string decoder_config_json(const DecoderConfig& c);

// What the checkpoint layer saves and loads of a model of config `c`: every parameter's Hugging
// Face name and shape in the order the decoder registers them (a tied head as the embedding's
// alias), the tensors a Hugging Face folder of the family holds fused (Phi-3's qkv_proj and
// gate_up_proj) or apart (the Hub's experts one by one, which the model holds stacked as
// transformers v5 does: experts.gate_up_proj (E, 2I, C), experts.down_proj (E, C, I)), and the
// config.json to write beside them (fp32).
ModelDescription describe(const DecoderConfig& c);

}  // namespace fsdp::model

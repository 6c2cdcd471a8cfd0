// The small Llama the model tests build: every size distinct, and initial weights large enough that
// every term of the forward matters.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config/hf_config.h"

namespace fsdp::model::testing {

inline DecoderConfig tiny(int64_t kv_heads = 2) {
  DecoderConfig c;
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 4;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 100.0;
  c.initializer_range = 0.2;  // large enough that every term matters
  return c;
}

// tiny()'s sizes in a config.json of `model_type` plus `extra` (more of the object's members, or
// nothing), read as a user's file is: the family's form and layer plan as the parser makes them.
inline DecoderConfig tiny_of(const std::string& model_type, const std::string& extra = "") {
  const std::string text = R"({"model_type": ")" + model_type +
                           R"(", "vocab_size": 37, "hidden_size": 16, "intermediate_size": 24,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
      "rope_theta": 100.0, "initializer_range": 0.2)" +
                           (extra.empty() ? std::string() : ", " + extra) + "}";
  return parse_decoder_config(text, "tiny " + model_type);
}

// tiny()'s sizes with latent attention (deepseek_v3, deepseek_v2, glm4_moe_lite): every head its own key and value.
inline DecoderConfig tiny_latent(const std::string& model_type, const std::string& extra) {
  const std::string text = R"({"model_type": ")" + model_type +
                           R"(", "vocab_size": 37, "hidden_size": 16, "intermediate_size": 24,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-5,
      "rope_theta": 100.0, "initializer_range": 0.2, )" +
                           extra + "}";
  return parse_decoder_config(text, "tiny " + model_type);
}

// One tiny model of each layer kind issue 60 added, with the settings that make it differ from
// Llama: Gemma 2's soft-capped scores and logits (sandwich norms of (1 + w), GELU, its own score
// scale, a sliding layer), Gemma 3's per-head norms and local rotary table, Gemma 4's full-attention
// layer of wider heads with values from k_proj (and its proportional rotation), and its experts beside
// the dense MLP (a normed, scaled router), E2B's and E4B's per-layer embeddings and last layers attending
// with earlier layers' keys and values (four layers), OLMo 2's norms after
// the blocks and over the whole projections (and OLMo 3's with a window and two rotary tables, the full
// layer's YaRN), SmolLM3's layer without rotary, Granite's multipliers,
// Phi-3's partial rotation with longrope (past 4 positions its long factors) and a window, GLM-4.5's
// q/k/v biases, per-head norms and half-rotated heads, and its sparse second layer (a sigmoid router choosing
// in the better of two groups, a stored bias, scaled weights, ungated shared experts); DeepSeek-V3's latent attention
// (a query latent, values narrower than the keys, interleaved rotation, biases) and GLM-4.7-Flash's (q_proj, values
// wider, the rotation not interleaved), each before a sparse layer; DeepSeek-V2's (q_proj) before its softmax router
// choosing within the better of two groups.
inline std::vector<std::pair<std::string, DecoderConfig>> tiny_new_kinds() {
  const std::string sliding = R"("sliding_window": 3, "layer_types": ["sliding_attention", "full_attention"])";
  return {{"gemma2", tiny_of("gemma2", sliding + R"(, "head_dim": 4, "query_pre_attn_scalar": 6,
                                 "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0)")},
          {"gemma3_text", tiny_of("gemma3_text", sliding + R"(, "head_dim": 4, "rope_parameters": {
                                      "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
                                      "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}})")},
          {"gemma4_text", tiny_of("gemma4_text", sliding + R"(, "head_dim": 4, "global_head_dim": 8,
                                      "num_global_key_value_heads": 2, "attention_k_eq_v": true,
                                      "hidden_size_per_layer_input": 0)")},
          {"gemma4_moe", tiny_of("gemma4_text", sliding + R"(, "head_dim": 4, "global_head_dim": 8,
                                      "num_global_key_value_heads": 2, "attention_k_eq_v": true,
                                      "hidden_size_per_layer_input": 0, "enable_moe_block": true,
                                      "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 8)")},
          {"gemma4_small", parse_decoder_config(R"({"model_type": "gemma4_text", "vocab_size": 37, "hidden_size": 16,
              "intermediate_size": 24, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-5, "initializer_range": 0.2, "sliding_window": 3, "head_dim": 4, "global_head_dim": 8,
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
              "hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 37, "num_kv_shared_layers": 2,
              "use_double_wide_mlp": true})",
                                                "tiny gemma4_small")},
          {"glm4_moe", tiny_of("glm4_moe", R"("attention_bias": true, "use_qk_norm": true, "n_routed_experts": 4,
                                  "num_experts_per_tok": 2, "moe_intermediate_size": 8, "n_group": 2, "topk_group": 1,
                                  "routed_scaling_factor": 2.0, "n_shared_experts": 2)")},
          {"deepseek_v3", tiny_latent("deepseek_v3", R"("attention_bias": true, "q_lora_rank": 6, "kv_lora_rank": 8,
              "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 3, "n_routed_experts": 4,
              "num_experts_per_tok": 2, "moe_intermediate_size": 8, "n_group": 2, "topk_group": 1,
              "first_k_dense_replace": 1)")},
          {"deepseek_v2", tiny_latent("deepseek_v2", R"("q_lora_rank": null, "kv_lora_rank": 8,
              "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 4, "n_routed_experts": 4,
              "num_experts_per_tok": 2, "moe_intermediate_size": 8, "n_shared_experts": 1, "first_k_dense_replace": 1,
              "topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.5)")},
          {"glm4_moe_lite", tiny_latent("glm4_moe_lite", R"("q_lora_rank": null, "kv_lora_rank": 8,
              "qk_nope_head_dim": 2, "qk_rope_head_dim": 4, "v_head_dim": 8, "rope_interleave": false,
              "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8)")},
          {"olmo2", tiny_of("olmo2")},
          {"olmo3", tiny_of("olmo3", sliding + R"(, "max_position_embeddings": 64, "rope_parameters": {
                                "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1000.0,
                                                   "original_max_position_embeddings": 16},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}})")},
          {"smollm3", tiny_of("smollm3", R"("no_rope_layers": [1, 0])")},
          {"granite", tiny_of("granite", R"("embedding_multiplier": 3.0, "attention_multiplier": 0.3,
                                 "residual_multiplier": 0.5, "logits_scaling": 2.0)")},
          {"phi3", tiny_of("phi3", R"("head_dim": 8, "partial_rotary_factor": 0.5, "sliding_window": 3,
                              "max_position_embeddings": 64, "original_max_position_embeddings": 4,
                              "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.5],
                                               "long_factor": [2.0, 4.0]})")}};
}

}  // namespace fsdp::model::testing

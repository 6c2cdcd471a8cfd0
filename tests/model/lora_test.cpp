// LoRA on the decoder (model/lora/lora.h): which modules a setting targets and what it refuses, the
// frozen and trainable parameters, PEFT's initialisation, the forward with an adapter against the
// same model with the adapter merged into its weights, and the counts.
#include "model/lora/lora.h"

#include <torch/torch.h>

#include <cmath>
#include <map>

#include "model/layers/decoder.h"
#include "support/error_of.h"
#include "tiny_config.h"
#include "util/strings.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp;
using namespace fsdp::model;
using fsdp::testing::error_of;

namespace {

using fsdp::model::testing::tiny;

CausalLM with_lora(const LoraSettings& s, const DecoderConfig& c = tiny()) {
  CausalLM m(c);
  add_lora(*m, s);
  init_parameters(*m, 3);
  return m;
}

LoraSettings settings(std::vector<std::string> targets, int64_t r = 4, double alpha = 8) {
  LoraSettings s;
  s.r = r;
  s.alpha = alpha;
  s.target_modules = std::move(targets);
  return s;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("target_modules: short names, full names, regular expressions, all-linear; PEFT's default") {
  CausalLM m(tiny());
  CHECK(lora_target_names(*m, settings({})) ==
        std::vector<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                                 "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"});
  CHECK(lora_target_names(*m, settings({"model.layers.1.mlp.down_proj"})) ==
        std::vector<std::string>{"model.layers.1.mlp.down_proj"});
  CHECK(lora_target_names(*m, settings({R"(.*\.0\..*_proj)"})).size() == 7);
  CHECK(lora_target_names(*m, settings({"all-linear"})).size() == 14);  // not lm_head
}

TEST_CASE(
    "Phi-3's fused projections: qkv_proj and gate_up_proj adapted whole under PEFT's names, their parts refused") {
  const DecoderConfig phi = fsdp::model::testing::tiny_of("phi3");
  CausalLM m(phi);
  CHECK(lora_target_names(*m, settings({"qkv_proj", "gate_up_proj"})) ==
        std::vector<std::string>{"model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj",
                                 "model.layers.1.self_attn.qkv_proj", "model.layers.1.mlp.gate_up_proj"});
  // all-linear as PEFT reads it on Phi3ForCausalLM: the fused projections, o_proj and down_proj.
  CHECK(lora_target_names(*m, settings({"all-linear"})).size() == 8);
  CHECK(lora_target_names(*m, settings({R"(.*\.1\.self_attn\.qkv_proj)"})) ==
        std::vector<std::string>{"model.layers.1.self_attn.qkv_proj"});
  CHECK(error_of([&] { lora_target_names(*m, settings({"up_proj"})); }) ==
        "lora.target_modules: model.layers.0.mlp.up_proj (\"up_proj\") is part of Phi3ForCausalLM's fused gate_up_proj, "
        "which PEFT adapts whole; target gate_up_proj instead");
  CHECK(error_of([&] { lora_target_names(*m, settings({})); }) ==
        "lora.target_modules: Phi3ForCausalLM has no default targets (PEFT asks for them too); name qkv_proj, "
        "o_proj, gate_up_proj, down_proj or all-linear");
  add_lora(*m, settings({"qkv_proj", "gate_up_proj"}));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : m->named_parameters())
    if (p.value().requires_grad()) shapes[p.key()] = p.value().sizes().vec();
  const int64_t c = phi.hidden_size, qkv = (phi.num_attention_heads + 2 * phi.num_key_value_heads) * phi.head_dim;
  CHECK(shapes.size() == 8);
  CHECK(shapes.at("model.layers.0.self_attn.qkv_proj.lora_A.weight") == std::vector<int64_t>{4, c});
  CHECK(shapes.at("model.layers.0.self_attn.qkv_proj.lora_B.weight") == std::vector<int64_t>{qkv, 4});
  CHECK(shapes.at("model.layers.1.mlp.gate_up_proj.lora_B.weight") ==
        std::vector<int64_t>{2 * phi.intermediate_size, 4});
}

TEST_CASE("a target the model lacks, or that is not a linear layer, is refused naming what it has") {
  CausalLM m(tiny());
  const std::string typo = error_of([&] { lora_target_names(*m, settings({"q_prj"})); });
  CHECK(contains(typo, "lora.target_modules: the model has no module named \"q_prj\" (did you mean q_proj?)"));
  CHECK(contains(typo, "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"));
  CHECK(contains(error_of([&] { lora_target_names(*m, settings({"mlp"})); }), "is not a linear layer"));
  CHECK(contains(error_of([&] { lora_target_names(*m, settings({"lm_head"})); }), "is not a linear layer"));
  LoraSettings s = settings({"q_proj"});
  s.modules_to_save = {"head"};
  CHECK(contains(error_of([&] { add_lora(*m, s); }), "lora.modules_to_save: the model has no module named \"head\""));
  DecoderConfig tied = tiny();
  tied.tie_word_embeddings = true;
  CausalLM t(tied);
  // A tied head is the embedding: lm_head and embed_tokens name one weight, trained once (PEFT's
  // ensure_weight_tying), and nothing else trains beside the adapters.
  s.modules_to_save = {"lm_head"};
  add_lora(*t, s);
  std::vector<std::string> trained;
  for (const auto& p : t->named_parameters())
    if (p.value().requires_grad() && p.key().find("lora_") == std::string::npos) trained.push_back(p.key());
  CHECK(trained == std::vector<std::string>{"model.embed_tokens.weight"});
}

TEST_CASE("only the adapters and the modules to save train; PEFT's names and initialisation") {
  LoraSettings s = settings({"q_proj", "down_proj"});
  s.modules_to_save = {"lm_head"};
  CausalLM m = with_lora(s);
  std::map<std::string, at::Tensor> p;
  for (const auto& kv : m->named_parameters()) p[kv.key()] = kv.value();
  CHECK(p.at("model.layers.0.self_attn.q_proj.lora_A.weight").sizes() == at::IntArrayRef({4, 16}));
  CHECK(p.at("model.layers.0.self_attn.q_proj.lora_B.weight").sizes() == at::IntArrayRef({16, 4}));
  CHECK(p.at("model.layers.1.mlp.down_proj.lora_A.weight").sizes() == at::IntArrayRef({4, 24}));
  for (const auto& [name, t] : p)
    CHECK_MESSAGE(t.requires_grad() == (is_lora_parameter(name) || name == "lm_head.weight"), name);
  // A uniform within 1/sqrt(in) from the seed and the name; B zero.
  const at::Tensor a = p.at("model.layers.1.mlp.down_proj.lora_A.weight");
  CHECK(a.abs().max().item<float>() <= 1.0 / std::sqrt(24.0));
  CHECK(a.std().item<float>() > 0.5 / std::sqrt(3.0 * 24.0));
  CHECK(a.equal(lora_init(3, "model.layers.1.mlp.down_proj.lora_A.weight", {4, 24})));
  CHECK(!a.equal(lora_init(4, "model.layers.1.mlp.down_proj.lora_A.weight", {4, 24})));
  CHECK(p.at("model.layers.1.mlp.down_proj.lora_B.weight").abs().max().item<float>() == 0);
  const LoraCounts n = lora_counts(*m);
  const int64_t adapters = 2 * (4 * 16 + 16 * 4) + 2 * (4 * 24 + 16 * 4), head = 37 * 16;
  CHECK(n.trainable == adapters + head);
  CHECK(n.all == tiny().num_parameters() + adapters + head);  // the head twice, as PEFT counts it
}

TEST_CASE("the adapted forward equals the merged model's, and equals the base while B is zero") {
  // And Phi-3's: fused adapters, each part's rows of lora_B folded into its own weight.
  for (const bool fused : {false, true}) {
    CAPTURE(fused);
    const DecoderConfig c = fused ? fsdp::model::testing::tiny_of("phi3") : tiny();
    const LoraSettings s = settings({"all-linear"}, 4, 16);
    CausalLM m = with_lora(s, c);
    CausalLM base(c);
    init_parameters(*base, 3);
    const at::Tensor tokens = at::arange(12).remainder(37).view({1, 12});
    torch::NoGradGuard no_grad;
    CHECK(at::allclose(m->forward(tokens), base->forward(tokens), 0, 0));
    std::map<std::string, at::Tensor> params;
    for (const auto& kv : m->named_parameters()) {
      if (ends_with(kv.key(), "lora_B.weight")) kv.value().normal_(0, 0.3);
      params[kv.key()] = kv.value().clone();
    }
    merge_lora(params, s.scaling_for("lora_test"));
    CHECK(params.size() == base->named_parameters().size());
    const at::Tensor plain = base->forward(tokens);
    for (const auto& kv : base->named_parameters()) kv.value().copy_(params.at(kv.key()));
    const at::Tensor adapted = m->forward(tokens), merged = base->forward(tokens);
    CHECK(!at::allclose(adapted, plain, 1e-3, 1e-3));  // the adapters now matter
    CHECK(at::allclose(adapted, merged, 1e-5, 1e-5));
  }
}

TEST_CASE("target_parameters: the experts' stacked weights adapted per expert, nested under PEFT's names") {
  using fsdp::model::testing::tiny_of;
  const DecoderConfig qwen = tiny_of("qwen3_moe", R"("num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 12, "norm_topk_prob": true, "mlp_only_layers": [0])");
  const DecoderConfig oss = tiny_of("gpt_oss", R"("num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8)");
  for (const auto& [name, c] : {std::pair{"qwen3_moe", qwen}, std::pair{"gpt_oss", oss}}) {
    CAPTURE(name);
    const bool sparse_first = std::string(name) == "gpt_oss";  // gpt-oss: every layer sparse
    LoraSettings s = settings({"q_proj"}, 2, 6);
    s.target_parameters = {"mlp.experts.gate_up_proj", "down_proj"};
    CausalLM m = with_lora(s, c);
    // PEFT's nesting: the last targeted weight (down_proj) is the experts module's own adapter, the
    // one before it under base_layer; lora_A (r E, in), lora_B (out, r E).
    const std::string e = "model.layers.1.mlp.experts.";
    auto params = m->named_parameters();
    const int64_t C = c.hidden_size, I = c.moe.intermediate_size;
    CHECK(params[e + "lora_A.weight"].sizes() == at::IntArrayRef({8, I}));
    CHECK(params[e + "lora_B.weight"].sizes() == at::IntArrayRef({C, 8}));
    CHECK(params[e + "base_layer.lora_A.weight"].sizes() == at::IntArrayRef({8, C}));
    CHECK(params[e + "base_layer.lora_B.weight"].sizes() == at::IntArrayRef({2 * I, 8}));
    CHECK(params.contains("model.layers.0.mlp.experts.lora_A.weight") == sparse_first);
    CHECK(!params[e + "gate_up_proj"].requires_grad());
    CHECK(lora_target_parameters(*m, s) ==
          (sparse_first ? std::vector<std::string>{"model.layers.0.mlp.experts.gate_up_proj",
                                                   "model.layers.0.mlp.experts.down_proj", e + "gate_up_proj",
                                                   e + "down_proj"}
                        : std::vector<std::string>{e + "gate_up_proj", e + "down_proj"}));
    // One weight alone: its adapter is the module's own.
    LoraSettings one = s;
    one.target_parameters = {"gate_up_proj"};
    CHECK(CausalLM(c)->named_parameters().size() + 2 * (sparse_first ? 2 : 1) + 4 ==
          with_lora(one, c)->named_parameters().size());
    CHECK(with_lora(one, c)->named_parameters()[e + "lora_A.weight"].size(1) == C);

    // The adapted forward equals the model with each expert's B_e A_e folded into its weights.
    const at::Tensor tokens = at::arange(12).remainder(37).view({1, 12});
    torch::NoGradGuard no_grad;
    CausalLM base(c);
    init_parameters(*base, 3);
    const at::Tensor plain = base->forward(tokens);
    CHECK(at::allclose(m->forward(tokens), plain, 0, 0));  // B starts at zero
    std::map<std::string, at::Tensor> values;
    for (const auto& kv : m->named_parameters()) {
      if (ends_with(kv.key(), "lora_B.weight")) kv.value().normal_(0, 0.3);
      values[kv.key()] = kv.value().clone();
    }
    merge_lora(values, s.scaling_for("lora_test"), s.target_parameters, /*transposed_experts=*/sparse_first);
    CHECK(values.size() == base->named_parameters().size());
    for (const auto& kv : base->named_parameters()) kv.value().copy_(values.at(kv.key()));
    const at::Tensor adapted = m->forward(tokens), merged = base->forward(tokens);
    CHECK(!at::allclose(adapted, plain, 1e-3, 1e-3));
    CHECK(at::allclose(adapted, merged, 1e-5, 1e-5));
  }
}

TEST_CASE("target_parameters refuses what PEFT's ParamWrapper does not adapt, naming the setting") {
  using fsdp::model::testing::tiny_of;
  const DecoderConfig moe = tiny_of("qwen3_moe", R"("num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 12)");
  LoraSettings s = settings({"q_proj"});
  s.target_parameters = {"mlp.experts.gate_up_prj"};
  CHECK(contains(error_of([&] { with_lora(s, moe); }),
                 "lora.target_parameters: the model has no parameter named \"mlp.experts.gate_up_prj\""));
  s.target_parameters = {"self_attn.q_proj.weight"};
  CHECK(contains(error_of([&] { with_lora(s, moe); }), "is neither an experts module's stacked weight nor a router's"));
  s.target_parameters = {"down_proj"};
  s.dropout = 0.1;
  CHECK(contains(error_of([&] { with_lora(s, moe); }), "set lora.dropout: 0"));
  s.dropout = 0;
  CHECK(contains(error_of([&] { with_lora(s); }), "has no mixture-of-experts layer"));
  // Only the experts: no linear layer adapted (PEFT adds no default target_modules then).
  s.target_modules = {};
  CHECK(lora_target_names(*CausalLM(moe), s).empty());
}

// PEFT 0.21 under transformers 5 reads all-linear and the experts' projection names on Qwen3-MoE,
// Mixtral, Qwen3-Next and GLM-4.5 as the stacked experts and the router (lora_python_test checks that PEFT
// does): fsdptrain says so on the [lora] line; it says nothing where PEFT reads them as named.
TEST_CASE("a note where PEFT would read the targets of a mixture of experts as its experts and router") {
  using fsdp::model::testing::tiny_of;
  const std::string experts = R"("num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 12)";
  const DecoderConfig qwen = tiny_of("qwen3_moe", experts);
  const DecoderConfig mixtral = tiny_of("mixtral", R"("num_local_experts": 4, "num_experts_per_tok": 2)");
  const DecoderConfig qwen2 = tiny_of("qwen2_moe", experts);
  const DecoderConfig gemma4 = tiny_of("gemma4_text", R"("hidden_size_per_layer_input": 0, "head_dim": 4,
      "enable_moe_block": true, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 8)");
  const std::string all = peft_moe_target_note(qwen, settings({"all-linear"}));
  CHECK(contains(all, "reads target_modules all-linear on Qwen3MoeForCausalLM as the experts' stacked weights"));
  CHECK(contains(all,
                 "PEFT's here: lora.target_parameters [mlp.experts.gate_up_proj, mlp.experts.down_proj, "
                 "mlp.gate.weight], lora.rank_pattern {gate_up_proj: 8}, lora.alpha_pattern {gate_up_proj: 16}"));
  CHECK(contains(peft_moe_target_note(qwen, settings({"q_proj", "model.layers.1.mlp.down_proj"})),
                 "reads target_modules model.layers.1.mlp.down_proj on Qwen3MoeForCausalLM"));
  CHECK(contains(peft_moe_target_note(mixtral, settings({"all-linear"})), "on MixtralForCausalLM"));
  CHECK(contains(peft_moe_target_note(tiny_of("glm4_moe", R"("n_routed_experts": 4, "num_experts_per_tok": 2)"),
                                      settings({"q_proj", "down_proj"})),
                 "reads target_modules down_proj on Glm4MoeForCausalLM"));
  CHECK(peft_moe_target_note(qwen, settings({"q_proj", "v_proj"})).empty());
  CHECK(peft_moe_target_note(mixtral, settings({"down_proj"})).empty());  // its experts are w1, w2, w3 there
  CHECK(peft_moe_target_note(qwen2, settings({"all-linear"})).empty());
  CHECK(peft_moe_target_note(gemma4, settings({"all-linear"})).empty());
  CHECK(peft_moe_target_note(tiny(), settings({"all-linear"})).empty());
}

TEST_CASE("rank_pattern and alpha_pattern: the first pattern a module's name ends in, as PEFT's get_pattern_key") {
  LoraSettings s = settings({"all-linear"}, 4, 8);
  s.rank_pattern = {{"layers.1.self_attn.q_proj", 8}, {"q_proj", 2}, {R"(.*\.experts\.gate_up_proj)", 6}};
  s.alpha_pattern = {{"down_proj", 32}};
  CHECK(s.rank_of("model.layers.1.self_attn.q_proj") == 8);  // the first that matches
  CHECK(s.rank_of("model.layers.0.self_attn.q_proj") == 2);
  LoraSettings shortest_first = s;  // the first, not the longest
  std::swap(shortest_first.rank_pattern[0], shortest_first.rank_pattern[1]);
  CHECK(shortest_first.rank_of("model.layers.1.self_attn.q_proj") == 2);
  CHECK(s.rank_of("model.layers.0.self_attn.k_proj") == 4);
  CHECK(s.rank_of("model.layers.0.self_attn.xq_proj") == 4);  // a pattern matches whole parts of the name
  CHECK(s.rank_of("model.layers.3.mlp.experts.gate_up_proj") == 6);
  CHECK(s.alpha_of("model.layers.0.mlp.down_proj") == 32);
  CHECK(s.scaling_of("model.layers.0.mlp.down_proj") == doctest::Approx(8.0));
  CHECK(s.scaling_of("model.layers.0.self_attn.q_proj") == doctest::Approx(4.0));
  s.use_rslora = true;
  CHECK(s.scaling_of("model.layers.0.self_attn.q_proj") == doctest::Approx(8 / std::sqrt(2.0)));
  s.use_rslora = false;
  // The merges take a tensor's rank from its shape: another rank than the settings give is refused.
  const LoraScaling scaling = s.scaling_for("adapter_config.json");
  CHECK(scaling("model.layers.1.self_attn.q_proj", 8) == doctest::Approx(1.0));
  CHECK(contains(error_of([&] { scaling("model.layers.0.self_attn.q_proj", 4); }),
                 "adapter_config.json: the adapter of model.layers.0.self_attn.q_proj has rank 4 where r and "
                 "rank_pattern give it 2"));

  s.rank_pattern.pop_back();  // the dense model has no experts: a pattern that names nothing is refused (below)
  CausalLM m = with_lora(s);
  auto params = m->named_parameters();
  CHECK(params["model.layers.1.self_attn.q_proj.lora_A.weight"].size(0) == 8);
  CHECK(params["model.layers.0.self_attn.q_proj.lora_B.weight"].size(1) == 2);
  CHECK(params["model.layers.0.mlp.up_proj.lora_A.weight"].size(0) == 4);
  // Each adapter carries its own scaling: alpha 32 over r 4 on down_proj, 8 over 2 on layer 0's q_proj.
  auto scaling_of = [&](const std::string& module) {
    return m->named_modules()[module + ".lora_A"]->as<LoraDownImpl>()->scaling;
  };
  CHECK(scaling_of("model.layers.0.mlp.down_proj") == doctest::Approx(8.0));
  CHECK(scaling_of("model.layers.0.self_attn.q_proj") == doctest::Approx(4.0));
  CHECK(scaling_of("model.layers.1.self_attn.q_proj") == doctest::Approx(1.0));
  CHECK(scaling_of("model.layers.1.mlp.up_proj") == doctest::Approx(2.0));
  // The adapted forward equals the merged model's, each adapter at its own scaling.
  const at::Tensor tokens = at::arange(12).remainder(37).view({1, 12});
  torch::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> values;
  for (const auto& kv : m->named_parameters()) {
    if (ends_with(kv.key(), "lora_B.weight")) kv.value().normal_(0, 0.3);
    values[kv.key()] = kv.value().clone();
  }
  merge_lora(values, s.scaling_for("lora_test"));
  CausalLM base(tiny());
  for (const auto& kv : base->named_parameters()) kv.value().copy_(values.at(kv.key()));
  CHECK(at::allclose(m->forward(tokens), base->forward(tokens), 1e-5, 1e-5));
  LoraSettings plain = s;  // merged at one scaling for all, the model differs
  plain.rank_pattern.clear();
  plain.alpha_pattern.clear();
  std::map<std::string, at::Tensor> wrong;
  for (const auto& kv : m->named_parameters()) wrong[kv.key()] = kv.value().clone();
  CHECK(contains(error_of([&] { merge_lora(wrong, plain.scaling_for("an adapter")); }), "where r gives it 4"));

  // A pattern that gives no adapter its value is refused (PEFT warns and trains at the default).
  LoraSettings typo = settings({"q_proj", "v_proj"});
  typo.rank_pattern = {{"q_prj", 8}};
  CausalLM t(tiny());
  CHECK(contains(error_of([&] { add_lora(*t, typo); }),
                 "lora.rank_pattern: \"q_prj\" matches none of the adapted modules (q_proj, v_proj, in 4 places"));
  typo.rank_pattern = {{"(q_proj", 8}};
  CHECK(contains(error_of([&] { add_lora(*t, typo); }), "lora.rank_pattern"));
}

TEST_CASE("layers_to_transform: the layers whose target_modules get adapters, as PEFT numbers them") {
  CHECK(lora_layer_index("model.layers.12.self_attn.q_proj", {}) == 12);
  CHECK(lora_layer_index("model.layers.1.mlp.experts.3.gate_proj", {}) == 1);  // the first number, not an expert's
  CHECK(!lora_layer_index("model.per_layer_model_projection", {}));
  CHECK(!lora_layer_index("layers.1.q_proj", {}));  // PEFT wants a part before the layers' name
  CHECK(lora_layer_index("model.layers.2.blocks.5.q_proj", {"blocks"}) == 5);
  CHECK(lora_layer_index("model.layers.2.blocks.5.q_proj", {"blocks", "layers"}) == 5);  // the patterns in order
  CHECK(lora_layer_index("model.layers.2.q_proj", {"lay.rs"}) == 2);                     // a regular expression
  CHECK(!lora_layer_index("model.layers.2.q_proj", {"blocks"}));

  CausalLM m(tiny());
  LoraSettings s = settings({"q_proj", "down_proj", "model.layers.0.mlp.up_proj"});
  s.layers_to_transform = {1};
  // A module named in full is adapted whatever its layer (PEFT checks the layer of the others only).
  CHECK(lora_target_names(*m, s) == std::vector<std::string>{"model.layers.0.mlp.up_proj",
                                                             "model.layers.1.self_attn.q_proj",
                                                             "model.layers.1.mlp.down_proj"});
  s.target_modules = {"all-linear"};
  CHECK(lora_target_names(*m, s).size() == 7);
  s.layers_pattern = {"blocks"};
  CHECK(contains(error_of([&] { lora_target_names(*m, s); }),
                 "lora.layers_to_transform [1] leaves none of the modules lora.target_modules names (by "
                 "lora.layers_pattern blocks); its layers are numbered 0 to 1"));
  s.layers_pattern.clear();
  s.layers_to_transform = {2};
  CHECK(contains(
      error_of([&] { lora_target_names(*m, s); }),
      "lora.layers_to_transform: 2 is not a layer of this LlamaForCausalLM, whose layers are numbered 0 to 1"));
}

TEST_CASE("a router's weight in target_parameters, and Qwen2-MoE's shared expert gate, adapted as PEFT adapts them") {
  using fsdp::model::testing::tiny_of;
  const DecoderConfig qwen = tiny_of("qwen3_moe", R"("num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 12, "norm_topk_prob": true, "mlp_only_layers": [0])");
  // PEFT 0.21's reading of all-linear on Qwen3-MoE: attention, the experts (gate_up_proj at twice the rank
  // and alpha) and the router's weight.
  LoraSettings s = settings({"q_proj", "k_proj", "v_proj", "o_proj"}, 2, 6);
  s.target_parameters = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj", "gate.weight"};
  s.rank_pattern = {{R"(.*\.gate_up_proj)", 4}};
  s.alpha_pattern = {{R"(.*\.gate_up_proj)", 12}};
  CausalLM m = with_lora(s, qwen);
  CHECK(lora_target_parameters(*m, s) == std::vector<std::string>{"model.layers.1.mlp.gate.weight",
                                                                  "model.layers.1.mlp.experts.gate_up_proj",
                                                                  "model.layers.1.mlp.experts.down_proj"});
  auto params = m->named_parameters();
  const int64_t C = qwen.hidden_size, E = 4;
  CHECK(params["model.layers.1.mlp.gate.lora_A.weight"].sizes() == at::IntArrayRef({2, C}));
  CHECK(params["model.layers.1.mlp.gate.lora_B.weight"].sizes() == at::IntArrayRef({E, 2}));
  CHECK(params["model.layers.1.mlp.experts.base_layer.lora_A.weight"].size(0) == 4 * E);  // gate_up_proj: rank 4
  CHECK(params["model.layers.1.mlp.experts.lora_A.weight"].size(0) == 2 * E);
  CHECK(!params["model.layers.1.mlp.gate.weight"].requires_grad());
  CHECK(params["model.layers.1.mlp.gate.lora_A.weight"].requires_grad());
  // The router's adapter moves the routing; the merged model routes and computes the same.
  const at::Tensor tokens = at::arange(12).remainder(37).view({1, 12});
  torch::NoGradGuard no_grad;
  CausalLM base(qwen);
  init_parameters(*base, 3);
  const at::Tensor plain = base->forward(tokens);
  std::map<std::string, at::Tensor> values;
  for (const auto& kv : m->named_parameters()) {
    if (ends_with(kv.key(), "lora_B.weight")) kv.value().normal_(0, 0.3);
    values[kv.key()] = kv.value().clone();
  }
  merge_lora(values, s.scaling_for("lora_test"), s.target_parameters);
  for (const auto& kv : base->named_parameters()) kv.value().copy_(values.at(kv.key()));
  CHECK(at::allclose(m->forward(tokens), base->forward(tokens), 1e-5, 1e-5));
  // The router's adapter alone moves the output (the others' B back at zero).
  for (const auto& kv : m->named_parameters())
    if (ends_with(kv.key(), "lora_B.weight") && kv.key() != "model.layers.1.mlp.gate.lora_B.weight") kv.value().zero_();
  CHECK(!at::allclose(m->forward(tokens), plain, 1e-3, 1e-3));
  LoraSettings gate_only = settings({"q_proj"}, 2, 6);
  gate_only.target_parameters = {"mlp.gate.weight"};
  CHECK(lora_target_parameters(*CausalLM(qwen), gate_only) ==
        std::vector<std::string>{"model.layers.1.mlp.gate.weight"});

  // Qwen2-MoE's shared_expert_gate (1, C) is a linear layer, which PEFT's all-linear adapts.
  const DecoderConfig qwen2 = tiny_of("qwen2_moe", R"("num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 12, "shared_expert_intermediate_size": 16, "mlp_only_layers": [0])");
  const std::vector<std::string> all = lora_target_names(*CausalLM(qwen2), settings({"all-linear"}));
  CHECK(std::find(all.begin(), all.end(), "model.layers.1.mlp.shared_expert_gate") != all.end());
  CausalLM shared = with_lora(settings({"shared_expert_gate"}), qwen2);
  CHECK(shared->named_parameters()["model.layers.1.mlp.shared_expert_gate.lora_B.weight"].sizes() ==
        at::IntArrayRef({1, 4}));
}

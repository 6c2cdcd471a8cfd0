// Llama against numbers computed independently here: a float64 reimplementation of the whole
// forward pass, RMSNorm, rotary identities, causal masking, GQA as repeated heads, Llama 3 rope
// scaling, config.json spellings, and initialisation that depends only on the seed and the name.
#include "model/layers/decoder.h"

#include <torch/torch.h>

#include <cmath>

#include "data/dataset.h"
#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "model/kernels/ops.h"
#include "model/kernels/stacked_weights.h"
#include "model/layers/chunked_loss.h"
#include "model/parallel/context_parallel.h"
#include "model/parallel/tensor_parallel.h"
#include "support/error_of.h"
#include "tiny_config.h"
#include "util/error.h"
#include "util/strings.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp;
using namespace fsdp::model;

namespace {

using fsdp::testing::error_of;

using fsdp::model::testing::tiny;

// Every parameter's gradient, then zeroed for the next backward.
std::vector<at::Tensor> take_grads(CausalLMImpl& m) {
  std::vector<at::Tensor> g;
  for (const auto& p : m.parameters()) g.push_back(p.grad().clone());
  m.zero_grad();
  return g;
}

CausalLM build(const DecoderConfig& c, uint64_t seed = 5) {
  CausalLM m(c);
  init_parameters(*m, seed);
  return m;
}

std::map<std::string, at::Tensor> weights64(CausalLMImpl& m) {
  std::map<std::string, at::Tensor> w;
  for (const auto& p : m.named_parameters()) w[p.key()] = p.value().detach().to(at::kDouble);
  return w;
}

// The forward pass written out in float64 from the formulas (HF modeling_llama), without the
// model's code: explicit rotation of pairs (i, i + D/2), an explicit causal mask and softmax, and
// kv head h / (H / K) for query head h.
at::Tensor reference_logits(const DecoderConfig& c, std::map<std::string, at::Tensor> w, const at::Tensor& tokens) {
  const int64_t B = tokens.size(0), T = tokens.size(1), H = c.num_attention_heads, K = c.num_key_value_heads,
                D = c.head_dim;
  auto rms = [&](const at::Tensor& x, const at::Tensor& g) {
    return x / at::sqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps) * g;
  };
  at::Tensor angle = at::empty({T, D / 2}, at::kDouble);
  for (int64_t p = 0; p < T; ++p)
    for (int64_t i = 0; i < D / 2; ++i) angle[p][i] = p * std::pow(c.rope_theta, -2.0 * i / D);
  const at::Tensor cs = angle.cos(), sn = angle.sin();
  auto rotate = [&](const at::Tensor& x) {  // (B, heads, T, D)
    const at::Tensor a = x.narrow(-1, 0, D / 2), b = x.narrow(-1, D / 2, D / 2);
    return at::cat({a * cs - b * sn, b * cs + a * sn}, -1);
  };
  at::Tensor x = w["model.embed_tokens.weight"].index_select(0, tokens.reshape({-1})).view({B, T, -1});
  const at::Tensor mask = at::ones({T, T}, at::kBool).triu(1);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const at::Tensor h = rms(x, w[p + "input_layernorm.weight"]);
    at::Tensor q = rotate(at::matmul(h, w[p + "self_attn.q_proj.weight"].t()).view({B, T, H, D}).transpose(1, 2));
    at::Tensor k = rotate(at::matmul(h, w[p + "self_attn.k_proj.weight"].t()).view({B, T, K, D}).transpose(1, 2));
    at::Tensor v = at::matmul(h, w[p + "self_attn.v_proj.weight"].t()).view({B, T, K, D}).transpose(1, 2);
    std::vector<at::Tensor> heads;
    for (int64_t hd = 0; hd < H; ++hd) {
      const int64_t kv = hd / (H / K);
      at::Tensor s = at::matmul(q.select(1, hd), k.select(1, kv).transpose(1, 2)) / std::sqrt(static_cast<double>(D));
      s = s.masked_fill(mask, -std::numeric_limits<double>::infinity());
      const at::Tensor e = (s - std::get<0>(s.max(-1, true))).exp();
      heads.push_back(at::matmul(e / e.sum(-1, true), v.select(1, kv)));  // (B, T, D)
    }
    x = x + at::matmul(at::cat(heads, -1), w[p + "self_attn.o_proj.weight"].t());
    const at::Tensor h2 = rms(x, w[p + "post_attention_layernorm.weight"]);
    const at::Tensor g = at::matmul(h2, w[p + "mlp.gate_proj.weight"].t());
    x = x + at::matmul(g / (1 + (-g).exp()) * at::matmul(h2, w[p + "mlp.up_proj.weight"].t()),
                       w[p + "mlp.down_proj.weight"].t());
  }
  x = rms(x, w["model.norm.weight"]);
  const at::Tensor head = c.tie_word_embeddings ? w["model.embed_tokens.weight"] : w["lm_head.weight"];
  return at::matmul(x, head.t());
}

}  // namespace

TEST_CASE("a fixed-seed model's logits equal a float64 reimplementation") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  for (bool tied : {false, true}) {
    DecoderConfig c = tiny();
    c.tie_word_embeddings = tied;
    CausalLM m = build(c);
    const at::Tensor tokens = at::randint(0, c.vocab_size, {3, 7}, at::kLong);
    const at::Tensor got = m->forward(tokens).to(at::kDouble);
    const at::Tensor want = reference_logits(c, weights64(*m), tokens);
    CHECK(got.sizes().vec() == std::vector<int64_t>{3, 7, c.vocab_size});
    CHECK((got - want).abs().max().item<double>() < 1e-4);
    CHECK(want.abs().max().item<double>() > 0.1);  // not a trivially small comparison
  }
}

TEST_CASE("HF parameter names and shapes") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  DecoderConfig c = tiny();
  CausalLM m(c);
  auto params = m->named_parameters();
  CHECK(params["model.layers.1.self_attn.q_proj.weight"].sizes().vec() == std::vector<int64_t>{16, 16});
  CHECK(params["model.layers.1.self_attn.k_proj.weight"].sizes().vec() == std::vector<int64_t>{8, 16});
  CHECK(params["model.layers.0.mlp.down_proj.weight"].sizes().vec() == std::vector<int64_t>{16, 24});
  CHECK(params["lm_head.weight"].sizes().vec() == std::vector<int64_t>{37, 16});
  CHECK(params.contains("model.norm.weight"));
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  CHECK(n == c.num_parameters());
}

TEST_CASE("RMSNorm: fp32 statistics, cast back to bf16 before the (bf16) weight") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  RmsNorm norm(8, 1e-6);
  norm->weight.data().copy_(at::linspace(0.5, 2.0, 8));
  norm->to(at::kBFloat16);
  const at::Tensor x = (at::randn({2, 3, 8}) * 3).to(at::kBFloat16);
  const at::Tensor got = norm(x);
  CHECK((got.scalar_type() == at::kBFloat16));
  const at::Tensor x64 = x.to(at::kDouble);
  const at::Tensor normed = (x64 / (x64.pow(2).mean(-1, true) + 1e-6).sqrt()).to(at::kBFloat16);
  CHECK(at::equal(got, normed * norm->weight));
}

TEST_CASE("rotary embeddings: a rotation, and attention scores depend on relative position only") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  DecoderConfig c = tiny();
  const at::Tensor inv = rope_inv_freq(c);
  const at::Tensor like = at::zeros({1}, at::kDouble);
  auto [cos, sin] = rope_cos_sin(inv, 12, like);
  const at::Tensor q = at::randn({c.head_dim}, at::kDouble), k = at::randn({c.head_dim}, at::kDouble);
  auto at_pos = [&](const at::Tensor& v, int64_t p) { return kernels::apply_rotary(v, cos[p], sin[p]); };
  CHECK(std::abs(at_pos(q, 7).norm().item<double>() - q.norm().item<double>()) < 1e-6);
  const double d1 = at_pos(q, 9).dot(at_pos(k, 4)).item<double>();
  const double d2 = at_pos(q, 5).dot(at_pos(k, 0)).item<double>();
  CHECK(std::abs(d1 - d2) < 1e-5);
  CHECK(std::abs(inv[1].item<double>() - std::pow(c.rope_theta, -2.0 / c.head_dim)) < 1e-6);
}

TEST_CASE("Llama 3 rope scaling: high frequencies kept, low ones divided by the factor, the middle blended") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  DecoderConfig c = tiny();
  c.head_dim = 128;
  c.rope_theta = 500000.0;
  c.rope_scaling = RopeScaling{};  // Llama 3's: factor 8, low 1, high 4, over 8192 positions
  CHECK((c.rope_scaling->type == RopeScaling::Type::kLlama3 && c.rope_scaling->factor == 8.0 &&
         c.rope_scaling->low_freq_factor == 1.0 && c.rope_scaling->high_freq_factor == 4.0 &&
         c.rope_scaling->original_max_position_embeddings == 8192));
  DecoderConfig plain = c;
  plain.rope_scaling.reset();
  const at::Tensor s = rope_inv_freq(c).to(at::kDouble), p = rope_inv_freq(plain).to(at::kDouble);
  for (int64_t i = 0; i < 64; ++i) {
    const double f = p[i].item<double>(), wavelen = 2 * M_PI / f, got = s[i].item<double>();
    double want;
    if (wavelen < 8192 / 4.0)
      want = f;
    else if (wavelen > 8192 / 1.0)
      want = f / 8.0;
    else {
      const double smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0);
      want = (1 - smooth) * f / 8.0 + smooth * f;
    }
    CHECK(std::abs(got - want) <= 1e-6 * want);
  }
}

TEST_CASE("causal: a token's logits do not depend on later tokens") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  DecoderConfig c = tiny();
  CausalLM m = build(c);
  at::Tensor a = at::randint(0, c.vocab_size, {1, 8}, at::kLong);
  at::Tensor b = a.clone();
  b.narrow(1, 5, 3).add_(1).remainder_(c.vocab_size);  // every later token differs
  const at::Tensor la = m->forward(a), lb = m->forward(b);
  CHECK(at::allclose(la.narrow(1, 0, 5), lb.narrow(1, 0, 5), 1e-4, 1e-5));
  CHECK(!at::allclose(la.narrow(1, 5, 3), lb.narrow(1, 5, 3)));
}

TEST_CASE("GQA equals full attention with each kv head repeated") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  DecoderConfig gqa = tiny(2), full = tiny(4);
  CausalLM a = build(gqa), b = build(full);
  torch::NoGradGuard no_grad;
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& p : pa) {
    at::Tensor src = p.value();
    if (p.key().find("k_proj") != std::string::npos || p.key().find("v_proj") != std::string::npos)
      src =
          src.view({2, 1, gqa.head_dim, -1}).expand({2, 2, gqa.head_dim, src.size(1)}).reshape({4 * gqa.head_dim, -1});
    pb[p.key()].copy_(src);
  }
  const at::Tensor tokens = at::randint(0, gqa.vocab_size, {2, 6}, at::kLong);
  // Different matmul shapes round differently in the last bits; the logits are O(1).
  CHECK(at::allclose(a->forward(tokens), b->forward(tokens), 1e-4, 1e-5));
}

TEST_CASE("a large initial weight fills in blocks on every core: the same values on one thread or two, N(0, std)") {
  DecoderConfig c = tiny();
  c.initializer_range = 0.02;
  const std::vector<int64_t> shape{3000, 1000};  // 3M values: three blocks of 2^20 (the last one short)
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor one = init_parameter(c, 9, "model.embed_tokens.weight", shape);
  at::set_num_threads(2);
  const at::Tensor two = init_parameter(c, 9, "model.embed_tokens.weight", shape);
  at::set_num_threads(threads);
  CHECK(at::equal(one, two));
  CHECK(std::abs(one.mean().item<double>()) < 1e-4);        // 3M draws: the mean's error is ~1e-5
  CHECK(std::abs(one.std().item<double>() - 0.02) < 1e-4);  // and the std's ~1e-5
  const at::Tensor flat = one.reshape({-1});
  const int64_t block = int64_t{1} << 20;  // each block its own generator: no block repeats another
  CHECK(!at::equal(flat.narrow(0, 0, 1000), flat.narrow(0, block, 1000)));
  CHECK(!at::equal(flat.narrow(0, block, 1000), flat.narrow(0, 2 * block, 1000)));
  CHECK(!at::equal(one, init_parameter(c, 10, "model.embed_tokens.weight", shape)));
}

TEST_CASE("a rank's range of an initial weight, made alone, equals that range of the whole") {
  DecoderConfig c = tiny();
  const std::vector<int64_t> shape{3000, 1000};  // three blocks of 2^20, the last one short
  const int64_t block = int64_t{1} << 20, n = 3000 * 1000;
  for (const std::string name : {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                                 "model.layers.0.self_attn.q_proj.bias", "model.layers.0.mlp.up_proj.lora_A.weight"}) {
    const at::Tensor whole = init_parameter(c, 9, name, shape).reshape({-1});
    for (const auto& [begin, count] : std::vector<std::pair<int64_t, int64_t>>{{0, n},
                                                                               {0, 1},
                                                                               {block - 1000, 2000},
                                                                               {block, block},
                                                                               {2 * block - 7, n - 2 * block + 7},
                                                                               {n - 5, 5},
                                                                               {17, 0}}) {
      INFO(name, " [", begin, ", ", begin + count, ")");
      CHECK(at::equal(init_parameter_range(c, 9, name, shape, begin, count), whole.narrow(0, begin, count)));
    }
  }
  CHECK(error_of([&] {
          init_parameter_range(c, 9, "model.embed_tokens.weight", shape, n - 1, 2);
        }).find("outside model.embed_tokens.weight's 3000000 values") != std::string::npos);
}

TEST_CASE("initial weights depend only on the seed and the name; layer-by-layer sharding builds the same model") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  DecoderConfig c = tiny();
  CHECK(at::equal(init_parameter(c, 9, "model.layers.1.mlp.up_proj.weight", {24, 16}),
                  init_parameter(c, 9, "model.layers.1.mlp.up_proj.weight", {24, 16})));
  CHECK(!at::equal(init_parameter(c, 9, "model.layers.1.mlp.up_proj.weight", {24, 16}),
                   init_parameter(c, 9, "model.layers.0.mlp.up_proj.weight", {24, 16})));
  CausalLM full = build(c, 9);
  CausalLM lazy(c, /*free_after_create=*/true);
  for (const auto& p : lazy->parameters()) CHECK(p.storage().nbytes() == 0);
  FsdpOptions o;
  o.init = [&](const std::string& name, at::IntArrayRef shape) { return init_parameter(c, 9, name, shape); };
  o.init_range = [&](const std::string& name, at::IntArrayRef shape, int64_t begin, int64_t count) {
    return init_parameter_range(c, 9, name, shape, begin, count);  // what a run gives fully_shard
  };
  auto sharded = fully_shard(*lazy, decoder_traits(c), DeviceMesh{dist::make_single_process_group(), std::nullopt}, o);
  const at::Tensor tokens = at::randint(0, c.vocab_size, {2, 5}, at::kLong);
  torch::NoGradGuard no_grad;
  const at::Tensor got =
      sharded->forward({tokens}, [&](const TensorList& in) { return TensorList{lazy->forward(in[0])}; })[0];
  CHECK(at::allclose(got, full->forward(tokens), 1e-5, 1e-6));
}

TEST_CASE("config.json: HF spellings old and new, and clear errors") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  const DecoderConfig a = parse_decoder_config(
      R"({"model_type":"llama","vocab_size":257,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
          "num_attention_heads":4,"torch_dtype":"bfloat16",
          "rope_theta":500000.0,"rope_scaling":{"type":"llama3","factor":8.0,"low_freq_factor":1.0,
          "high_freq_factor":4.0,"original_max_position_embeddings":8192}})",
      "a.json");
  CHECK(a.head_dim == 16);
  CHECK(a.num_key_value_heads == 4);
  CHECK(a.dtype == "bfloat16");
  CHECK(a.rope_theta == 500000.0);
  REQUIRE(a.rope_scaling.has_value());
  CHECK(a.rope_scaling->factor == 8.0);
  const DecoderConfig b = parse_decoder_config(
      R"({"vocab_size":257,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
          "dtype":"float32","torch_dtype":"bfloat16",
          "rope_parameters":{"rope_type":"llama3","rope_theta":10000.0,"factor":4.0}})",
      "b.json");
  CHECK(b.dtype == "float32");
  CHECK(b.rope_theta == 10000.0);
  REQUIRE(b.rope_scaling.has_value());
  CHECK(b.rope_scaling->factor == 4.0);
  CHECK(parse_decoder_config(decoder_config_json(b), "round trip").rope_scaling->factor == 4.0);
  CHECK(error_of([] { parse_decoder_config("{", "c.json"); }).find("c.json: not valid JSON") != std::string::npos);
  CHECK(error_of([] {
          parse_decoder_config(R"({"model_type":"gpt2"})", "g.json");
        }).find("model_type \"gpt2\" is not supported") != std::string::npos);
  CHECK(error_of([] {
          parse_decoder_config(R"({"hidden_size":"big"})", "h.json");
        }).find("h.json: \"hidden_size\": expected a number") != std::string::npos);
  CHECK(error_of([] { load_llama_config("/nonexistent/config.json"); }).find("cannot read") != std::string::npos);
  // 2^31 layers: refused by the field, before any per-layer pass (one took the launcher 100 s).
  CHECK(error_of([] {
          parse_decoder_config(R"({"vocab_size":257,"hidden_size":64,"intermediate_size":128,
                                   "num_hidden_layers":2147483648,"num_attention_heads":4})",
                               "d.json");
        }).find("d.json: num_hidden_layers is 2147483648; no model is that large") != std::string::npos);
}

namespace {

// A four-layer config.json of `type` (type.json) with `extra` members, read as a user's file is; and the
// message it is refused with.
DecoderConfig parse_shaped(const std::string& type, const std::string& extra = "") {
  const std::string shape = R"("vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4,
      "num_attention_heads": 4, "num_key_value_heads": 2)";
  return parse_decoder_config(R"({"model_type": ")" + type + "\", " + shape + (extra.empty() ? "" : ", " + extra) + "}",
                              type + ".json");
}
std::string shaped_error(const std::string& type, const std::string& extra) {
  return error_of([&] { parse_shaped(type, extra); });
}

// The export of `c` reads back as the same model: the same config.json, layer plans, local rotary base and size.
void check_round_trip(const DecoderConfig& c) {
  INFO(family_names(c.family).model_type);
  const DecoderConfig back = parse_decoder_config(decoder_config_json(c), "export");
  CHECK(decoder_config_json(back) == decoder_config_json(c));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    CHECK(back.plan(i).window == c.plan(i).window);
    CHECK(back.plan(i).rotary == c.plan(i).rotary);
    CHECK(back.plan(i).rope == c.plan(i).rope);
  }
  CHECK(back.local_rope_theta == c.local_rope_theta);
  CHECK(back.num_parameters() == c.num_parameters());
}

}  // namespace

// Issue 60: the families' forms and layer plans as transformers' configs fill them in, written back
// the same, and what is not theirs refused by name.
TEST_CASE("config.json of the 2026 families: transformers' defaults, the per-layer plan, a round trip, refusals") {
  auto parse = [](const std::string& type, const std::string& extra = "") { return parse_shaped(type, extra); };
  const DecoderConfig g2 = parse("gemma2", R"("head_dim": 8)");
  CHECK(g2.norms == NormPlacement::kSandwich);
  CHECK((g2.norm_unit_offset && g2.norm_fp32_product && g2.tie_word_embeddings));
  CHECK(g2.activation == Activation::kGeluTanh);
  CHECK((g2.attn_softcap == 50.0 && g2.final_softcap == 30.0 && g2.query_pre_attn_scalar == 256.0));
  // null is no cap, as transformers reads it (not the default), and an export writes it back so.
  const DecoderConfig uncapped =
      parse("gemma2", R"("head_dim": 8, "attn_logit_softcapping": null, "final_logit_softcapping": null)");
  CHECK((uncapped.attn_softcap == 0 && uncapped.final_softcap == 0));
  const DecoderConfig again = parse_decoder_config(decoder_config_json(uncapped), "export.json");
  CHECK((again.attn_softcap == 0 && again.final_softcap == 0));
  CHECK(g2.attention_scale == doctest::Approx(1.0 / 16));
  CHECK(g2.embedding_scale == doctest::Approx(std::sqrt(32.0)));
  for (int64_t i = 0; i < 4; ++i) CHECK(g2.plan(i).window == (i % 2 == 0 ? 4096 : 0));  // every second layer
  // Gemma 3's older spelling: rope_theta, rope_local_base_freq and rope_scaling; five of six layers slide.
  const DecoderConfig g3 =
      parse("gemma3_text", R"("head_dim": 8, "sliding_window": 16, "sliding_window_pattern": 3, "rope_theta": 1e6,
          "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0})");
  CHECK((g3.qk_norm && g3.attn_softcap == 0 && g3.final_softcap == 0));
  CHECK((g3.local_rope_theta == 1e4 && g3.rope_theta == 1e6));
  REQUIRE(g3.rope_scaling.has_value());
  CHECK(g3.rope_scaling->type == RopeScaling::Type::kLinear);
  for (int64_t i = 0; i < 4; ++i) {
    const bool slides = (i + 1) % 3 != 0;
    CHECK(g3.plan(i).window == (slides ? 16 : 0));
    CHECK(g3.plan(i).rope == (slides ? 1 : 0));  // the local table for the sliding layers
  }
  // The local table is unscaled, the global one divided by the factor.
  const at::Tensor global = rope_inv_freq(g3), local = rope_inv_freq(g3, /*local=*/true);
  CHECK(global[1].item<double>() == doctest::Approx(std::pow(1e6, -2.0 / 8) / 8));
  CHECK(local[1].item<double>() == doctest::Approx(std::pow(1e4, -2.0 / 8)));
  const DecoderConfig olmo = parse("olmo2", R"("pad_token_id": 3, "bos_token_id": 2, "eos_token_id": [1, 5])");
  CHECK(olmo.pad_token_id == 3);  // nn.Embedding's padding_idx
  // The ids are carried into the export as written (an id out of the vocabulary is no padding row).
  CHECK(decoder_config_json(olmo).find("\"eos_token_id\": [\n    1,\n    5\n  ]") != std::string::npos);
  CHECK(decoder_config_json(olmo).find("\"bos_token_id\": 2") != std::string::npos);
  CHECK(parse("olmo2", R"("pad_token_id": 64)").pad_token_id == -1);
  CHECK((olmo.norms == NormPlacement::kPost && olmo.qk_norm_whole && !olmo.qk_norm && !olmo.tie_word_embeddings));
  const DecoderConfig smol = parse("smollm3", R"("use_sliding_window": true, "sliding_window": 8)");
  for (int64_t i = 0; i < 4; ++i) {  // every fourth layer without rotary, and (without layer_types) sliding
    CHECK(smol.plan(i).rotary == (i != 3));
    CHECK(smol.plan(i).window == (i == 3 ? 8 : 0));
  }
  const DecoderConfig granite = parse("granite", R"("attention_multiplier": 0.5, "logits_scaling": 4.0)");
  CHECK((granite.attention_scale == 0.5 && granite.logits_scaling == 4.0 && granite.embedding_scale == 1.0));
  for (const DecoderConfig& c : {g2, g3, olmo, smol, granite}) check_round_trip(c);  // the export reads back the same
  const auto& error = shaped_error;
  CHECK(error("llama", R"("hidden_act": "relu")") ==
        "llama.json: hidden_act \"relu\" is not supported; fsdptrain implements \"silu\" and \"gelu_pytorch_tanh\"");
  CHECK(error("llama", R"("attn_logit_softcapping": 50.0)")
            .find("attn_logit_softcapping is a field of Gemma 2 and 3, not of LlamaForCausalLM") != std::string::npos);
  CHECK(error("qwen3", R"("logits_scaling": 2.0)")
            .find("logits_scaling is a field of GraniteForCausalLM, not of Qwen3ForCausalLM") != std::string::npos);
  CHECK(error("smollm3", R"("no_rope_layers": [1, 0])").find("no_rope_layers must list one 0 or 1 per layer (4)") !=
        std::string::npos);
  CHECK(error("gemma2", R"("head_dim": 8, "rope_scaling": {"rope_type": "su", "factor": 4.0})")
            .find("rope type \"su\" is not supported; fsdptrain implements \"default\", \"linear\", \"dynamic\", "
                  "\"llama3\", \"yarn\", \"longrope\" and (Gemma 4's) \"proportional\"") != std::string::npos);
  CHECK(error("llama", R"("partial_rotary_factor": 0.75)") ==
        "llama.json: partial_rotary_factor 0.75 is not supported for LlamaForCausalLM (transformers' class rotates the "
        "whole head); only Phi-3/4, Qwen3.5/3.6, Qwen3-Next and GLM-4.5 rotate a share of it");
  CHECK(error("olmo2", R"("sliding_window": 8)").find("sliding_window is not a field of Olmo2ForCausalLM") !=
        std::string::npos);
}

// OLMo 3: OLMo 2's layers with windows and a rotary table per layer type, from the released folders' spelling
// and transformers 5's; a null window where layers slide (transformers cannot run it) and a single rope_parameters
// table (Olmo3Config ignores it) refused by name; Mistral's window when left out.
TEST_CASE("config.json of OLMo 3: its windows and two rotary tables, a round trip, refusals") {
  auto parse = [](const std::string& type, const std::string& extra = "") { return parse_shaped(type, extra); };
  const auto& error = shaped_error;
  // OLMo 3: OLMo 2's form; three layers of four sliding (4096) by default; the top-level rope_theta and rope_scaling
  // are the full layers' while the sliding ones rotate at 500000 (Olmo3Config gives them its default, not rope_theta).
  const DecoderConfig olmo3 = parse("olmo3", R"("rope_theta": 1e4, "max_position_embeddings": 64,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16})");
  CHECK((olmo3.norms == NormPlacement::kPost && olmo3.qk_norm_whole && !olmo3.qk_norm && !olmo3.tie_word_embeddings));
  CHECK((olmo3.rope_theta == 1e4 && olmo3.local_rope_theta == 500000.0));
  REQUIRE(olmo3.rope_scaling.has_value());
  CHECK(olmo3.rope_scaling->type == RopeScaling::Type::kYarn);
  for (int64_t i = 0; i < 4; ++i) {
    CHECK(olmo3.plan(i).window == (i == 3 ? 0 : 4096));
    CHECK(olmo3.plan(i).rope == (i == 3 ? 0 : 1));  // the sliding layers' own table, unscaled
  }
  // transformers 5's spelling: a table per layer type.
  const DecoderConfig olmo3_v5 = parse("olmo3", R"("sliding_window": 8, "layer_types": ["full_attention",
      "sliding_attention", "full_attention", "sliding_attention"], "rope_parameters": {"full_attention":
      {"rope_type": "default", "rope_theta": 1e6}, "sliding_attention": {"rope_type": "default", "rope_theta": 1e3}})");
  CHECK((olmo3_v5.rope_theta == 1e6 && olmo3_v5.local_rope_theta == 1e3 && !olmo3_v5.rope_scaling));
  for (int64_t i = 0; i < 4; ++i) CHECK(olmo3_v5.plan(i).window == (i % 2 == 1 ? 8 : 0));
  for (const DecoderConfig& c : {olmo3, olmo3_v5}) check_round_trip(c);
  // What transformers' OLMo 3 cannot run, or silently reads otherwise: refused, naming the fix.
  CHECK(error("olmo3", R"("sliding_window": null)") ==
        "olmo3.json: sliding_window is null, yet layer_types (as Olmo3ForCausalLM fills it in) holds sliding_attention "
        "layers; transformers cannot run this config either. Set sliding_window, or make every layer full_attention");
  CHECK(error("gemma2", R"("sliding_window": null, "layer_types": ["sliding_attention", "full_attention",
      "full_attention", "full_attention"])")
            .find("gemma2.json: sliding_window is null, yet layer_types holds sliding_attention layers") !=
        std::string::npos);
  // Mistral's window when sliding_window is left out (MistralConfig's 4096), and none when it is null.
  CHECK(parse("mistral").plan(0).window == 4096);
  CHECK(parse("mistral", R"("sliding_window": null)").plan(0).window == 0);
  CHECK(parse("olmo3", R"("sliding_window": null, "layer_types": ["full_attention", "full_attention",
      "full_attention", "full_attention"])")
            .plan(0)
            .window == 0);
  CHECK(error("olmo3", R"("rope_parameters": {"rope_type": "default", "rope_theta": 1e4})")
            .find("olmo3.json: rope_parameters of olmo3 holds a table per layer type (full_attention, "
                  "sliding_attention); Olmo3Config ignores a single table such as this one") != std::string::npos);
}

// Gemma 4's dense text models (gemma-4-31B): the full-attention layers' heads from either spelling,
// the proportional rotary, the round trip, and what is refused by name.
TEST_CASE("config.json of Gemma 4: the full-attention layers' heads, the proportional rotary, refusals") {
  const std::string shape = R"("model_type": "gemma4_text", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 8, "hidden_size_per_layer_input": 0)";
  auto parse = [&](const std::string& extra) {
    return parse_decoder_config("{" + shape + ", " + extra + "}", "g4.json");
  };
  // The Hub's spelling (global_head_dim, num_global_key_value_heads), and transformers 5's saved one.
  const DecoderConfig hub = parse(R"("global_head_dim": 16, "num_global_key_value_heads": 1, "attention_k_eq_v": true,
      "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"])");
  const DecoderConfig saved = parse(R"("attention_k_eq_v": true, "per_layer_config": {"1": {"head_dim": 16,
      "num_key_value_heads": 1}, "3": {"head_dim": 16, "num_key_value_heads": 1}},
      "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"])");
  for (const DecoderConfig& c : {hub, saved}) {
    CHECK((c.norms == NormPlacement::kSandwich && !c.norm_unit_offset && c.norm_fp32_product && c.qk_norm));
    CHECK((c.v_norm && c.layer_scalar && c.attention_scale == 1.0 && c.tie_word_embeddings));
    CHECK((c.activation == Activation::kGeluTanh && c.embedding_scale == doctest::Approx(std::sqrt(32.0))));
    for (int64_t i = 0; i < 4; ++i) {  // the last layer is full attention whatever layer_types says
      const bool full = i == 1 || i == 3;
      CHECK(c.plan(i).window == (full ? 0 : 512));
      CHECK(c.plan(i).head_dim == (full ? 16 : 8));
      CHECK(c.plan(i).kv_heads == (full ? 1 : 2));
      CHECK(c.plan(i).k_eq_v == full);
      CHECK(c.plan(i).rope == (full ? 0 : 1));
    }
    const ModelDescription d = describe(c);
    auto has = [&](const std::string& name) {
      return std::any_of(d.params.begin(), d.params.end(), [&](const ParamSpec& p) { return p.name == name; });
    };
    CHECK((has("model.layers.0.self_attn.v_proj.weight") && !has("model.layers.1.self_attn.v_proj.weight")));
    CHECK(has("model.layers.3.layer_scalar"));
    // transformers counts no buffer: the layer scalars are not parameters there.
    CHECK(c.num_parameters() == 64 * 32 + 4 * (3 * 32 * 48 + 4 * 32) + 32 + 2 * (2 * 32 * 32 + 2 * 32 * 16 + 2 * 8) +
                                    2 * (4 * 16 * 32 + 16 * 32 + 4 * 16 * 32 + 2 * 16));
    const DecoderConfig back = parse_decoder_config(decoder_config_json(c), "export");
    CHECK(decoder_config_json(back) == decoder_config_json(c));
    for (int64_t i = 0; i < 4; ++i) CHECK(back.plan(i).head_dim == c.plan(i).head_dim);
  }
  // Gemma4TextConfig's tables: the sliding layers' plain (1e4), the full ones' proportional over their
  // 16 dimensions, a quarter of them turned (2 of 8 frequencies), the rest 0 (unturned).
  CHECK(hub.local_rope_theta == 1e4);
  REQUIRE(hub.rope_scaling.has_value());
  CHECK(hub.rope_scaling->type == RopeScaling::Type::kProportional);
  const at::Tensor global = rope_inv_freq(hub), local = rope_inv_freq(hub, /*local=*/true);
  REQUIRE((global.size(0) == 8 && local.size(0) == 4));
  CHECK(global[0].item<double>() == 1.0);
  CHECK(global[1].item<double>() == doctest::Approx(std::pow(1e6, -2.0 / 16)));
  CHECK(global.narrow(0, 2, 6).abs().sum().item<double>() == 0.0);
  CHECK(local[1].item<double>() == doctest::Approx(std::pow(1e4, -2.0 / 8)));
  // What fsdptrain does not implement is refused by name, never trained as something else.
  auto error = [&](const std::string& extra) { return error_of([&] { parse(extra); }); };
  CHECK(error(R"("use_bidirectional_attention": "all")").find("fsdptrain trains causal decoders") != std::string::npos);
  // "vision" (the Hub's configs): image tokens both ways, text causal; as null.
  CHECK(decoder_config_json(parse(R"("use_bidirectional_attention": "vision")")) ==
        decoder_config_json(parse(R"("use_bidirectional_attention": null)")));
  CHECK(error(R"("per_layer_config": {"0": {"head_dim": 16}})").find("full-attention layers only") !=
        std::string::npos);
  CHECK(error(R"("per_layer_config": {"3": {"head_dim": 16, "sliding_window": 8}})")
            .find("\"sliding_window\" is not read") != std::string::npos);
  CHECK(error_of([] {
          parse_decoder_config(R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
              "num_hidden_layers": 2, "num_attention_heads": 4, "attention_k_eq_v": true})",
                               "l.json");
        }).find("attention_k_eq_v is a field of Gemma 4, not of LlamaForCausalLM") != std::string::npos);
}

// Gemma 4 E2B and E4B: per-layer embeddings (on by Gemma4TextConfig's default), the last layers taking
// the last earlier layer of their kind's keys and values, their MLPs twice as wide; counts, the round
// trip, refusals.
TEST_CASE("config.json of Gemma 4 E2B/E4B: per-layer embeddings, shared keys and values, double-wide MLPs") {
  const std::string shape = R"("model_type": "gemma4_text", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 8, "global_head_dim": 16, "layer_types": ["sliding_attention", "full_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"])";
  auto parse = [&](const std::string& extra) {
    return parse_decoder_config("{" + shape + (extra.empty() ? "" : ", " + extra) + "}", "e2b.json");
  };
  // Not written: Gemma4TextConfig's defaults, 256 a layer from a 262,144-row table.
  const DecoderConfig plain = parse("");
  CHECK((plain.per_layer_input_dim == 256 && plain.per_layer_vocab == 262144 && plain.kv_shared_layers == 0));
  const DecoderConfig c =
      parse(R"("hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 64, "num_kv_shared_layers": 3,
               "use_double_wide_mlp": true)");
  // Layers 3-5 share: the sliding ones layer 2's, the full one layer 1's; 1 and 2 keep theirs, 0 neither.
  const int64_t source[] = {-1, -1, -1, 2, 2, 1};
  for (int64_t i = 0; i < 6; ++i) {
    INFO("layer " << i);
    CHECK(c.plan(i).kv_source == source[i]);
    CHECK(c.plan(i).kv_kept == (i == 1 || i == 2));
    CHECK(c.plan(i).mlp_width == (i >= 3 ? 96 : 48));
  }
  // Counted as transformers builds it: the table, the projection and its norm; per layer the gate, the
  // projection and the norm; the sharing layers without k_proj, v_proj and k_norm, their MLPs doubled.
  const double base = parse(R"("hidden_size_per_layer_input": 0)").parameter_count();
  const double kv = 2.0 * 32 * 2 * 8 + 8, kv_full = 2.0 * 32 * 2 * 16 + 16;
  CHECK(c.parameter_count() ==
        base + 64.0 * 24 + 32.0 * 24 + 4 + 6 * (2.0 * 32 * 4 + 32) - 2 * kv - kv_full + 3 * (3.0 * 32 * 48));
  // FLOPs count the table as the input embedding: looked up, not multiplied.
  // Attention: 12 H D T a layer, D 8 in the four sliding layers and 16 in the two full ones (tied embeddings).
  CHECK(c.flops_per_token(16) ==
        doctest::Approx(6 * (c.active_parameter_count() - 64.0 * 24) + 12.0 * 4 * 16 * (4 * 8 + 2 * 16)));
  const ModelDescription d = describe(c);
  std::set<std::string> names;
  for (const ParamSpec& p : d.params) names.insert(p.name);
  CHECK(names.count("model.embed_tokens_per_layer.weight") == 1);
  CHECK(names.count("model.layers.5.per_layer_input_gate.weight") == 1);
  CHECK(names.count("model.layers.2.self_attn.k_proj.weight") == 1);
  CHECK(names.count("model.layers.3.self_attn.k_proj.weight") == 0);
  CHECK(names.count("model.layers.5.self_attn.k_norm.weight") == 0);
  // A folder holding the sharing layers' k_proj (made before transformers dropped them) reads without them.
  CHECK(d.layout.ours("model.layers.4.self_attn.v_proj.weight").empty());
  CHECK(d.layout.ours("model.layers.2.self_attn.v_proj.weight") == "model.layers.2.self_attn.v_proj.weight");
  DecoderConfig multimodal = c;  // the Hub's folders: the text model under the multimodal model's prefixes
  multimodal.text_of_multimodal = true;
  const FolderLayout hub = describe(multimodal).layout;
  CHECK(hub.ours("model.language_model.layers.3.self_attn.k_norm.weight").empty());
  CHECK(hub.ours("language_model.model.layers.5.self_attn.k_proj.weight").empty());
  CHECK(hub.ours("model.language_model.layers.2.self_attn.k_proj.weight") == "model.layers.2.self_attn.k_proj.weight");
  CHECK(hub.ours("model.language_model.embed_tokens_per_layer.weight") == "model.embed_tokens_per_layer.weight");
  // The export says what it read.
  const DecoderConfig back = parse_decoder_config(decoder_config_json(c), "export");
  CHECK(decoder_config_json(back) == decoder_config_json(c));
  CHECK((back.per_layer_input_dim == 4 && back.per_layer_vocab == 64 && back.kv_shared_layers == 3 &&
         back.double_wide_mlp));
  auto error = [&](const std::string& extra) { return error_of([&] { parse(extra); }); };
  CHECK(error(R"("hidden_size_per_layer_input": null)").find("write 0 for no per-layer embeddings") !=
        std::string::npos);
  CHECK(error(R"("num_kv_shared_layers": null)").find("num_kv_shared_layers is null, which Gemma4TextConfig refuses") !=
        std::string::npos);
  CHECK(error(R"("hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 32)")
            .find("vocab_size_per_layer_input (32) is smaller than vocab_size (64)") != std::string::npos);
  CHECK(error(R"("num_kv_shared_layers": 6)").find("num_kv_shared_layers is 6; it must be from 0 to") !=
        std::string::npos);
  // Five shared layers leave layer 0 (sliding) alone before them: the full ones (1, 5) have no source.
  CHECK(error(R"("num_kv_shared_layers": 5)")
            .find("layer 1 (full attention) is among the last num_kv_shared_layers (5) but no earlier layer of its "
                  "kind") != std::string::npos);
  CHECK(error_of([] {
          parse_decoder_config(R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_kv_shared_layers": 1})",
                               "l.json");
        }).find("num_kv_shared_layers is a field of Gemma 4, not of LlamaForCausalLM") != std::string::npos);
  // Tensor parallel is refused naming the key to set; context and sequence parallel split them (cp_exact).
  const auto tp = std::make_shared<TensorParallel>(TensorParallel::shapes_only(2));
  CHECK(error_of([&] { CausalLM m(c, true, tp); })
            .find("[tp] Gemma4ForCausalLM's per-layer embeddings (hidden_size_per_layer_input) and layers sharing keys "
                  "and values (num_kv_shared_layers), Gemma 4 E2B's and E4B's, are not split by tensor parallel; set "
                  "parallelism_config_tp_size: 1") != std::string::npos);
  const auto sp = std::make_shared<ContextParallel>(ContextParallel::shapes_only(2, SequenceSplit::kUlysses));
  CHECK(error_of([&] { CausalLM m(c, true, nullptr, sp); }).empty());
}

// Gemma 4's mixture of experts (gemma-4-26B-A4B): the experts beside every layer's dense MLP, their
// router's and norms' parameters, the count, the round trip, and the fields it cannot do without.
TEST_CASE("config.json of Gemma 4's mixture of experts: every layer sparse beside its MLP, counts, refusals") {
  const std::string shape = R"("model_type": "gemma4_text", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 8, "global_head_dim": 16, "hidden_size_per_layer_input": 0, "enable_moe_block": true)";
  auto parse = [&](const std::string& extra) {
    return parse_decoder_config("{" + shape + (extra.empty() ? "" : ", " + extra) + "}", "a4b.json");
  };
  const DecoderConfig c = parse(R"("num_experts": 6, "top_k_experts": 2, "moe_intermediate_size": 12)");
  const MoeConfig& m = c.moe;
  CHECK((m.gemma4 && m.num_experts == 6 && m.experts_per_token == 2 && m.intermediate_size == 12));
  CHECK((m.norm_topk_prob && m.router_aux_loss_coef == 0 && !m.output_router_logits));
  CHECK((c.plan(0).moe && c.plan(1).moe));
  const ModelDescription d = describe(c);
  std::vector<std::string> layer0;
  for (const ParamSpec& p : d.params)
    if (p.name.rfind("model.layers.0.", 0) == 0) layer0.push_back(p.name.substr(15));
  CHECK(layer0 == std::vector<std::string>{"layer_scalar",
                                           "self_attn.q_proj.weight",
                                           "self_attn.k_proj.weight",
                                           "self_attn.v_proj.weight",
                                           "self_attn.o_proj.weight",
                                           "self_attn.q_norm.weight",
                                           "self_attn.k_norm.weight",
                                           "mlp.gate_proj.weight",
                                           "mlp.up_proj.weight",
                                           "mlp.down_proj.weight",
                                           "router.scale",
                                           "router.per_expert_scale",
                                           "router.proj.weight",
                                           "experts.gate_up_proj",
                                           "experts.down_proj",
                                           "input_layernorm.weight",
                                           "post_attention_layernorm.weight",
                                           "pre_feedforward_layernorm.weight",
                                           "post_feedforward_layernorm.weight",
                                           "post_feedforward_layernorm_1.weight",
                                           "post_feedforward_layernorm_2.weight",
                                           "pre_feedforward_layernorm_2.weight"});
  CHECK(d.layout.stacked.empty());  // stored stacked, as the Hub's folders hold them
  // Each layer: attention (layer 1 full: heads of 16, no k_eq_v here so a v_proj), the MLP, the router
  // (proj, scale, per-expert scales), 6 experts of 3 x 32 x 12, seven norms.
  const int64_t sliding = 4 * 8 * 32 + 2 * 2 * 8 * 32 + 4 * 8 * 32 + 2 * 8,
                full = 4 * 16 * 32 + 2 * 2 * 16 * 32 + 4 * 16 * 32 + 2 * 16;
  const int64_t feed_forward = 3 * 32 * 48 + 6 * 32 + 32 + 6 + 6 * 3 * 32 * 12 + 7 * 32;
  CHECK(c.num_parameters() == 64 * 32 + sliding + full + 2 * feed_forward + 32);
  CHECK(c.active_parameter_count() == doctest::Approx(c.num_parameters() - 2 * 4 * 3 * 32 * 12));
  const DecoderConfig back = parse_decoder_config(decoder_config_json(c), "export");
  CHECK(decoder_config_json(back) == decoder_config_json(c));
  CHECK((back.moe.gemma4 && back.moe.num_experts == 6 && back.moe.experts_per_token == 2));
  CHECK(hf_class_name("Router", c.family) == "Gemma4TextRouter");
  CHECK(hf_class_name("Experts", c.family) == "Gemma4TextExperts");
  // Gemma4TextConfig has no default for the experts' fields: each must be written.
  CHECK(error_of([&] { parse(R"("top_k_experts": 2, "moe_intermediate_size": 12)"); })
            .find("a4b.json: enable_moe_block is true but num_experts is not written; Gemma4TextConfig has no "
                  "default for it") != std::string::npos);
  CHECK(error_of([&] {
          parse(R"("num_experts": 2, "top_k_experts": 3, "moe_intermediate_size": 12)");
        }).find("top_k_experts (3) is more than the experts (2)") != std::string::npos);
}

TEST_CASE("regression: a misspelled config.json field is not silently replaced by a default") {
  const std::string fields = R"("vocab_size":257,"hidden_size":64,"intermediate_size":128,"num_attention_heads":4)";
  // A required field spelled wrong: refused, pointing at the misspelling.
  CHECK(error_of([&] { parse_decoder_config("{" + fields + R"(,"num_hiden_layers":2})", "t.json"); })
            .find("t.json: num_hidden_layers is missing; a model needs it (\"num_hiden_layers\" is there: a "
                  "misspelling?)") != std::string::npos);
  // An optional one: a warning with the closest field; fields HF configs carry pass silently.
  std::vector<std::string> warnings;
  const DecoderConfig c = parse_decoder_config(
      "{" + fields + R"(,"num_hidden_layers":2,"rms_norm_epsilon":1e-6,"bos_token_id":1,"use_cache":true})", "t.json",
      &warnings);
  CHECK(c.num_hidden_layers == 2);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] == "t.json: unknown field \"rms_norm_epsilon\" (did you mean rms_norm_eps?)");
  CHECK(error_of([&] {
          parse_decoder_config("{" + fields + R"(,"num_hidden_layers":2,"attention_dropout":0.1})", "d.json");
        }).find("attention_dropout 0.1 is not supported") != std::string::npos);
}

TEST_CASE("the shipped model configs parse; Llama-3-8B has its known parameter count and FLOPs per token") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  const std::string dir = std::string(FSDP_SOURCE_DIR) + "/configs/models/";
  const DecoderConfig tiny_model = load_llama_config(dir + "tiny/config.json");
  CHECK(tiny_model.vocab_size == 257);  // byte-level text: 256 bytes + end-of-text
  CHECK(load_llama_config(dir + "llama-125m/config.json").num_parameters() / 1000000 == 109);  // 85M + tied embedding
  CHECK(load_llama_config(dir + "llama-1b/config.json").num_parameters() == 1235814400);       // Llama 3.2 1B
  const DecoderConfig big = load_llama_config(dir + "llama3-8b/config.json");
  CHECK(big.num_parameters() == 8030261248);
  CHECK(big.head_dim == 128);
  REQUIRE(big.rope_scaling.has_value());
  // 6 N' + 12 L H D T, N' without the input embedding (the PaLM / torchtitan convention).
  const double n_prime = 8030261248.0 - 128256.0 * 4096.0;
  CHECK(big.flops_per_token(8192) == doctest::Approx(6 * n_prime + 12.0 * 32 * 32 * 128 * 8192));
}

TEST_CASE("the chunked loss equals cross-entropy over the full logits: both chunkings, ignored tokens, a soft cap") {
  torch::manual_seed(3);
  struct Case {
    LossChunking how;
    int64_t rows, vocab_rows;
  };
  // By tokens: chunks of 1, 7, 64 tokens or the default. By the vocabulary: one block or blocks of 7
  // tokens (the weight's gradient summed over blocks), chunks of 1, 13 or all of the 101 rows.
  const Case cases[] = {
      {LossChunking::kTokens, 0, 0},      {LossChunking::kTokens, 1, 0},     {LossChunking::kTokens, 7, 0},
      {LossChunking::kTokens, 64, 0},     {LossChunking::kVocabulary, 0, 0}, {LossChunking::kVocabulary, 0, 13},
      {LossChunking::kVocabulary, 7, 13}, {LossChunking::kVocabulary, 7, 1}, {LossChunking::kVocabulary, 64, 101}};
  // Gemma's final soft cap (2.5: most of these logits bend) taken a chunk at a time as the rest.
  for (const double cap : {0.0, 2.5})
    for (const Case& k : cases) {
      CAPTURE(cap);
      CAPTURE(static_cast<int>(k.how));
      CAPTURE(k.rows);
      CAPTURE(k.vocab_rows);
      const at::Tensor h0 = torch::randn({37, 16}, torch::kDouble), w0 = torch::randn({101, 16}, torch::kDouble);
      at::Tensor y = torch::randint(0, 101, {37}, torch::kLong);
      y.index_put_({torch::tensor({3, 20})}, -100);
      const at::Tensor h = h0.to(torch::kFloat).requires_grad_(), w = w0.to(torch::kFloat).requires_grad_();
      const at::Tensor loss =
          chunked_linear_cross_entropy_sum(h, w, y, k.rows, -100, nullptr, 0, k.how, k.vocab_rows, cap);
      (loss * 0.5).backward();
      // The reference in float64 through autograd.
      const at::Tensor hr = h0.clone().requires_grad_(), wr = w0.clone().requires_grad_();
      at::Tensor logits = at::matmul(hr, wr.t());
      if (cap > 0) logits = at::tanh(logits / cap) * cap;
      const at::Tensor ref = at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum, -100);
      (ref * 0.5).backward();
      CHECK(loss.item<double>() == doctest::Approx(ref.item<double>()).epsilon(1e-6));
      CHECK((h.grad().to(torch::kDouble) - hr.grad()).abs().max().item<double>() <= 1e-5);
      CHECK((w.grad().to(torch::kDouble) - wr.grad()).abs().max().item<double>() <= 1e-5);
      CHECK(h.grad()[3].abs().max().item<double>() == 0);  // an ignored token contributes nothing
    }
  // Without gradients (evaluation) only the value is computed.
  c10::NoGradGuard no_grad;
  const at::Tensor h = torch::randn({9, 8}), w = torch::randn({30, 8}), y = torch::randint(0, 30, {9}, torch::kLong);
  const double ref = at::cross_entropy_loss(at::matmul(h, w.t()), y, {}, at::Reduction::Sum).item<double>();
  CHECK(chunked_linear_cross_entropy_sum(h, w, y, 2).item<double>() == doctest::Approx(ref).epsilon(1e-5));
  CHECK(chunked_linear_cross_entropy_sum(h, w, y, 2, -100, nullptr, 0, LossChunking::kVocabulary, 7).item<double>() ==
        doctest::Approx(ref).epsilon(1e-5));
}

TEST_CASE("the chunked loss in bf16: both chunkings within bf16's rounding of the float64 gradients") {
  // bf16 operands and gradients, fp32 logits and softmax: each gradient within a few bf16 roundings
  // (2^-8 relative) of float64's, the vocabulary's chunks (one product per chunk over all tokens,
  // rounded once) no further than the tokens' (a sum over chunks in fp32, rounded once).
  torch::manual_seed(5);
  const at::Tensor h0 = torch::randn({64, 32}, torch::kDouble), w0 = torch::randn({300, 32}, torch::kDouble) * 0.3;
  at::Tensor y = torch::randint(0, 300, {64}, torch::kLong);
  y.index_put_({torch::tensor({0, 9})}, -100);
  const at::Tensor hr = h0.to(torch::kBFloat16).to(torch::kDouble).requires_grad_();
  const at::Tensor wr = w0.to(torch::kBFloat16).to(torch::kDouble).requires_grad_();
  const at::Tensor ref = at::cross_entropy_loss(at::matmul(hr, wr.t()), y, {}, at::Reduction::Sum, -100);
  ref.backward();
  for (const LossChunking how : {LossChunking::kTokens, LossChunking::kVocabulary}) {
    CAPTURE(static_cast<int>(how));
    const at::Tensor h = h0.to(torch::kBFloat16).requires_grad_(), w = w0.to(torch::kBFloat16).requires_grad_();
    const at::Tensor loss = chunked_linear_cross_entropy_sum(h, w, y, 16, -100, nullptr, 0, how, 64);
    loss.backward();
    CHECK((h.grad().scalar_type() == torch::kBFloat16));
    CHECK((w.grad().scalar_type() == torch::kBFloat16));
    CHECK(loss.item<double>() == doctest::Approx(ref.item<double>()).epsilon(1e-3));
    for (const auto& [got, want] : {std::pair{h.grad(), hr.grad()}, std::pair{w.grad(), wr.grad()}}) {
      const double rel = ((got.to(torch::kDouble) - want).norm() / want.norm()).item<double>();
      CHECK(rel < 8e-3);
    }
  }
}

TEST_CASE("the chunked loss over no tokens: a zero sum and zero gradients, both chunkings") {
  for (const LossChunking how : {LossChunking::kTokens, LossChunking::kVocabulary}) {
    const at::Tensor h = torch::randn({0, 4}).requires_grad_(), w = torch::randn({11, 4}).requires_grad_();
    const at::Tensor loss =
        chunked_linear_cross_entropy_sum(h, w, torch::empty({0}, torch::kLong), 0, -100, nullptr, 0, how);
    loss.backward();
    CHECK(loss.item<double>() == 0);
    CHECK(w.grad().abs().max().item<double>() == 0);
  }
}

TEST_CASE("the chunked loss's backward runs once: a second one (retain_graph) is refused, not doubled") {
  const at::Tensor h = torch::randn({5, 4}).requires_grad_(), w = torch::randn({11, 4});
  const at::Tensor loss = chunked_linear_cross_entropy_sum(h, w, torch::randint(0, 11, {5}, torch::kLong));
  loss.backward({}, /*retain_graph=*/true);
  CHECK(error_of([&] { loss.backward(); }).find("ran twice") != std::string::npos);
}

TEST_CASE("the model's loss is the cross-entropy of its logits, tied head or not") {
  for (const bool tied : {false, true}) {
    CAPTURE(tied);
    DecoderConfig c = tiny();
    c.tie_word_embeddings = tied;
    CausalLM m(c);
    init_parameters(*m, 5);
    const at::Tensor x = torch::randint(0, c.vocab_size, {2, 9}, torch::kLong);
    const at::Tensor y = torch::randint(0, c.vocab_size, {2, 9}, torch::kLong);
    const at::Tensor logits = m->forward(x).to(torch::kFloat);
    const double ref =
        at::cross_entropy_loss(logits.reshape({-1, c.vocab_size}), y.reshape({-1}), {}, at::Reduction::Sum)
            .item<double>();
    CHECK(m->loss_sum(x, y).item<double>() == doctest::Approx(ref).epsilon(1e-6));
    CHECK(m->loss(x, y).item<double>() == doctest::Approx(ref / 18).epsilon(1e-6));
    // The same gradients as autograd through the full logits.
    m->zero_grad();
    at::cross_entropy_loss(m->forward(x).to(torch::kFloat).reshape({-1, c.vocab_size}), y.reshape({-1}), {},
                           at::Reduction::Sum)
        .backward();
    std::vector<at::Tensor> want;
    for (const auto& p : m->parameters()) want.push_back(p.grad().clone());
    m->zero_grad();
    m->loss_sum(x, y).backward();
    size_t i = 0;
    for (const auto& p : m->parameters()) {
      CHECK((p.grad() - want[i]).abs().max().item<double>() <= 1e-5 * (1 + want[i].abs().max().item<double>()));
      ++i;
    }
  }
}

// Issue 16: fine-tuning on prompt/completion records trains on the completions only.
TEST_CASE("prompt tokens contribute nothing: the gradient is that of the completion tokens' loss alone") {
  DecoderConfig c = tiny();
  CausalLM m(c);
  init_parameters(*m, 11);
  // Two records packed into one sequence: [BOS-like 1] prompt... completion... ; mask 0 on prompts.
  std::vector<int32_t> tokens{1, 5, 6, 7, 20, 21, 2, 1, 8, 9, 22, 23, 24, 2, 1, 5};
  std::vector<uint8_t> mask{1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0};
  const fsdp::data::TokenStream stream = fsdp::data::TokenStream::in_memory(tokens, "pairs", mask);
  const fsdp::data::SequenceReader reader(stream, 15, fsdp::data::Packing::kPlain, "pairs");
  fsdp::data::DistributedLoader loader(reader, 0, 1, 1, 0, 1, 3);
  const auto batch = loader.next();
  const at::Tensor x = at::tensor(batch.inputs, at::kLong).view({1, 15});
  const at::Tensor y = at::tensor(batch.targets, at::kLong).view({1, 15});
  auto grads = [&m] { return take_grads(*m); };
  m->zero_grad();
  m->loss_sum(x, y).backward();
  const std::vector<at::Tensor> got = grads();
  // The reference: -log p(target) summed over the positions whose target is a completion token,
  // through the full logits (no ignore index involved).
  std::vector<int64_t> positions, targets;
  for (int64_t j = 0; j < 15; ++j)
    if (mask[static_cast<size_t>(j + 1)]) {
      positions.push_back(j);
      targets.push_back(tokens[static_cast<size_t>(j + 1)]);
    }
  REQUIRE(positions.size() == 7);
  const at::Tensor logp = at::log_softmax(m->forward(x).to(at::kFloat)[0], -1);
  const at::Tensor picked = logp.index({at::tensor(positions, at::kLong), at::tensor(targets, at::kLong)});
  (-picked.sum()).backward();
  const std::vector<at::Tensor> want = grads();
  // Every target counted: a different gradient, so the check above can tell.
  m->loss_sum(x, at::tensor(std::vector<int64_t>(tokens.begin() + 1, tokens.end()), at::kLong).view({1, 15}))
      .backward();
  const std::vector<at::Tensor> all = grads();
  double differs = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK((got[i] - want[i]).abs().max().item<double>() <= 1e-5 * (1 + want[i].abs().max().item<double>()));
    differs = std::max(differs, (all[i] - want[i]).abs().max().item<double>());
  }
  CHECK(differs > 1e-3);
}

// Issue 17: decoding with a KV cache computes what the whole sequence computes, for every family's
// switches (a sliding window shorter than the sequence, q/k norms, q/k/v biases).
TEST_CASE("the KV cache: prefill then one token at a time equals the full forward, position by position") {
  for (const Family family : {Family::kLlama, Family::kMistral, Family::kQwen2, Family::kQwen3}) {
    CAPTURE(static_cast<int>(family));
    DecoderConfig c = tiny();
    c.family = family;
    c.qkv_bias = family == Family::kQwen2;
    c.qk_norm = family == Family::kQwen3;
    if (family != Family::kLlama) {
      c.sliding_window = 3;
      c.sliding_layers = {family == Family::kMistral, true};
    }
    CausalLM m(c);
    init_parameters(*m, 21);
    c10::NoGradGuard no_grad;
    for (auto& p : m->named_parameters())  // biases and norms away from their initial zeros and ones
      if (p.key().find("bias") != std::string::npos || p.key().find("norm") != std::string::npos)
        p.value().add_(torch::randn(p.value().sizes()) * 0.3);
    const at::Tensor x = torch::randint(0, c.vocab_size, {1, 9}, torch::kLong);
    const at::Tensor full = m->forward(x);
    std::vector<LayerCache> cache;
    std::vector<at::Tensor> parts{m->forward_cached(x.narrow(1, 0, 4), cache)};  // a 4-token prompt
    for (int64_t i = 4; i < 9; ++i) parts.push_back(m->forward_cached(x.narrow(1, i, 1), cache));
    CHECK(cache[0].k.size(2) == 9);
    CHECK((at::cat(parts, 1) - full).abs().max().item<double>() <= 1e-5);
  }
}

TEST_CASE("config.json of Phi-3/4 and the scaled rope types: partial rotation, longrope, yarn, dynamic") {
  const std::string shape = R"("vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64)";
  auto parse = [&](const std::string& type, const std::string& extra = "") {
    return parse_decoder_config(
        R"({"model_type": ")" + type + "\", " + shape + (extra.empty() ? "" : ", " + extra) + "}", type + ".json");
  };
  // Phi-3: head_dim 8, three quarters rotated (6 dimensions, 3 frequencies); longrope's factor from
  // the positions' ratio (64 / 16), its short factors up to 16 positions and its long ones past them.
  const DecoderConfig phi = parse("phi3", R"("partial_rotary_factor": 0.75, "sliding_window": 5,
      "original_max_position_embeddings": 16, "rope_scaling": {"type": "longrope", "short_factor": [1, 2, 4],
      "long_factor": [3, 5, 7]})");
  CHECK((phi.fused_projections && phi.head_dim == 8 && phi.rotary_dim() == 6));
  CHECK((phi.bos_token_id_json == "1" && phi.eos_token_id_json == "32000" && phi.pad_token_id == -1));
  for (int64_t i = 0; i < 2; ++i) CHECK(phi.plan(i).window == 5);  // every layer, as Mistral's
  REQUIRE(phi.rope_scaling.has_value());
  CHECK(phi.rope_scaling->type == RopeScaling::Type::kLongRope);
  CHECK(phi.rope_attention_factor() == doctest::Approx(std::sqrt(1 + std::log(4.0) / std::log(16.0))));
  CHECK(!rope_depends_on_length(phi, 16));
  CHECK(rope_depends_on_length(phi, 17));
  const at::Tensor short_freq = rope_inv_freq(phi, false, 16), long_freq = rope_inv_freq(phi, false, 17);
  REQUIRE(short_freq.numel() == 3);
  CHECK(short_freq[2].item<double>() == doctest::Approx(std::pow(1e4, -4.0 / 6) / 4));
  CHECK(long_freq[2].item<double>() == doctest::Approx(std::pow(1e4, -4.0 / 6) / 7));
  const ModelDescription d = describe(phi);
  REQUIRE(d.layout.fused.size() == 4);  // two a layer
  CHECK(d.layout.fused[0].name == "model.layers.0.self_attn.qkv_proj.weight");
  CHECK(d.layout.fused[0].parts ==
        std::vector<std::pair<std::string, int64_t>>{{"model.layers.0.self_attn.q_proj.weight", 32},
                                                     {"model.layers.0.self_attn.k_proj.weight", 16},
                                                     {"model.layers.0.self_attn.v_proj.weight", 16}});
  CHECK(d.layout.fused[1].name == "model.layers.0.mlp.gate_up_proj.weight");
  CHECK(describe(tiny()).layout.fused.empty());
  // YaRN: with d = 8 over 32 original positions the ramp keeps the first frequency and divides the
  // others by the factor; cos and sin grow by 0.1 ln(factor) + 1.
  const DecoderConfig yarn = parse("llama", R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0,
      "factor": 4.0, "original_max_position_embeddings": 32})");
  REQUIRE(yarn.rope_scaling.has_value());
  CHECK(yarn.rope_attention_factor() == doctest::Approx(0.1 * std::log(4.0) + 1));
  const at::Tensor y = rope_inv_freq(yarn);
  CHECK(y[0].item<double>() == doctest::Approx(1.0));
  CHECK(y[3].item<double>() == doctest::Approx(std::pow(1e4, -6.0 / 8) / 4));
  // Dynamic NTK: plain within max_position_embeddings, a larger base past it.
  const DecoderConfig dynamic = parse("qwen2", R"("rope_scaling": {"type": "dynamic", "factor": 2.0})");
  CHECK(rope_inv_freq(dynamic, false, 64).equal(rope_inv_freq(parse("qwen2"), false, 64)));
  CHECK(!rope_depends_on_length(dynamic, 64));
  const double grown = 1e4 * std::pow(2.0 * 128 / 64 - 1, 8.0 / 6);
  CHECK(rope_inv_freq(dynamic, false, 128)[1].item<double>() == doctest::Approx(std::pow(grown, -2.0 / 8)));
  for (const DecoderConfig& c : {phi, yarn, dynamic}) {  // the export reads back as the same model
    INFO(family_names(c.family).model_type);
    const DecoderConfig back = parse_decoder_config(decoder_config_json(c), "export");
    CHECK(decoder_config_json(back) == decoder_config_json(c));
    CHECK(rope_inv_freq(back, false, 100).equal(rope_inv_freq(c, false, 100)));
    CHECK(back.rope_attention_factor() == c.rope_attention_factor());
    CHECK(back.rotary_dim() == c.rotary_dim());
  }
  auto error = [&](const std::string& type, const std::string& extra) { return error_of([&] { parse(type, extra); }); };
  CHECK(error("phi3", R"("rope_scaling": {"rope_type": "linear", "factor": 2.0})") ==
        "phi3.json: rope type \"linear\" is not one of Phi3ForCausalLM's (\"default\", \"longrope\")");
  CHECK(
      error("phi3", R"("rope_scaling": {"rope_type": "longrope", "short_factor": [1, 2], "long_factor": [1, 2, 3, 4]})")
          .find("rope_scaling's short_factor must list 4 numbers") != std::string::npos);
  CHECK(error("phi3", R"("resid_pdrop": 0.1)") ==
        "phi3.json: resid_pdrop 0.1 is not supported; fsdptrain trains without dropout (set it to 0.0)");
  CHECK(error("phi3", R"("attention_bias": true)").find("attention_bias/mlp_bias are not fields of Phi3ForCausalLM") !=
        std::string::npos);
  CHECK(error("phi3", R"("partial_rotary_factor": 0.1)").find("gives 0 rotated dimensions") != std::string::npos);
  CHECK(error("llama", R"("rope_scaling": {"rope_type": "dynamic"})") ==
        "llama.json: rope type \"dynamic\" needs a factor");
}

TEST_CASE(
    "a Gemma3ForConditionalGeneration config.json: its text model, Gemma3TextConfig's defaults, the folder's names") {
  // As the released folders write it: text_config holds only what differs from Gemma3TextConfig.
  const DecoderConfig c = parse_decoder_config(R"({"architectures": ["Gemma3ForConditionalGeneration"],
      "model_type": "gemma3", "torch_dtype": "bfloat16", "eos_token_id": [1, 106],
      "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                      "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                      "sliding_window": 1024},
      "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}})",
                                               "gemma-3-4b/config.json");
  CHECK(c.text_of_multimodal);
  CHECK(c.family == Family::kGemma3);
  CHECK((c.vocab_size == 262208 && c.num_attention_heads == 8 && c.num_key_value_heads == 4 && c.head_dim == 256));
  CHECK((c.max_position_embeddings == 131072 && c.pad_token_id == 0 && c.tie_word_embeddings));
  CHECK((c.eos_token_id_json == "[1,106]" && c.bos_token_id_json == "2" && c.dtype == "bfloat16"));
  CHECK((c.plan(0).window == 1024 && c.plan(5).window == 0));  // five of six layers slide
  // The export is the text model alone, Gemma3ForCausalLM: its config.json says nothing of vision.
  const std::string exported = decoder_config_json(c);
  CHECK(exported.find("\"Gemma3ForCausalLM\"") != std::string::npos);
  CHECK(exported.find("vision") == std::string::npos);
  CHECK(!parse_decoder_config(exported, "export").text_of_multimodal);
  // Both spellings of the text model's names in the folder, the vision tower's left out.
  const FolderLayout layout = describe(c).layout;
  CHECK(layout.ours("language_model.model.layers.3.mlp.up_proj.weight") == "model.layers.3.mlp.up_proj.weight");
  CHECK(layout.ours("model.language_model.norm.weight") == "model.norm.weight");
  CHECK(layout.ours("language_model.lm_head.weight") == "lm_head.weight");
  CHECK(layout.ours("vision_tower.vision_model.embeddings.patch_embedding.weight").empty());
  CHECK(layout.ours("model.multi_modal_projector.mm_input_projection_weight").empty());
  CHECK(describe(tiny()).layout.ours("model.norm.weight") == "model.norm.weight");
  CHECK(error_of([] { parse_decoder_config(R"({"model_type": "gemma3"})", "g.json"); }) ==
        "g.json: a Gemma3ForConditionalGeneration config.json (model_type \"gemma3\") needs its text_config");
  // Mistral Small 3.1/3.2's form: a Mistral text model (MistralConfig's own defaults); Ministral 3's: a Ministral 3
  // one (Ministral3Config's YaRN and query scale when its rope_parameters is left out); another type is refused.
  const DecoderConfig mistral = parse_decoder_config(R"({"architectures": ["Mistral3ForConditionalGeneration"],
      "model_type": "mistral3", "text_config": {"model_type": "mistral", "hidden_size": 5120, "head_dim": 128,
      "intermediate_size": 32768,
      "num_hidden_layers": 40, "num_attention_heads": 32, "vocab_size": 131072, "sliding_window": null}})",
                                                     "mistral-small/config.json");
  CHECK((mistral.text_of_multimodal && mistral.family == Family::kMistral && mistral.num_key_value_heads == 8));
  CHECK(decoder_config_json(mistral).find("\"MistralForCausalLM\"") != std::string::npos);
  const DecoderConfig ministral = parse_decoder_config(R"({"model_type": "mistral3", "text_config": {
      "model_type": "ministral3", "hidden_size": 3072, "intermediate_size": 9216, "num_hidden_layers": 26,
      "num_attention_heads": 32, "vocab_size": 131072}})",
                                                       "ministral-3-3b/config.json");
  CHECK((ministral.text_of_multimodal && ministral.family == Family::kMinistral3 && ministral.head_dim == 128));
  CHECK((ministral.query_scale_beta == 0.1 && ministral.query_scale_positions == 16384));
  CHECK((ministral.max_position_embeddings == 262144 && ministral.positions_computed() == 16384));
  CHECK((ministral.rope_scaling && ministral.rope_scaling->type == RopeScaling::Type::kYarn &&
         ministral.rope_scaling->factor == 16.0 && ministral.rope_theta == 1e6));
  // The export writes the query scale where Ministral3Attention reads it, and reads back the same model.
  const std::string written = decoder_config_json(ministral);
  CHECK(written.find("\"llama_4_scaling_beta\": 0.1") != std::string::npos);
  CHECK(parse_decoder_config(written, "export").positions_computed() == 16384);
  CHECK(error_of([] {
          parse_decoder_config(R"({"model_type": "mistral3", "text_config": {"model_type": "llama"}})", "m.json");
        }).find("a Mistral3ForConditionalGeneration folder whose text_config is \"llama\"") != std::string::npos);
  CHECK(error_of([] {
          parse_decoder_config(R"({"model_type": "ministral3", "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 64,
              "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})",
                               "m.json");
        }).find("ministral3's rope_parameters needs llama_4_scaling_beta") != std::string::npos);
  // Past its unscaled positions the model is refused, not computed without the scale.
  DecoderConfig small = parse_decoder_config(R"({"model_type": "ministral3", "hidden_size": 16,
      "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
      "head_dim": 8, "vocab_size": 32, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
      "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 8}})",
                                             "m.json");
  CausalLM m(small);
  CHECK(m->forward(at::zeros({1, 8}, at::kLong)).size(1) == 8);
  CHECK(error_of([&] {
          m->forward(at::zeros({1, 9}, at::kLong));
        }).find("9 positions: Ministral3ForCausalLM scales its queries past position 8") != std::string::npos);
}

TEST_CASE("the KV cache of each new layer kind equals its full forward, position by position") {
  for (const auto& [name, c] : fsdp::model::testing::tiny_new_kinds()) {
    CAPTURE(name);
    CausalLM m(c);
    init_parameters(*m, 22);
    c10::NoGradGuard no_grad;
    for (auto& p : m->named_parameters())  // norms away from their initial values
      if (p.key().find("norm") != std::string::npos) p.value().add_(torch::randn(p.value().sizes()) * 0.3);
    const at::Tensor x = torch::randint(0, c.vocab_size, {1, 9}, torch::kLong);
    const at::Tensor full = m->forward(x);
    std::vector<LayerCache> cache;
    // A prefill past Phi-3's 4 original positions: its keys then take the long factors, as the full
    // forward's do (transformers too keeps a shorter prefill's keys with the short ones).
    std::vector<at::Tensor> parts{m->forward_cached(x.narrow(1, 0, 5), cache)};
    for (int64_t i = 5; i < 9; ++i) parts.push_back(m->forward_cached(x.narrow(1, i, 1), cache));
    CHECK((at::cat(parts, 1) - full).abs().max().item<double>() <= 1e-5);
    // The loss is the cross-entropy of those logits (the soft cap and logits_scaling in both).
    const at::Tensor y = torch::randint(0, c.vocab_size, {1, 9}, torch::kLong);
    const at::Tensor want = at::cross_entropy_loss(full.reshape({9, -1}), y.reshape({-1}), {}, at::Reduction::Sum);
    CHECK(m->loss_sum(x, y).item<double>() == doctest::Approx(want.item<double>()).epsilon(1e-5));
  }
}

namespace {

// describe(c)'s names and shapes are the parameters a model of `c` registers, in its order.
void check_described_as_registered(const DecoderConfig& c) {
  const ModelDescription d = describe(c);
  CausalLM m(c);
  const auto named = m->named_parameters();
  REQUIRE(d.params.size() == named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    CHECK(d.params[i].name == named[i].key());
    CHECK(d.params[i].shape == named[i].value().sizes().vec());
  }
  CHECK(d.num_parameters == c.num_parameters());
}

}  // namespace

TEST_CASE("describe() lists every parameter of every family as the decoder registers it, ties as aliases") {
  for (const char* model : {"tiny", "llama3-8b", "mistral-7b", "qwen2.5-0.5b", "qwen3-1.7b"}) {
    DecoderConfig c = load_llama_config(std::string(FSDP_SOURCE_DIR) + "/configs/models/" + model + "/config.json");
    c.num_hidden_layers = 2;  // the names repeat per layer; two are enough and keep the module small
    c.sliding_layers.resize(2);
    c.vocab_size = 64;
    c.hidden_size = c.num_attention_heads * 2;
    c.head_dim = 2;
    c.intermediate_size = 8;
    for (bool tied : {false, true}) {
      c.tie_word_embeddings = tied;
      INFO(model, tied ? " tied" : "");
      check_described_as_registered(c);
      const ModelDescription d = describe(c);
      CHECK(d.params.front().aliases ==
            (tied ? std::vector<std::string>{"lm_head.weight"} : std::vector<std::string>{}));
      CHECK(d.architecture == family_names(c.family).architecture);
      CHECK(d.config_json.find("\"torch_dtype\": \"float32\"") != std::string::npos);
    }
  }
  for (auto [name, c] : fsdp::model::testing::tiny_new_kinds())
    for (bool tied : {false, true}) {
      c.tie_word_embeddings = tied;
      INFO(name, tied ? " tied" : "");
      check_described_as_registered(c);
    }
}

// Issue 61: the mixtures of experts' fields, their layers' plan, parameters and folder layout.
TEST_CASE("config.json of the mixtures of experts: sparse layers, counts, a round trip, the Hub's layout, refusals") {
  auto parse = [](const std::string& type, const std::string& extra = "") { return parse_shaped(type, extra); };
  const DecoderConfig q3 = parse("qwen3_moe", R"("num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
      "decoder_sparse_step": 2, "mlp_only_layers": [3], "output_router_logits": true)");
  CHECK((q3.qk_norm && !q3.moe.norm_topk_prob && q3.moe.output_router_logits && q3.moe.router_aux_loss_coef == 0.001));
  for (int64_t i = 0; i < 4; ++i) CHECK(q3.plan(i).moe == (i == 1));  // (i + 1) % 2 == 0, but layer 3 is dense
  // Counted: the routers and experts of the one sparse layer; active: 2 of its 6 experts.
  const double expert = 3.0 * 32 * 8;
  CHECK(q3.parameter_count() - q3.active_parameter_count() == doctest::Approx(4 * expert));
  const DecoderConfig q2 = parse("qwen2_moe", R"("num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
      "shared_expert_intermediate_size": 12)");
  CHECK((q2.qkv_bias && q2.moe.shared_expert_intermediate_size == 12 && q2.plan(0).moe && q2.plan(3).moe));
  const DecoderConfig mx = parse("mixtral", R"("num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8)");
  CHECK((mx.moe.num_experts == 4 && mx.moe.intermediate_size == 48 && mx.moe.norm_topk_prob && mx.plan(2).window == 8));
  for (const DecoderConfig& c : {q3, q2, mx}) {
    INFO(family_names(c.family).model_type);
    const DecoderConfig back = parse_decoder_config(decoder_config_json(c), "export");
    CHECK(decoder_config_json(back) == decoder_config_json(c));
    CHECK(back.num_parameters() == c.num_parameters());
    for (int64_t i = 0; i < 4; ++i) CHECK(back.plan(i).moe == c.plan(i).moe);
    check_described_as_registered(c);
  }
  // The Hub's folders hold the experts one by one; the model stacks them (gate's rows, then up's).
  const FolderLayout layout = describe(mx).layout;
  std::map<std::string, std::vector<int64_t>> stored;
  for (int64_t e = 0; e < 4; ++e)
    for (const char* w : {"w1", "w2", "w3"})
      stored[str("model.layers.0.block_sparse_moe.experts.", e, ".", w, ".weight")] =
          w == std::string("w2") ? std::vector<int64_t>{32, 48} : std::vector<int64_t>{48, 32};
  stored["model.layers.0.block_sparse_moe.gate.weight"] = {4, 32};
  const auto places = layout.places(stored);
  REQUIRE(places.count("model.layers.0.mlp.experts.gate_up_proj"));
  CHECK(places.at("model.layers.0.mlp.experts.gate_up_proj").shape == std::vector<int64_t>{4, 96, 32});
  CHECK(places.at("model.layers.0.mlp.experts.gate_up_proj").stack[1] ==
        std::vector<std::string>{"model.layers.0.block_sparse_moe.experts.1.w1.weight",
                                 "model.layers.0.block_sparse_moe.experts.1.w3.weight"});
  CHECK(places.at("model.layers.0.mlp.experts.down_proj").shape == std::vector<int64_t>{4, 32, 48});
  CHECK(places.at("model.layers.0.mlp.gate.weight").stored == "model.layers.0.block_sparse_moe.gate.weight");
  CHECK(places.size() == 3);  // the parts are read as the stacked parameters, not beside them
  CHECK(layout.stored_name("model.layers.0.mlp.gate.weight") == "model.layers.0.block_sparse_moe.gate.weight");
  const auto& error = shaped_error;
  CHECK(error("qwen3", R"("num_experts": 8)").find("num_experts is a mixture-of-experts field, not one of "
                                                     "Qwen3ForCausalLM; remove it, or set model_type to qwen3_moe") !=
        std::string::npos);
  CHECK(error("qwen3_moe", R"("num_experts": 2, "num_experts_per_tok": 3)")
            .find("num_experts_per_tok (3) is more than the experts (2)") != std::string::npos);
  CHECK(error("qwen3_moe", R"("mlp_only_layers": [4])").find("mlp_only_layers holds 4; each is a layer index in [0, 4)") !=
        std::string::npos);
  CHECK(error("mixtral", R"("router_jitter_noise": 0.1)").find("router_jitter_noise 0.1 is not supported") !=
        std::string::npos);
  CHECK(error("qwen3_moe", R"("use_sliding_window": true, "sliding_window": 8)")
            .find("does not implement Qwen3MoeForCausalLM's sliding windows yet") != std::string::npos);
}

// GLM-4.5 (glm4_moe): Glm4MoeConfig's defaults, the dense first layers, the router's stored bias and the shared
// experts under transformers' names, the folder's multi-token-prediction layer left out, refusals.
TEST_CASE("config.json of GLM-4.5: dense first layers, the router's stored bias, shared experts, refusals") {
  const DecoderConfig c = parse_shaped("glm4_moe", R"("attention_bias": true, "n_routed_experts": 8,
      "num_experts_per_tok": 3, "moe_intermediate_size": 8, "n_shared_experts": 2, "n_group": 2, "topk_group": 1,
      "routed_scaling_factor": 2.5)");
  CHECK((c.qkv_bias && !c.attention_bias && !c.qk_norm && c.partial_rotary_factor == 0.5 && c.rotary_dim() == 4));
  CHECK((c.rms_norm_eps == 1e-5 && c.max_position_embeddings == 131072 && c.rope_theta == 10000.0));
  const MoeConfig& m = c.moe;
  CHECK((m.grouped_router && m.norm_topk_prob && m.router_aux_loss_coef == 0 && !m.output_router_logits));
  CHECK((m.num_experts == 8 && m.experts_per_token == 3 && m.shared_expert_intermediate_size == 16));
  CHECK((m.n_group == 2 && m.topk_group == 1 && m.routed_scaling_factor == 2.5 && c.mtp_layers == 1));
  for (int64_t i = 0; i < 4; ++i) CHECK(c.plan(i).moe == (i >= 1));  // first_k_dense_replace 1
  // Counted: the routers, 8 experts and the shared experts of three layers (not the stored bias, a buffer in
  // transformers); active: 3 of the 8.
  CHECK(c.parameter_count() - c.active_parameter_count() == doctest::Approx(3 * 5 * 3.0 * 32 * 8));
  check_round_trip(c);
  check_described_as_registered(c);
  const ModelDescription d = describe(c);
  std::set<std::string> names;
  for (const ParamSpec& p : d.params) names.insert(p.name);
  for (const char* name : {"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
                           "model.layers.1.mlp.shared_experts.down_proj.weight", "model.layers.0.mlp.up_proj.weight",
                           "model.layers.3.self_attn.v_proj.bias"})
    CHECK_MESSAGE(names.count(name), name);
  for (const char* name : {"model.layers.1.mlp.shared_expert_gate.weight", "model.layers.0.mlp.gate.weight",
                           "model.layers.3.self_attn.o_proj.bias", "model.layers.1.self_attn.q_norm.weight"})
    CHECK_MESSAGE(!names.count(name), name);
  // The folder's multi-token-prediction layer (model.layers.4) is not the model's; layer 40 of a deeper one would be.
  CHECK(d.layout.ours("model.layers.4.eh_proj.weight").empty());
  CHECK(d.layout.ours("model.layers.4.mlp.experts.0.up_proj.weight").empty());
  CHECK(d.layout.ours("model.layers.40.mlp.gate.weight") == "model.layers.40.mlp.gate.weight");
  const std::string exported = decoder_config_json(c);
  for (const char* field : {"\"num_nextn_predict_layers\": 0", "\"attention_bias\": true", "\"n_shared_experts\": 2",
                            "\"partial_rotary_factor\": 0.5", "\"first_k_dense_replace\": 1"})
    CHECK_MESSAGE(exported.find(field) != std::string::npos, field);
  CHECK(exported.find("mlp_bias") == std::string::npos);
  CHECK(exported.find("router_aux_loss_coef") == std::string::npos);
  const DecoderConfig normed = parse_shaped("glm4_moe", R"("use_qk_norm": true, "first_k_dense_replace": 0)");
  CHECK((normed.qk_norm && normed.plan(0).moe && normed.moe.num_experts == 128));
  const auto& error = shaped_error;
  CHECK(error("glm4_moe", R"("n_routed_experts": 8, "n_group": 3)")
            .find("n_group 3 must divide n_routed_experts 8 into groups of at least two experts") != std::string::npos);
  CHECK(error("glm4_moe", R"("n_routed_experts": 8, "n_group": 4, "topk_group": 1, "num_experts_per_tok": 3)")
            .find("topk_group 1 of n_group 4 groups of 2 experts leave fewer than num_experts_per_tok 3") !=
        std::string::npos);
  CHECK(error("glm4_moe", R"("routed_scaling_factor": 0)").find("routed_scaling_factor (0) must be > 0") !=
        std::string::npos);
  CHECK(error("glm4_moe", R"("n_shared_experts": 0)").find("n_shared_experts is 0; it must be a whole number >= 1") !=
        std::string::npos);
  CHECK(error("glm4_moe", R"("sliding_window": 8)").find("sliding_window is not a field of Glm4MoeForCausalLM") !=
        std::string::npos);
  CHECK(error("glm4_moe", R"("mlp_bias": true)").find("mlp_bias is not a field of Glm4MoeForCausalLM") !=
        std::string::npos);
  CHECK(error("qwen3_moe", R"("n_group": 2)")
            .find("n_group is a field of Glm4MoeForCausalLM and the DeepSeek classes, not of Qwen3MoeForCausalLM; "
                  "remove it, or set model_type to glm4_moe, deepseek_v2 or deepseek_v3") != std::string::npos);
}

// DeepSeek-V3 (deepseek_v3) and GLM-4.7-Flash (glm4_moe_lite): latent attention's fields, widths, parameters and
// names, each class's defaults, GLM-4.7-Flash's mlp_layer_types, and refusals.
TEST_CASE("config.json of DeepSeek-V3 and GLM-4.7-Flash: latent attention, their dense layers, refusals") {
  auto latent = [](const std::string& type, const std::string& extra = "") {
    return parse_decoder_config(R"({"model_type": ")" + type + R"(", "vocab_size": 64, "hidden_size": 30,
        "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4)" +
                                    (extra.empty() ? "" : ", " + extra) + "}",
                                type + ".json");
  };
  auto error = [&](const std::string& type, const std::string& extra) {
    return error_of([&] { latent(type, extra); });
  };
  // hidden_size 30 is no multiple of the heads: latent attention's widths are its own.
  const DecoderConfig d = latent("deepseek_v3", R"("q_lora_rank": 12, "kv_lora_rank": 10, "qk_nope_head_dim": 6,
      "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 8, "num_experts_per_tok": 2,
      "moe_intermediate_size": 8, "n_group": 2, "topk_group": 1, "attention_bias": true,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5,
                       "original_max_position_embeddings": 1024})");
  CHECK((d.latent() && d.mla.q_rank == 12 && d.mla.interleave && d.num_key_value_heads == 4));
  CHECK((d.head_dim == 10 && d.rotary_dim() == 4 && d.max_position_embeddings == 4096 && d.rms_norm_eps == 1e-6));
  const double mscale = 0.1 * 0.5 * std::log(4.0) + 1.0;  // yarn's mscale_all_dim, squared, on 10^-1/2
  CHECK(d.attention_scale == doctest::Approx(mscale * mscale / std::sqrt(10.0)));
  CHECK((d.moe.first_k_dense_replace == 3 && d.moe.routed_scaling_factor == 2.5 && d.mtp_layers == 1));
  for (int64_t i = 0; i < 4; ++i) CHECK(d.plan(i).moe == (i >= 3));
  // q_a_proj (+ bias), its norm, q_b_proj; kv_a_proj_with_mqa (+ bias), its norm, kv_b_proj; o_proj (+ bias).
  const double attention = 30 * 12 + 12 + 12 + 12 * 4 * 10 + 30 * 14 + 14 + 10 + 10 * 4 * 14 + 4 * 8 * 30 + 30;
  const double dense = 3 * 30 * 48.0, sparse = 8 * 30 + 8 * 3 * 30 * 8.0 + 3 * 30 * 8;
  CHECK(d.parameter_count() == doctest::Approx(2 * 64 * 30 + 4 * (attention + 2 * 30) + 3 * dense + sparse + 30));
  // The scores at the query-key width (10), the values' sums at theirs (8).
  CHECK(d.flops_per_token(16) - 6 * (d.active_parameter_count() - 64 * 30) == doctest::Approx(4 * 6 * 4 * 18 * 16.0));
  check_round_trip(d);
  check_described_as_registered(d);
  std::set<std::string> names;
  for (const ParamSpec& p : describe(d).params) names.insert(p.name);
  for (const char* name :
       {"model.layers.0.self_attn.q_a_proj.bias", "model.layers.0.self_attn.q_a_layernorm.weight",
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "model.layers.3.mlp.shared_experts.up_proj.weight",
        "model.layers.0.self_attn.kv_b_proj.weight", "model.layers.3.mlp.gate.e_score_correction_bias"})
    CHECK_MESSAGE(names.count(name), name);
  for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                           "model.layers.0.self_attn.kv_b_proj.bias", "model.layers.0.self_attn.q_b_proj.bias"})
    CHECK_MESSAGE(!names.count(name), name);
  const std::string exported = decoder_config_json(d);
  for (const char* field :
       {"\"head_dim\": 4", "\"q_lora_rank\": 12", "\"v_head_dim\": 8", "\"rope_interleave\": true",
        "\"mscale_all_dim\": 0.5", "\"num_nextn_predict_layers\": 0", "\"first_k_dense_replace\": 3"})
    CHECK_MESSAGE(exported.find(field) != std::string::npos, field);
  // GLM-4.7-Flash: q_proj without a latent, values wider than queries and keys, the sparse layers its list names.
  const DecoderConfig g = latent("glm4_moe_lite", R"("q_lora_rank": null, "kv_lora_rank": 10, "qk_nope_head_dim": 4,
      "qk_rope_head_dim": 2, "v_head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
      "mlp_layer_types": ["dense", "sparse", "dense", "sparse"], "rope_interleave": false)");
  CHECK((g.mla.q_rank == 0 && !g.mla.interleave && g.head_dim == 8 && g.rms_norm_eps == 1e-5));
  CHECK((g.attention_scale == doctest::Approx(1 / std::sqrt(6.0)) && g.mtp_layers == 0 &&
         g.moe.routed_scaling_factor == 1.8));
  for (int64_t i = 0; i < 4; ++i) CHECK(g.plan(i).moe == (i % 2 == 1));
  check_round_trip(g);
  check_described_as_registered(g);
  CHECK(decoder_config_json(g).find("\"mlp_layer_types\": [\n    \"dense\",\n    \"sparse\"") != std::string::npos);
  CHECK(decoder_config_json(g).find("first_k_dense_replace") == std::string::npos);
  // The released config.json's first_k_dense_replace 1 is what the default list builds; another is refused.
  const DecoderConfig released = latent("glm4_moe_lite", R"("first_k_dense_replace": 1, "topk_method": "noaux_tc")");
  CHECK((!released.plan(0).moe && released.plan(1).moe && released.moe.num_experts == 64 && released.head_dim == 256));
  CHECK(error("glm4_moe_lite", R"("first_k_dense_replace": 2)")
            .find("first_k_dense_replace 2 is not what Glm4MoeLiteForCausalLM builds: its class reads mlp_layer_types "
                  "(absent: the first layer dense, the rest sparse)") != std::string::npos);
  CHECK(error("glm4_moe_lite", R"("mlp_layer_types": ["dense", "moe", "dense", "sparse"])")
            .find("mlp_layer_types[1] is \"moe\"; each is \"dense\" or \"sparse\"") != std::string::npos);
  CHECK(error("deepseek_v3", R"("num_key_value_heads": 2)")
            .find("num_key_value_heads 2 is not num_attention_heads 4; latent attention gives every head a key and "
                  "value of its own") != std::string::npos);
  CHECK(error("deepseek_v3", R"("head_dim": 128)").find("head_dim 128 is not qk_rope_head_dim 64") !=
        std::string::npos);
  CHECK(error("deepseek_v3", R"("qk_rope_head_dim": 3)").find("qk_rope_head_dim 3 must be even") != std::string::npos);
  // qk_head_dim, which transformers' configs save (their sum): read without a warning, checked.
  std::vector<std::string> warnings;
  parse_decoder_config(R"({"model_type": "glm4_moe_lite", "vocab_size": 64, "hidden_size": 30, "intermediate_size": 48,
      "num_hidden_layers": 4, "num_attention_heads": 4, "qk_head_dim": 256})",
                       "flash.json", &warnings);
  CHECK(warnings.empty());
  CHECK(error("deepseek_v3", R"("qk_head_dim": 128)")
            .find("qk_head_dim 128 is not qk_nope_head_dim 128 + qk_rope_head_dim 64; each head's query and key are "
                  "that wide. Remove qk_head_dim, or make it 192") != std::string::npos);
  CHECK(shaped_error("qwen3", R"("qk_head_dim": 8)").find("qk_head_dim is a field of latent attention") !=
        std::string::npos);
  CHECK(error("deepseek_v3", R"("q_lora_rank": 0)").find("q_lora_rank is 0; it must be a whole number >= 1, or null") !=
        std::string::npos);
  CHECK(error("deepseek_v3", R"("mlp_layer_types": ["dense", "sparse", "sparse", "sparse"])")
            .find("mlp_layer_types is a field of Glm4MoeLiteForCausalLM, not of DeepseekV3ForCausalLM") !=
        std::string::npos);
  CHECK(error("deepseek_v3", R"("use_qk_norm": true)")
            .find("use_qk_norm is a field of Glm4MoeForCausalLM, not of "
                  "DeepseekV3ForCausalLM") != std::string::npos);
  CHECK(error("deepseek_v3", R"("partial_rotary_factor": 0.5)")
            .find("partial_rotary_factor 0.5 is not supported for DeepseekV3ForCausalLM") != std::string::npos);
  CHECK(shaped_error("qwen3", R"("kv_lora_rank": 8)")
            .find("kv_lora_rank is a field of latent attention (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, "
                  "Glm4MoeLiteForCausalLM), not of Qwen3ForCausalLM") != std::string::npos);
}

// DeepSeek-V2 (deepseek_v2): DeepseekV2Config's defaults, latent attention always interleaved, the router's two
// choices (greedy, group_limited_greedy) with softmax scores and no stored bias, the export's fields, refusals.
TEST_CASE("config.json of DeepSeek-V2: its defaults, greedy and group-limited choices, no stored bias, refusals") {
  auto v2 = [](const std::string& extra = "") {
    return parse_decoder_config(R"({"model_type": "deepseek_v2", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4, "num_experts_per_tok": 2)" +
                                    (extra.empty() ? "" : ", " + extra) + "}",
                                "v2.json");
  };
  auto error = [&](const std::string& extra) { return error_of([&] { v2(extra); }); };
  // DeepseekV2Config's defaults: 64 experts of 1407, 2 shared, every layer sparse, the greedy choice unscaled.
  const DecoderConfig d = v2();
  const MoeConfig& m = d.moe;
  CHECK((d.latent() && d.mla.q_rank == 1536 && d.mla.kv_rank == 512 && d.mla.qk_dim() == 192 && d.mla.v_dim == 128));
  CHECK((d.mla.interleave && d.head_dim == 192 && d.rotary_dim() == 64 && d.num_key_value_heads == 4));
  CHECK((m.grouped_router && m.softmax_scores && !m.group_limited && !m.norm_topk_prob && m.num_experts == 64));
  CHECK((m.intermediate_size == 1407 && m.shared_expert_intermediate_size == 2 * 1407 && m.experts_per_token == 2));
  CHECK((m.routed_scaling_factor == 1.0 && m.first_k_dense_replace == 0 && d.mtp_layers == 0));
  CHECK((m.router_aux_loss_coef == 0 && !m.output_router_logits && m.n_group == 0 && m.topk_group == 0));
  CHECK((d.max_position_embeddings == 2048 && d.rms_norm_eps == 1e-6 && d.bos_token_id_json == "1"));
  for (int64_t i = 0; i < 4; ++i) CHECK(d.plan(i).moe);
  check_round_trip(d);
  check_described_as_registered(d);
  std::set<std::string> names;
  for (const ParamSpec& p : describe(d).params) names.insert(p.name);
  CHECK(names.count("model.layers.0.mlp.gate.weight"));
  CHECK(names.count("model.layers.0.mlp.shared_experts.gate_proj.weight"));
  CHECK(!names.count("model.layers.0.mlp.gate.e_score_correction_bias"));  // softmax scores: none stored
  CHECK(!names.count("model.layers.0.mlp.shared_expert_gate.weight"));
  CHECK(hf_class_name("MoeBlock", d.family) == "DeepseekV2Moe");
  CHECK(our_class_name("DeepseekV2Moe", d.family) == "MoeBlock");
  CHECK(hf_class_name("Attention", d.family) == "DeepseekV2Attention");
  // DeepSeek-V2-Lite's form: q_proj, the greedy choice with n_group 1 as written, the first layer dense; the
  // DeepSeek fields transformers does not read (scoring_func, moe_layer_freq, aux_loss_alpha, seq_aux, auto_map)
  // read without a warning.
  std::vector<std::string> warnings;
  const DecoderConfig lite = parse_decoder_config(R"({"model_type": "deepseek_v2", "vocab_size": 64,
      "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_experts_per_tok": 6, "q_lora_rank": null, "n_routed_experts": 8, "topk_method": "greedy", "n_group": 1,
      "topk_group": 1, "first_k_dense_replace": 1, "norm_topk_prob": false, "scoring_func": "softmax",
      "moe_layer_freq": 1, "aux_loss_alpha": 0.001, "seq_aux": true, "auto_map": {"AutoConfig": "x.Y"},
      "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                       "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}})",
                                                  "lite.json", &warnings);
  CHECK(warnings.empty());
  CHECK((lite.mla.q_rank == 0 && !lite.moe.group_limited && lite.moe.n_group == 1 && !lite.plan(0).moe));
  const double mscale = 0.1 * 0.707 * std::log(40.0) + 1.0;  // yarn's mscale_all_dim, squared, on 192^-1/2
  CHECK(lite.attention_scale == doctest::Approx(mscale * mscale / std::sqrt(192.0)));
  std::string exported = decoder_config_json(lite);
  for (const char* field : {"\"topk_method\": \"greedy\"", "\"n_group\": 1", "\"norm_topk_prob\": false",
                            "\"first_k_dense_replace\": 1", "\"q_lora_rank\": null", "\"model_type\": \"deepseek_v2\""})
    CHECK_MESSAGE(exported.find(field) != std::string::npos, field);
  for (const char* field : {"rope_interleave", "num_nextn_predict_layers", "mlp_bias", "router_aux_loss_coef"})
    CHECK_MESSAGE(exported.find(field) == std::string::npos, field);
  CHECK(decoder_config_json(d).find("\"n_group\": null") != std::string::npos);  // as written: absent
  // DeepSeek-V2's own: the topk_group best of n_group groups, each scored by its best expert (so a group of one).
  const DecoderConfig grouped = v2(R"("n_routed_experts": 8, "topk_method": "group_limited_greedy", "n_group": 8,
      "topk_group": 3, "routed_scaling_factor": 16.0)");
  CHECK((grouped.moe.group_limited && grouped.moe.n_group == 8 && grouped.moe.topk_group == 3));
  CHECK(decoder_config_json(grouped).find("\"topk_method\": \"group_limited_greedy\"") != std::string::npos);
  check_round_trip(grouped);
  CHECK(
      error(R"("topk_method": "noaux_tc")")
          .find("topk_method \"noaux_tc\" is not one DeepseekV2ForCausalLM computes: it chooses experts by \"greedy\" "
                "(the top k of all) or \"group_limited_greedy\" (within the best groups). Write one of the two, or "
                "set model_type to deepseek_v3 for DeepSeek-V3's router") != std::string::npos);
  CHECK(error(R"("topk_method": "group_limited_greedy", "n_group": 8)")
            .find("topk_group is missing; topk_method group_limited_greedy chooses within groups of experts") !=
        std::string::npos);
  CHECK(error(R"("topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 1, "num_experts_per_tok": 9)")
            .find("topk_group 1 of n_group 8 groups of 8 experts leave fewer than num_experts_per_tok 9") !=
        std::string::npos);
  CHECK(error(R"("norm_topk_prob": true)")
            .find("norm_topk_prob is true, but DeepseekV2ForCausalLM never renormalises the chosen experts' scores") !=
        std::string::npos);
  CHECK(error(R"("rope_interleave": false)")
            .find("rope_interleave is false, but DeepseekV2ForCausalLM always turns adjacent pairs") !=
        std::string::npos);
  CHECK(error(R"("num_experts_per_tok": 65)").find("num_experts_per_tok 65 is more than the 64 experts") !=
        std::string::npos);
  CHECK(error_of([] {
          parse_decoder_config(R"({"model_type": "deepseek_v2", "vocab_size": 64, "hidden_size": 32,
              "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4})",
                               "v2.json");
        }).find("num_experts_per_tok is missing; DeepseekV2ForCausalLM's router has no default for it") !=
        std::string::npos);
  CHECK(error(R"("hidden_size": 30)").find("hidden_size 30 is not a multiple of num_attention_heads 4") !=
        std::string::npos);
}

// quantization_config: block FP8 (DeepSeek-V3's, the Qwen *-FP8 folders) is read dequantized, each weight beside its
// scales; the export is unquantized; the methods whose weights fsdptrain cannot read are refused by name.
TEST_CASE("config.json's quantization_config: block FP8 weights read with their scales, other methods refused") {
  const DecoderConfig q = parse_shaped("qwen3", R"("quantization_config": {"quant_method": "fp8",
      "activation_scheme": "dynamic", "weight_block_size": [64, 32], "modules_to_not_convert": null})");
  CHECK(q.fp8_block == std::vector<int64_t>{64, 32});
  CHECK(describe(q).layout.fp8_block == q.fp8_block);
  CHECK(decoder_config_json(q).find("quantization_config") == std::string::npos);
  CHECK(describe(q).config_json == describe(parse_shaped("qwen3")).config_json);  // a resume's check: the same model
  CHECK(parse_shaped("qwen3", R"("quantization_config": {"quant_method": "fp8"})").fp8_block ==
        std::vector<int64_t>{128, 128});  // FineGrainedFP8Config's default
  CHECK(parse_shaped("qwen3").fp8_block.empty());
  // Qwen3.5's FP8 folders write it beside text_config: the text model's weights are the FP8 ones.
  const DecoderConfig mm = parse_decoder_config(R"({"model_type": "gemma3", "architectures":
      ["Gemma3ForConditionalGeneration"], "quantization_config": {"quant_method": "fp8"}, "text_config": {
      "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 8}})",
                                                "mm.json");
  CHECK((mm.text_of_multimodal && mm.fp8_block == std::vector<int64_t>{128, 128}));

  // Each weight with a scale_inv beside it is read with it, the scales are no tensors of the model; the experts
  // stored one by one are stacked as before (each part with its own scales, ckpt/sources.cpp).
  const FolderLayout layout = describe(parse_shaped("qwen3_moe", R"("num_experts": 2, "num_experts_per_tok": 1,
      "moe_intermediate_size": 8, "quantization_config": {"quant_method": "fp8", "weight_block_size": [8, 8]})"))
                                  .layout;
  std::map<std::string, std::vector<int64_t>> stored = {{"model.layers.0.self_attn.q_proj.weight", {32, 32}},
                                                        {"model.layers.0.self_attn.q_proj.weight_scale_inv", {4, 4}},
                                                        {"model.layers.0.self_attn.q_norm.weight", {8}}};
  for (int64_t e = 0; e < 2; ++e)
    for (const char* w : {"gate_proj", "up_proj"}) {
      const std::string name = str("model.layers.0.mlp.experts.", e, ".", w, ".weight");
      stored[name] = {8, 32};
      stored[name + "_scale_inv"] = {1, 4};
    }
  const auto places = layout.places(stored);
  CHECK(places.size() == 3);
  const auto& qp = places.at("model.layers.0.self_attn.q_proj.weight");
  CHECK((qp.fp8 && qp.scales == "model.layers.0.self_attn.q_proj.weight_scale_inv" && qp.shape[0] == 32));
  CHECK((!places.at("model.layers.0.self_attn.q_norm.weight").fp8 &&
         places.at("model.layers.0.self_attn.q_norm.weight").scales.empty()));
  CHECK(places.at("model.layers.0.mlp.experts.gate_up_proj").shape == std::vector<int64_t>{2, 16, 32});
  CHECK(layout.fp8_scales("model.layers.0.mlp.experts.1.up_proj.weight", stored) ==
        "model.layers.0.mlp.experts.1.up_proj.weight_scale_inv");
  FolderLayout unquantized = layout;
  unquantized.fp8_block.clear();  // a folder without quantization_config: a scale_inv is a tensor like another
  CHECK(unquantized.places(stored).count("model.layers.0.self_attn.q_proj.weight_scale_inv"));

  CHECK(shaped_error("qwen3", R"("quantization_config": {"quant_method": "gptq", "bits": 4})")
            .find("quantization_config {\"bits\":4,\"quant_method\":\"gptq\"} is not a format fsdptrain reads: it "
                  "reads unquantized weights (bf16, fp16, fp32), block FP8") != std::string::npos);
  CHECK(shaped_error("qwen3", R"("quantization_config": {"quant_method": "mxfp4"})")
            .find("is not a format fsdptrain reads") != std::string::npos);  // gpt-oss's experts only
  CHECK(shaped_error("qwen3", R"("quantization_config": {"quant_method": "fp8", "activation_scheme": "static"})")
            .find("activation_scheme \"static\" is not read") != std::string::npos);
  CHECK(shaped_error("qwen3", R"("quantization_config": {"quant_method": "fp8", "activation_scheme": null})")
            .find("activation_scheme null is not read") != std::string::npos);  // named, not nlohmann's type error
  CHECK(shaped_error("qwen3", R"("quantization_config": {"quant_method": "fp8", "weight_block_size": [128]})")
            .find("weight_block_size [128] must be two positive integers") != std::string::npos);
  CHECK(shaped_error("qwen3", R"("quantization_config": {"quant_method": "fp8", "weight_block_size": null})")
            .find("weight_block_size null must be two positive integers") != std::string::npos);
}

// GLM-4.5's router: the biased sigmoid scores choose within the best group, the unbiased ones weigh, times the factor.
TEST_CASE("GLM-4.5's router: groups and a stored bias choose the experts, the scores weigh them, the shared add") {
  const DecoderConfig c = fsdp::model::testing::tiny_of("glm4_moe", R"("n_routed_experts": 8, "num_experts_per_tok": 3,
      "moe_intermediate_size": 8, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5)");
  CausalLM m(c);
  init_parameters(*m, 5);
  MoeBlockImpl& block = *m->sparse_blocks().at(0);
  torch::NoGradGuard no_grad;
  const at::Tensor x = at::randn({1, 10, c.hidden_size}, at::TensorOptions().dtype(at::kFloat));
  // Experts 4 to 6 of the second group: its two best biased scores sum highest, and they are its best three.
  block.correction_bias.copy_(at::tensor({0.0f, 0.0f, 0.0f, 0.0f, 100.0f, 90.0f, 80.0f, 0.0f}));
  const at::Tensor y = block.forward(x);
  CHECK(at::equal(block.last.routed_per_expert, at::tensor({0.0f, 0.0f, 0.0f, 0.0f, 10.0f, 10.0f, 10.0f, 0.0f})));
  const at::Tensor h = x.reshape({-1, c.hidden_size});
  const at::Tensor scores = at::sigmoid(at::linear(h, block.gate->weight)).narrow(1, 4, 3);  // unbiased
  const at::Tensor w = scores / scores.sum(-1, true) * 2.5;
  auto expert = [&](int e) {  // every row through expert e alone
    std::vector<int> ends(8, 0);
    for (int i = e; i < 8; ++i) ends[i] = 10;
    return block.experts->forward(h, at::tensor(ends, at::kInt), at::full({10}, e, at::kLong));
  };
  at::Tensor want = block.shared_expert->forward(x).reshape({-1, c.hidden_size});
  for (int e = 4; e < 7; ++e) want = want + w.narrow(1, e - 4, 1) * expert(e);
  CHECK(at::allclose(y.reshape({-1, c.hidden_size}), want, 1e-5, 1e-6));
  // The group's choice: the first group's experts biased highest one at a time lose to the second's pair.
  block.correction_bias.copy_(at::tensor({150.0f, 0.0f, 0.0f, 0.0f, 100.0f, 90.0f, 0.0f, 0.0f}));
  block.forward(x);
  CHECK(at::equal(block.last.routed_per_expert.narrow(0, 0, 4), at::zeros({4})));
  // Auxiliary-loss-free balancing's bias adds to the stored one.
  block.selection_bias = at::tensor({0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 500.0f});
  block.forward(x);
  CHECK(block.last.routed_per_expert[7].item<float>() == 10.0f);
}

// DeepSeek-V2's router, as DeepseekV2TopkRouter computes it: the softmax of the fp32 logits; greedy, the top k of
// them; group_limited_greedy, within the best groups, each group scored by its best expert (not GLM-4.5's two);
// the chosen scores, never renormalised, times routed_scaling_factor weigh the experts; the shared experts add.
TEST_CASE("DeepSeek-V2's router: softmax scores, groups scored by their best, unnormalised weights times the factor") {
  const DecoderConfig c = fsdp::model::testing::tiny_latent("deepseek_v2", R"("q_lora_rank": null,
      "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4, "n_routed_experts": 8,
      "num_experts_per_tok": 3, "moe_intermediate_size": 8, "routed_scaling_factor": 2.5)");
  CausalLM m(c);
  init_parameters(*m, 5);
  MoeBlockImpl& block = *m->sparse_blocks().at(0);
  CHECK(!block.correction_bias.defined());
  torch::NoGradGuard no_grad;
  const at::Tensor x = at::randn({1, 10, c.hidden_size}, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor h = x.reshape({-1, c.hidden_size});
  auto expert = [&](int e) {  // every row through expert e alone
    std::vector<int> ends(8, 0);
    for (int i = e; i < 8; ++i) ends[i] = 10;
    return block.experts->forward(h, at::tensor(ends, at::kInt), at::full({10}, e, at::kLong));
  };
  // Greedy: each row's top 3 softmax scores, as they are, times 2.5.
  const at::Tensor probs = at::softmax(at::linear(h, block.gate->weight), -1);  // (10, 8)
  const auto [top, chosen] = at::topk(probs, 3, -1);
  at::Tensor want = block.shared_expert->forward(x).reshape({-1, c.hidden_size});
  for (int e = 0; e < 8; ++e) {
    const at::Tensor weight = (top * (chosen == e).to(at::kFloat)).sum(-1, /*keepdim=*/true) * 2.5;  // (10, 1)
    want = want + weight * expert(e);
  }
  CHECK(at::allclose(block.forward(x).reshape({-1, c.hidden_size}), want, 1e-5, 1e-6));
  CHECK(block.last.routed_per_expert.sum().item<float>() == 30.0f);
  // group_limited_greedy over 2 groups of 4, 1 kept: with equal scores (a zero router), the bias TorchTitan's
  // balancing adds picks the first group by its best expert (0.5 against 0.3), though the second's two best outsum
  // the first's (0.6 against 0.55); experts 0 to 2 are its best three.
  block.gate->weight.zero_();
  block.group_limited = true;
  block.n_group = 2;
  block.topk_group = 1;
  block.selection_bias = at::tensor({0.5f, 0.05f, 0.02f, 0.0f, 0.3f, 0.3f, 0.0f, 0.0f});
  const at::Tensor y = block.forward(x);
  CHECK(at::equal(block.last.routed_per_expert, at::tensor({10.0f, 10.0f, 10.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f})));
  // Each weight is its unbiased score, 1/8, times 2.5.
  const at::Tensor three = (expert(0) + expert(1) + expert(2)) * (2.5 / 8);
  CHECK(at::allclose(y.reshape({-1, c.hidden_size}),
                     block.shared_expert->forward(x).reshape({-1, c.hidden_size}) + three, 1e-5, 1e-6));
}

// Issue 27: records packed into one row (data.packing: masked) train as if each were alone: their
// positions restart, they see only themselves (within a sliding window too), and the loss and its
// gradient are the sum of the records' own.
TEST_CASE("packed records: loss and gradients equal the records' run one at a time") {
  DecoderConfig c = tiny();
  c.sliding_window = 3;
  c.sliding_layers = {false, true};  // layer 1 slides: the window applies within a record
  CausalLM m = build(c, 17);
  const std::vector<std::vector<int64_t>> records{{1, 5, 9, 2}, {3, 4, 6, 7, 8, 10}, {11, 12}};
  std::vector<int64_t> tokens, targets, positions, segments;
  for (size_t r = 0; r < records.size(); ++r)
    for (size_t i = 0; i < records[r].size(); ++i) {
      tokens.push_back(records[r][i]);
      const bool last = i + 1 == records[r].size();
      targets.push_back(last ? -100 : records[r][i + 1]);  // the target into the next record is not counted
      positions.push_back(static_cast<int64_t>(i));
      segments.push_back(static_cast<int64_t>(r));
    }
  const int64_t T = static_cast<int64_t>(tokens.size());
  auto row = [T](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).view({1, T}); };
  auto grads = [&m] { return take_grads(*m); };
  m->zero_grad();
  const at::Tensor packed = m->loss_sum(row(tokens), row(targets), Packed{row(positions), row(segments)});
  packed.backward();
  const std::vector<at::Tensor> got = grads();
  double alone = 0;
  for (const auto& r : records) {
    const int64_t n = static_cast<int64_t>(r.size());
    const at::Tensor x = at::tensor(std::vector<int64_t>(r.begin(), r.end() - 1), at::kLong).view({1, n - 1});
    const at::Tensor y = at::tensor(std::vector<int64_t>(r.begin() + 1, r.end()), at::kLong).view({1, n - 1});
    const at::Tensor l = m->loss_sum(x, y);
    l.backward();
    alone += l.item<double>();
  }
  const std::vector<at::Tensor> want = grads();
  CHECK(packed.item<double>() == doctest::Approx(alone).epsilon(1e-5));
  for (size_t i = 0; i < got.size(); ++i) CHECK(at::allclose(got[i], want[i], 1e-4, 1e-6));
  // Without the packing the records see each other: another loss, so the check above can tell.
  CHECK(m->loss_sum(row(tokens), row(targets)).item<double>() != doctest::Approx(alone).epsilon(1e-3));
}

TEST_CASE("stacked_weights: adjacent weights are one block over their storage, their gradients split back") {
  const at::Tensor storage = at::randn({10 * 3}, at::kFloat);
  auto part = [&](int64_t offset, int64_t rows) {
    return storage.as_strided({rows, 3}, {3, 1}, offset).detach().requires_grad_();
  };
  const at::Tensor a = part(0, 4), b = part(12, 2), c = part(18, 4);
  const auto block = stacked_weights({a, b, c});
  REQUIRE(block.has_value());
  CHECK(block->data_ptr() == a.data_ptr());  // a view: no copy
  CHECK(at::equal(*block, at::cat({a, b, c}, 0)));
  const at::Tensor x = at::randn({5, 3});
  const at::Tensor g = at::randn({5, 10});
  (at::linear(x, *block) * g).sum().backward();
  CHECK(at::allclose(a.grad(), g.narrow(1, 0, 4).t().mm(x)));
  CHECK(at::allclose(b.grad(), g.narrow(1, 4, 2).t().mm(x)));
  CHECK(at::allclose(c.grad(), g.narrow(1, 6, 4).t().mm(x)));
  CHECK_FALSE(stacked_weights({a, c}).has_value());                                     // a gap
  CHECK_FALSE(stacked_weights({b, a}).has_value());                                     // out of order
  CHECK_FALSE(stacked_weights({a, at::randn({2, 3})}).has_value());                     // another storage
  CHECK_FALSE(stacked_weights({part(0, 4), part(12, 3).narrow(1, 0, 2)}).has_value());  // not contiguous
  CHECK(at::equal(stacked_biases({at::ones({2}), at::zeros({1})}), at::tensor({1.f, 1.f, 0.f})));
  CHECK_FALSE(stacked_biases({at::Tensor(), at::Tensor()}).defined());
}

// Gemma 4 E2B/E4B: the layers that share keys and values take them from another unit, and the
// per-layer table is a unit of its own; recomputed under activation checkpointing, each unit's
// backward still reaches the keys' layer. The unsharded model's loss and gradients either way.
TEST_CASE("Gemma 4 E2B/E4B under fully_shard: keys and values across units, with activation checkpointing") {
  torch::manual_seed(3);
  DecoderConfig c;
  for (const auto& [name, kind] : fsdp::model::testing::tiny_new_kinds())
    if (name == "gemma4_small") c = kind;
  REQUIRE(c.kv_shared_layers == 2);
  const at::Tensor tokens = at::randint(0, c.vocab_size, {2, 7}, at::kLong);
  CausalLM plain = build(c, 6);
  const at::Tensor expected = plain->loss(tokens, tokens);
  expected.backward();
  const auto plain_params = plain->named_parameters();
  for (const bool checkpointing : {false, true}) {
    INFO("activation checkpointing: " << checkpointing);
    CausalLM m = build(c, 6);
    FsdpOptions o;
    o.activation_checkpointing = checkpointing;
    if (checkpointing) o.layer_classes = {"Gemma4TextDecoderLayer"};  // named: the table is a unit all the same
    auto sharded = fully_shard(*m, decoder_traits(c), DeviceMesh{dist::make_single_process_group(), std::nullopt}, o);
    CHECK(sharded->groups().size() == 6);  // the root, the per-layer table, four layers
    const at::Tensor got =
        sharded->forward({tokens}, [&](const TensorList& in) { return TensorList{m->loss(in[0], in[0])}; })[0];
    got.backward();
    CHECK(got.item<double>() == doctest::Approx(expected.item<double>()).epsilon(1e-6));
    const auto grads = sharded->gather_full_gradients();
    CHECK(grads.size() == plain_params.size() - 4);  // all but the four layers' layer_scalar
    for (const auto& [name, g] : grads) {
      INFO(name);
      // float32's summation order (the sharded model's fused q/k/v and gate/up products, four layers
      // deep): measured 2.4e-6 of the gradient's largest entry here, 7.7e-6 with AVX2's kernels alone, and
      // 3.4e-5 on an AMD EPYC without AVX-512 (its MKL and oneDNN paths). A lost path is of the gradient's size.
      const at::Tensor want = plain_params[name].grad();
      CHECK((g - want).abs().max().item<double>() <= 1e-4 * want.abs().max().item<double>());
    }
  }
}

TEST_CASE(
    "under fully_shard q/k/v and gate/up are one block each, with the loss and gradients of one product per weight") {
  torch::manual_seed(2);
  for (const bool qwen2 : {false, true}) {
    INFO("attention bias (Qwen2): " << qwen2);
    DecoderConfig c = tiny();
    c.attention_bias = qwen2;
    CausalLM plain = build(c, 4), sharded_model = build(c, 4);
    auto sharded = fully_shard(*sharded_model, decoder_traits(c),
                               DeviceMesh{dist::make_single_process_group(), std::nullopt}, FsdpOptions{});
    const auto params = sharded_model->named_parameters();
    for (const std::string prefix : {"model.layers.1.self_attn.", "model.layers.1.mlp."}) {
      const bool attn = prefix.find("attn") != std::string::npos;
      const std::vector<std::string> names = attn ? std::vector<std::string>{"q_proj", "k_proj", "v_proj"}
                                                  : std::vector<std::string>{"gate_proj", "up_proj"};
      for (size_t i = 1; i < names.size(); ++i) {
        const at::Tensor& before = params[prefix + names[i - 1] + ".weight"];
        const at::Tensor& w = params[prefix + names[i] + ".weight"];
        CHECK(w.storage().is_alias_of(before.storage()));
        CHECK(w.storage_offset() == before.storage_offset() + before.numel());
      }
    }
    const at::Tensor tokens = at::randint(0, c.vocab_size, {2, 6}, at::kLong);
    const at::Tensor expected = plain->loss(tokens, tokens);
    expected.backward();
    const at::Tensor got = sharded->forward(
        {tokens}, [&](const TensorList& in) { return TensorList{sharded_model->loss(in[0], in[0])}; })[0];
    got.backward();
    CHECK(got.item<double>() == doctest::Approx(expected.item<double>()).epsilon(1e-6));
    const auto grads = sharded->gather_full_gradients();
    const auto plain_params = plain->named_parameters();
    for (const auto& [name, g] : grads) {
      INFO(name);
      CHECK(at::allclose(g, plain_params[name].grad(), 1e-5, 1e-6));
    }
  }
}

TEST_CASE("auxiliary-loss-free balancing: the bias chooses the experts, never weighs them; TorchTitan's step") {
  using fsdp::model::testing::tiny_of;
  const DecoderConfig qwen = tiny_of("qwen3_moe", R"("num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 12, "norm_topk_prob": false)");
  const DecoderConfig oss = tiny_of("gpt_oss", R"("num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8)");
  for (const auto& [name, c] : {std::pair{"qwen3_moe", qwen}, std::pair{"gpt_oss", oss}}) {
    CAPTURE(name);
    CausalLM m(c);
    init_parameters(*m, 5);
    MoeBlockImpl& block = *m->sparse_blocks().at(0);
    torch::NoGradGuard no_grad;
    const at::Tensor x = at::randn({1, 10, c.hidden_size}, at::TensorOptions().dtype(at::kFloat));
    const at::Tensor plain = block.forward(x);
    const at::Tensor plain_load = block.last.routed_per_expert.clone();
    // A bias that dwarfs every score: experts 2 and 3 receive every token.
    block.selection_bias = at::tensor({0.0f, 0.0f, 100.0f, 90.0f});
    const at::Tensor biased = block.forward(x);
    CHECK(at::equal(block.last.routed_per_expert, at::tensor({0.0f, 0.0f, 10.0f, 10.0f})));
    CHECK(at::equal(block.last.tokens_per_expert, plain_load));  // the aux loss's counts are transformers' own
    // Weighed by the router's own scores of the two: each token's softmax over all four experts
    // (gpt-oss: over the two chosen logits).
    const at::Tensor h = x.reshape({-1, c.hidden_size});
    const at::Tensor logits = at::linear(h, block.gate->weight, block.gate->bias);
    const at::Tensor w = c.moe.gpt_oss ? at::softmax(logits.narrow(1, 2, 2), -1) : at::softmax(logits, -1).narrow(1, 2, 2);
    auto expert = [&](int e) {  // every row through expert e alone
      const at::Tensor ends = at::tensor({0, 0, e == 2 ? 10 : 0, 10}, at::kInt);
      return block.experts->forward(h, ends, at::full({10}, e, at::kLong));
    };
    const at::Tensor want = w.narrow(1, 0, 1) * expert(2) + w.narrow(1, 1, 1) * expert(3);
    CHECK(at::allclose(biased.reshape({-1, c.hidden_size}), want, 1e-5, 1e-6));
    CHECK(!at::allclose(biased, plain, 1e-3, 1e-3));
  }
  // TorchTitan's step: coeff x sign(mean - load), centred (loads 6, 0, 2, 0: mean 2).
  at::Tensor bias = at::zeros({4});
  update_selection_bias(bias, at::tensor({6.0f, 0.0f, 2.0f, 0.0f}), 0.1);
  CHECK(at::allclose(bias, at::tensor({-0.125f, 0.075f, -0.025f, 0.075f}), 0, 1e-7));
}

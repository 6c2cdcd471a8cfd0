// The bill of one bf16 training step at the ~1B Llama's widths (configs/models/llama-1b: hidden 2048,
// 32 heads of 64, 8 key/value heads, MLP 8192, the full 128,256-token vocabulary; 2 of its 16
// layers, micro batch 2 of 2048 tokens), run through fully_shard on the `meta` device, which takes
// the GPU's branches and allocates nothing. Every op the step dispatches is recorded (LibTorch's
// RecordFunction, with its inputs' dtypes and shapes) and the bill is checked against the GPU
// step's dtype plan:
//   - every matrix product runs with bf16 operands (the loss head's included): its FLOPs all bf16;
//   - no float64 tensor anywhere in the step;
//   - per decoder layer (three layers' bill less two's): the ops that would launch a kernel (the
//     innermost ops that are not views), the bytes elementwise ops and copies read in the forward
//     and backward (in activations' bytes) and those FSDP, the norm, clipping and AdamW read (in the
//     layer's fp32 parameters' bytes) stay under stated bounds.
// The first GPU profile's waste (fp32 loss-head products, float64 norms) fails the first two.
// The bill is printed (ctest --output-on-failure, or model_test -tc='*bill*' -s).
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "llama_1b_widths.h"
#include "model/layers/chunked_loss.h"
#include "model/layers/decoder.h"
#include "model/kernels/float8.h"
#include "optim/adamw.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp;
using namespace fsdp::model;

namespace {

bool is_attention(const std::string& name) {
  return name.find("scaled_dot_product") != std::string::npos || name.find("flash_attention") != std::string::npos;
}

struct Op {
  std::string name;
  std::vector<at::ScalarType> dtypes;  // of its tensor inputs (tensor lists flattened)
  std::vector<std::vector<int64_t>> shapes;
  std::vector<bool> contiguous;  // of each tensor input
  int64_t bytes = 0;             // its tensor inputs' bytes
  bool leaf = true;              // no op ran inside it
  bool inside_attention = false;
  std::string scope;        // the innermost of fsdptrain's named ranges around it ("fsdp gather ...", "optimizer")
  bool user_scope = false;  // it is such a range, not an op
  int64_t seq = -1;         // autograd's sequence number: a backward node's is its forward op's
  bool attention_backward = false;  // a backward node of an op inside attention's forward
};

// Records every aten op dispatched while it lives (any thread: the backward's too).
class Recorder {
 public:
  Recorder() {
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&Recorder::enter, &Recorder::leave)
            .needsInputs(true)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE}));
    self() = this;
  }
  ~Recorder() {
    at::removeCallback(handle_);
    self() = nullptr;
  }
  std::vector<Op> ops() {
    std::lock_guard<std::mutex> lock(mu_);
    return ops_;
  }

 private:
  struct Index : at::ObserverContext {
    explicit Index(size_t i) : i(i) {}
    size_t i;
  };
  static std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
    Recorder* r = self();
    if (r == nullptr) return nullptr;
    Op op;
    op.name = fn.name();
    op.seq = fn.seqNr();
    // Python-style scalars (x * 0.5) arrive as 0-dim double "wrapped numbers": not float64 data.
    // gather and scatter touch only their indices' elements of the tensor they index (its bytes not
    // counted; the index and the values are).
    const bool indexing = op.name == "aten::gather" || op.name == "aten::scatter_" || op.name == "aten::scatter";
    auto add = [&](const at::Tensor& t) {
      if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
      op.dtypes.push_back(t.scalar_type());
      op.shapes.push_back(t.sizes().vec());
      op.contiguous.push_back(t.is_contiguous());
      if (!indexing || op.shapes.size() > 1) op.bytes += t.numel() * static_cast<int64_t>(t.element_size());
    };
    for (const c10::IValue& v : fn.inputs()) {
      if (v.isTensor()) add(v.toTensor());
      if (v.isTensorList())
        for (const at::Tensor& t : v.toTensorVector()) add(t);
    }
    std::lock_guard<std::mutex> lock(r->mu_);
    std::vector<size_t>& stack = r->stacks_[std::this_thread::get_id()];
    op.user_scope = fn.scope() == at::RecordScope::USER_SCOPE;
    for (size_t parent : stack) {
      if (r->ops_[parent].user_scope) {
        op.scope = r->ops_[parent].name;
        continue;
      }
      r->ops_[parent].leaf = false;
      if (is_attention(r->ops_[parent].name) || r->ops_[parent].attention_backward) op.inside_attention = true;
    }
    // On meta, SDPA takes its math path (a GPU runs one fused kernel each way): its ops, and the
    // backward nodes autograd made for them, are attention's.
    const bool node = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
    if (op.inside_attention && !node && op.seq >= 0) r->attention_seq_.insert(op.seq);
    if (node && r->attention_seq_.count(op.seq) > 0) op.attention_backward = true;
    r->ops_.push_back(std::move(op));
    stack.push_back(r->ops_.size() - 1);
    return std::make_unique<Index>(r->ops_.size() - 1);
  }
  static void leave(const at::RecordFunction&, at::ObserverContext* ctx) {
    Recorder* r = self();
    if (r == nullptr || ctx == nullptr) return;
    std::lock_guard<std::mutex> lock(r->mu_);
    std::vector<size_t>& stack = r->stacks_[std::this_thread::get_id()];
    if (!stack.empty() && stack.back() == static_cast<Index*>(ctx)->i) stack.pop_back();
  }
  static Recorder*& self() {
    static Recorder* r = nullptr;
    return r;
  }
  std::mutex mu_;
  std::vector<Op> ops_;
  std::set<int64_t> attention_seq_;
  std::map<std::thread::id, std::vector<size_t>> stacks_;
  at::CallbackHandle handle_;
};

// Ops that only describe memory (views, shapes, allocation): no kernel on a GPU.
bool is_view(const std::string& name) {
  static const std::set<std::string> views = {"aten::view",
                                              "aten::reshape",
                                              "aten::_reshape_alias",
                                              "aten::slice",
                                              "aten::narrow",
                                              "aten::select",
                                              "aten::t",
                                              "aten::transpose",
                                              "aten::permute",
                                              "aten::expand",
                                              "aten::as_strided",
                                              "aten::unsqueeze",
                                              "aten::squeeze",
                                              "aten::split",
                                              "aten::split_with_sizes",
                                              "aten::chunk",
                                              "aten::unbind",
                                              "aten::detach",
                                              "aten::alias",
                                              "aten::empty",
                                              "aten::empty_like",
                                              "aten::empty_strided",
                                              "aten::resize_",
                                              "aten::_unsafe_view",
                                              "aten::lift_fresh",
                                              "aten::contiguous",
                                              "aten::to",
                                              "aten::result_type",
                                              "aten::set_",
                                              "aten::expand_as",
                                              "aten::view_as",
                                              "aten::flatten",
                                              "aten::unflatten",
                                              "aten::movedim",
                                              "aten::numpy_T",
                                              "aten::_local_scalar_dense",
                                              "aten::is_same_size",
                                              "aten::size",
                                              "aten::stride",
                                              "aten::record_stream",
                                              "aten::_nested_tensor_from_mask_left_aligned",
                                              "aten::align_tensors",
                                              "aten::type_as"};
  return views.count(name) > 0;
}

bool is_product(const std::string& name) {
  static const std::set<std::string> products = {
      "aten::mm",      "aten::addmm",    "aten::addmm_",        "aten::bmm",
      "aten::baddbmm", "aten::baddbmm_", "fsdptrain::float8_mm",  // model/kernels/float8_products.h
      "aten::_grouped_mm"};                                        // a mixture of experts' products
  return products.count(name) > 0;
}

// Which tensor inputs multiply: mm/bmm's first two; addmm/baddbmm's (and their in-place forms')
// second and third (after self).
size_t first_operand(const Op& op) {
  return op.name.rfind("aten::addmm", 0) == 0 || op.name.rfind("aten::baddbmm", 0) == 0 ? 1 : 0;
}

// 2 m k n for mm/addmm, b times that for bmm/baddbmm.
double product_flops(const Op& op) {
  const size_t i = first_operand(op);
  if (op.shapes.size() < i + 2) return 0;
  const auto& a = op.shapes[i];
  const auto& b = op.shapes[i + 1];
  if (a.size() == 2 && b.size() == 2) return 2.0 * a[0] * a[1] * b[1];  // also grouped along K: (K, M) x (M, N)
  if (a.size() == 2 && b.size() == 3) return 2.0 * a[0] * a[1] * b[2];  // grouped: each row by its group's (K, N)
  if (a.size() == 3 && b.size() == 3) return 2.0 * a[0] * a[1] * a[2] * b[2];
  return 0;
}

bool is_float8(at::ScalarType t) {
  return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2;
}

struct Bill {
  double product_flops = 0, bf16_product_flops = 0, float8_product_flops = 0;
  std::vector<std::string> strided_swiglu;      // SwiGLU launches with a strided input (unvectorized on a GPU)
  std::map<std::string, double> fp32_products;  // name -> FLOPs, products with an operand not in bf16
  std::set<std::string> float64_ops;
  std::vector<std::string> notes;  // each float64 or non-bf16 product op with its inputs' shapes
  int64_t launches = 0;            // innermost non-view ops, attention apart
  int64_t attention = 0;           // SDPA calls
  std::map<std::string, int64_t> launches_by_op;
  double moved_bytes = 0;  // the tensor inputs of the launching ops that are not products or attention
  double state_bytes = 0;  // of those, inside FSDP's gathers and reductions, the norm, clipping, AdamW
};

// Whether an op moves parameter-sized state (FSDP's copies and casts, the gradient norm, clipping,
// the optimizer) rather than activations.
bool state_scope(const std::string& scope) {
  return scope.rfind("fsdp ", 0) == 0 || scope == "optimizer" || scope == "grad norm" || scope == "clip gradients";
}

Bill bill_of(const std::vector<Op>& ops) {
  Bill b;
  for (const Op& op : ops) {
    auto note = [&](const char* what) {
      std::ostringstream line;
      line << what << " " << op.name << ":";
      for (size_t i = 0; i < op.shapes.size(); ++i) line << " " << op.dtypes[i] << at::IntArrayRef(op.shapes[i]);
      b.notes.push_back(line.str());
    };
    for (at::ScalarType t : op.dtypes)
      if (t == at::kDouble) {
        b.float64_ops.insert(op.name);
        note("float64");
        break;
      }
    if (is_product(op.name) && !op.inside_attention) {
      const double f = product_flops(op);
      b.product_flops += f;
      const size_t i = first_operand(op);
      const bool bf16 = op.dtypes.size() >= i + 2 && op.dtypes[i] == at::kBFloat16 && op.dtypes[i + 1] == at::kBFloat16;
      const bool float8 = op.dtypes.size() >= i + 2 && is_float8(op.dtypes[i]) && is_float8(op.dtypes[i + 1]);
      if (bf16)
        b.bf16_product_flops += f;
      else if (float8)
        b.float8_product_flops += f;
      else {
        b.fp32_products[op.name] += f;
        note("non-bf16 product");
      }
    }
    // Kernels: the innermost aten ops that are not views, attention apart (one fused kernel each way
    // on a GPU, counted by itself).
    if (op.user_scope) continue;
    if (is_attention(op.name) && !op.inside_attention) ++b.attention;
    if (op.inside_attention || is_attention(op.name) || is_view(op.name) || !op.leaf) continue;
    // Autograd's nodes and detach launch no kernel of their own; fsdptrain's fused kernels
    // (model/kernels/elementwise.h) record one launch each as "fsdptrain::<op>".
    if (op.name.rfind("aten::", 0) != 0 && op.name.rfind("fsdptrain::", 0) != 0) continue;
    if (op.name.rfind("fsdptrain::swiglu", 0) == 0 &&
        std::find(op.contiguous.begin(), op.contiguous.end(), false) != op.contiguous.end()) {
      note("strided SwiGLU");
      b.strided_swiglu.push_back(op.name);
    }
    ++b.launches;
    ++b.launches_by_op[op.name];
    if (!is_product(op.name)) b.moved_bytes += static_cast<double>(op.bytes);
    if (!is_product(op.name) && state_scope(op.scope)) b.state_bytes += static_cast<double>(op.bytes);
  }
  return b;
}

// One bf16 training step (forward, backward, norm, clipping, AdamW) on meta, recorded; the decoder
// layers' products in float8 when `recipe` asks (model/kernels/float8.h).
std::vector<Op> record_step_of(const DecoderConfig& c, int64_t batch, int64_t seq,
                               Float8Recipe recipe = Float8Recipe::kNone) {
  struct Recipe {  // the process's float8 recipe for this step only
    explicit Recipe(Float8Recipe r) { set_float8_recipe(r); }
    ~Recipe() { set_float8_recipe(Float8Recipe::kNone); }
  } scoped(recipe);
  CausalLM m(c, /*free_after_create=*/true);
  FsdpOptions o;
  o.device = c10::Device(c10::kMeta);
  o.mixed_precision.param_dtype = at::kBFloat16;
  // The values do not matter on meta: no initial weights drawn on the host (2.7 s a model at the 1B widths).
  o.init = [](const std::string&, at::IntArrayRef shape) { return at::empty(shape, at::device(c10::kMeta)); };
  auto sharded = fully_shard(*m, decoder_traits(c), DeviceMesh{dist::make_single_process_group(), std::nullopt}, o);
  optim::ShardedAdamW adamw(*sharded, optim::AdamWOptions{});
  const auto ids = at::TensorOptions().dtype(at::kLong).device(o.device);
  const at::Tensor tokens = at::empty({batch, seq}, ids), targets = at::empty({batch, seq}, ids);
  Recorder recorder;
  const at::Tensor loss =
      sharded->forward({tokens}, [&](const TensorList& in) { return TensorList{m->loss(in[0], targets)}; })[0];
  loss.backward();
  const at::Tensor norm = optim::grad_norm(*sharded);
  adamw.step(at::zeros({1}, norm.options()), optim::clip_divisor(norm, 1.0));  // the trainer's clipping
  return recorder.ops();
}

std::vector<Op> record_step(int64_t layers, int64_t batch, int64_t seq, Float8Recipe recipe = Float8Recipe::kNone) {
  return record_step_of(one_b_widths(layers), batch, seq, recipe);
}

// The 1B widths in a config.json of `model_type` plus `extra`: each new layer kind as the parser
// makes it (Gemma 3: sandwich norms of (1 + w), GELU, per-head q/k norms, a local rotary table, a
// sliding layer; Gemma 2: soft-capped scores and logits; OLMo 2: norms after the blocks and over
// the whole projections; SmolLM3: a layer without rotary; Granite: the multipliers; Qwen3.5 and
// Qwen3-Next: Gated DeltaNet, an output gate, (1 + w) norms, a partial rotation; gpt-oss: sinks,
// biased experts).
DecoderConfig one_b_of(const std::string& model_type, const std::string& extra) {
  return parse_decoder_config(R"({"model_type": ")" + model_type + R"(", "vocab_size": 128256, "hidden_size": 2048,
      "intermediate_size": 8192, "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8,
      "head_dim": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": true)" +
                                (extra.empty() ? std::string() : ", " + extra) + "}",
                            model_type);
}

std::string describe(const Bill& b, int64_t layers) {
  std::ostringstream s;
  s << "step bill (" << layers << " layers): " << b.product_flops / 1e12 << " TFLOP in products, "
    << 100.0 * b.bf16_product_flops / b.product_flops << " % in bf16";
  if (b.float8_product_flops > 0) s << ", " << 100.0 * b.float8_product_flops / b.product_flops << " % in float8";
  s << "; " << b.launches << " launching ops and " << b.attention << " attention calls; " << b.moved_bytes / 1e9
    << " GB read by elementwise ops and copies\n  launching ops:";
  for (const auto& [name, n] : b.launches_by_op) s << " " << name << " " << n << ";";
  for (const auto& [name, f] : b.fp32_products) s << "\n  non-bf16 product: " << name << " " << f / 1e9 << " GFLOP";
  for (const std::string& name : b.float64_ops) s << "\n  float64 in: " << name;
  for (const std::string& what : b.notes) s << "\n  " << what;
  return s.str();
}

}  // namespace

TEST_CASE("the bill of a bf16 step at the 1B widths: bf16 products, no float64, bounded launches and bytes") {
  const int64_t batch = 2, seq = 2048;
  const Bill two = bill_of(record_step(2, batch, seq));
  const Bill three = bill_of(record_step(3, batch, seq));
  MESSAGE(describe(two, 2));
  MESSAGE(describe(three, 3));
  // Every matrix product's FLOPs in bf16, the loss head's included.
  CHECK_MESSAGE(two.fp32_products.empty(), describe(two, 2));
  CHECK(two.bf16_product_flops == two.product_flops);
  // No float64 anywhere in the step.
  CHECK_MESSAGE(two.float64_ops.empty(), describe(two, 2));
  // A decoder layer's share: the difference between three layers and two.
  const int64_t per_layer = three.launches - two.launches;
  std::ostringstream ops;
  for (const auto& [name, n] : three.launches_by_op) {
    const auto it = two.launches_by_op.find(name);
    const int64_t d = n - (it == two.launches_by_op.end() ? 0 : it->second);
    if (d != 0) ops << " " << name << " " << d << ";";
  }
  // Activations: one (batch, seq, hidden) bf16 tensor. State: a layer's parameters in fp32.
  const double activation = 2.0 * batch * seq * 2048;
  const double layer_params = 4.0 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048);
  const double activation_bytes = (three.moved_bytes - three.state_bytes) - (two.moved_bytes - two.state_bytes);
  const double state_bytes = three.state_bytes - two.state_bytes;
  MESSAGE("per decoder layer: " << per_layer << " launching ops (attention apart);" << ops.str() << "\n  "
                                << activation_bytes / activation << " activations' bytes read by elementwise ops "
                                << "and copies in the forward and backward; " << state_bytes / layer_params
                                << " times its fp32 parameters' bytes by FSDP's casts and copies, the norm, "
                                << "clipping and AdamW");
  // SwiGLU reads and writes contiguous blocks: ATen's GPU loops vectorize only those (the halves of
  // one (N, 2F) product took 4.5 ms of the 1B step on an H200).
  CHECK_MESSAGE(three.strided_swiglu.empty(), describe(three, 3));
  // Bounds: what this code has (92 ops, 135 and 9.5; before the fused rotary and SwiGLU kernels 124
  // and 170, before clipping moved into AdamW's kernel 10.5; the gate and up products are two since
  // SwiGLU reads them as contiguous blocks), with a little room; the ops are named in the message
  // above. On meta RMSNorm and _foreach_norm take their composite paths (mean, rsqrt, mul; one norm a tensor), which a
  // GPU runs as one kernel each: the counts are a GPU's plus those; SDPA takes its math path, whose ops (and their
  // backward nodes, by autograd's sequence numbers) count as attention, apart.
  CHECK(per_layer <= 95);
  CHECK(activation_bytes <= 142 * activation);
  CHECK(state_bytes <= 10 * layer_params);  // AdamW alone reads 4 (parameter, gradient, two moments)
}

TEST_CASE("each new layer kind's bf16 step at the 1B widths: bf16 products, no float64") {
  const std::string sliding = R"("sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"])";
  const std::pair<const char*, std::string> kinds[] = {
      {"gemma3_text", sliding},
      {"gemma2", sliding},
      {"olmo2", ""},
      {"olmo3", sliding},
      {"smollm3", R"("no_rope_layers": [1, 0])"},
      {"granite", R"("embedding_multiplier": 12.0, "attention_multiplier": 0.015625, "residual_multiplier": 0.22,
                     "logits_scaling": 8.0)"},
      // The hybrids: a Gated DeltaNet layer (every product of the chunked rule) and a gated full-attention one.
      {"qwen3_5_text", R"("layer_types": ["linear_attention", "full_attention"])"},
      {"qwen3_next", R"("layer_types": ["linear_attention", "full_attention"], "num_experts": 0)"},
      // gpt-oss: sinks (the scores whole), a window, biased experts over grouped products.
      {"gpt_oss", R"("num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 128)"}};
  for (const auto& [type, extra] : kinds) {
    CAPTURE(type);
    const Bill b = bill_of(record_step_of(one_b_of(type, extra), 1, 1024));
    MESSAGE(type << ": " << describe(b, 2));
    CHECK_MESSAGE(b.fp32_products.empty(), describe(b, 2));
    CHECK(b.bf16_product_flops == b.product_flops);
    CHECK_MESSAGE(b.float64_ops.empty(), describe(b, 2));
  }
}

TEST_CASE("a mixture of experts' bf16 step: every expert product one grouped bf16 product, routing without host syncs") {
  // Qwen3-30B-A3B's expert widths (128 experts of 768, 8 a token) at the 1B's hidden size, 2 layers of
  // 1 x 2048 tokens. On meta a host sync cannot happen (a meta tensor has no value to read): the step
  // running at all says routing never waits for the host.
  const int64_t layers = 2, tokens = 2048, experts_per_token = 8, hidden = 2048, expert = 768;
  const DecoderConfig c = one_b_of("qwen3_moe", R"("num_experts": 128, "num_experts_per_tok": 8,
                                                  "moe_intermediate_size": 768)");
  const std::vector<Op> ops = record_step_of(c, 1, tokens);
  const Bill b = bill_of(ops);
  MESSAGE("qwen3_moe: " << describe(b, layers));
  CHECK_MESSAGE(b.fp32_products.empty(), describe(b, layers));
  CHECK(b.bf16_product_flops == b.product_flops);
  CHECK_MESSAGE(b.float64_ops.empty(), describe(b, layers));
  double grouped = 0;
  int64_t grouped_calls = 0, host_reads = 0;
  for (const Op& op : ops) {
    if (op.name == "aten::_grouped_mm") {
      grouped += product_flops(op);
      ++grouped_calls;
    }
    if (op.name == "aten::_local_scalar_dense" || op.name == "aten::item") ++host_reads;
  }
  // Per layer: gate, up and down forward, and each one's two gradients (input and weights).
  CHECK(grouped_calls == 9 * layers);
  const double forward = 2.0 * tokens * experts_per_token * (hidden * 2 * expert + expert * hidden);
  CHECK(grouped == 3 * forward * layers);
  CHECK(host_reads == 0);
  CHECK_MESSAGE(b.strided_swiglu.empty(), describe(b, layers));  // gate and up apart: contiguous blocks
}

TEST_CASE("GLM-4.5's bf16 step: the routers' products in fp32, as transformers computes them; every other in bf16") {
  // Its router scores in fp32 (Glm4MoeTopkRouter casts the input and weight): forward and both gradients, N x C x E
  // each; the experts, shared experts and attention in bf16. 64 experts in 4 groups, every layer sparse.
  const int64_t layers = 2, tokens = 1024, hidden = 2048, experts = 64;
  const DecoderConfig c = one_b_of("glm4_moe", R"("n_routed_experts": 64, "num_experts_per_tok": 4,
      "moe_intermediate_size": 512, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 0)");
  const Bill b = bill_of(record_step_of(c, 1, tokens));
  MESSAGE("glm4_moe: " << describe(b, layers));
  double fp32 = 0;
  for (const auto& [name, flops] : b.fp32_products) fp32 += flops;
  CHECK(fp32 == 3 * 2.0 * tokens * hidden * experts * layers);
  CHECK(b.bf16_product_flops + fp32 == b.product_flops);
  CHECK_MESSAGE(b.float64_ops.empty(), describe(b, layers));
}

TEST_CASE("DeepSeek-V2's bf16 step rotates in fp32 from fp32 angles, as transformers' complex angles; V3's in bf16") {
  // transformers' DeepseekV2 multiplies complex fp32 angles (no cast to the compute dtype touches them), DeepseekV3
  // rotates with cos and sin in the activations' dtype. Latent attention at DeepSeek-V2-Lite's widths (16 heads, a
  // 512-wide latent, 64 rotated dimensions), 16 experts; the products in bf16 but the routers'.
  const int64_t layers = 2, tokens = 1024, hidden = 2048, experts = 16;
  for (const auto& [type, rotation] : {std::pair{"deepseek_v2", at::kFloat}, std::pair{"deepseek_v3", at::kBFloat16}}) {
    CAPTURE(type);
    const DecoderConfig c = parse_decoder_config(R"({"model_type": ")" + std::string(type) +
                                                     R"(", "vocab_size": 128256, "hidden_size": 2048,
        "intermediate_size": 8192, "num_hidden_layers": 2, "num_attention_heads": 16, "q_lora_rank": null,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "n_routed_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 1024, "n_shared_experts": 1,
        "first_k_dense_replace": 0, "n_group": 1, "topk_group": 1})",
                                                 type);
    const std::vector<Op> ops = record_step_of(c, 1, tokens);
    int64_t rotations = 0;
    for (const Op& op : ops) {
      if (op.name != "fsdptrain::rotary") continue;
      ++rotations;
      for (at::ScalarType t : op.dtypes) {
        const bool expected = t == rotation;
        CHECK_MESSAGE(expected, op.name << " runs in " << c10::toString(t));
      }
    }
    CHECK(rotations > 0);  // the forward's, the recomputed forward's and the backward's
    const Bill b = bill_of(ops);
    MESSAGE(type << ": " << describe(b, layers));
    double fp32 = 0;
    for (const auto& [name, flops] : b.fp32_products) fp32 += flops;
    CHECK(fp32 == 3 * 2.0 * tokens * hidden * experts * layers);  // the routers' alone
    CHECK_MESSAGE(b.float64_ops.empty(), describe(b, layers));
  }
}

TEST_CASE("the loss head's bill at the 1B shape: bf16 products, no (V, C) accumulator, bounded passes per logit") {
  // 4096 tokens of width 2048 against the 128,256-row head on meta (the GPU's kernel: vocabulary
  // chunks). The token-chunked kernel read and wrote an fp32 (V, C) sum in every one of its 16
  // chunks (15.5 ms of the H100's 135 ms step on 2026-11-26) and made 38 bytes of elementwise
  // reads per logit; this one makes the logits twice and reads each about 17 bytes' worth (the
  // log-sum-exp's max, shifted exp and sum; the gradient's shifted exp; the head's gradient scaled).
  const int64_t n = 4096, width = 2048, vocab = 128256;
  const auto bf16 = at::TensorOptions().device(c10::kMeta).dtype(at::kBFloat16);
  const at::Tensor h = at::empty({n, width}, bf16).requires_grad_(),
                   w = at::empty({vocab, width}, bf16).requires_grad_();
  const at::Tensor y = at::empty({n}, bf16.dtype(at::kLong));
  std::vector<Op> ops;
  {
    Recorder recorder;
    (chunked_linear_cross_entropy_sum(h, w, y) / 4096.0).backward();
    ops = recorder.ops();
  }
  const Bill b = bill_of(ops);
  const double logits = static_cast<double>(n) * vocab, product = 2.0 * n * width * vocab;
  double accumulator = 0;  // the largest sum a product (addmm) adds into: dh's (N, C), never the head's (V, C)
  for (const Op& op : ops)
    if (op.name == "aten::addmm" && !op.shapes.empty()) {
      double elements = 1;
      for (int64_t d : op.shapes[0]) elements *= static_cast<double>(d);
      accumulator = std::max(accumulator, elements);
    }
  MESSAGE(describe(b, 0) << "\n  loss head: " << b.product_flops / product << " products of (N, C, V); "
                         << b.moved_bytes / logits << " bytes read by elementwise ops per logit; largest "
                         << "accumulator " << accumulator << " elements");
  CHECK(b.fp32_products.empty());
  CHECK(b.float64_ops.empty());
  CHECK(b.product_flops <= 4.01 * product);                     // the logits twice, dh and dW once
  CHECK(accumulator < static_cast<double>(vocab) * width / 4);  // a chunk's logits or dh's sum, not (V, C)
  CHECK(b.moved_bytes <= 20 * logits);
}

TEST_CASE("the bill of a float8 step at the 1B widths: every decoder product in float8, the head in bf16") {
  // engine.float8 (model/kernels/float8.h) on meta: each decoder layer's seven projections make three float8
  // products each (output, input's and weight's gradients): 6 N x (the layer's linear parameters)
  // FLOPs; the loss head keeps its bf16 products; no float64; the casts' launches stay bounded.
  const int64_t batch = 2, seq = 2048, tokens = batch * seq;
  const double layer_linear = 2.0 * 2048 * 2048 + 2.0 * 2048 * 512 + 3.0 * 2048 * 8192;
  for (Float8Recipe recipe : {Float8Recipe::kTensorwise, Float8Recipe::kRowwise}) {
    const std::string name = kFloat8RecipeNames[static_cast<size_t>(recipe)];
    CAPTURE(name);
    const Bill bf16 = bill_of(record_step(2, batch, seq));
    const Bill two = bill_of(record_step(2, batch, seq, recipe));
    const Bill three = bill_of(record_step(3, batch, seq, recipe));
    MESSAGE(describe(two, 2));
    const int64_t per_layer = three.launches - two.launches;
    MESSAGE("per decoder layer in float8 (" << name << "): " << per_layer << " launching ops");
    CHECK_MESSAGE(two.fp32_products.empty(), describe(two, 2));
    CHECK(two.float64_ops.empty());
    CHECK(two.float8_product_flops == doctest::Approx(2 * 6.0 * tokens * layer_linear));
    CHECK(three.float8_product_flops - two.float8_product_flops == doctest::Approx(6.0 * tokens * layer_linear));
    // What stays bf16 is what the bf16 step has beyond the decoder layers' products: the loss head.
    CHECK(two.bf16_product_flops == doctest::Approx(bf16.bf16_product_flops - 2 * 6.0 * tokens * layer_linear));
    // The casts: an amax reduction, a scale and a cast per operand (rowwise casts each gradient and
    // weight twice, along rows and columns), the input once for q, k and v and once for gate and up.
    // What this code has (133 and 187 against bf16's 92; 163 and 205 with a cast of x a projection
    // and transposing copies), with a little room.
    CHECK(per_layer <= (recipe == Float8Recipe::kRowwise ? 195 : 140));
  }
}

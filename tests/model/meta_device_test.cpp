// The GPU path's device discipline, checked on the CPU: every family's decoder (and the FSDP engine's
// test models) trained on the `meta` device through fully_shard. Meta takes the branches any
// non-CPU device takes (CUDA's kernels, not the CPU's), refuses an op that meets a host tensor, and
// fails any read back to the host (.item(), a copy to the CPU). A watch over every dispatched op
// also names an op that *reads* a host tensor (a copy of a host buffer to the device inside the
// step, which on a GPU is a blocking copy in every forward): the first GPU run found a host causal
// mask and a host rotary buffer copied in every forward exactly so.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "fsdp/set_data.h"
#include "fsdp/test_models.h"
#include "host_tensor_watch.h"
#include "model/layers/decoder.h"
#include "model/lora/lora.h"
#include "optim/adamw.h"
#include "tiny_config.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp;
using namespace fsdp::model;
using fsdp::model::testing::HostTensorWatch;
using fsdp::model::testing::joined;

namespace {

using fsdp::model::testing::tiny;
using fsdp::model::testing::tiny_new_kinds;

const c10::Device kMeta(c10::kMeta);

// Shape functions for the ops of a step that LibTorch registers for meta only from Python
// (torch/_meta_registrations.py): the output's shape and dtype, and the same-device rule a GPU
// kernel enforces.
at::Tensor index_select_meta(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  TORCH_CHECK(index.device() == self.device(), "index_select: index on ", index.device(), ", self on ", self.device());
  std::vector<int64_t> sizes = self.sizes().vec();
  sizes.at(static_cast<size_t>(at::maybe_wrap_dim(dim, self.dim()))) = index.numel();
  return at::empty(sizes, self.options());
}

void same_device(const char* op, std::initializer_list<const at::Tensor*> ts) {
  for (const at::Tensor* t : ts)
    TORCH_CHECK(t->device() == (*ts.begin())->device(), op, ": tensors on ", (*ts.begin())->device(), " and ",
                t->device());
}

at::Tensor where_meta(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other) {
  same_device("where", {&self, &cond, &other});
  const std::vector<int64_t> sizes = at::infer_size(at::infer_size(cond.sizes(), self.sizes()), other.sizes());
  return at::empty(sizes, self.options().dtype(at::result_type(self, other)));
}

at::Tensor& where_out_meta(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  const at::Tensor r = where_meta(cond, self, other);
  out.resize_(r.sizes());
  return out;
}

at::Tensor& unary_out_meta(const at::Tensor& self, at::Tensor& out) {
  out.resize_(self.sizes());
  return out;
}

at::Tensor embedding_dense_backward_meta(const at::Tensor& grad, const at::Tensor& indices, c10::SymInt num_weights,
                                         c10::SymInt, bool) {
  same_device("embedding_dense_backward", {&grad, &indices});
  return at::empty({num_weights.expect_int(), grad.size(-1)}, grad.options());
}

// The loss head's weight gradient on a GPU: bf16 operands accumulated into an fp32 sum in place.
at::Tensor& addmm_dtype_out_meta(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                                 at::ScalarType out_dtype, const at::Scalar&, const at::Scalar&, at::Tensor& out) {
  same_device("addmm.dtype_out", {&out, &self, &mat1, &mat2});
  TORCH_CHECK(mat1.scalar_type() == mat2.scalar_type() && out.scalar_type() == out_dtype &&
                  (self.scalar_type() == out_dtype || self.scalar_type() == mat1.scalar_type()),
              "addmm.dtype_out: dtypes ", self.scalar_type(), ", ", mat1.scalar_type(), ", ", mat2.scalar_type(),
              " into ", out_dtype);
  TORCH_CHECK(mat1.dim() == 2 && mat2.dim() == 2 && mat1.size(1) == mat2.size(0), "addmm.dtype_out: shapes ",
              mat1.sizes(), " and ", mat2.sizes());
  out.resize_({mat1.size(0), mat2.size(1)});
  return out;
}

// Updates in place: nothing to compute on meta, but every list must live on the parameters' device.
void fused_adamw_meta(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                      at::TensorList, at::TensorList steps, double, double, double, double, double, bool, bool,
                      const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {
  for (at::TensorList list : {grads, exp_avgs, exp_avg_sqs, steps})
    for (size_t i = 0; i < list.size(); ++i) same_device("_fused_adamw_", {&params[0], &list[i]});
  if (grad_scale) same_device("_fused_adamw_", {&params[0], &*grad_scale});
  if (found_inf) same_device("_fused_adamw_", {&params[0], &*found_inf});
}

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("_fused_adamw_", fused_adamw_meta);
  m.impl("addmm.dtype_out", addmm_dtype_out_meta);
  m.impl("embedding_dense_backward", embedding_dense_backward_meta);
  m.impl("abs.out", unary_out_meta);
  m.impl("where.self_out", where_out_meta);
  m.impl("index_select", index_select_meta);
  m.impl("where.self", where_meta);
}

DecoderConfig family_config(Family family) {
  DecoderConfig c = tiny();
  c.family = family;
  c.head_dim = 8;  // SDPA's and flash attention's smallest head width
  c.qkv_bias = family == Family::kQwen2;
  c.qk_norm = family == Family::kQwen3;
  if (family != Family::kLlama) {
    c.sliding_window = 3;
    c.sliding_layers = {family == Family::kMistral, true};
  }
  return c;
}

struct Case {
  bool lora = false;
  bool packed = false;
  bool checkpointing = false;
  at::ScalarType dtype = at::kFloat;
};

// One training step on meta (forward, backward, the norm, clipping, AdamW) with the watch armed from
// building the inputs to the optimizer's update.
void train_on_meta(const DecoderConfig& c, const Case& k) {
  CAPTURE(static_cast<int>(c.family));
  CAPTURE(k.lora);
  CAPTURE(k.packed);
  CAPTURE(k.checkpointing);
  CAPTURE(k.dtype);
  CausalLM m(c, /*free_after_create=*/true);
  if (k.lora) {
    LoraSettings l;
    l.r = 2;
    l.target_modules = {"all-linear"};  // Phi-3: its fused qkv_proj and gate_up_proj among them
    add_lora(*m, l, /*free_after_create=*/true);
  }
  FsdpOptions o;
  o.device = kMeta;
  o.activation_checkpointing = k.checkpointing;
  o.mixed_precision.param_dtype = k.dtype;
  o.init = [&](const std::string& name, at::IntArrayRef shape) { return init_parameter(c, 3, name, shape); };
  auto sharded = fully_shard(*m, decoder_traits(c), DeviceMesh{dist::make_single_process_group(), std::nullopt}, o);
  optim::ShardedAdamW adamw(*sharded, optim::AdamWOptions{});

  const int64_t B = 2, T = 6;
  Packed packed;
  if (k.packed) {  // two records a row (positions restart at 0), made on the host as the loader does
    const at::Tensor pos = at::tensor({0, 1, 2, 0, 1, 2}, at::kLong).repeat({B, 1});
    const at::Tensor seg = at::tensor({0, 0, 0, 1, 1, 1}, at::kLong).repeat({B, 1});
    packed = with_lengths(Packed{pos, seg}).to(kMeta);  // the trainer's copy, before the step
  }
  HostTensorWatch watch;
  const auto on_meta = at::TensorOptions().dtype(at::kLong).device(kMeta);
  const at::Tensor tokens = at::empty({B, T}, on_meta), targets = at::empty({B, T}, on_meta);
  const at::Tensor loss =
      sharded->forward({tokens}, [&](const TensorList& in) { return TensorList{m->loss(in[0], targets, packed)}; })[0];
  CHECK(loss.device() == kMeta);
  loss.backward();
  const at::Tensor norm = optim::grad_norm(*sharded);
  adamw.step(at::zeros({1}, norm.options()), optim::clip_divisor(norm, 1.0));  // the trainer's clipping
  const std::set<std::string> host_ops = HostTensorWatch::take();
  CHECK_MESSAGE(host_ops.empty(), "ops that read a host tensor inside the step: ", joined(host_ops));
  CHECK(norm.device() == kMeta);
  for (const auto& g : sharded->groups())
    if (g->trainable_numel() > 0) CHECK(g->flat_grad().device() == kMeta);
}

}  // namespace

TEST_CASE("every family trains on the meta device with no host tensor inside the step") {
  std::vector<DecoderConfig> configs;
  for (const Family family : {Family::kLlama, Family::kMistral, Family::kQwen2, Family::kQwen3})
    configs.push_back(family_config(family));
  for (auto [name, c] : tiny_new_kinds()) {  // each new layer kind
    c.head_dim = 8;                          // SDPA's and flash attention's smallest head width
    configs.push_back(c);
  }
  for (const DecoderConfig& c : configs) {
    train_on_meta(c, Case{});
    train_on_meta(c, Case{/*lora=*/true, /*packed=*/false, /*checkpointing=*/true, at::kBFloat16});
    train_on_meta(c, Case{/*lora=*/false, /*packed=*/true, /*checkpointing=*/false, at::kFloat});
  }
}

// Packed rows in bf16 take variable-length flash attention on a GPU; LibTorch registers that kernel
// for CUDA only (no meta function), so on meta the same rows in bf16 would fail inside ATen, not in
// our code. The fp32 packed case above runs the masked path that holds the same positions and
// segments on the device.
TEST_CASE("the decoder's CUDA branches are the ones meta takes") {
  const DecoderConfig c = family_config(Family::kQwen3);
  CausalLM m(c);
  init_parameters(*m, 4);
  torch::NoGradGuard no_grad;
  // Module::to, as generate does on a GPU; LibTorch's set_data refuses CPU to meta, so by hand.
  for (at::Tensor& t : m->parameters()) set_data_any_device(t, t.to(kMeta));
  for (at::Tensor& t : m->buffers()) set_data_any_device(t, t.to(kMeta));
  CHECK(m->named_buffers()["inv_freq"].device() == kMeta);  // the rotary buffer moves with the model
  HostTensorWatch watch;
  const at::Tensor logits = m->forward(at::empty({1, 5}, at::TensorOptions().dtype(at::kLong).device(kMeta)));
  CHECK(logits.sizes() == at::IntArrayRef{1, 5, c.vocab_size});
  CHECK_MESSAGE(HostTensorWatch::take().empty(), "a forward read a host tensor");
}

TEST_CASE("the FSDP engine's test models train on the meta device") {
  using namespace fsdp::testing;
  for (const bool checkpointing : {false, true}) {
    CAPTURE(checkpointing);
    TinyTransformer m;
    FsdpOptions o;
    o.device = kMeta;
    o.activation_checkpointing = checkpointing;
    auto sharded =
        fully_shard(*m, TinyTransformerImpl::traits(), DeviceMesh{dist::make_single_process_group(), std::nullopt}, o);
    HostTensorWatch watch;
    const at::Tensor tokens =
        at::empty({2, TinyTransformerImpl::kSeq}, at::TensorOptions().dtype(at::kLong).device(kMeta));
    const at::Tensor logits =
        sharded->forward({tokens}, [&](const TensorList& in) { return TensorList{m->forward(in[0])}; })[0];
    logits.pow(2).mean().backward();
    CHECK_MESSAGE(HostTensorWatch::take().empty(), "the test transformer read a host tensor inside its step");
  }
  MlpStack stack;
  FsdpOptions o;
  o.device = kMeta;
  auto sharded =
      fully_shard(*stack, MlpStackImpl::traits(), DeviceMesh{dist::make_single_process_group(), std::nullopt}, o);
  HostTensorWatch watch;
  const at::Tensor x = at::empty({3, MlpStackImpl::kIn}, at::TensorOptions().device(kMeta));
  sharded->forward({x}, [&](const TensorList& in) { return TensorList{stack->forward(in[0])}; })[0].sum().backward();
  CHECK(HostTensorWatch::take().empty());
}

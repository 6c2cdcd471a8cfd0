// Packed records on a GPU (label gpu; exit 77, skipped, without one): variable-length flash
// attention over the records gives the loss and gradients that SDPA with the block-diagonal mask
// gives (the path tested against transformers on CPU), with and without a sliding window, in bf16.
// Also the fused elementwise kernels (model/kernels/elementwise.h: nvcc's build of the functors the
// CPU tests check) against ATen's ops on the GPU, and context parallel's blocks on one rank: CUDA's flash kernel per
// block (bf16), merged by log-sum-exp, against the op-by-op sums (model/parallel/context_parallel.h), forward and
// backward; capped and sunk scores, windows and packed records as blocks on one device against the float64 sums.
#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <iostream>
#include <sstream>

#include "dist/process_group.h"
#include "model/kernels/elementwise.h"
#include "model/kernels/ops.h"
#include "model/kernels/provider.h"
#include "model/layers/decoder.h"
#include "model/parallel/context_parallel.h"

using fsdp::model::DecoderConfig;
using fsdp::model::CausalLM;
using fsdp::model::Packed;

namespace {

DecoderConfig config(int64_t window) {
  DecoderConfig c;
  c.vocab_size = 97;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.initializer_range = 0.1;
  c.sliding_window = window;
  c.sliding_layers = {false, window > 0};
  return c;
}

struct Result {
  double loss = 0;
  std::vector<at::Tensor> grads;
};

Result run(CausalLM& m, const at::Tensor& x, const at::Tensor& y, const Packed& p) {
  m->zero_grad();
  const at::Tensor loss = m->loss_sum(x, y, p);
  loss.backward();
  Result r{loss.item<double>(), {}};
  for (const auto& q : m->parameters()) r.grads.push_back(q.grad().to(at::kFloat).clone());
  return r;
}

// Rows of 64 tokens holding records of 5..40 tokens; the last target of each record not counted.
bool check(int64_t window) {
  const DecoderConfig c = config(window);
  CausalLM m(c);
  fsdp::model::init_parameters(*m, 3);
  m->to(at::kCUDA, at::kBFloat16);
  const int64_t B = 3, T = 64;
  std::vector<int64_t> positions, segments, targets;
  at::Tensor tokens = at::randint(0, c.vocab_size, {B, T}, at::TensorOptions().dtype(at::kLong));
  const int64_t lengths[] = {5, 40, 19, 23, 7, 11, 30, 9, 17, 8};
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t pos = 0, seg = 0, len = lengths[next++ % 10];
    for (int64_t t = 0; t < T; ++t) {
      if (pos == len) {
        pos = 0;
        ++seg;
        len = lengths[next++ % 10];
      }
      positions.push_back(pos++);
      segments.push_back(seg);
    }
  }
  const at::Tensor tok = tokens.reshape({-1});
  for (int64_t i = 0; i < B * T; ++i)
    targets.push_back(i + 1 < B * T && positions[i + 1] != 0 ? tok[i + 1].item<int64_t>() : -100);
  auto rows = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).view({B, T}); };
  const Packed masked{rows(positions), rows(segments)};
  const Packed varlen = fsdp::model::with_lengths(masked);
  const at::Tensor x = tokens.to(at::kCUDA), y = rows(targets).to(at::kCUDA);
  const Result a = run(m, x, y, masked), b = run(m, x, y, varlen);
  double worst = 0;
  for (size_t i = 0; i < a.grads.size(); ++i)
    worst = std::max(worst, ((a.grads[i] - b.grads[i]).norm() / a.grads[i].norm().clamp_min(1e-12)).item<double>());
  const double rel_loss = std::abs(a.loss - b.loss) / std::abs(a.loss);
  std::cout << "window " << window << ": loss " << a.loss << " (masked SDPA) vs " << b.loss
            << " (varlen flash), relative " << rel_loss << "; gradients " << worst << " (worst parameter)\n";
  return rel_loss < 1e-2 && worst < 5e-2;
}

// Context parallel's blockwise attention through CUDA's flash kernel (bf16) against its reference
// sums, both strategies.
bool check_context_blocks() {
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor q = at::randn({2, 8, 256, 64}, opts), k = at::randn({2, 2, 256, 64}, opts);
  const at::Tensor v = at::randn({2, 2, 256, 64}, opts), g = at::randn({2, 8, 256, 64}, opts);
  bool ok = true;
  for (auto how : {fsdp::model::SequenceSplit::kAllGather, fsdp::model::SequenceSplit::kRing}) {
    std::vector<at::Tensor> results[2];
    for (bool reference : {false, true}) {
      fsdp::model::ContextParallel cp(fsdp::dist::make_single_process_group(), how);
      fsdp::model::kernels::set_kernel_choice(
          {reference ? fsdp::model::kernels::Provider::kReference : fsdp::model::kernels::Provider::kAuto,
           fsdp::model::kernels::OnednnProducts::kLarge});
      at::Tensor qq = q.clone().requires_grad_(), kk = k.clone().requires_grad_(), vv = v.clone().requires_grad_();
      const at::Tensor out = fsdp::model::context_attention(qq, kk, vv, cp);
      out.backward(g);
      results[reference] = {out.to(at::kFloat), qq.grad().to(at::kFloat), kk.grad().to(at::kFloat),
                            vv.grad().to(at::kFloat)};
    }
    fsdp::model::kernels::set_kernel_choice({});  // engine.kernels: auto again
    double worst = 0;
    std::ostringstream each;
    const char* names[] = {"out", "dq", "dk", "dv"};
    for (size_t i = 0; i < 4; ++i) {
      const double rel = ((results[0][i] - results[1][i]).norm() / results[1][i].norm()).item<double>();
      worst = std::max(worst, rel);
      each << " " << names[i] << " " << rel;
    }
    std::cout << "context parallel blocks (" << fsdp::model::sequence_split_name(how)
              << "), flash against reference sums, bf16: worst relative " << worst << " (" << each.str() << " )\n";
    ok &= worst < 2e-2;
  }
  return ok;
}

// Capped and sunk scores, windows and packed records as blocks on one device (blockwise_attention,
// bf16: flash blocks and float32-result tile products) against the eager sums in float64, forward
// and backward.
bool check_scored_blocks() {
  namespace kernels = fsdp::model::kernels;
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const int64_t B = 2, H = 8, K = 2, T = 701, D = 64;
  const at::Tensor q = at::randn({B, H, T, D}, opts), k = at::randn({B, K, T, D}, opts);
  const at::Tensor v = at::randn({B, K, T, D}, opts), g = at::randn({B, H, T, D}, opts);
  const at::Tensor sinks = at::randn({H}, opts.dtype(at::kFloat));
  const at::Tensor segments = (at::rand({B, T}, opts.dtype(at::kFloat)) < 0.01).cumsum(1);
  struct Case {
    const char* what;
    fsdp::model::ScoreRule rule;
    bool sinks, packed;
  };
  const Case cases[] = {{"sinks", {}, true, false},
                        {"sinks, a window of 128", {std::nullopt, 0, 128}, true, false},
                        {"a cap and a scale", {0.1, 5.0, 0}, false, false},
                        {"a cap, a window of 300", {0.1, 5.0, 300}, false, false},
                        {"sinks, packed records", {}, true, true}};
  bool ok = true;
  for (const Case& c : cases) {
    const at::Tensor i = at::arange(T, opts.dtype(at::kLong)).unsqueeze(1), j = at::arange(T, opts.dtype(at::kLong));
    at::Tensor mask = j <= i;
    if (c.rule.window > 0) mask = mask & (j > i - c.rule.window);
    if (c.packed) mask = (mask & (segments.unsqueeze(2) == segments.unsqueeze(1))).unsqueeze(1);
    const double scale = c.rule.scale.value_or(1.0 / 8.0);
    std::vector<at::Tensor> results[2];
    for (bool exact : {false, true}) {
      const auto dtype = exact ? at::kDouble : at::kBFloat16;
      // Copies: each pass's leaves its own (a cast to the same dtype would hand back the shared tensor).
      at::Tensor qq = q.to(dtype).clone().requires_grad_(), kk = k.to(dtype).clone().requires_grad_();
      at::Tensor vv = v.to(dtype).clone().requires_grad_();
      at::Tensor ss = sinks.to(exact ? at::kDouble : at::kFloat).clone().requires_grad_();
      at::Tensor out;
      if (exact) {
        const at::Tensor ke = kk.repeat_interleave(H / K, 1), ve = vv.repeat_interleave(H / K, 1);
        out = c.sinks ? kernels::apply_sink_attention(qq, ke, ve, mask, scale, ss)
                      : kernels::apply_softcapped_attention(qq, ke, ve, mask, scale, c.rule.softcap);
      } else {
        out = fsdp::model::blockwise_attention(qq, kk, vv, c.rule, c.sinks ? ss : at::Tensor(),
                                               c.packed ? segments : at::Tensor());
      }
      out.backward(g.to(dtype));
      results[exact] = {out.to(at::kFloat), qq.grad().to(at::kFloat), kk.grad().to(at::kFloat),
                        vv.grad().to(at::kFloat)};
      if (c.sinks) results[exact].push_back(ss.grad().to(at::kFloat));
    }
    double worst = 0;
    for (size_t n = 0; n < results[0].size(); ++n)
      worst = std::max(worst, ((results[0][n] - results[1][n]).norm() / results[1][n].norm()).item<double>());
    std::cout << "blockwise attention, " << c.what << ", bf16 against float64 sums: worst relative " << worst << "\n";
    ok &= worst < 2e-2;
  }
  return ok;
}

// The fused rotary and SwiGLU kernels on the GPU against ATen's ops there, forward and backward,
// fp32 and bf16, in the decoder's layouts (q a transposed view, gate and up halves of one block).
bool check_fused_kernels() {
  namespace kernels = fsdp::model::kernels;
  if (!kernels::available_on(c10::Device(at::kCUDA))) {
    std::cout << "fused kernels: not built (no nvcc), skipped\n";
    return true;
  }
  bool ok = true;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    const at::Tensor base = at::randn({2, 64, 8, 64}, opts), half = at::rand({64, 32}, opts.dtype(at::kFloat)) * 6;
    const at::Tensor emb = at::cat({half, half}, -1), cos = emb.cos().to(dtype), sin = emb.sin().to(dtype);
    const at::Tensor x = base.transpose(1, 2).detach().requires_grad_(),
                     xr = base.transpose(1, 2).detach().requires_grad_();
    const at::Tensor out = kernels::rotary(x, cos, sin);
    const auto h = xr.chunk(2, -1);
    const at::Tensor ref = xr * cos + at::cat({-h[1], h[0]}, -1) * sin;
    const at::Tensor g = at::randn(out.sizes(), opts);
    out.backward(g);
    ref.backward(g);
    const at::Tensor gu = at::randn({2, 64, 256}, opts).mul_(3).detach().requires_grad_();
    const at::Tensor gur = gu.detach().clone().requires_grad_();
    const at::Tensor s = kernels::swiglu(gu);
    const auto parts = gur.chunk(2, -1);
    const at::Tensor sr = at::silu(parts[0]) * parts[1];
    const at::Tensor gs = at::randn(s.sizes(), opts);
    s.backward(gs);
    sr.backward(gs);
    auto rel = [](const at::Tensor& a, const at::Tensor& b) {
      return ((a.to(at::kFloat) - b.to(at::kFloat)).norm() / b.to(at::kFloat).norm()).item<double>();
    };
    // The loss's softmax numerators: fp32 logits in, the dtype out.
    const at::Tensor logits = at::randn({512, 300}, opts.dtype(at::kFloat)) * 4,
                     shift = at::randn({300}, logits.options());
    at::Tensor e = at::empty({512, 300}, opts);
    kernels::exp_shifted_out(e, logits, shift);
    const double ex = rel(e, (logits - shift).exp());
    const double worst =
        std::max({rel(out, ref), rel(x.grad(), xr.grad()), rel(s, sr), rel(gu.grad(), gur.grad()), ex});
    const double bound = dtype == at::kFloat ? 1e-6 : 8e-3;
    std::cout << "fused kernels (" << dtype << ") against ATen's ops on the GPU: rotary " << rel(out, ref) << " (grad "
              << rel(x.grad(), xr.grad()) << "), swiglu " << rel(s, sr) << " (grad " << rel(gu.grad(), gur.grad())
              << "), exp_shifted " << ex << "; bound " << bound << "\n";
    ok &= worst < bound;
  }
  return ok;
}

}  // namespace

int main() {
  if (!at::hasCUDA()) {
    std::cout << "skipped: no CUDA device\n";
    return 77;
  }
  // Every check runs and says what it found, whichever fails.
  const bool fused = check_fused_kernels();
  const bool varlen = check(0) & check(8);
  const bool blocks = check_context_blocks();
  const bool scored = check_scored_blocks();
  if (!fused) std::cout << "FAILED: the fused kernels differ from ATen's ops\n";
  if (!varlen) std::cout << "FAILED: varlen flash attention differs from the masked reference\n";
  if (!blocks) std::cout << "FAILED: context parallel's flash blocks differ from their reference sums\n";
  if (!scored) std::cout << "FAILED: capped or sunk scores as blocks differ from the float64 sums\n";
  const bool all = fused && varlen && blocks && scored;
  if (all) std::cout << "ok\n";
  return all ? 0 : 1;
}

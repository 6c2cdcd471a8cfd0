// float8 training on a GPU (label gpu; exit 77, skipped, without one, or on a GPU without float8
// tensor cores: compute capability below 8.9). Checks, each reported whichever fails:
//   - the fused casts (nvcc's build of kernels/functors.h) give the bits and scales of torchao's ATen
//     arithmetic on the GPU, and of the CPU's run of the same functors, in every layout;
//   - float8_linear on cuBLAS keeps torchao's signal-to-noise ratios against the fp32 product
//     (output >= 18 dB, gradients >= 17 dB), both recipes;
//   - a float8 layer's forward and backward beside bf16's at the 8B shape's MLP product (8192 tokens
//     of 4096 into 14336), timed with events and printed (not asserted: a figure for the session's log).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <vector>

#include "model/kernels/float8.h"
#include "model/kernels/float8_products.h"
#include "model/kernels/provider.h"

using namespace fsdp::model;

namespace {

struct Choice {
  explicit Choice(kernels::Provider p) { kernels::set_kernel_choice({p, kernels::OnednnProducts::kLarge}); }
  ~Choice() { kernels::set_kernel_choice({kernels::Provider::kAuto, kernels::OnednnProducts::kLarge}); }
};

Float8Tensor cast(kernels::Provider p, const at::Tensor& x, at::ScalarType dtype, std::optional<int64_t> dim, bool pow2,
                  Float8Layout layout) {
  Choice c(p);
  return to_float8(x, dtype, dim, pow2, layout);
}

at::Tensor bytes_of(const at::Tensor& bits) {
  return bits.defined() ? bits.contiguous().view(at::kByte).cpu() : at::Tensor();
}

bool same(const Float8Tensor& a, const Float8Tensor& b) {
  auto eq = [](const at::Tensor& x, const at::Tensor& y) {
    return x.defined() == y.defined() && (!x.defined() || at::equal(bytes_of(x), bytes_of(y)));
  };
  return eq(a.rows, b.rows) && eq(a.columns, b.columns) && at::equal(a.inverse.cpu(), b.inverse.cpu());
}

// Rows and columns by 16 take the tiled kernel (kernels/float8_cuda.cu), others ATen's loops on the
// GPU: both against ATen's ops there and the CPU's run of the functors.
bool check_casts() {
  bool ok = true;
  for (const auto& shape : {std::pair<int64_t, int64_t>{192, 320}, {40, 24}}) {
    at::Tensor x = at::randn({shape.first, shape.second}) * at::exp(at::randn({shape.first, shape.second}) * 2);
    x[3].zero_();
    x = x.to(at::kBFloat16);
    const at::Tensor xg = x.cuda();
    for (at::ScalarType dtype : {at::kFloat8_e4m3fn, at::kFloat8_e5m2})
      for (std::optional<int64_t> dim :
           {std::optional<int64_t>(), std::optional<int64_t>(-1), std::optional<int64_t>(0)})
        for (bool pow2 : {false, true})
          for (Float8Layout layout : {Float8Layout::kRows, Float8Layout::kColumns, Float8Layout::kBoth}) {
            const Float8Tensor fused = cast(kernels::Provider::kPortable, xg, dtype, dim, pow2, layout);
            const Float8Tensor ref = cast(kernels::Provider::kReference, xg, dtype, dim, pow2, layout);
            const Float8Tensor host = cast(kernels::Provider::kPortable, x, dtype, dim, pow2, layout);
            if (!same(fused, ref) || !same(fused, host)) {
              std::cout << "float8 cast of " << shape.first << " x " << shape.second << " to " << dtype << " (dim "
                        << dim.value_or(99) << ", power of 2 " << pow2 << ", layout " << static_cast<int>(layout)
                        << "): the GPU kernel differs from " << (!same(fused, ref) ? "ATen's ops" : "the CPU's kernel")
                        << "\n";
              ok = false;
            }
          }
  }
  std::cout << "float8 casts on the GPU (tiled and ATen's loops): "
            << (ok ? "the bits and scales of ATen's ops and of the CPU" : "DIFFER") << "\n";
  return ok;
}

bool check_sqnr() {
  const int64_t m = 1024, k = 512, n = 768;
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor x0 = at::randn({m, k}, bf16), w0 = at::randn({n, k}, bf16) * 0.02, go = at::randn({m, n}, bf16);
  const at::Tensor xr = x0.to(at::kFloat).requires_grad_(), wr = w0.to(at::kFloat).requires_grad_();
  at::linear(xr, wr).backward(go.to(at::kFloat));
  const at::Tensor yr = at::linear(xr.detach(), wr.detach());
  bool ok = true;
  for (Float8Recipe recipe : {Float8Recipe::kTensorwise, Float8Recipe::kRowwise}) {
    const at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const at::Tensor y = float8_linear(x, w, recipe);
    y.backward(go);
    const double out = sqnr_db(yr, y), dw = sqnr_db(wr.grad(), w.grad()), dx = sqnr_db(xr.grad(), x.grad());
    const bool good = out >= 18 && dw >= 17 && dx >= 17;
    std::cout << "float8 " << kFloat8RecipeNames[static_cast<size_t>(recipe)] << " linear on cuBLAS: output " << out
              << " dB, weight gradient " << dw << " dB, input gradient " << dx << " dB"
              << (good ? "" : " (below 18/17/17)") << "\n";
    ok = ok && good;
  }
  return ok;
}

// Milliseconds of forward + backward of one layer, the median of 10 after 3 warm-ups.
double time_layer(const at::Tensor& x, const at::Tensor& w, const at::Tensor& go, Float8Recipe recipe) {
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    const at::Tensor y = recipe == Float8Recipe::kNone ? at::linear(x, w) : float8_linear(x, w, recipe);
    y.backward(go);
    stop.record();
    stop.synchronize();
    if (i >= 3) ms.push_back(start.elapsed_time(stop));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Milliseconds of fn, the median of 10 after 3 warm-ups.
template <typename Fn>
double time_of(Fn&& fn) {
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    fn();
    stop.record();
    stop.synchronize();
    if (i >= 3) ms.push_back(start.elapsed_time(stop));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Where a float8 layer's time goes at x (M, K), w (N, K): the pieces alone, with the bytes each
// moves over its time (GB/s), for the session's log.
void time_pieces(int64_t m, int64_t k, int64_t n) {
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor x = at::randn({m, k}, bf16), w = at::randn({n, k}, bf16) * 0.02;
  const Float8Tensor xq = to_float8(x, at::kFloat8_e4m3fn, std::nullopt, false, Float8Layout::kBoth);
  const Float8Tensor wq = to_float8(w, at::kFloat8_e4m3fn, std::nullopt, false, Float8Layout::kBoth);
  const double e = static_cast<double>(m * k);
  const double amax = time_of([&] { at::linalg_vector_norm(x, INFINITY); });
  const double cast_rows = time_of([&] { to_float8(x, at::kFloat8_e4m3fn); });
  const double cast_both = time_of([&] { to_float8(x, at::kFloat8_e4m3fn, std::nullopt, false, Float8Layout::kBoth); });
  const double mm8 =
      time_of([&] { kernels::float8_mm(xq.rows, xq.inverse, wq.rows.t(), wq.inverse, at::kBFloat16, true); });
  const double mm16 = time_of([&] { at::mm(x, w.t()); });
  std::cout << "pieces at " << m << " x " << k << " -> " << n << ": amax " << amax << " ms (" << 2 * e / amax / 1e6
            << " GB/s); cast by rows " << cast_rows << " ms (" << 5 * e / cast_rows / 1e6 << " GB/s with the amax); "
            << "both layouts " << cast_both << " ms (" << 6 * e / cast_both / 1e6 << " GB/s); float8 product " << mm8
            << " ms (" << 2.0 * m * k * n / mm8 / 1e9 << " TFLOP/s) against bf16's " << mm16 << " ms ("
            << 2.0 * m * k * n / mm16 / 1e9 << " TFLOP/s)\n";
}

void time_layers() {
  const int64_t m = 8192, k = 4096, n = 14336;
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor x = at::randn({m, k}, bf16).requires_grad_(), w = (at::randn({n, k}, bf16) * 0.02).requires_grad_();
  const at::Tensor go = at::randn({m, n}, bf16);
  const double flop = 6.0 * m * k * n;
  const double base = time_layer(x, w, go, Float8Recipe::kNone);
  std::cout << "layer (" << m << " x " << k << " -> " << n << ") forward + backward: bf16 " << base << " ms ("
            << flop / base / 1e9 << " TFLOP/s)";
  for (Float8Recipe recipe : {Float8Recipe::kTensorwise, Float8Recipe::kRowwise}) {
    const double t = time_layer(x, w, go, recipe);
    std::cout << "; float8 " << kFloat8RecipeNames[static_cast<size_t>(recipe)] << " " << t << " ms (" << base / t
              << "x)";
  }
  std::cout << "\n";
}

}  // namespace

int main() {
  if (!at::hasCUDA()) {
    std::cout << "skipped: no CUDA device\n";
    return 77;
  }
  const cudaDeviceProp* p = at::cuda::getCurrentDeviceProperties();
  if (p->major * 10 + p->minor < 89) {
    std::cout << "skipped: " << p->name << " has no float8 tensor cores (compute capability " << p->major << "."
              << p->minor << ")\n";
    return 77;
  }
  at::manual_seed(0);
  const bool casts = check_casts();
  const bool sqnr = check_sqnr();
  time_layers();
  time_pieces(8192, 4096, 14336);
  time_pieces(8192, 14336, 4096);
  if (casts && sqnr) std::cout << "ok\n";
  return casts && sqnr ? 0 : 1;
}

#include "model/kernels/float8_products.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/record_function.h>

#include "util/error.h"

namespace fsdp::model::kernels {

at::Tensor float8_mm(const at::Tensor& a, const at::Tensor& a_inverse, const at::Tensor& b, const at::Tensor& b_inverse,
                     at::ScalarType out_dtype, bool fast_accum) {
  FSDP_ASSERT(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "float8_mm of ", a.sizes(), " and ", b.sizes());
  RECORD_FUNCTION("fsdptrain::float8_mm", std::vector<c10::IValue>({a, b, a_inverse, b_inverse}));
  const int64_t m = a.size(0), n = b.size(1);
  if (a.is_meta()) return at::empty({m, n}, a.options().dtype(out_dtype));  // no meta _scaled_mm in C++
  // On the CPU, cuBLAS's arithmetic on the dequantized operands: float8 values are exact in fp32, so
  // the products are exact and the sums fp32, and the scales apply to the sums (one a tensor, or per
  // row of a and column of b). LibTorch's CPU _scaled_mm takes one scale an operand and, where the
  // CPU has no float8 kernels (oneDNN's reference loops), ran a tiny model's step 50x slower.
  if (a.is_cpu()) return (at::mm(a.to(at::kFloat), b.to(at::kFloat)) * a_inverse * b_inverse).to(out_dtype);
  return at::_scaled_mm(a, b, a_inverse, b_inverse, /*bias=*/std::nullopt, /*scale_result=*/std::nullopt, out_dtype,
                        fast_accum);
}

void check_float8_shapes(const at::Tensor& x2, const std::vector<at::Tensor>& weights) {
  if (!x2.is_cuda()) return;
  const int64_t m = x2.size(0), k = x2.size(1);
  for (const at::Tensor& w : weights)
    FSDP_CHECK(k % 16 == 0 && w.size(0) % 16 == 0 && m % 16 == 0, "[model] engine.float8: cuBLAS's float8 products ",
               "need multiples of 16, and this layer has ", w.size(0), " outputs and ", k, " inputs over ", m,
               " tokens a micro-batch; choose a model and a sequence length x micro batch that divide by 16, or "
               "engine.float8: none");
}

void check_float8_device(const c10::Device& device) {
  FSDP_CHECK(device.is_cuda(), "engine.float8: float8 products make training faster on GPUs (compute capability 8.9 ",
             "and up); this run is on ", device.str(), ", where they would only be emulated: remove engine.float8 ",
             "(or set it to none)");
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(device.index());
  FSDP_CHECK(p->major * 10 + p->minor >= 89, "engine.float8: ", p->name, " (compute capability ", p->major, ".",
             p->minor, ") has no float8 tensor cores; they start at 8.9 (Ada, Hopper, Blackwell): set engine.float8: ",
             "none on this GPU");
}

}  // namespace fsdp::model::kernels

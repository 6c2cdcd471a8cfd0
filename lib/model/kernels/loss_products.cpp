#include "model/kernels/loss_products.h"

#include <ATen/ATen.h>

#include "model/kernels/linear.h"

namespace fsdp::model::kernels {

void product_into(at::Tensor out, const at::Tensor& a, const at::Tensor& b, double beta) {  // out: a handle
  if (a.scalar_type() == at::kFloat)
    at::addmm_out(out, out, a, b, beta);
  else if (a.is_cpu())
    at::addmm_out(out, out, a.to(at::kFloat), b.to(at::kFloat), beta);
  else
    at::addmm_out(out, out, a, b, at::kFloat, beta);
}

void mm_into(at::Tensor out, const at::Tensor& a, const at::Tensor& b) {  // out: a handle
  if (a.is_cpu())
    out.copy_(matmul_nt(a, b.t()));
  else
    at::mm_out(out, a, b);  // written in place
}

void WeightGradient::add(const at::Tensor& g, const at::Tensor& h) {
  on_cpu_ = h.is_cpu();
  if (on_cpu_) {
    const at::Tensor part = matmul_nt(h.t(), g.t());  // (C, V): g goes in as oneDNN's weight, read in place
    sum_ = sum_.defined() ? sum_.add_(part) : part.to(at::kFloat);  // part is new: no copy in fp32
    return;
  }
  const bool first = !sum_.defined();
  if (first) sum_ = at::empty({g.size(1), h.size(1)}, h.options().dtype(at::kFloat));
  if (h.scalar_type() == at::kFloat)
    at::addmm_out(sum_, sum_, g.t(), h, /*beta=*/first ? 0 : 1);
  else
    at::addmm_out(sum_, sum_, g.t(), h, at::kFloat, /*beta=*/first ? 0 : 1);
}

at::Tensor WeightGradient::take(const at::Tensor& weight) const {
  if (!sum_.defined()) return at::zeros(weight.sizes(), weight.options());
  if (on_cpu_) return at::empty(weight.sizes(), weight.options()).copy_(sum_.t());  // one pass: layout and dtype
  return sum_.scalar_type() == weight.scalar_type() ? sum_ : sum_.to(weight.scalar_type());
}

}  // namespace fsdp::model::kernels

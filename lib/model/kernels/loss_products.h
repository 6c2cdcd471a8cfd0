// The chunked loss's products (model/layers/chunked_loss.h) for each device: where the CPU takes oneDNN's
// layouts and a GPU takes cuBLAS's mixed-dtype products, so the loss's code asks for a product and
// never which device it is on. No state beyond WeightGradient's sum; not thread-safe per object.
#pragma once

#include <ATen/core/Tensor.h>

namespace fsdp::model::kernels {

// out (fp32) = beta out + a b with a and b in their dtype and the sum in fp32 (one product in place;
// the CPU has no mixed-dtype product, so there the operands are upcast first). beta 0 ignores out.
void product_into(at::Tensor out, const at::Tensor& a, const at::Tensor& b, double beta);

// out = a b in a's dtype, out (M, N) a view written in place (a (M, K), b (K, N)); on the CPU
// oneDNN's product of b's transpose as its weight, then copied in.
void mm_into(at::Tensor out, const at::Tensor& a, const at::Tensor& b);

// The weight's gradient, summed over the chunks in fp32: dw += g^T h, with g (m, V) and h (m, C) in
// the weight's dtype. On a GPU (and on meta, which takes its branches) one product per chunk with
// bf16/fp16 operands reads and writes the fp32 (V, C) sum in place (cuBLAS accumulates in fp32: no
// fp32 product, no separate add, no transposed copy). On the CPU, oneDNN's layout: the chunk's
// product as (C, V) in the weight's dtype, added to an fp32 (C, V) sum transposed once at the end.
class WeightGradient {
 public:
  void add(const at::Tensor& g, const at::Tensor& h);
  // The sum in the weight's layout and dtype (zeros when no chunk added to it).
  at::Tensor take(const at::Tensor& weight) const;

 private:
  at::Tensor sum_;  // fp32: (V, C) off the CPU, (C, V) on it
  bool on_cpu_ = false;
};

}  // namespace fsdp::model::kernels

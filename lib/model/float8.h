// float8 training of the decoder layers' products (engine.float8), as torchao defines its recipes
// (Float8LinearConfig.from_recipe_name, the config TorchTitan's float8 converter applies):
//   - tensorwise: one dynamic scale per tensor (max / amax of the whole tensor); the input and the
//     weight in float8_e4m3fn, the output's gradient in float8_e5m2;
//   - rowwise: one scale per row of the left operand and per column of the right one, every operand
//     in float8_e4m3fn, each scale rounded down to a power of 2; an operand a backward product
//     reduces along another dimension is cast again along that one.
// Each of the three products of a linear layer (output, the input's gradient, the weight's) takes
// float8 operands and accumulates in fp32 (cuBLAS's fast accumulation for the output's product, as
// torchao), its result in the input's dtype. What stays in the compute dtype: everything else (the
// loss head, embeddings, norms, attention, LoRA adapters). A scale is max / max(amax, 1e-12) in
// float64 rounded to fp32, and a value x * scale in fp32 saturated to the format's largest finite
// value: torchao's arithmetic (tests compare the reference provider's ATen ops with the fused kernels).
//
// Devices: on a GPU through at::_scaled_mm (compute capability 8.9 and up: Ada, Hopper, Blackwell);
// on the CPU, where LibTorch's _scaled_mm takes only one scale per operand, rowwise products run on
// the dequantized operands in fp32: the numerics tests run there; the config refuses float8 for a
// CPU run (it makes nothing faster there). Meta: shapes and dtypes only.
//
// Thread safety: the recipe is one choice per process, set before the model runs.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace fsdp::model {

enum class Float8Recipe { kNone, kTensorwise, kRowwise };
inline constexpr std::array<const char*, 3> kFloat8RecipeNames = {"none", "tensorwise", "rowwise"};

// The process's recipe for the decoder layers' products from here on (the trainer: engine.float8).
void set_float8_recipe(Float8Recipe recipe);
Float8Recipe float8_recipe();
// By name ("none", "tensorwise", "rowwise"); throws InputError naming engine.float8 otherwise.
Float8Recipe float8_recipe_named(const std::string& name);

// A tensor in float8 and the inverse scale a product multiplies it by.
struct Float8Tensor {
  at::Tensor bits;     // float8_e4m3fn or float8_e5m2, the input's shape
  at::Tensor inverse;  // fp32: one value (tensorwise), else the input's shape with 1 along the reduced dim
};

// x (2-D) in `dtype` with one scale for the whole tensor (reduce_dim unset) or one for each slice
// along reduce_dim (the amax is taken over that dim: -1 gives one per row). With column_major the
// bits are laid out column by column (strides (1, rows)), as a right-hand operand of a product
// needs them.
Float8Tensor to_float8(const at::Tensor& x, at::ScalarType dtype, std::optional<int64_t> reduce_dim = std::nullopt,
                       bool power_of_2 = false, bool column_major = false);

// a (M, K) b (K, N) from float8 operands, a row-major and b column-major, with inverse scales of one
// value each or (M, 1) and (1, N); fp32 accumulation, the result (M, N) in out_dtype.
at::Tensor float8_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype, bool fast_accum);

// x (..., K) weight^T for weight (N, K), no bias, with the recipe's float8 products forward and
// backward; differentiable in x and weight (a frozen weight's gradient is not computed). On a GPU, K,
// N and the rows of x must be multiples of 16 (cuBLAS's float8 kernels): InputError otherwise.
at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, Float8Recipe recipe);

// InputError unless `device` runs float8 products: a GPU of compute capability 8.9 or later.
void check_float8_device(const c10::Device& device);

// 10 log10(|ref|^2 / |ref - x|^2) in dB, over fp32 copies: torchao's measure of a float8 result
// against the high-precision one (its tests ask >= 18 dB for outputs, >= 17 for weight gradients).
double sqnr_db(const at::Tensor& ref, const at::Tensor& x);

}  // namespace fsdp::model

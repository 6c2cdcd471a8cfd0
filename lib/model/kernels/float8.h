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
// on the CPU, every product runs on the dequantized operands in fp32, the scales applied to its sums
// as cuBLAS applies them: the numerics tests run there; the config refuses float8 for a
// CPU run (it makes nothing faster there). Meta: shapes and dtypes only.
//
// Thread safety: the recipe is one choice per process, set before the model runs.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::model {

enum class Float8Recipe { kNone, kTensorwise, kRowwise };
inline constexpr std::array<const char*, 3> kFloat8RecipeNames = {"none", "tensorwise", "rowwise"};

// The process's recipe for the decoder layers' products from here on (the trainer: engine.float8).
void set_float8_recipe(Float8Recipe recipe);
Float8Recipe float8_recipe();
// By name ("none", "tensorwise", "rowwise"); throws InputError naming engine.float8 otherwise.
Float8Recipe float8_recipe_named(const std::string& name);

// A 2-D tensor in float8, laid out as the products need it, and the inverse scale a product
// multiplies it by. A product's left operand is read by rows, its right one by columns.
struct Float8Tensor {
  at::Tensor rows;     // float8_e4m3fn or float8_e5m2 (M, K) row-major, or undefined
  at::Tensor columns;  // the same values (M, K) column-major (strides (1, M)), or undefined
  at::Tensor inverse;  // fp32: one value (tensorwise), else (M, 1) or (1, K): 1 along the reduced dim
};
enum class Float8Layout { kRows, kColumns, kBoth };

// x (2-D) in `dtype` with one scale for the whole tensor (reduce_dim unset) or one for each slice
// along reduce_dim (the amax is taken over that dim: -1 gives one a row), in the layouts asked for
// (both from one read of x on a GPU).
Float8Tensor to_float8(const at::Tensor& x, at::ScalarType dtype, std::optional<int64_t> reduce_dim = std::nullopt,
                       bool power_of_2 = false, Float8Layout layout = Float8Layout::kRows);

// x (..., K) weight_i^T for each weight (N_i, K) (one to three: q, k and v, or gate and up, read
// the same input), no bias, with the recipe's float8 products forward and backward: x is cast once
// for all of them, each weight with its own scale (torchao's Float8Linear for each). Differentiable
// in x and every weight (a frozen weight's gradient is not computed). On a GPU, K, each N_i and the
// rows of x must be multiples of 16 (cuBLAS's float8 kernels): InputError otherwise. In tensorwise, a weight
// fully_shard gathered in float8 (fsdp/float8_gather.h) is multiplied by its gathered bits and
// scale, forward and backward, and never read itself.
std::vector<at::Tensor> float8_linears(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                       Float8Recipe recipe);
// One weight.
at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, Float8Recipe recipe);

// Tensorwise e4m3 bits of x with the scale of a given amax (a () fp32 tensor), into bits (x's shape);
// returns the () fp32 inverse scale. fully_shard's float8 all-gather (fsdp/float8_gather.h) casts a
// rank's rows of a weight with the whole weight's amax this way: the bits to_float8 gives the whole.
at::Tensor to_float8_with_amax(const at::Tensor& bits, const at::Tensor& x, const at::Tensor& amax);

// 10 log10(|ref|^2 / |ref - x|^2) in dB, over fp32 copies: torchao's measure of a float8 result
// against the high-precision one (its tests ask >= 18 dB for outputs, >= 17 for weight gradients).
double sqnr_db(const at::Tensor& ref, const at::Tensor& x);

}  // namespace fsdp::model

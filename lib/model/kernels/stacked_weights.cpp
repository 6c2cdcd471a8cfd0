#include "model/kernels/stacked_weights.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "util/error.h"

namespace fsdp::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Whether `ts` (at least two, same dtype, device and trailing shape) are contiguous and each begins
// where the one before ends, in one storage.
bool end_to_end(const std::vector<at::Tensor>& ts) {
  if (ts.size() < 2) return false;
  const at::Tensor& first = ts.front();
  int64_t next = first.storage_offset();
  for (const at::Tensor& t : ts) {
    if (!t.defined() || !t.is_contiguous() || t.dim() != first.dim() || t.scalar_type() != first.scalar_type() ||
        t.device() != first.device() || !t.storage().is_alias_of(first.storage()) || t.storage_offset() != next)
      return false;
    for (int64_t d = 1; d < t.dim(); ++d)
      if (t.size(d) != first.size(d)) return false;
    next += t.numel();
  }
  return true;
}

// Forward: the block the inputs form, over their storage. Backward: the block's gradient cut back
// into each input's rows (views, no copy).
struct StackedRows : torch::autograd::Function<StackedRows> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList parts) {
    std::vector<int64_t> sizes = parts.front().sizes().vec();
    int64_t rows = 0;
    std::vector<int64_t> counts;
    for (const at::Tensor& p : parts) {
      rows += p.size(0);
      counts.push_back(p.size(0));
    }
    sizes[0] = rows;
    ctx->saved_data["rows"] = counts;
    at::Tensor block = at::empty({0}, parts.front().options());
    block.set_(parts.front().storage(), parts.front().storage_offset(), sizes);  // contiguous strides
    return block;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return grads[0].split_with_sizes(ctx->saved_data["rows"].toIntVector(), 0);
  }
};

}  // namespace

std::optional<at::Tensor> stacked_weights(const std::vector<at::Tensor>& weights) {
  if (!end_to_end(weights)) return std::nullopt;
  return StackedRows::apply(at::TensorList(weights));
}

at::Tensor stacked_biases(const std::vector<at::Tensor>& biases) {
  size_t defined = 0;
  for (const at::Tensor& b : biases) defined += b.defined() ? 1 : 0;
  if (defined == 0) return at::Tensor();
  FSDP_ASSERT(defined == biases.size(), "[stacked_biases] some projections have a bias and some do not");
  if (auto block = stacked_weights(biases)) return *block;
  return at::cat(biases, 0);
}

}  // namespace fsdp::model

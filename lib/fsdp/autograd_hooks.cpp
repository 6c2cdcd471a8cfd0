#include "fsdp/autograd_hooks.h"

#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace fsdp::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct CallbackHolder : torch::CustomClassHolder {
  explicit CallbackHolder(std::function<void()> f) : fn(std::move(f)) {}
  std::function<void()> fn;
};

struct PostBackward : torch::autograd::Function<PostBackward> {
  // Inputs travel as at::TensorList: autograd records each element as an input only in that form
  // (a std::vector argument would count as one non-tensor argument and cut the graph here).
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<CallbackHolder> on_backward,
                               at::TensorList inputs) {
    ctx->saved_data["on_backward"] = at::IValue::make_capsule(on_backward);
    return variable_list(inputs.begin(), inputs.end());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::static_intrusive_pointer_cast<CallbackHolder>(ctx->saved_data["on_backward"].toCapsule())->fn();
    variable_list out{at::Tensor()};
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  }
};

struct FnHolder : torch::CustomClassHolder {
  explicit FnHolder(UnitFn f) : fn(std::move(f)) {}
  UnitFn fn;
};

struct Checkpoint : torch::autograd::Function<Checkpoint> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<FnHolder> holder, at::TensorList inputs) {
    ctx->saved_data["fn"] = at::IValue::make_capsule(holder);
    variable_list in(inputs.begin(), inputs.end());
    ctx->save_for_backward(in);
    return holder->fn(in);  // grad mode is off inside forward: no activations are kept
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto holder = c10::static_intrusive_pointer_cast<FnHolder>(ctx->saved_data["fn"].toCapsule());
    variable_list detached;
    for (const at::Tensor& s : ctx->get_saved_variables()) {
      at::Tensor d = s.detach();
      d.requires_grad_(s.requires_grad());
      detached.push_back(d);
    }
    variable_list outputs;
    {
      c10::AutoGradMode enable(true);
      outputs = holder->fn(detached);
    }
    variable_list roots, grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    // Parameters' gradients accumulate into their .grad here, before the unit's post-backward runs.
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    variable_list out{at::Tensor()};
    for (const at::Tensor& d : detached) out.push_back(d.requires_grad() ? d.grad() : at::Tensor());
    return out;
  }
};

}  // namespace

TensorList register_post_backward(std::function<void()> on_backward, const TensorList& inputs) {
  variable_list needing;
  std::vector<size_t> where;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      needing.push_back(inputs[i]);
      where.push_back(i);
    }
  }
  if (needing.empty()) return inputs;
  variable_list passed =
      PostBackward::apply(c10::make_intrusive<CallbackHolder>(std::move(on_backward)), at::TensorList(needing));
  TensorList out = inputs;
  for (size_t k = 0; k < where.size(); ++k) out[where[k]] = passed[k];
  return out;
}

TensorList checkpoint(const UnitFn& fn, const TensorList& inputs, bool params_need_grad) {
  const bool any =
      std::any_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  if (any || !params_need_grad) return Checkpoint::apply(c10::make_intrusive<FnHolder>(fn), at::TensorList(inputs));
  // The unit's parameters need gradients though no input does (LoRA above a frozen embedding): one
  // more input, empty and requiring grad, makes the outputs require grad, so backward reaches the
  // recomputation. fn never sees it.
  TensorList with = inputs;
  c10::Device device(c10::kCPU);
  for (const at::Tensor& t : inputs)
    if (t.defined()) device = t.device();
  with.push_back(at::empty({0}, at::TensorOptions().device(device)).requires_grad_());
  UnitFn without = [fn, n = inputs.size()](const TensorList& in) {
    return fn(TensorList(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n)));
  };
  return Checkpoint::apply(c10::make_intrusive<FnHolder>(std::move(without)), at::TensorList(with));
}

}  // namespace fsdp::detail

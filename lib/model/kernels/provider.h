// Who computes the model's named ops (model/kernels/ops.h: rms_norm, rotary, swiglu, attention, the
// loss's pieces, float8 casts; the products in model/kernels/linear.h). Three providers, one choice
// per process, each a table of ops in its own file (host.cpp, portable.cpp, reference.cpp):
//   - host: the CPU's own kernels: model/kernels/fused_ops.h (RMSNorm, the rotary embedding of q and k
//     in one pass, SwiGLU), oneDNN's products and attention where they pay (engine.onednn_products),
//     the token-chunked loss. The CPU only.
//   - portable: the kernels a GPU runs: model/kernels' functors launched by ATen's TensorIterator
//     (gpu_kernel on CUDA, cpu_kernel on the host, shapes only on meta), LibTorch's rms_norm,
//     stacked products, variable-length flash attention for packed rows (GPUs), the
//     vocabulary-chunked loss. On the CPU it runs the GPU's arithmetic, so CPU tests check it.
//   - reference: ATen's ops one by one (one product per weight, masked attention, the
//     token-chunked loss with LibTorch's products): the numerics to compare the others against.
// auto: host on the CPU, portable elsewhere (reference where this build has no kernels for the
// device). Chosen by the option table's engine.kernels (the trainer calls set_kernel_choice);
// programs that read no config take $FSDPTRAIN_KERNELS / $FSDPTRAIN_ONEDNN_PRODUCTS, the variables
// `fsdptrain launch` exports for those rows. Thread safety: set before the model runs.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <string>

namespace fsdp::model::kernels {

enum class Provider { kAuto, kHost, kPortable, kReference };
inline constexpr std::array<const char*, 4> kProviderNames = {"auto", "host", "portable", "reference"};

// Which float32 products on the CPU go to oneDNN (host provider): those large enough to pay its
// fixed cost per call, all of them, or none (LibTorch's mm and SDPA).
enum class OnednnProducts { kLarge, kAll, kOff };
inline constexpr std::array<const char*, 3> kOnednnProductsNames = {"large", "all", "off"};

struct KernelChoice {
  Provider provider = Provider::kAuto;
  OnednnProducts onednn = OnednnProducts::kLarge;
};

// The process's choice from here on (the trainer: engine.kernels, engine.onednn_products).
void set_kernel_choice(KernelChoice choice);
// The choice set, else the environment's, else the defaults. Throws InputError naming a variable
// whose value is none of its choices.
KernelChoice kernel_choice();

// The provider that computes an op on x's device: auto resolved. Throws InputError for host off the
// CPU and for portable on a device this build has no kernels for, naming the fix.
Provider provider_for(const at::Tensor& x);

// The provider's name or choice by name (config values map through these).
const char* provider_name(Provider p);
Provider provider_named(const std::string& name);
OnednnProducts onednn_products_named(const std::string& name);

}  // namespace fsdp::model::kernels

// For safetensors_python_test.py: `write PATH` writes a fixed set of tensors (arange-based, one
// per dtype); `dump PATH` reads any file and prints one JSON object: name -> [dtype, shape, sum].
#include <ATen/ATen.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "ckpt/safetensors_torch.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: safetensors_tool write|dump PATH\n";
    return 2;
  }
  const std::string mode = argv[1], path = argv[2];
  try {
    if (mode == "write") {
      const at::Tensor base = at::arange(24, at::kDouble).view({2, 3, 4}) - 7;
      std::vector<std::pair<std::string, at::Tensor>> tensors;
      for (auto [name, type] : std::vector<std::pair<std::string, at::ScalarType>>{{"f64", at::kDouble},
                                                                                   {"f32", at::kFloat},
                                                                                   {"f16", at::kHalf},
                                                                                   {"bf16", at::kBFloat16},
                                                                                   {"i64", at::kLong},
                                                                                   {"i32", at::kInt},
                                                                                   {"i16", at::kShort},
                                                                                   {"i8", at::kChar}})
        tensors.emplace_back(name, base.to(type));
      tensors.emplace_back("u8", (base + 7).to(at::kByte));
      tensors.emplace_back("bool", base.gt(0));
      tensors.emplace_back("scalar", at::scalar_tensor(3.5, at::kFloat));
      fsdp::ckpt::save_safetensors(path, tensors);
      return 0;
    }
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [name, t] : fsdp::ckpt::load_safetensors(path)) {
      fsdp::ckpt::SafetensorsFile f(path);
      out[name] = {fsdp::ckpt::dtype_name(f.header().find(name)->dtype), t.sizes().vec(),
                   t.to(at::kDouble).sum().item<double>()};
    }
    std::cout << out.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}

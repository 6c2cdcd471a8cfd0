#include "launch/env_report.h"

#include <cstdlib>

#include "config/loader.h"
#include "config/show.h"
#include "dist/build_info.h"
#include "util/env.h"
#include "util/error.h"
#include "util/system_info.h"

namespace fsdp::launch {

std::string env_report(const config::ConfigInputs& inputs, const std::string& config_source) {
  const BuildInfo b = build_info();
  const SystemInfo s = system_info();
  std::string out;
  auto line = [&](const std::string& k, const std::string& v) { out += "- " + k + ": " + v + "\n"; };
  out += "fsdptrain environment\n\n";
  line("fsdptrain version", b.fsdptrain_version);
  line("LibTorch version", b.libtorch_version);
  line("CUDA compiled in", b.cuda_compiled ? "yes (CUDA " + b.cuda_version + ")" : "no");
  line("NCCL compiled in", b.nccl_compiled ? str("yes (headers ", b.nccl_compiled_version, ", loaded ",
                                                 b.nccl_runtime_version.empty() ? "?" : b.nccl_runtime_version, ")")
                                           : "no");
  const int gpus = cuda_device_count();
  std::string gpu_text = gpus == 0 ? "none found (training runs on CPU processes over Gloo)" : std::to_string(gpus);
  for (int i = 0; i < gpus; ++i) gpu_text += str("\n    ", i, ": ", cuda_device_name(i));
  line("GPUs", gpu_text);
  line("CPU cores", std::to_string(s.cpu_cores));
  line("Memory", str(s.memory_total_bytes / (1024 * 1024 * 1024), " GiB total, ",
                     s.memory_available_bytes / (1024 * 1024 * 1024), " GiB available"));
  line("OS", s.os);
  line("Hostname", s.hostname);
  for (const char* var : {"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "MASTER_ADDR",
                          "MASTER_PORT", env::kConfigFile.name, "HF_HOME"}) {
    if (const char* v = std::getenv(var)) line(std::string("$") + var, v);
  }
  out += "\n";
  if (!inputs.has_file && inputs.sets.empty() && inputs.flags.empty()) {
    out += "Config file: none found (" + config_source + ")\n";
    return out;
  }
  out += "Config file: " + (inputs.has_file ? inputs.file + " (" + config_source + ")" : std::string("none")) + "\n";
  config::Diagnostics diags;
  config::ResolvedConfig rc = config::load_config(inputs, diags);
  for (const auto& e : diags.errors()) out += "  error: " + e + "\n";
  for (const auto& w : diags.warnings()) out += "  warning: " + w + "\n";
  out += config::format_resolved(rc, config::ShowFormat::kTable);
  return out;
}

}  // namespace fsdp::launch

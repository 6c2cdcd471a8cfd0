// The bodies of the `config` subcommands that write files: `config default` and `config update`.
// (`config show`/`validate` are show.h + loader.h; the wizard is wizard.h; to-fsdp2 is to_fsdp2.h.)
#pragma once

#include <string>

namespace fsdp::config {

struct DefaultConfigRequest {
  std::string path;  // "" = fsdptrain's default path
  std::string mixed_precision = "no";
  int gpu_count = 0;  // GPUs on this machine: FSDP over them, or over 1 CPU process
};

// Writes an FSDP2 config for this machine. Refuses to overwrite an existing file. Returns the path.
std::string write_default_config(const DefaultConfigRequest& req);

struct UpdateConfigRequest {
  std::string path;  // "" = the default config file
  bool to_fsdp2 = false;
  bool force = false;  // accept a lossy FSDP1 -> FSDP2 conversion
};

// Rewrites a config with every current default filled in and legacy spellings (fp16: true,
// unprefixed fsdp keys, fsdp_backward_prefetch_policy) in today's form; optionally converts FSDP1 to
// FSDP2 first. The previous file is kept as PATH.bak. Returns a one-line summary.
std::string update_config(const UpdateConfigRequest& req);

}  // namespace fsdp::config

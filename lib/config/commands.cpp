#include "config/commands.h"

#include "config/loader.h"
#include "config/show.h"
#include "config/to_fsdp2.h"
#include "config/yaml_writer.h"
#include "util/error.h"
#include "util/files.h"
#include "util/log.h"
#include "util/strings.h"

namespace fsdp::config {

std::string write_default_config(const DefaultConfigRequest& req) {
  const std::string path = req.path.empty() ? fsdptrain_default_config_path() : req.path;
  FSDP_CHECK(!file_exists(path), "config default: ", path,
             " already exists and was left as it is; edit it, delete it, or pass --config_file NEW.yaml");
  ConfigInputs in;
  in.sets = {"distributed_type=FSDP", "num_processes=" + std::to_string(std::max(1, req.gpu_count)),
             std::string("use_cpu=") + (req.gpu_count == 0 ? "true" : "false"),
             "mixed_precision=" + req.mixed_precision, "fsdp_config.fsdp_version=2"};
  ResolvedConfig rc = load_config_or_throw(in);
  const std::string yaml = emit_config_yaml(
      file_values(rc),
      str("written by `fsdptrain config default` for ",
          req.gpu_count == 0 ? std::string("a machine without GPUs") : std::to_string(req.gpu_count) + " GPU(s)"));
  write_file_atomic(path, yaml);
  return path;
}

std::string update_config(const UpdateConfigRequest& req) {
  const std::string path = req.path.empty() ? find_default_config().path : req.path;
  FSDP_CHECK(!path.empty(), "config update: no config file given and none found at ", fsdptrain_default_config_path(),
             " or ", accelerate_default_config_path(),
             "; pass --config_file FILE or create one with `fsdptrain config`");
  FSDP_CHECK(file_exists(path), "config update: ", path, " not found");
  const std::string original = read_file(path);
  std::string text = original;
  if (req.to_fsdp2) {
    ToFsdp2Result r = convert_to_fsdp2(text, path);
    for (const auto& n : r.notes) log_info("to-fsdp2: " + n);
    for (const auto& l : r.lossy) log_warn("to-fsdp2: lossy: " + l);
    if (!r.lossy.empty() && !req.force)
      throw LossyError(str("config update: refusing a lossy FSDP1 -> FSDP2 conversion of ", path,
                           "; nothing was written. Pass --force to accept it"));
    text = r.output;
  }
  ConfigInputs in;
  in.file = path;
  in.text = text;
  in.has_file = true;
  ResolvedConfig rc = load_config_or_throw(in);
  const std::string updated = emit_config_yaml(file_values(rc), "updated by `fsdptrain config update`");
  if (updated == original) return str(path, " is already up to date\n");
  write_file_atomic(path + ".bak", original);
  write_file_atomic(path, updated);
  return str("updated ", path, " (the previous version, with its comments, is in ", path, ".bak)\n");
}

}  // namespace fsdp::config

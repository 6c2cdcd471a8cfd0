// `fsdptrain to-fsdp2`: converts an Accelerate FSDP1 config to FSDP2, lossless or loud.
//
// Unlike `accelerate to-fsdp2` it keeps comments, key order and quoting (the file is edited line
// by line, guided by the YAML parser's positions), maps HYBRID_SHARD(_ZERO2) to an HSDP
// parallelism_config instead of silently sharding over all ranks, maps legacy integers and
// lower-case names, refuses NO_SHARD / LOCAL_STATE_DICT / forward_prefetch: true /
// use_orig_params: false unless forced, keeps FSDP1's checkpoint format explicit, recognises a
// string "2" version, is idempotent, and always produces a file that passes `config validate`.
#pragma once

#include <string>
#include <vector>

namespace fsdp::config {

struct ToFsdp2Result {
  std::string output;              // the converted text (== input when nothing changed)
  bool converted = false;          // false: no fsdp_config, or already FSDP2
  std::vector<std::string> notes;  // what changed and why (printed)
  std::vector<std::string> lossy;  // changes that lose behaviour; refused unless forced
};

// Converts `text` (read from `file`, used in messages). Throws InputError for input that cannot be
// converted (YAML errors, unknown keys, conflicting strategies, a hybrid layout with no
// num_processes). Lossy changes are listed in `lossy` and applied as --force would.
ToFsdp2Result convert_to_fsdp2(const std::string& text, const std::string& file);

struct ToFsdp2Command {
  std::string config_file;
  std::string output_file;
  bool overwrite = false;
  bool dry_run = false;
  bool force = false;
};

// The whole command: checks the arguments as Accelerate does, converts, refuses lossy changes
// without --force (LossyError, exit 3, nothing written), prints a diff to stdout with --dry-run,
// writes atomically otherwise. Returns what to print on success; notes go to stderr.
std::string run_to_fsdp2(const ToFsdp2Command& cmd);

}  // namespace fsdp::config

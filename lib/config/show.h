// Text for `config show` (every resolved value with its origin), `config keys` (the option table
// itself) and `fsdptrain env`.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fsdp::config {

struct ResolvedConfig;

// The (key, value) pairs a config file should hold for this config: every top-level Accelerate
// key, fsdp_config keys of the configured FSDP version (when FSDP) except another wrap policy's
// parameter, parallelism_config only when set, and fsdptrain's own sections when set and
// with_extensions (without them Accelerate loads the file). A file written from them validates
// with no warnings.
std::vector<std::pair<std::string, std::string>> file_values(const ResolvedConfig& rc, bool with_extensions = true);

enum class ShowFormat { kTable, kYaml, kJson };

std::string format_resolved(const ResolvedConfig& rc, ShowFormat format);
// The option table: key, type, default, CLI flag, worker env variable, help; then the environment
// variables that no key sets (util/env.h). Markdown when asked.
std::string format_option_table(bool markdown);

}  // namespace fsdp::config

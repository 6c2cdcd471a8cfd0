// Text for `config show` (every resolved value with its origin), `config keys` (the option table
// itself) and `fsdptrain env`.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fsdp::config {

struct ResolvedConfig;

// The (key, value) pairs a config file should hold for this config, Accelerate-loadable: every
// top-level Accelerate key, fsdp_config keys of the configured FSDP version (when FSDP), and
// parallelism_config and fsdptrain's own keys only when set.
std::vector<std::pair<std::string, std::string>> file_values(const ResolvedConfig& rc);

enum class ShowFormat { kTable, kYaml, kJson };

std::string format_resolved(const ResolvedConfig& rc, ShowFormat format);
// The option table: key, type, default, CLI flag, worker env variable, help. Markdown when asked.
std::string format_option_table(bool markdown);

}  // namespace fsdp::config

// Environment variables. fsdptrain's own settings (every FSDPTRAIN_* variable, and the Accelerate
// variable the config's debug key travels in) are declared here, once, as EnvSetting rows, and read
// only through env_flag, env_text, env_seconds and env_choice: one reader, one set of parsing rules
// (the option table's), each variable read from the environment once per process and kept.
//
// A setting that is also a config key (engine.kernels, dist_timeout, ...) names that key; its row of
// the option table (config/options.cpp) refers to the declaration here, gives its help, and
// `launch` exports the resolved value in the variable. The others (`key` empty) are settings of the
// environment alone, listed after the keys by `fsdptrain config keys`.
//
// The launcher's counts and addresses (RANK, LOCAL_RANK, MASTER_ADDR, ...) are torchrun's contract,
// not settings: env_count and env_or read them. Thread-safe.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp {

enum class EnvKind {
  kFlag,     // true/false, yes/no, on/off, y/n, t/f, 1/0, any case (parse_bool); anything else is false
  kSeconds,  // a number of seconds > 0
  kChoice,   // one of the reader's names, any case; unset: the first
  kText,     // any text (a path, a folder)
};

struct EnvSetting {
  const char* name;  // "FSDPTRAIN_KERNELS"
  EnvKind kind;
  const char* key;   // the option table's key that sets it ("engine.kernels"); "" for the environment's alone
  const char* help;  // for a setting of the environment alone (a key's help is its row's)
};

namespace env {
// Settings of the environment alone.
inline constexpr EnvSetting kConfigFile{"FSDPTRAIN_CONFIG_FILE", EnvKind::kText, "",
                                        "The config file of commands given no --config"};
inline constexpr EnvSetting kDebug{"FSDPTRAIN_DEBUG", EnvKind::kFlag, "",
                                   "As debug: true for any command: LibTorch's C++ backtraces in errors, and the "
                                   "cross-rank check of every collective"};
inline constexpr EnvSetting kPython{"FSDPTRAIN_PYTHON", EnvKind::kText, "",
                                    "A Python interpreter with torch and accelerate, suggested by `launch` when the "
                                    "python3 on PATH lacks them"};
inline constexpr EnvSetting kLaunched{"FSDPTRAIN_LAUNCHED", EnvKind::kFlag, "",
                                      "Set by `launch` in each worker: the launcher prefixes the worker's lines with "
                                      "its rank, so the worker does not"};
inline constexpr EnvSetting kProgress{"FSDPTRAIN_PROGRESS", EnvKind::kFlag, "",
                                      "Set by `launch` in each worker, true when its output is a terminal: the "
                                      "trainer draws a live progress line"};
// Settings of a config key, which `launch` exports to every worker.
inline constexpr EnvSetting kAccelerateDebug{"ACCELERATE_DEBUG_MODE", EnvKind::kFlag, "debug", ""};
inline constexpr EnvSetting kDistTimeout{"FSDPTRAIN_DIST_TIMEOUT", EnvKind::kSeconds, "dist_timeout", ""};
inline constexpr EnvSetting kVerbose{"FSDPTRAIN_VERBOSE", EnvKind::kFlag, "logging.verbose", ""};
inline constexpr EnvSetting kKernels{"FSDPTRAIN_KERNELS", EnvKind::kChoice, "engine.kernels", ""};
inline constexpr EnvSetting kOnednnProducts{"FSDPTRAIN_ONEDNN_PRODUCTS", EnvKind::kChoice, "engine.onednn_products",
                                            ""};
inline constexpr EnvSetting kFloat8{"FSDPTRAIN_FLOAT8", EnvKind::kChoice, "engine.float8", ""};
inline constexpr EnvSetting kFloat8AllGather{"FSDPTRAIN_FLOAT8_ALL_GATHER", EnvKind::kFlag, "engine.float8_all_gather",
                                             ""};
inline constexpr EnvSetting kReadAhead{"FSDPTRAIN_READ_AHEAD", EnvKind::kChoice, "engine.read_ahead", ""};
inline constexpr EnvSetting kHostCache{"FSDPTRAIN_HOST_CACHE", EnvKind::kFlag, "engine.host_cache", ""};
inline constexpr EnvSetting kOffloadOverlap{"FSDPTRAIN_OFFLOAD_OVERLAP", EnvKind::kFlag, "engine.offload_overlap", ""};
inline constexpr EnvSetting kOffloadKeepOnDevice{"FSDPTRAIN_OFFLOAD_KEEP_ON_DEVICE", EnvKind::kFlag,
                                                 "engine.offload_keep_on_device", ""};
inline constexpr EnvSetting kSyncDebug{"FSDPTRAIN_SYNC_DEBUG", EnvKind::kFlag, "engine.sync_debug", ""};
inline constexpr EnvSetting kDumpGradients{"FSDPTRAIN_DUMP_GRADIENTS", EnvKind::kText, "engine.dump_gradients", ""};
}  // namespace env

// The parsing rules, the option table's (config/options.cpp) as well as the reader's: a boolean
// (true/false, yes/no, on/off, y/n, t/f, 1/0; any case, spaces around ignored), and the index of
// `word` among `names` compared in any case.
std::optional<bool> parse_bool(std::string_view text);
std::optional<size_t> find_any_case(const std::vector<std::string>& names, std::string_view word);

// Every declaration above, in that order.
const std::vector<const EnvSetting*>& env_settings();

// The readers, each for its kind (asserted). Unset and empty are the same.
bool env_flag(const EnvSetting& s);                      // unset: false
std::string env_text(const EnvSetting& s);               // unset: ""
std::optional<double> env_seconds(const EnvSetting& s);  // unset: nullopt; throws InputError otherwise
// The index of the value among `names`; unset: 0. Throws InputError
// "[env] NAME="x": expected one of a, b, c".
int env_choice(const EnvSetting& s, const std::vector<std::string>& names);
template <size_t N>
int env_choice(const EnvSetting& s, const std::array<const char*, N>& names) {
  return env_choice(s, std::vector<std::string>(names.begin(), names.end()));
}

// debug: true (exported as ACCELERATE_DEBUG_MODE) or FSDPTRAIN_DEBUG: LibTorch's backtraces in
// errors, and the cross-rank check of every collective. Never throws (it is read while an error prints).
bool debug_requested();

// The launcher's variables: the value; `fallback` when it is unset or empty.
std::string env_or(const char* name, const std::string& fallback);
// A count the launcher sets (RANK, LOCAL_RANK, MASTER_PORT, ...): a whole number >= 0; `fallback`
// when unset or empty. Throws InputError "[env] NAME="x" is not a whole number >= 0".
int env_count(const char* name, int fallback);

}  // namespace fsdp

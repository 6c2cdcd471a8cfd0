// The option table: every configurable value of fsdptrain declared once — its YAML key, CLI flag,
// the environment variable exported to workers, type, allowed values, default and help — and
// bound to the member of Config it fills. --help, `config show`, `config keys`, validation, the
// wizard and the worker environment are all generated from this table (options.cpp).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"

namespace fsdp::config {

// A place in a config file, 1-based; line 0 means "not from a file".
struct Mark {
  std::string file;
  int line = 0;
  int col = 0;
};

// kScheduler: read from a job scheduler's environment (SLURM_NODEID, ...), detail names the variable.
enum class OriginKind { kDefault, kFile, kSet, kFlag, kDerived, kScheduler };

// Where a resolved value came from. `detail` is the flag as typed ("--num_processes") or the
// --set argument ("--set num_processes=4"); `mark` is the file position for kFile.
struct Origin {
  OriginKind kind = OriginKind::kDefault;
  Mark mark;
  std::string detail;

  // "default", "configs/x.yaml:3:1", "--set num_processes=4", "--num_processes", "derived: ..."
  std::string describe() const;
};

// A value before type checking, as written: one scalar's text, a sequence of scalars, or null.
struct RawValue {
  enum class Shape { kNull, kScalar, kSequence, kMap };
  Shape shape = Shape::kNull;
  std::string text;                // kScalar
  std::vector<std::string> items;  // kSequence
  // kMap whose values are all scalars (lora.rank_pattern: {q_proj: 16}): its entries in the file's order.
  std::vector<std::pair<std::string, std::string>> entries;
  bool quoted = false;             // a quoted scalar ("true" in quotes is still accepted as a bool)
  Origin origin;
};

enum class ValueType {
  kBool,  // true/false, yes/no, on/off, 1/0 (any case) — YAML 1.1 spellings included
  kInt,   // integers; 1e8 and 1.0e+8 accepted when integral
  kFloat,
  kString,
  kEnum,     // one of `choices`, any case; legacy integers 1..N when `int_aliases`
  kList,     // comma-separated string or a YAML sequence; canonical form "A,B"
  kGpuIds,   // "all" or comma-separated device indices; `gpu_ids: 0` (an int) accepted
  kMap,      // scalars by name (lora.rank_pattern: {q_proj: 16}), read by the spec's parse; canonical: JSON text
  kIgnored,  // accepted for compatibility with Accelerate and ignored (TPU, SageMaker, dynamo keys)
};

enum class FsdpVersions { kAny, kV1Only, kV2Only };

// The parts of fsdptrain that read an option (a bit set). An option with an `env` variable also
// reaches the programs `launch` runs; one that neither part reads only reaches them.
enum Consumer : unsigned {
  kLauncher = 1,  // lib/launch: processes, rendezvous, supervision, pinning
  kTrainer = 2,   // the built-in trainer and the engine it drives (lib/train, lib/fsdp, lib/ckpt)
};

struct OptionSpec {
  std::string key;   // dotted YAML key: "num_processes", "fsdp_config.fsdp_offload_params"
  std::string flag;  // CLI flag without dashes ("" = none); --a_b and --a-b both work
  bool flag_alone = false;  // the flag may come without a value, meaning "true" (always so for kBool)
  std::string env;   // variable exported to each worker ("" = none)
  ValueType type = ValueType::kString;
  std::vector<std::string> choices;  // kEnum canonical spellings
  bool int_aliases = false;          // kEnum: 1..N select choices[0..N-1] (Accelerate's legacy ints)
  // Values Accelerate knows but fsdptrain refuses, with the reason (upper-cased value -> reason).
  std::vector<std::pair<std::string, std::string>> unsupported;
  std::optional<long long> min_value, max_value;  // kInt bounds
  std::string default_value;                      // canonical text; "" = unset
  std::string default_note;  // shown instead of default_value when the default depends on other keys
  std::string help;
  FsdpVersions versions = FsdpVersions::kAny;
  // fsdptrain's own key: Accelerate rejects it in a file, so files we write omit it unless set.
  bool extension = false;
  unsigned used_by = 0;  // Consumer bits; 0 for ignored keys and for those only programs read
  // Writes the canonical value into Config. Called for every option, with "" when unset.
  std::function<void(Config&, const std::string&)> apply;
  // Whether two Configs hold the same value in the field `apply` writes (rows bound to one field).
  std::function<bool(const Config&, const Config&)> same_field;
  // Optional: a parser that replaces the one of `type` (returns canonical text or sets *error).
  std::function<std::optional<std::string>(const RawValue&, std::string* error)> parse;

  std::string section() const;  // "fsdp_config" for "fsdp_config.fsdp_version", "" for top level
  std::string leaf() const;     // "fsdp_version"
  std::string type_name() const;
};

struct ResolvedConfig;

// Keys set in `rc` that the built-in trainer does not act on (only programs read them), each with
// what to do instead: printed as warnings by `launch` when it runs the trainer.
std::vector<std::string> unused_by_trainer(const ResolvedConfig& rc);

// The whole table, in the order `config show` and --help print it.
const std::vector<OptionSpec>& all_options();
const OptionSpec* find_option(const std::string& key);
const OptionSpec* find_option_by_flag(const std::string& flag);  // "num_processes" or "num-processes"

// The nested sections that hold keys ("fsdp_config", "parallelism_config", ...), in table order.
std::vector<std::string> option_sections();

// Turns a raw value into the option's canonical text, or returns nullopt and sets *error to
// "expected ..., got ..." (without location; the caller adds it).
std::optional<std::string> canonicalize(const OptionSpec& spec, const RawValue& raw, std::string* error);

// Parses a boolean spelling (true/false, yes/no, on/off, y/n, t/f, 1/0; any case).
std::optional<bool> parse_bool(const std::string& text);

}  // namespace fsdp::config

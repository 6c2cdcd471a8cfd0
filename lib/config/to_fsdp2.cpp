#include "config/to_fsdp2.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <optional>

#include "config/loader.h"
#include "config/option.h"
#include "util/error.h"
#include "util/files.h"
#include "util/log.h"
#include "util/strings.h"
#include "util/text_diff.h"

namespace fsdp::config {

namespace {

struct Lines {
  std::vector<std::string> v;
  bool trailing_newline = true;
  static Lines from(const std::string& text) {
    Lines l;
    l.v = split(text, '\n');
    l.trailing_newline = !text.empty() && text.back() == '\n';
    if (l.trailing_newline) l.v.pop_back();
    return l;
  }
};

size_t indent_of(const std::string& line) {
  size_t i = 0;
  while (i < line.size() && line[i] == ' ') ++i;
  return i;
}

bool blank_or_comment(const std::string& line) {
  std::string t = trim(line);
  return t.empty() || t[0] == '#';
}

// The " # comment" at the end of a "key: value" line, outside quotes ("" if none).
std::string trailing_comment(const std::string& line) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '#' && i > 0 && (line[i - 1] == ' ' || line[i - 1] == '\t')) {
      size_t b = i;
      while (b > 0 && (line[b - 1] == ' ' || line[b - 1] == '\t')) --b;
      return line.substr(b);
    }
  }
  return "";
}

// One key of fsdp_config as written.
struct Entry {
  std::string raw_key;  // as written ("sharding_strategy")
  std::string key;      // normalised ("fsdp_sharding_strategy")
  YAML::Node value;
  size_t line = 0;  // 0-based line of the key
  size_t col = 0;   // 0-based column of the key
  size_t end = 0;   // one past the last line of its value
};

std::string where(const std::string& file, size_t line, size_t col) {
  return str(file, ":", line + 1, ":", col + 1);
}

// The entry's value in the option table's canonical form ("" for null), read by the same parser the
// loader uses, so every spelling the loader accepts converts and every error reads the same.
std::string canonical_value(const Entry& e, const std::string& file) {
  const OptionSpec* spec = find_option("fsdp_config." + e.key);
  FSDP_ASSERT(spec, e.key);
  std::string error;
  std::optional<std::string> v = canonicalize(*spec, raw_value_from_yaml(e.value, Origin{}), &error);
  if (!v) throw InputError(str(where(file, e.line, e.col), ": fsdp_config.", e.raw_key, ": ", error));
  return *v;
}

// One conversion in progress: the file's lines, its fsdp_config entries, and the edits so far.
// Each step below reads or adds to it; assemble() applies the edits.
struct Conversion {
  std::string file;
  YAML::Node root;
  Lines lines;
  std::vector<Entry> entries;
  std::string key_indent;
  std::map<size_t, std::vector<std::string>> replace;  // line -> replacement lines (empty = delete)
  std::vector<std::string> appended_fsdp;              // new keys at the end of fsdp_config
  std::vector<std::string> appended_top;               // a new parallelism_config
  const Entry* strategy_entry = nullptr;               // fsdp_sharding_strategy
  const Entry* reshard_entry = nullptr;                // fsdp_reshard_after_forward
  std::optional<std::pair<int, int>> hsdp;             // (replicate, shard)
  ToFsdp2Result result;

  const Entry* find(const std::string& key) const {
    for (const auto& e : entries)
      if (e.key == key) return &e;
    return nullptr;
  }
  void rewrite_line(const Entry& e, const std::string& new_key, const std::string& new_value) {
    replace[e.line] = {key_indent + new_key + ": " + new_value + trailing_comment(lines.v[e.line])};
  }
  void rename_only(const Entry& e, const std::string& new_key) {
    if (e.raw_key == new_key) return;
    const std::string& old = lines.v[e.line];
    replace[e.line] = {old.substr(0, e.col) + new_key + old.substr(e.col + e.raw_key.size())};
    result.notes.push_back(str("fsdp_config.", e.raw_key, " -> ", new_key, " (full key name)"));
  }
  void erase(const Entry& e) {
    for (size_t l = e.line; l < e.end; ++l) replace[l] = {};
  }
  void drop(const Entry& e, const std::string& why) {
    erase(e);
    result.notes.push_back(str("fsdp_config.", e.raw_key, " removed: ", why));
  }
};

// The parsed file, or nothing (with a note) when there is no fsdp_config to convert.
std::optional<YAML::Node> parse_fsdp_block(Conversion& c, const std::string& text) {
  try {
    c.root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(str(c.file, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg));
  }
  if (!c.root.IsDefined() || c.root.IsNull()) throw InputError(c.file + ": the config file is empty");
  if (!c.root.IsMap()) throw InputError(c.file + ": expected a mapping of keys at the top of the file");
  YAML::Node fsdp = c.root["fsdp_config"];
  if (!fsdp.IsDefined() || fsdp.IsNull() || (fsdp.IsMap() && fsdp.size() == 0)) {
    c.result.notes.push_back("no fsdp_config in the file: nothing to convert");
    return std::nullopt;
  }
  if (!fsdp.IsMap()) throw InputError(c.file + ": fsdp_config: expected a mapping of keys");
  if (fsdp.Style() == YAML::EmitterStyle::Flow)
    throw InputError(
        where(c.file, fsdp.Mark().line, fsdp.Mark().column) +
        ": fsdp_config: written in flow style ({...}); rewrite it as a block mapping (one key per line) so "
        "the conversion can keep comments and order");
  return fsdp;
}

// Where an entry's lines end: its value's continuation lines are more indented than the key, or an
// indentless "- item" sequence at the key's indentation.
size_t end_of_entry(const Lines& lines, const Entry& e) {
  size_t last = e.line;
  for (size_t l = e.line + 1; l < lines.v.size(); ++l) {
    const std::string& s = lines.v[l];
    if (blank_or_comment(s)) continue;
    const size_t ind = indent_of(s);
    if (!(ind > e.col || (ind == e.col && starts_with(trim(s), "- ")))) break;
    last = l;
  }
  return last + 1;
}

void read_entries(Conversion& c, const YAML::Node& fsdp) {
  for (const auto& kv : fsdp) {
    Entry e;
    e.raw_key = kv.first.Scalar();
    e.key = starts_with(e.raw_key, "fsdp_") ? e.raw_key : "fsdp_" + e.raw_key;
    if (e.key == "fsdp_backward_prefetch_policy") e.key = "fsdp_backward_prefetch";
    e.value = kv.second;
    e.line = kv.first.Mark().line;
    e.col = kv.first.Mark().column;
    if (const Entry* other = c.find(e.key))
      throw InputError(str(where(c.file, e.line, e.col), ": fsdp_config.", e.raw_key,
                           ": duplicate key (first written at line ", other->line + 1, "); keep one of them"));
    e.end = end_of_entry(c.lines, e);
    c.entries.push_back(e);
  }
  c.key_indent = std::string(c.entries.front().col, ' ');
  c.strategy_entry = c.find("fsdp_sharding_strategy");
  c.reshard_entry = c.find("fsdp_reshard_after_forward");
}

// The strategy FSDP1 runs: fsdp_sharding_strategy, else what fsdp_reshard_after_forward names
// (a strategy, or FSDP1's boolean). Throws when the two keys name different strategies.
std::optional<ShardingStrategy> effective_strategy(Conversion& c) {
  std::optional<ShardingStrategy> strategy;
  if (c.strategy_entry)
    strategy = enum_from_name<ShardingStrategy>(canonical_value(*c.strategy_entry, c.file), kShardingStrategyNames);
  if (!c.reshard_entry) return strategy;
  const Entry& r = *c.reshard_entry;
  const std::string v = canonical_value(r, c.file);
  const bool is_bool = v == "true" || v == "false";
  std::optional<ShardingStrategy> named = enum_from_name<ShardingStrategy>(v, kShardingStrategyNames);
  if (const std::optional<long long> n = parse_int(v); !named && n) named = strategy_numbered(*n);
  if (strategy && named && *named != *strategy)
    throw InputError(str(where(c.file, r.line, r.col), ": fsdp_config.", r.raw_key, ": names the strategy ",
                         enum_name(*named, kShardingStrategyNames), " but fsdp_sharding_strategy is ",
                         enum_name(*strategy, kShardingStrategyNames), "; keep one of the two keys"));
  if (strategy && is_bool)
    c.result.notes.push_back(
        str("fsdp_config.", r.raw_key, ": FSDP1 ignored this boolean; the strategy in fsdp_sharding_strategy decides"));
  if (!strategy && named) return named;
  if (!strategy && is_bool) return v == "true" ? ShardingStrategy::kFullShard : ShardingStrategy::kShardGradOp;
  return strategy;
}

// HYBRID_SHARD(_ZERO2) -> one replica per machine; NO_SHARD -> every rank a replica (lossy).
void plan_replication(Conversion& c, ShardingStrategy strategy) {
  const bool hybrid = is_hybrid(strategy);
  if (!hybrid && strategy != ShardingStrategy::kNoShard) return;
  YAML::Node np = c.root["num_processes"];
  YAML::Node nm = c.root["num_machines"];
  std::optional<long long> procs = np.IsDefined() && np.IsScalar() ? parse_int(np.Scalar()) : std::nullopt;
  std::optional<long long> machines = nm.IsDefined() && nm.IsScalar() ? parse_int(nm.Scalar()) : 1LL;
  const char* name = enum_name(strategy, kShardingStrategyNames);
  if (!procs || *procs < 1 || !machines || *machines < 1 || *procs % *machines != 0)
    throw InputError(str(c.file, ": fsdp_config: ", name,
                         " needs num_processes (and num_machines) in the file to derive the FSDP2 layout; add "
                         "num_processes: N (the total across all machines)"));
  if (hybrid) {
    c.hsdp = std::make_pair(static_cast<int>(*machines), static_cast<int>(*procs / *machines));
    c.result.notes.push_back(str(name, " -> HSDP: parallelism_config dp_replicate_size ", c.hsdp->first,
                                 " (one replica per machine) x dp_shard_size ", c.hsdp->second,
                                 " (accelerate to-fsdp2 would silently shard over all ranks)"));
    return;
  }
  c.hsdp = std::make_pair(static_cast<int>(*procs), 1);
  c.result.lossy.push_back(
      str("NO_SHARD has no FSDP2 equivalent: FSDP2 cannot skip sharding; the closest layout is "
          "parallelism_config dp_replicate_size ",
          *procs,
          " x dp_shard_size 1 (every rank keeps a full copy); accelerate to-fsdp2 writes "
          "reshard_after_forward: false, which shards parameters, gradients and optimizer state"));
}

// The strategy keys become one fsdp_reshard_after_forward line, where the first of them was.
void convert_strategy(Conversion& c) {
  const std::optional<ShardingStrategy> strategy = effective_strategy(c);
  if (!strategy) return;
  const std::string reshard_value = reshards_after_forward(*strategy) ? "true" : "false";
  plan_replication(c, *strategy);
  const Entry* s = c.strategy_entry;
  const Entry* r = c.reshard_entry;
  const Entry* keep = s && r ? (s->line < r->line ? s : r) : (s ? s : r);
  c.rewrite_line(*keep, "fsdp_reshard_after_forward", reshard_value);
  c.result.notes.push_back(
      str(enum_name(*strategy, kShardingStrategyNames), " -> fsdp_reshard_after_forward: ", reshard_value));
  for (const Entry* other : {s, r})
    if (other && other != keep) c.erase(*other);
}

std::string scalar_of(const Entry& e) {
  return e.value.IsScalar() ? trim(e.value.Scalar()) : "";
}

// ---- The rules for FSDP1 keys, one per key; keys not listed are renamed to their full name. ----

void rule_version(Conversion& c, const Entry& e) {
  c.rewrite_line(e, "fsdp_version", "2");
}

void rule_backward_prefetch(Conversion& c, const Entry& e) {
  c.drop(e, "FSDP2 always prefetches the next unit's all-gather in backward");
}

void rule_sync_module_states(Conversion& c, const Entry& e) {
  c.drop(e, "FSDP2 has no such switch (with fsdp_cpu_ram_efficient_loading, rank 0 reads and the others receive)");
}

// A boolean FSDP2 does not have: dropped, and lossy when it held `lost` (FSDP2 behaves as the other value).
void drop_bool(Conversion& c, const Entry& e, bool lost, const std::string& lossy, const std::string& why) {
  if (parse_bool(scalar_of(e)) == lost) c.result.lossy.push_back(lossy);
  c.drop(e, why);
}

void rule_use_orig_params(Conversion& c, const Entry& e) {
  drop_bool(c, e, false,
            "fsdp_use_orig_params: false cannot be kept: FSDP2 always exposes the original parameters (no "
            "flattened parameters)",
            "FSDP2 always uses the original parameters");
}

void rule_forward_prefetch(Conversion& c, const Entry& e) {
  drop_bool(c, e, true,
            "fsdp_forward_prefetch: true cannot be kept: FSDP2 has no forward-prefetch switch (it overlaps the "
            "next unit's all-gather by itself)",
            "FSDP2 has no forward-prefetch switch");
}

// Null means FSDP1's default, which is written out so the format does not change silently.
void rule_state_dict_type(Conversion& c, const Entry& e) {
  std::string name = canonical_value(e, c.file);
  if (name.empty()) name = "FULL_STATE_DICT";
  const StateDictType sdt = *enum_from_name<StateDictType>(name, kStateDictTypeNames);
  if (sdt == StateDictType::kLocalStateDict) {
    c.result.lossy.push_back(
        "LOCAL_STATE_DICT does not exist in FSDP2; SHARDED_STATE_DICT (per-rank files that "
        "reshard to any world size) replaces it");
    c.rewrite_line(e, "fsdp_state_dict_type", "SHARDED_STATE_DICT");
  } else if (scalar_of(e) != name || e.raw_key != e.key) {
    c.rewrite_line(e, "fsdp_state_dict_type", name);
    c.result.notes.push_back(str("fsdp_config.", e.raw_key, ": ", scalar_of(e), " -> ", name));
  }
}

struct KeyRule {
  const char* key;
  void (*apply)(Conversion&, const Entry&);
};
constexpr KeyRule kKeyRules[] = {
    {"fsdp_version", rule_version},
    {"fsdp_backward_prefetch", rule_backward_prefetch},
    {"fsdp_sync_module_states", rule_sync_module_states},
    {"fsdp_use_orig_params", rule_use_orig_params},
    {"fsdp_forward_prefetch", rule_forward_prefetch},
    {"fsdp_state_dict_type", rule_state_dict_type},
};

// A key FSDP2 shares keeps its value under its full name; anything else is refused.
void rule_other(Conversion& c, const Entry& e) {
  if (const OptionSpec* spec = find_option("fsdp_config." + e.key); spec && spec->versions != FsdpVersions::kV1Only) {
    c.rename_only(e, e.key);
    return;
  }
  std::vector<std::string> known;
  for (const auto& o : all_options())
    if (o.section() == "fsdp_config") known.push_back(o.leaf());
  auto near = closest_match(e.key, known);
  throw InputError(str(where(c.file, e.line, e.col), ": fsdp_config.", e.raw_key, ": unknown key",
                       near ? " (did you mean " + *near + "?)" : std::string(),
                       "; fix it before converting (accelerate to-fsdp2 would copy it and FSDP2 would ignore it)"));
}

void convert_keys(Conversion& c) {
  for (const auto& e : c.entries) {
    if (&e == c.strategy_entry || &e == c.reshard_entry) continue;
    auto rule =
        std::find_if(std::begin(kKeyRules), std::end(kKeyRules), [&](const KeyRule& r) { return e.key == r.key; });
    (rule == std::end(kKeyRules) ? rule_other : rule->apply)(c, e);
  }
}

void append_parallelism(Conversion& c);

// Whether an entry of an FSDP2 file is FSDP1's: a key FSDP2 does not have, or a strategy name
// where FSDP2 expects reshard_after_forward's boolean or number of ranks (partial resharding).
bool is_stray_fsdp1(Conversion& c, const Entry& e) {
  if (e.key == "fsdp_reshard_after_forward") {
    const std::string v = canonical_value(e, c.file);
    return v != "true" && v != "false" && !v.empty() && !parse_int(v);
  }
  const OptionSpec* spec = find_option("fsdp_config." + e.key);
  return spec != nullptr && spec->versions == FsdpVersions::kV1Only;
}

// An FSDP2 file holding FSDP1 keys (what `config validate` sends here): the strategy becomes
// reshard_after_forward unless that boolean is already there (and agrees), the other keys go
// by their rules; the FSDP2 keys stay as they are.
void convert_stray_fsdp1_keys(Conversion& c) {
  const Entry* s = c.strategy_entry;
  const Entry* r = c.reshard_entry;
  const bool reshard_is_bool = r && !is_stray_fsdp1(c, *r);
  if (s && reshard_is_bool) {
    const ShardingStrategy strategy =
        *enum_from_name<ShardingStrategy>(canonical_value(*s, c.file), kShardingStrategyNames);
    const bool reshard = canonical_value(*r, c.file) != "false";  // true, or N ranks: it reshards
    if (reshards_after_forward(strategy) != reshard || is_hybrid(strategy))
      throw InputError(str(where(c.file, s->line, s->col), ": fsdp_config.", s->raw_key, ": ",
                           enum_name(strategy, kShardingStrategyNames), " disagrees with fsdp_reshard_after_forward: ",
                           reshard ? "true" : "false", " in this FSDP2 file; remove the one you do not mean"));
    c.drop(*s, "FSDP2 reads fsdp_reshard_after_forward, which says the same");
  } else if (s || r) {
    convert_strategy(c);
  }
  for (const auto& e : c.entries) {
    if (&e == c.strategy_entry || &e == c.reshard_entry || !is_stray_fsdp1(c, e)) continue;
    auto rule =
        std::find_if(std::begin(kKeyRules), std::end(kKeyRules), [&](const KeyRule& k) { return e.key == k.key; });
    if (rule != std::end(kKeyRules)) rule->apply(c, e);
  }
  if (c.hsdp) append_parallelism(c);
}

// fsdp_version and FSDP1's checkpoint format written out; HSDP's parallelism_config added.
void append_missing(Conversion& c) {
  if (!c.find("fsdp_version")) c.appended_fsdp.push_back(c.key_indent + "fsdp_version: 2");
  if (!c.find("fsdp_state_dict_type")) {
    c.appended_fsdp.push_back(c.key_indent + "fsdp_state_dict_type: FULL_STATE_DICT");
    c.result.notes.push_back(
        "fsdp_state_dict_type: FULL_STATE_DICT written explicitly (FSDP1's default; FSDP2's "
        "default would silently switch checkpoints to SHARDED_STATE_DICT)");
  }
  if (c.hsdp) append_parallelism(c);
}

void append_parallelism(Conversion& c) {
  YAML::Node pc = c.root["parallelism_config"];
  if (pc.IsDefined() && !pc.IsNull() && !(pc.IsMap() && pc.size() == 0))
    throw InputError(str(c.file,
                         ": parallelism_config: already present; remove it or the hybrid fsdp_sharding_strategy, "
                         "the conversion writes it"));
  c.appended_top = {"parallelism_config:", str("  parallelism_config_dp_replicate_size: ", c.hsdp->first),
                    str("  parallelism_config_dp_shard_size: ", c.hsdp->second)};
}

// The edited text: new fsdp_config keys, then a new parallelism_config, right after the
// fsdp_config block so related settings stay together.
std::string assemble(const Conversion& c) {
  const size_t block_end = c.entries.back().end;
  std::vector<std::string> appended = c.appended_fsdp;
  appended.insert(appended.end(), c.appended_top.begin(), c.appended_top.end());
  std::vector<std::string> out;
  for (size_t l = 0; l < c.lines.v.size(); ++l) {
    if (l == block_end) out.insert(out.end(), appended.begin(), appended.end());
    auto it = c.replace.find(l);
    if (it == c.replace.end())
      out.push_back(c.lines.v[l]);
    else
      out.insert(out.end(), it->second.begin(), it->second.end());
  }
  if (block_end >= c.lines.v.size()) out.insert(out.end(), appended.begin(), appended.end());
  std::string text = join(out, "\n");
  if (c.lines.trailing_newline || !text.empty()) text += "\n";
  return text;
}

// The result must validate; if it does not, the input had problems conversion cannot fix.
// A file without num_processes (SLURM job scripts pass it to the launcher) is checked with one
// process per machine standing in: the conversion does not depend on it.
void check_converted(const std::string& text, const std::string& file) {
  ConfigInputs in;
  in.file = file + " (converted)";
  in.text = text;
  in.has_file = true;
  const YAML::Node root = YAML::Load(text);
  if (!root["num_processes"]) {
    const YAML::Node machines = root["num_machines"];
    in.sets.push_back("num_processes=" + (machines && machines.IsScalar() ? machines.Scalar() : std::string("1")));
  }
  Diagnostics diags;
  load_config(in, diags);
  if (diags.has_errors())
    throw InputError(
        str("the converted config does not validate; fix these in ", file, " first:\n", join(diags.errors(), "\n")));
}

// The edited text, checked to validate.
ToFsdp2Result finish(Conversion& c, const std::string& note) {
  c.result.output = assemble(c);
  c.result.converted = true;
  c.result.notes.push_back(note);
  check_converted(c.result.output, c.file);
  return c.result;
}

}  // namespace

ToFsdp2Result convert_to_fsdp2(const std::string& text, const std::string& file) {
  Conversion c;
  c.file = file;
  c.result.output = text;
  const std::optional<YAML::Node> fsdp = parse_fsdp_block(c, text);
  if (!fsdp) return c.result;
  c.lines = Lines::from(text);
  read_entries(c, *fsdp);
  // A string "2" counts (Accelerate compares to the int and converts again).
  if (const Entry* v = c.find("fsdp_version"); v && v->value.IsScalar() && trim(v->value.Scalar()) == "2") {
    const bool stray =
        std::any_of(c.entries.begin(), c.entries.end(), [&](const Entry& e) { return is_stray_fsdp1(c, e); });
    if (!stray) {
      c.result.notes.push_back("fsdp_config.fsdp_version is already 2: nothing to convert");
      return c.result;
    }
    convert_stray_fsdp1_keys(c);
    return finish(c, "FSDP1 keys removed from an FSDP2 file");
  }
  convert_strategy(c);
  convert_keys(c);
  append_missing(c);
  return finish(c, "fsdp_version: 1 -> 2");
}

std::string run_to_fsdp2(const ToFsdp2Command& cmd) {
  FSDP_CHECK(!cmd.config_file.empty(), "to-fsdp2: --config_file is required");
  FSDP_CHECK(file_exists(cmd.config_file), "to-fsdp2: config file ", cmd.config_file, " not found");
  FSDP_CHECK(cmd.overwrite || !cmd.output_file.empty() || cmd.dry_run,
             "to-fsdp2: pass --output_file NEW.yaml, or --overwrite to rewrite ", cmd.config_file, " in place");
  const std::string out_path = cmd.output_file.empty() ? cmd.config_file : cmd.output_file;
  FSDP_CHECK(cmd.dry_run || cmd.overwrite || !file_exists(out_path), "to-fsdp2: ", out_path,
             " already exists; pass --overwrite to replace it");

  const std::string text = read_file(cmd.config_file);
  ToFsdp2Result r = convert_to_fsdp2(text, cmd.config_file);
  for (const auto& n : r.notes) log_info("to-fsdp2: " + n);
  for (const auto& l : r.lossy) log_warn("to-fsdp2: lossy: " + l);
  if (cmd.dry_run) {
    std::string diff = unified_diff(text, r.output, cmd.config_file, out_path);
    std::cout << (diff.empty() ? "# no changes\n" : diff) << std::flush;
  }
  if (!r.lossy.empty() && !cmd.force)
    throw LossyError(str("to-fsdp2: refusing a lossy conversion of ", cmd.config_file, " (", r.lossy.size(),
                         " change(s) above); nothing was written. Pass --force to accept them"));
  if (cmd.dry_run) return "";
  write_file_atomic(out_path, r.output);
  return str("wrote ", out_path, r.converted ? " (FSDP2)" : " (unchanged)", "\n");
}

}  // namespace fsdp::config

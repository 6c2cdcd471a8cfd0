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

}  // namespace

ToFsdp2Result convert_to_fsdp2(const std::string& text, const std::string& file) {
  ToFsdp2Result result;
  result.output = text;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(str(file, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) throw InputError(file + ": the config file is empty");
  if (!root.IsMap()) throw InputError(file + ": expected a mapping of keys at the top of the file");
  YAML::Node fsdp = root["fsdp_config"];
  if (!fsdp.IsDefined() || fsdp.IsNull() || (fsdp.IsMap() && fsdp.size() == 0)) {
    result.notes.push_back("no fsdp_config in the file: nothing to convert");
    return result;
  }
  if (!fsdp.IsMap()) throw InputError(file + ": fsdp_config: expected a mapping of keys");
  if (fsdp.Style() == YAML::EmitterStyle::Flow)
    throw InputError(
        where(file, fsdp.Mark().line, fsdp.Mark().column) +
        ": fsdp_config: written in flow style ({...}); rewrite it as a block mapping (one key per line) so "
        "the conversion can keep comments and order");

  Lines lines = Lines::from(text);
  std::vector<Entry> entries;
  for (const auto& kv : fsdp) {
    Entry e;
    e.raw_key = kv.first.Scalar();
    e.key = starts_with(e.raw_key, "fsdp_") ? e.raw_key : "fsdp_" + e.raw_key;
    if (e.key == "fsdp_backward_prefetch_policy") e.key = "fsdp_backward_prefetch";
    e.value = kv.second;
    e.line = kv.first.Mark().line;
    e.col = kv.first.Mark().column;
    for (const auto& other : entries)
      if (other.key == e.key)
        throw InputError(str(where(file, e.line, e.col), ": fsdp_config.", e.raw_key,
                             ": duplicate key (first written at line ", other.line + 1, "); keep one of them"));
    entries.push_back(e);
  }
  // Where each entry's lines end: the value's continuation lines are more indented than the key,
  // or an indentless "- item" sequence at the key's indentation.
  for (auto& e : entries) {
    size_t l = e.line + 1;
    size_t last = e.line;
    while (l < lines.v.size()) {
      const std::string& s = lines.v[l];
      if (blank_or_comment(s)) {
        ++l;
        continue;
      }
      size_t ind = indent_of(s);
      if (ind > e.col || (ind == e.col && starts_with(trim(s), "- "))) {
        last = l++;
        continue;
      }
      break;
    }
    e.end = last + 1;
  }
  const size_t block_end = entries.back().end;
  const std::string key_indent(entries.front().col, ' ');

  // Version: a string "2" counts (Accelerate compares to the int and converts again).
  for (const auto& e : entries) {
    if (e.key == "fsdp_version" && e.value.IsScalar() && trim(e.value.Scalar()) == "2") {
      result.notes.push_back("fsdp_config.fsdp_version is already 2: nothing to convert");
      return result;
    }
  }

  std::map<size_t, std::vector<std::string>> replace;  // line -> replacement lines (empty = delete)
  std::vector<std::string> appended_fsdp;              // new keys at the end of fsdp_config
  auto rewrite_line = [&](const Entry& e, const std::string& new_key, const std::string& new_value) {
    const std::string& old = lines.v[e.line];
    replace[e.line] = {key_indent + new_key + ": " + new_value + trailing_comment(old)};
  };
  auto rename_only = [&](const Entry& e, const std::string& new_key) {
    if (e.raw_key == new_key) return;
    const std::string& old = lines.v[e.line];
    replace[e.line] = {old.substr(0, e.col) + new_key + old.substr(e.col + e.raw_key.size())};
    result.notes.push_back(str("fsdp_config.", e.raw_key, " -> ", new_key, " (full key name)"));
  };
  auto drop = [&](const Entry& e, const std::string& why) {
    for (size_t l = e.line; l < e.end; ++l) replace[l] = {};
    result.notes.push_back(str("fsdp_config.", e.raw_key, " removed: ", why));
  };

  // The sharding strategy, wherever Accelerate's users wrote it.
  const Entry* strategy_entry = nullptr;
  const Entry* reshard_entry = nullptr;
  bool have_state_dict = false, have_version = false;
  for (const auto& e : entries) {
    if (e.key == "fsdp_sharding_strategy") strategy_entry = &e;
    if (e.key == "fsdp_reshard_after_forward") reshard_entry = &e;
    if (e.key == "fsdp_state_dict_type") have_state_dict = true;
    if (e.key == "fsdp_version") have_version = true;
  }
  std::optional<ShardingStrategy> strategy;
  if (strategy_entry)
    strategy = enum_from_name<ShardingStrategy>(canonical_value(*strategy_entry, file), kShardingStrategyNames);
  if (reshard_entry) {
    const std::string v = canonical_value(*reshard_entry, file);
    const bool is_bool = v == "true" || v == "false";
    const std::optional<ShardingStrategy> named = enum_from_name<ShardingStrategy>(v, kShardingStrategyNames);
    if (strategy && named && *named != *strategy)
      throw InputError(str(where(file, reshard_entry->line, reshard_entry->col), ": fsdp_config.",
                           reshard_entry->raw_key, ": names the strategy ", enum_name(*named, kShardingStrategyNames),
                           " but fsdp_sharding_strategy is ", enum_name(*strategy, kShardingStrategyNames),
                           "; keep one of the two keys"));
    if (strategy && is_bool)
      result.notes.push_back(str("fsdp_config.", reshard_entry->raw_key,
                                 ": FSDP1 ignored this boolean; the strategy in fsdp_sharding_strategy decides"));
    if (!strategy && named) strategy = named;
    if (!strategy && is_bool) strategy = v == "true" ? ShardingStrategy::kFullShard : ShardingStrategy::kShardGradOp;
  }
  std::optional<std::pair<int, int>> hsdp;  // (replicate, shard)
  std::string reshard_value;
  if (strategy) {
    reshard_value = reshards_after_forward(*strategy) ? "true" : "false";
    const bool hybrid = is_hybrid(*strategy);
    if (hybrid || *strategy == ShardingStrategy::kNoShard) {
      YAML::Node np = root["num_processes"];
      YAML::Node nm = root["num_machines"];
      std::optional<long long> procs = np.IsDefined() && np.IsScalar() ? parse_int(np.Scalar()) : std::nullopt;
      std::optional<long long> machines = nm.IsDefined() && nm.IsScalar() ? parse_int(nm.Scalar()) : 1LL;
      const char* name = enum_name(*strategy, kShardingStrategyNames);
      if (!procs || *procs < 1 || !machines || *machines < 1 || *procs % *machines != 0)
        throw InputError(str(file, ": fsdp_config: ", name,
                             " needs num_processes (and num_machines) in the file to derive the FSDP2 layout; add "
                             "num_processes: N (the total across all machines)"));
      if (hybrid) {
        hsdp = std::make_pair(static_cast<int>(*machines), static_cast<int>(*procs / *machines));
        result.notes.push_back(str(name, " -> HSDP: parallelism_config dp_replicate_size ", hsdp->first,
                                   " (one replica per machine) x dp_shard_size ", hsdp->second,
                                   " (accelerate to-fsdp2 would silently shard over all ranks)"));
      } else {
        hsdp = std::make_pair(static_cast<int>(*procs), 1);
        result.lossy.push_back(
            str("NO_SHARD has no FSDP2 equivalent: FSDP2 cannot skip sharding; the closest layout is "
                "parallelism_config dp_replicate_size ",
                *procs,
                " x dp_shard_size 1 (every rank keeps a full copy); accelerate to-fsdp2 writes "
                "reshard_after_forward: false, which shards parameters, gradients and optimizer state"));
      }
    }
    const Entry* keep = strategy_entry && reshard_entry
                            ? (strategy_entry->line < reshard_entry->line ? strategy_entry : reshard_entry)
                            : (strategy_entry ? strategy_entry : reshard_entry);
    rewrite_line(*keep, "fsdp_reshard_after_forward", reshard_value);
    result.notes.push_back(
        str(enum_name(*strategy, kShardingStrategyNames), " -> fsdp_reshard_after_forward: ", reshard_value));
    for (const Entry* other : {strategy_entry, reshard_entry})
      if (other && other != keep) {
        for (size_t l = other->line; l < other->end; ++l) replace[l] = {};
      }
  }

  for (const auto& e : entries) {
    if (&e == strategy_entry || &e == reshard_entry) continue;
    const std::string v = e.value.IsScalar() ? trim(e.value.Scalar()) : "";
    if (e.key == "fsdp_version") {
      rewrite_line(e, "fsdp_version", "2");
    } else if (e.key == "fsdp_backward_prefetch") {
      drop(e, "FSDP2 always prefetches the next unit's all-gather in backward");
    } else if (e.key == "fsdp_sync_module_states") {
      drop(e, "FSDP2 has no such switch (with fsdp_cpu_ram_efficient_loading, rank 0 reads and the others receive)");
    } else if (e.key == "fsdp_use_orig_params") {
      if (parse_bool(v) == false)
        result.lossy.push_back(
            "fsdp_use_orig_params: false cannot be kept: FSDP2 always exposes the original "
            "parameters (no flattened parameters)");
      drop(e, "FSDP2 always uses the original parameters");
    } else if (e.key == "fsdp_forward_prefetch") {
      if (parse_bool(v) == true)
        result.lossy.push_back(
            "fsdp_forward_prefetch: true cannot be kept: FSDP2 has no forward-prefetch switch "
            "(it overlaps the next unit's all-gather by itself)");
      drop(e, "FSDP2 has no forward-prefetch switch");
    } else if (e.key == "fsdp_state_dict_type") {
      // Null means FSDP1's default, which is written out so the format does not change silently.
      std::string name = canonical_value(e, file);
      if (name.empty()) name = "FULL_STATE_DICT";
      const StateDictType sdt = *enum_from_name<StateDictType>(name, kStateDictTypeNames);
      if (sdt == StateDictType::kLocalStateDict) {
        result.lossy.push_back(
            "LOCAL_STATE_DICT does not exist in FSDP2; SHARDED_STATE_DICT (per-rank files that "
            "reshard to any world size) replaces it");
        rewrite_line(e, "fsdp_state_dict_type", "SHARDED_STATE_DICT");
      } else if (v != name || e.raw_key != e.key) {
        rewrite_line(e, "fsdp_state_dict_type", name);
        result.notes.push_back(str("fsdp_config.", e.raw_key, ": ", v, " -> ", name));
      }
    } else if (const OptionSpec* spec = find_option("fsdp_config." + e.key);
               spec && spec->versions != FsdpVersions::kV1Only) {
      rename_only(e, e.key);
    } else {
      std::vector<std::string> known;
      for (const auto& o : all_options())
        if (o.section() == "fsdp_config") known.push_back(o.leaf());
      auto near = closest_match(e.key, known);
      throw InputError(str(where(file, e.line, e.col), ": fsdp_config.", e.raw_key, ": unknown key",
                           near ? " (did you mean " + *near + "?)" : std::string(),
                           "; fix it before converting (accelerate to-fsdp2 would copy it and FSDP2 would ignore it)"));
    }
  }
  if (!have_version) appended_fsdp.push_back(key_indent + "fsdp_version: 2");
  if (!have_state_dict) {
    appended_fsdp.push_back(key_indent + "fsdp_state_dict_type: FULL_STATE_DICT");
    result.notes.push_back(
        "fsdp_state_dict_type: FULL_STATE_DICT written explicitly (FSDP1's default; FSDP2's "
        "default would silently switch checkpoints to SHARDED_STATE_DICT)");
  }

  std::vector<std::string> appended_top;
  if (hsdp) {
    YAML::Node pc = root["parallelism_config"];
    if (pc.IsDefined() && !pc.IsNull() && !(pc.IsMap() && pc.size() == 0))
      throw InputError(str(file,
                           ": parallelism_config: already present; remove it or the hybrid fsdp_sharding_strategy, "
                           "the conversion writes it"));
    appended_top = {"parallelism_config:", str("  parallelism_config_dp_replicate_size: ", hsdp->first),
                    str("  parallelism_config_dp_shard_size: ", hsdp->second)};
  }

  // Assemble the output: new fsdp_config keys, then a new parallelism_config, right after the
  // fsdp_config block so related settings stay together.
  std::vector<std::string> appended = appended_fsdp;
  appended.insert(appended.end(), appended_top.begin(), appended_top.end());
  std::vector<std::string> out;
  for (size_t l = 0; l < lines.v.size(); ++l) {
    if (l == block_end) out.insert(out.end(), appended.begin(), appended.end());
    auto it = replace.find(l);
    if (it == replace.end())
      out.push_back(lines.v[l]);
    else
      out.insert(out.end(), it->second.begin(), it->second.end());
  }
  if (block_end >= lines.v.size()) out.insert(out.end(), appended.begin(), appended.end());
  std::string text_out = join(out, "\n");
  if (lines.trailing_newline || !text_out.empty()) text_out += "\n";
  result.output = text_out;
  result.converted = true;
  result.notes.push_back("fsdp_version: 1 -> 2");

  // The result must validate; if it does not, the input had problems conversion cannot fix.
  ConfigInputs in;
  in.file = file + " (converted)";
  in.text = text_out;
  in.has_file = true;
  Diagnostics diags;
  load_config(in, diags);
  if (diags.has_errors())
    throw InputError(
        str("the converted config does not validate; fix these in ", file, " first:\n", join(diags.errors(), "\n")));
  return result;
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

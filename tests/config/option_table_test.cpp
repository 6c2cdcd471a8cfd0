// The option table is the single declaration of every option: check it is consistent.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "config/option.h"
#include "config/show.h"
#include "config/test_support.h"
#include "config/worker_env.h"
#include "util/env.h"
#include "util/strings.h"

using namespace fsdp::config;
using fsdp::config::testing::load_text;
using fsdp::config::testing::Loaded;

TEST_CASE("every option has a unique key and flag, help, and a default its own parser accepts") {
  std::set<std::string> keys, flags, envs;
  for (const auto& o : all_options()) {
    CAPTURE(o.key);
    CHECK(keys.insert(o.key).second);
    if (!o.flag.empty()) CHECK(flags.insert(o.flag).second);
    if (!o.env.empty()) CHECK(envs.insert(o.env).second);
    CHECK_FALSE(o.help.empty());
    if (o.type == ValueType::kIgnored) continue;
    CHECK(o.apply);
    if (!o.default_value.empty()) {
      RawValue raw;
      raw.shape = RawValue::Shape::kScalar;
      raw.text = o.default_value;
      std::string error;
      auto v = canonicalize(o, raw, &error);
      CHECK_MESSAGE(v, error);
      if (v) CHECK(*v == o.default_value);
    }
  }
}

TEST_CASE("every Accelerate fsdp_config key and its worker variable are declared (reference §1.3)") {
  const std::vector<std::pair<std::string, std::string>> accelerate = {
      {"fsdp_version", "FSDP_VERSION"},
      {"fsdp_reshard_after_forward", "FSDP_RESHARD_AFTER_FORWARD"},
      {"fsdp_sharding_strategy", "FSDP_SHARDING_STRATEGY"},
      {"fsdp_offload_params", "FSDP_OFFLOAD_PARAMS"},
      {"fsdp_auto_wrap_policy", "FSDP_AUTO_WRAP_POLICY"},
      {"fsdp_transformer_layer_cls_to_wrap", "FSDP_TRANSFORMER_CLS_TO_WRAP"},
      {"fsdp_min_num_params", "FSDP_MIN_NUM_PARAMS"},
      {"fsdp_backward_prefetch", "FSDP_BACKWARD_PREFETCH"},
      {"fsdp_state_dict_type", "FSDP_STATE_DICT_TYPE"},
      {"fsdp_forward_prefetch", "FSDP_FORWARD_PREFETCH"},
      {"fsdp_use_orig_params", "FSDP_USE_ORIG_PARAMS"},
      {"fsdp_cpu_ram_efficient_loading", "FSDP_CPU_RAM_EFFICIENT_LOADING"},
      {"fsdp_sync_module_states", "FSDP_SYNC_MODULE_STATES"},
      {"fsdp_activation_checkpointing", "FSDP_ACTIVATION_CHECKPOINTING"},
      {"fsdp_ignored_modules", "FSDP_IGNORED_MODULES"}};
  for (const auto& [key, env] : accelerate) {
    const OptionSpec* o = find_option("fsdp_config." + key);
    REQUIRE_MESSAGE(o, key);
    CHECK(o->env == env);
    CHECK(o->flag == key);
  }
  for (const char* top : {"compute_environment",
                          "distributed_type",
                          "mixed_precision",
                          "use_cpu",
                          "debug",
                          "num_processes",
                          "num_machines",
                          "machine_rank",
                          "main_process_ip",
                          "main_process_port",
                          "rdzv_backend",
                          "same_network",
                          "gpu_ids",
                          "main_training_function",
                          "enable_cpu_affinity",
                          "downcast_bf16",
                          "tpu_env",
                          "tpu_use_cluster",
                          "tpu_use_sudo",
                          "dynamo_config"})
    CHECK_MESSAGE(find_option(top), top);
}

TEST_CASE("flags are found by either spelling; config keys lists every option") {
  CHECK(find_option_by_flag("num-processes") == find_option("num_processes"));
  CHECK(find_option_by_flag("fsdp_offload_params") == find_option("fsdp_config.fsdp_offload_params"));
  const std::string table = format_option_table(true);
  for (const auto& o : all_options()) CHECK_MESSAGE(table.find("`" + o.key + "`") != std::string::npos, o.key);
}

TEST_CASE("a default Config holds the option table's defaults (the two are written apart)") {
  const Config defaults;
  int checked = 0;
  for (const auto& o : all_options()) {
    if (!o.same_field || !o.default_note.empty()) continue;  // several fields, or a default that depends on others
    CAPTURE(o.key);
    Config from_table;
    o.apply(from_table, o.default_value);
    CHECK(o.same_field(from_table, defaults));
    ++checked;
  }
  CHECK(checked > 40);
}

TEST_CASE("every option names the part of fsdptrain that reads it, or reaches programs") {
  for (const auto& o : all_options()) {
    CAPTURE(o.key);
    if (o.type == ValueType::kIgnored) continue;
    CHECK((o.used_by != 0 || !o.env.empty()));
    if (o.section() == "fsdp_config" && o.versions != FsdpVersions::kV1Only)
      CHECK_MESSAGE(o.used_by != 0, "an FSDP2 key the engine does not read");
  }
}

TEST_CASE("fsdptrain's own switches are rows: each with its FSDPTRAIN_* variable, exported as resolved") {
  for (const std::string name : {"FSDPTRAIN_KERNELS", "FSDPTRAIN_ONEDNN_PRODUCTS", "FSDPTRAIN_READ_AHEAD",
                                 "FSDPTRAIN_HOST_CACHE", "FSDPTRAIN_OFFLOAD_OVERLAP", "FSDPTRAIN_SYNC_DEBUG",
                                 "FSDPTRAIN_DUMP_GRADIENTS", "FSDPTRAIN_VERBOSE", "FSDPTRAIN_DIST_TIMEOUT"}) {
    INFO(name);
    CHECK(std::count_if(all_options().begin(), all_options().end(),
                        [&](const OptionSpec& s) { return s.env == name && (s.used_by & kTrainer); }) == 1);
  }
  const Loaded l = load_text("distributed_type: FSDP\nnum_processes: 2\n",
                             {"engine.kernels=portable", "engine.sync_debug=true", "engine.dump_gradients=grads"},
                             {{"logging.verbose", "true"}});
  INFO(l.errors());
  CHECK(l.errors().empty());
  CHECK((l.rc.typed.engine.kernels == KernelProvider::kPortable));
  CHECK(l.rc.typed.logging.verbose);
  const auto env = worker_env(l.rc);
  auto exported = [&](const std::string& k, const std::string& v) {
    return std::find(env.begin(), env.end(), std::make_pair(k, v)) != env.end();
  };
  CHECK(exported("FSDPTRAIN_KERNELS", "portable"));
  CHECK(exported("FSDPTRAIN_ONEDNN_PRODUCTS", "large"));
  CHECK(exported("FSDPTRAIN_SYNC_DEBUG", "true"));
  CHECK(exported("FSDPTRAIN_VERBOSE", "true"));
  // An output folder, made absolute as the others are.
  const std::string& dump = l.rc.typed.engine.dump_gradients;
  CHECK(dump.front() == '/');
  CHECK(dump.size() > 6);
  CHECK(dump.substr(dump.size() - 6) == "/grads");
  CHECK(load_text("").rc.typed.engine.dump_gradients.empty());  // none unless given
  const Loaded bad = load_text("", {"engine.kernels=fused"});
  CHECK(bad.errors().find("engine.kernels") != std::string::npos);
  CHECK(bad.errors().find("portable") != std::string::npos);
}

// Issue 59: FSDPTRAIN_DIST_TIMEOUT was a row and also read and parsed apart in lib/dist; debug_requested()
// took 1/true/yes where the table's booleans also take on/off/y/n.
TEST_CASE("every variable fsdptrain reads is declared once in util/env.h, and a row names its declaration") {
  std::set<std::string> declared;
  for (const fsdp::EnvSetting* e : fsdp::env_settings()) {
    CAPTURE(e->name);
    CHECK(declared.insert(e->name).second);
    if (!*e->key) {  // the environment's alone: it says what it does
      CHECK(std::string(e->name).rfind("FSDPTRAIN_", 0) == 0);
      CHECK(std::string(e->help).size() > 10);
      continue;
    }
    const OptionSpec* row = find_option(e->key);
    REQUIRE(row);
    CHECK(row->env == e->name);
    const ValueType expected = e->kind == fsdp::EnvKind::kFlag      ? ValueType::kBool
                               : e->kind == fsdp::EnvKind::kSeconds ? ValueType::kFloat
                               : e->kind == fsdp::EnvKind::kChoice  ? ValueType::kEnum
                                                                    : ValueType::kString;
    CHECK((row->type == expected));
  }
  for (const auto& o : all_options())
    if (o.env.rfind("FSDPTRAIN_", 0) == 0) CHECK_MESSAGE(declared.count(o.env), o.key);
  // `config keys` lists the ones no key sets, after the keys.
  for (const bool markdown : {false, true}) {
    const std::string table = format_option_table(markdown);
    for (const char* name :
         {"FSDPTRAIN_CONFIG_FILE", "FSDPTRAIN_DEBUG", "FSDPTRAIN_PYTHON", "FSDPTRAIN_LAUNCHED", "FSDPTRAIN_PROGRESS"})
      CHECK_MESSAGE(table.find(name) != std::string::npos, name);
  }
}

TEST_CASE("the environment's booleans and the table's are one parser") {
  for (const char* yes : {"1", "true", "yes", "on", "y", "t", "TRUE", " On "}) CHECK(fsdp::parse_bool(yes) == true);
  for (const char* no : {"0", "false", "no", "off", "n", "f", "False"}) CHECK(fsdp::parse_bool(no) == false);
  CHECK_FALSE(fsdp::parse_bool("maybe").has_value());
  RawValue raw;
  raw.shape = RawValue::Shape::kScalar;
  raw.text = "on";
  std::string error;
  CHECK(canonicalize(*find_option("debug"), raw, &error) == std::string("true"));
}

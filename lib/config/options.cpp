// The option table. One row per option; see option.h for what each field means. Where
// Accelerate's three default layers (wizard, launcher, worker plugin) disagree, the default here
// is what `accelerate launch` uses for a file that omits the key, unless `default_note` says why not.
#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>

#include "config/loader.h"
#include "config/option.h"
#include "util/env.h"
#include "util/error.h"
#include "util/regex.h"
#include "util/strings.h"

namespace fsdp::config {

namespace {

template <typename T>
struct is_optional : std::false_type {};
template <typename T>
struct is_optional<std::optional<T>> : std::true_type {};

// lora.rank_pattern's and alpha_pattern's fields: (pattern, number) in order.
template <typename T>
struct is_pattern_list : std::false_type {};
template <typename N>
struct is_pattern_list<std::vector<std::pair<std::string, N>>> : std::true_type {};

// T, or what a std::optional<T> holds.
template <typename T>
struct unwrapped {
  using type = T;
};
template <typename T>
struct unwrapped<std::optional<T>> {
  using type = T;
};

template <typename T>
void assign(T& out, const std::string& v, const std::vector<std::string>& choices) {
  if constexpr (is_optional<T>::value) {
    if (v.empty()) {
      out.reset();
      return;
    }
    typename T::value_type inner{};
    assign(inner, v, choices);
    out = inner;
  } else if constexpr (std::is_same_v<T, std::string>) {
    out = v;
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    out = v.empty() ? std::vector<std::string>{} : split(v, ',');
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    out.clear();
    for (const std::string& n : v.empty() ? std::vector<std::string>{} : split(v, ',')) out.push_back(*parse_int(n));
  } else if constexpr (is_pattern_list<T>::value) {  // the JSON object parse_patterns wrote
    out.clear();
    const nlohmann::ordered_json patterns =
        v.empty() ? nlohmann::ordered_json::object() : nlohmann::ordered_json::parse(v);
    for (const auto& [pattern, value] : patterns.items())
      out.emplace_back(pattern, value.template get<typename T::value_type::second_type>());
  } else if (v.empty()) {
    return;  // unset: keep the struct's default
  } else if constexpr (std::is_same_v<T, bool>) {
    out = v == "true";
  } else if constexpr (std::is_enum_v<T>) {
    auto it = std::find(choices.begin(), choices.end(), v);
    FSDP_ASSERT(it != choices.end(), "enum value ", v);
    out = static_cast<T>(it - choices.begin());
  } else if constexpr (std::is_integral_v<T>) {
    out = static_cast<T>(*parse_int(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    out = static_cast<T>(*parse_float(v));
  }
}

// Fluent builder for one row.
struct Row {
  OptionSpec s;
  Row(std::string key, ValueType type) {
    s.key = std::move(key);
    s.type = type;
  }
  Row& flag(std::string f) {
    s.flag = std::move(f);
    return *this;
  }
  Row& flag_alone() {
    s.flag_alone = true;
    return *this;
  }
  // A variable only exported (Accelerate's, for Python workers).
  Row& env(std::string e) {
    s.env = std::move(e);
    return *this;
  }
  // A variable fsdptrain also reads: declared in util/env.h, where the reader knows it.
  Row& env(const EnvSetting& e) {
    FSDP_ASSERT(s.key == e.key, e.name, " is declared for ", e.key, ", not ", s.key);
    s.env = e.name;
    return *this;
  }
  Row& choices(std::vector<std::string> c, bool int_aliases = false) {
    s.choices = std::move(c);
    s.int_aliases = int_aliases;
    return *this;
  }
  Row& unsupported(std::vector<std::pair<std::string, std::string>> u) {
    s.unsupported = std::move(u);
    return *this;
  }
  Row& range(std::optional<long long> lo, std::optional<long long> hi = std::nullopt) {
    s.min_value = lo;
    s.max_value = hi;
    return *this;
  }
  Row& def(std::string d) {
    s.default_value = std::move(d);
    return *this;
  }
  Row& note(std::string n) {
    s.default_note = std::move(n);
    return *this;
  }
  Row& help(std::string h) {
    s.help = std::move(h);
    return *this;
  }
  Row& only(FsdpVersions v) {
    s.versions = v;
    return *this;
  }
  Row& extension() {
    s.extension = true;
    return *this;
  }
  Row& apply(std::function<void(Config&, const std::string&)> fn) {
    s.apply = std::move(fn);
    return *this;
  }
  Row& parse(std::function<std::optional<std::string>(const RawValue&, std::string*)> p) {
    s.parse = std::move(p);
    return *this;
  }
  template <typename Section, typename T>
  Row& to(Section Config::*section, T Section::*field) {
    using Stored = typename unwrapped<T>::type;
    if constexpr (std::is_integral_v<Stored> && !std::is_same_v<Stored, bool>) {
      // Every integer fits the field it lands in (no 4294967298 wrapping to 2 in an int).
      const long long lo = static_cast<long long>(std::numeric_limits<Stored>::min());
      const long long hi = std::numeric_limits<Stored>::max() > std::numeric_limits<long long>::max()
                               ? std::numeric_limits<long long>::max()
                               : static_cast<long long>(std::numeric_limits<Stored>::max());
      s.min_value = std::max(s.min_value.value_or(lo), lo);
      s.max_value = std::min(s.max_value.value_or(hi), hi);
    }
    std::vector<std::string> choices = s.choices;
    s.apply = [section, field, choices](Config& c, const std::string& v) { assign(c.*section.*field, v, choices); };
    s.same_field = [section, field](const Config& a, const Config& b) {
      return a.*section.*field == b.*section.*field;
    };
    return *this;
  }
  operator OptionSpec() const { return s; }
};

// logging.profile_steps: [a, b], "a,b" or "a" (one step) -> "a,b"; true (a bare --profile) -> "auto".
std::optional<std::string> parse_profile_steps(const RawValue& raw, std::string* error) {
  std::vector<std::string> parts = raw.items;
  if (raw.shape == RawValue::Shape::kScalar) {
    const std::string text = trim(raw.text);
    if (text == "true" || text == "auto") return std::string("auto");
    if (text.empty() || text == "false") return std::string();
    parts = split(text, ',');
  }
  if (raw.shape == RawValue::Shape::kNull) return std::string();
  std::vector<long long> steps;
  for (const std::string& p : parts)
    if (std::optional<long long> n = parse_int(trim(p)); n && *n >= 1) steps.push_back(*n);
  const bool all_steps = !parts.empty() && parts.size() <= 2 && steps.size() == parts.size();
  if (steps.size() == 1) steps.push_back(steps[0]);
  if (!all_steps || steps[0] > steps[1]) {
    *error = "expected the first and last step to trace, such as [3, 4] (steps count from 1, first <= last)";
    return std::nullopt;
  }
  return str(steps[0], ",", steps[1]);
}

// lora.rank_pattern and lora.alpha_pattern: a mapping of module patterns to ranks (whole numbers from 1) or to
// alphas (above 0), as PEFT's LoraConfig takes them ({q_proj: 16}; --set 'lora.rank_pattern={q_proj: 16}'), or
// that mapping's JSON text (how fsdptrain writes it) -> the JSON object, in the order given (PEFT takes the
// first pattern that matches).
std::function<std::optional<std::string>(const RawValue&, std::string*)> parse_patterns(bool ranks) {
  return [ranks](const RawValue& raw, std::string* error) -> std::optional<std::string> {
    const std::string expected = ranks ? "a mapping of module patterns to ranks, such as {q_proj: 16, down_proj: 8}"
                                       : "a mapping of module patterns to alphas, such as {q_proj: 32, down_proj: 16}";
    std::vector<std::pair<std::string, std::string>> entries = raw.entries;
    if (raw.shape == RawValue::Shape::kScalar) {
      const std::string t = trim(raw.text);
      if (t.empty() || t == "{}") return std::string();
      try {
        const auto j = nlohmann::ordered_json::parse(t);
        if (!j.is_object()) throw std::invalid_argument("not an object");
        for (const auto& [pattern, value] : j.items())
          entries.emplace_back(pattern, value.is_string() ? value.get<std::string>() : value.dump());
      } catch (const std::exception&) {
        *error = str("expected ", expected, ", got ", excerpt(t));
        return std::nullopt;
      }
    } else if (raw.shape != RawValue::Shape::kMap || raw.entries.empty()) {
      *error = str("expected ", expected);
      return std::nullopt;
    }
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (const auto& [pattern, text] : entries) {
      const std::optional<long long> rank = parse_int(trim(text));
      const std::optional<double> alpha = parse_float(trim(text));
      if (ranks ? !rank || *rank < 1 : !alpha || !(*alpha > 0)) {
        *error = str("expected ", expected, "; ", quoted(pattern), " is ", excerpt(text),
                     ranks ? " (a rank is a whole number from 1)" : " (an alpha is a number above 0)");
        return std::nullopt;
      }
      try {
        Regex("(?:.*\\.)?(?:" + pattern + ")", "the pattern " + excerpt(pattern));
      } catch (const InputError& e) {
        *error = e.what();
        return std::nullopt;
      }
      if (ranks)
        out[pattern] = static_cast<int64_t>(*rank);
      else
        out[pattern] = *alpha;
    }
    return out.dump();
  };
}

// lora.layers_to_transform: layer numbers ([0, 1, 2], "0,1,2" or one number) -> "0,1,2".
std::optional<std::string> parse_layers(const RawValue& raw, std::string* error) {
  std::vector<std::string> parts = raw.items;
  if (raw.shape == RawValue::Shape::kScalar) parts = split(raw.text, ',');
  if (raw.shape == RawValue::Shape::kNull) return std::string();
  std::vector<std::string> out;
  for (const std::string& p : parts) {
    const std::optional<long long> n = parse_int(trim(p));
    if (raw.shape == RawValue::Shape::kMap || !n || *n < 0) {
      *error = "expected the numbers of the decoder layers to adapt, such as [0, 1, 2] (layers count from 0)";
      return std::nullopt;
    }
    out.push_back(std::to_string(*n));
  }
  return join(out, ",");
}

void apply_profile_steps(Config& c, const std::string& v) {
  LoggingConfig& l = c.logging;
  l.profile_first = l.profile_last = 0;
  if (v == "auto") l.profile_first = l.profile_last = kProfileAuto;
  if (v.empty() || v == "auto") return;
  const std::vector<std::string> parts = split(v, ',');
  l.profile_first = *parse_int(parts.at(0));
  l.profile_last = *parse_int(parts.at(1));
}

Row ignored(const std::string& key, const std::string& why) {
  return Row(key, ValueType::kIgnored).help("accepted for compatibility with Accelerate and ignored: " + why);
}

// fsdp_reshard_after_forward holds a boolean in FSDP2, or an integer N >= 2 (partial resharding over
// N ranks, fully_shard(reshard_after_forward=N)); Accelerate's wizard stores the FSDP1 sharding
// strategy there (reference §1.6 Q1), by name or as 1-5. Accept all; canonical: "true"/"false", a
// strategy name, or the integer, which fsdp_version decides the meaning of (FsdpConfig).
std::optional<std::string> parse_reshard(const RawValue& raw, std::string* error) {
  if (raw.shape != RawValue::Shape::kScalar) {
    *error = "expected true or false";
    return std::nullopt;
  }
  const std::string t = trim(raw.text);
  if (t == "0" || t == "1") return std::string(t == "1" ? "true" : "false");
  if (auto b = parse_bool(t)) return std::string(*b ? "true" : "false");
  if (auto n = parse_int(t); n && *n >= 2) return std::to_string(*n);
  for (const char* name : kShardingStrategyNames)
    if (to_upper(t) == name) return std::string(name);
  *error =
      str("expected true, false, or a number of ranks N >= 2 to stay sharded over between forward and "
          "backward (or, in an FSDP1 config, a sharding strategy: ",
          join(enum_names(kShardingStrategyNames), ", "), "), got ", quoted(t));
  return std::nullopt;
}

// ... and fills three members: the boolean, the strategy named there (FSDP1), or the integer.
void apply_reshard(Config& c, const std::string& v) {
  c.fsdp.reshard_after_forward_strategy = enum_from_name<ShardingStrategy>(v, kShardingStrategyNames);
  const std::optional<int64_t> n = parse_int(v);
  c.fsdp.reshard_after_forward_size = n ? static_cast<int>(*n) : 0;
  if (v == "true" || v == "false" || n) c.fsdp.reshard_after_forward = v != "false";
}

// Who reads each option (OptionSpec::used_by). The trainer's own sections are all the trainer's.
void assign_consumers(std::vector<OptionSpec>& table) {
  const std::map<std::string, unsigned> launch_and_trainer = {
      {"compute_environment", kLauncher},
      {"distributed_type", kLauncher | kTrainer},
      {"mixed_precision", kTrainer},
      {"use_cpu", kLauncher | kTrainer},
      {"debug", kTrainer},  // LibTorch backtraces in error messages
      {"num_processes", kLauncher},
      {"num_machines", kLauncher},
      {"machine_rank", kLauncher},
      {"main_process_ip", kLauncher},
      {"main_process_port", kLauncher},
      {"rdzv_backend", kLauncher},
      {"same_network", kLauncher},
      {"gpu_ids", kLauncher},
      {"enable_cpu_affinity", kLauncher},
      {"max_restarts", kLauncher},
      {"monitor_interval", kLauncher},
      {"rdzv_timeout", kLauncher},
      {"dist_timeout", kLauncher | kTrainer},
      {"fsdp_config.fsdp_version", kTrainer},
      {"fsdp_config.fsdp_reshard_after_forward", kTrainer},
      {"fsdp_config.fsdp_sharding_strategy", kTrainer},
      {"fsdp_config.fsdp_offload_params", kTrainer},
      {"fsdp_config.fsdp_auto_wrap_policy", kTrainer},
      {"fsdp_config.fsdp_transformer_layer_cls_to_wrap", kTrainer},
      {"fsdp_config.fsdp_min_num_params", kTrainer},
      {"fsdp_config.fsdp_state_dict_type", kTrainer},
      {"fsdp_config.fsdp_cpu_ram_efficient_loading", kTrainer},
      {"fsdp_config.fsdp_activation_checkpointing", kTrainer},
      {"fsdp_config.fsdp_ignored_modules", kTrainer},  // the engine; the trainer refuses it
      {"parallelism_config.parallelism_config_dp_replicate_size", kTrainer},
      {"parallelism_config.parallelism_config_dp_shard_size", kTrainer},
      {"parallelism_config.parallelism_config_tp_size", kTrainer},
      {"parallelism_config.parallelism_config_cp_size", kTrainer},
      {"parallelism_config.parallelism_config_cp_backend", kTrainer},
      {"parallelism_config.parallelism_config_cp_comm_strategy", kTrainer},
      {"parallelism_config.parallelism_config_sp_size", kTrainer},
      {"parallelism_config.parallelism_config_sp_backend", kTrainer},
      {"parallelism_config.parallelism_config_sp_seq_length", kTrainer},
      {"parallelism_config.parallelism_config_sp_seq_length_is_variable", kTrainer},
      {"parallelism_config.parallelism_config_sp_attn_implementation", kTrainer},
  };
  for (OptionSpec& spec : table) {
    if (spec.extension) spec.used_by = kTrainer;
    auto it = launch_and_trainer.find(spec.key);
    if (it != launch_and_trainer.end()) spec.used_by = it->second;
  }
}

std::vector<OptionSpec> build_table() {
  using V = ValueType;
  const auto L = &Config::launch;
  const auto F = &Config::fsdp;
  const auto P = &Config::parallelism;
  const std::string not_fsdp_types =
      "fsdptrain runs FSDP on CUDA GPUs (NCCL) or CPU processes (Gloo); use distributed_type: FSDP";
  std::vector<OptionSpec> t = {
      // ---- Top level (Accelerate's ClusterConfig) ----
      Row("compute_environment", V::kEnum)
          .choices({"LOCAL_MACHINE"})
          .unsupported(
              {{"AMAZON_SAGEMAKER",
                "SageMaker jobs are not supported; run fsdptrain on the instances (one launcher per machine)"}})
          .def("LOCAL_MACHINE")
          .help("Where the job runs; fsdptrain runs on this machine (and others like it)")
          .to(L, &LaunchConfig::compute_environment),
      Row("distributed_type", V::kEnum)
          .flag("distributed_type")
          .choices(enum_names(kDistributedTypeNames))
          .unsupported({{"DEEPSPEED", "DeepSpeed is not supported; " + not_fsdp_types},
                        {"MEGATRON_LM", "Megatron-LM is not supported; " + not_fsdp_types},
                        {"XLA", "TPUs are not supported; " + not_fsdp_types},
                        {"MULTI_NPU", not_fsdp_types},
                        {"MULTI_MLU", not_fsdp_types},
                        {"MULTI_SDAA", not_fsdp_types},
                        {"MULTI_MUSA", not_fsdp_types},
                        {"MULTI_XPU", not_fsdp_types},
                        {"MULTI_HPU", not_fsdp_types},
                        {"MULTI_NEURON", not_fsdp_types}})
          .def("NO")
          .note("required in a config file, as in Accelerate; NO without one")
          .help("FSDP to shard; MULTI_GPU/MULTI_CPU replicate (DDP-like); NO runs one process")
          .to(L, &LaunchConfig::distributed_type),
      Row("mixed_precision", V::kEnum)
          .flag("mixed_precision")
          .env("ACCELERATE_MIXED_PRECISION")
          .choices(enum_names(kMixedPrecisionNames))
          .unsupported({{"FP8",
                         "Accelerate's fp8 mode is not read; for float8 training set mixed_precision: bf16 and "
                         "engine.float8: tensorwise (torchao's recipe, as Accelerate's AO backend)"}})
          .def("no")
          .help("Compute dtype: bf16 or fp16 gathers parameters in that dtype (fp32 master weights, fp32 reductions)")
          .to(L, &LaunchConfig::mixed_precision),
      Row("use_cpu", V::kBool)
          .flag("cpu")
          .env("ACCELERATE_USE_CPU")
          .def("false")
          .help("Train on CPU processes (Gloo) even when GPUs are present")
          .to(L, &LaunchConfig::use_cpu),
      Row("debug", V::kBool)
          .flag("debug")
          .env(env::kAccelerateDebug)
          .def("false")
          .help("Check that every rank issues the same collectives (slower)")
          .to(L, &LaunchConfig::debug),
      Row("num_processes", V::kInt)
          .flag("num_processes")
          .range(1)
          .parse([](const RawValue& raw, std::string* error) -> std::optional<std::string> {
            // Accelerate writes -1 for "not set; pass --num_processes".
            if (raw.shape == RawValue::Shape::kScalar && trim(raw.text) == "-1") return std::string();
            auto n = raw.shape == RawValue::Shape::kScalar ? parse_int(raw.text) : std::nullopt;
            if (!n || *n < 1) {
              *error = str("expected a whole number >= 1, got ", quoted(raw.text));
              return std::nullopt;
            }
            return std::to_string(*n);
          })
          .def("")
          .note("1 when distributed_type is NO, else required")
          .help("Total number of processes across ALL machines (not per machine)")
          .to(L, &LaunchConfig::num_processes),
      Row("num_machines", V::kInt)
          .flag("num_machines")
          .range(1)
          .def("1")
          .help("Number of machines; one launcher runs on each")
          .to(L, &LaunchConfig::num_machines),
      Row("machine_rank", V::kInt)
          .flag("machine_rank")
          .range(0)
          .def("0")
          .help("This machine's index, 0..num_machines-1; machine 0 hosts the rendezvous")
          .to(L, &LaunchConfig::machine_rank),
      Row("main_process_ip", V::kString)
          .flag("main_process_ip")
          .def("")
          .note("127.0.0.1 on one machine; required on several")
          .help("Address of machine 0, reachable from every machine")
          .to(L, &LaunchConfig::main_process_ip),
      Row("main_process_port", V::kInt)
          .flag("main_process_port")
          .range(0, 65535)
          .def("29500")
          .help("Rendezvous port on machine 0; 0 picks a free port (one machine only)")
          .to(L, &LaunchConfig::main_process_port),
      Row("rdzv_backend", V::kEnum)
          .flag("rdzv_backend")
          .choices({"static", "c10d"})
          .def("static")
          .help("Rendezvous: static (machine ranks as given) or c10d (accepted; fsdptrain's TCP store serves both)")
          .to(L, &LaunchConfig::rdzv_backend),
      Row("same_network", V::kBool)
          .flag("same_network")
          .def("true")
          .help("Whether all machines share one local network (informational; rendezvous is the same)")
          .to(L, &LaunchConfig::same_network),
      Row("gpu_ids", V::kGpuIds)
          .flag("gpu_ids")
          .env("CUDA_VISIBLE_DEVICES")
          .def("all")
          .help("GPUs to use on each machine: all, or ids such as 0,1,3")
          .to(L, &LaunchConfig::gpu_ids),
      Row("enable_cpu_affinity", V::kBool)
          .flag("enable_cpu_affinity")
          .env("ACCELERATE_CPU_AFFINITY")
          .def("false")
          .help("Pin each worker to the CPU cores nearest its GPU (on CPU: an even share of the cores)")
          .to(L, &LaunchConfig::enable_cpu_affinity),
      Row("max_restarts", V::kInt)
          .flag("max_restarts")
          .range(0)
          .def("0")
          .help("Restart the local worker group this many times after a failure (fsdptrain extension key)")
          .extension()
          .to(L, &LaunchConfig::max_restarts),
      Row("monitor_interval", V::kFloat)
          .flag("monitor_interval")
          .def("0.1")
          .help("Seconds between checks of worker health (fsdptrain extension key)")
          .extension()
          .to(L, &LaunchConfig::monitor_interval),
      Row("rdzv_timeout", V::kFloat)
          .flag("rdzv_timeout")
          .def("300")
          .help("Seconds to wait for every machine to join before failing (fsdptrain extension key)")
          .extension()
          .to(L, &LaunchConfig::rdzv_timeout),
      Row("dist_timeout", V::kFloat)
          .flag("dist_timeout")
          .env(env::kDistTimeout)
          .def("600")
          .help("Seconds a collective may take before the rank fails naming it (fsdptrain extension key)")
          .extension()
          .to(L, &LaunchConfig::dist_timeout),
      ignored("main_training_function", "TPU only"),
      ignored("downcast_bf16", "TPU only"),
      ignored("tpu_env", "TPU only"),
      ignored("tpu_use_cluster", "TPU only"),
      ignored("tpu_use_sudo", "TPU only"),
      ignored("tpu_name", "TPU only"),
      ignored("tpu_zone", "TPU only"),
      ignored("tpu_vm", "TPU only"),
      ignored("tpu_cluster", "TPU only"),
      ignored("command_file", "TPU only"),
      ignored("commands", "TPU only"),
      ignored("dynamo_config", "fsdptrain compiles ahead of time; torch.compile settings do not apply"),
      ignored("dynamo_backend", "fsdptrain compiles ahead of time; torch.compile settings do not apply"),
      ignored("deepspeed_config", "DeepSpeed is not supported"),
      ignored("megatron_lm_config", "Megatron-LM is not supported"),
      ignored("fp8_config", "Accelerate's fp8 settings are not read; engine.float8 chooses float8 training"),
      ignored("mpirun_config", "fsdptrain starts its own workers; MPI is not used"),
      ignored("ipex_config", "Intel extension settings do not apply"),

      // ---- fsdp_config (FSDP1 and FSDP2; Accelerate's names) ----
      Row("fsdp_config.fsdp_version", V::kEnum)
          .flag("fsdp_version")
          .env("FSDP_VERSION")
          .choices({"1", "2"})
          .def("1")
          .note("1 when absent, as `accelerate launch` does; `fsdptrain config` writes 2")
          .help("1: Accelerate's FSDP1 keys (run as the equivalent FSDP2 layout); 2: FSDP2 keys")
          .to(F, &FsdpConfig::version),
      Row("fsdp_config.fsdp_reshard_after_forward", V::kBool)
          .flag("fsdp_reshard_after_forward")
          .env("FSDP_RESHARD_AFTER_FORWARD")
          .parse(parse_reshard)
          .def("true")
          .help("Free each unit's gathered parameters after its forward (true), keep them for backward (false), or "
                "(FSDP2) keep them sharded over N ranks, a divisor of the shard group such as one machine's GPUs, so "
                "backward gathers inside those N")
          .apply(apply_reshard),
      Row("fsdp_config.fsdp_sharding_strategy", V::kEnum)
          .flag("fsdp_sharding_strategy")
          .env("FSDP_SHARDING_STRATEGY")
          .choices(enum_names(kShardingStrategyNames), true)
          .only(FsdpVersions::kV1Only)
          .def("")
          .note("FULL_SHARD")
          .help("FSDP1 strategy (names in any case, or 1-5); FSDP2 expresses it with reshard_after_forward and "
                "parallelism_config")
          .to(F, &FsdpConfig::sharding_strategy),
      Row("fsdp_config.fsdp_offload_params", V::kBool)
          .flag("fsdp_offload_params")
          .env("FSDP_OFFLOAD_PARAMS")
          .def("false")
          .help("Keep sharded parameters, gradients and optimizer state in host memory; the optimizer steps there")
          .to(F, &FsdpConfig::offload_params),
      Row("fsdp_config.fsdp_auto_wrap_policy", V::kEnum)
          .flag("fsdp_auto_wrap_policy")
          .env("FSDP_AUTO_WRAP_POLICY")
          .choices(enum_names(kWrapPolicyNames))
          .def("TRANSFORMER_BASED_WRAP")
          .note(
              "TRANSFORMER_BASED_WRAP (Accelerate's wizard default; its worker falls back to NO_WRAP, one giant unit)")
          .help("How the model is split into units that are gathered one at a time")
          .to(F, &FsdpConfig::auto_wrap_policy),
      Row("fsdp_config.fsdp_transformer_layer_cls_to_wrap", V::kList)
          .flag("fsdp_transformer_layer_cls_to_wrap")
          .env("FSDP_TRANSFORMER_CLS_TO_WRAP")
          .def("")
          .note("the model's decoder layer (LlamaDecoderLayer, MistralDecoderLayer, Qwen2DecoderLayer or "
                "Qwen3DecoderLayer, from its config.json)")
          .help("Class names that become units with TRANSFORMER_BASED_WRAP (comma-separated or a YAML list); "
                "leave it empty for the model's decoder layer")
          .to(F, &FsdpConfig::transformer_layer_cls_to_wrap),
      Row("fsdp_config.fsdp_min_num_params", V::kInt)
          .flag("fsdp_min_num_params")
          .env("FSDP_MIN_NUM_PARAMS")
          .range(0)
          .def("100000000")
          .help("With SIZE_BASED_WRAP: a module with at least this many parameters becomes a unit")
          .to(F, &FsdpConfig::min_num_params),
      Row("fsdp_config.fsdp_backward_prefetch", V::kEnum)
          .flag("fsdp_backward_prefetch")
          .env("FSDP_BACKWARD_PREFETCH")
          .choices(enum_names(kBackwardPrefetchNames), true)
          .only(FsdpVersions::kV1Only)
          .def("")
          .help("FSDP1 backward prefetch; FSDP2 always prefetches the next unit")
          .to(F, &FsdpConfig::backward_prefetch),
      Row("fsdp_config.fsdp_state_dict_type", V::kEnum)
          .flag("fsdp_state_dict_type")
          .env("FSDP_STATE_DICT_TYPE")
          .choices(enum_names(kStateDictTypeNames), true)
          .def("")
          .note("FULL_STATE_DICT for FSDP1, SHARDED_STATE_DICT for FSDP2")
          .help("Checkpoint format: FULL (a Hugging Face folder) or SHARDED (one file per rank, reshardable)")
          .to(F, &FsdpConfig::state_dict_type),
      Row("fsdp_config.fsdp_forward_prefetch", V::kBool)
          .flag("fsdp_forward_prefetch")
          .env("FSDP_FORWARD_PREFETCH")
          .only(FsdpVersions::kV1Only)
          .def("false")
          .help("FSDP1 only: prefetch the next unit during forward")
          .to(F, &FsdpConfig::forward_prefetch),
      Row("fsdp_config.fsdp_use_orig_params", V::kBool)
          .flag("fsdp_use_orig_params")
          .env("FSDP_USE_ORIG_PARAMS")
          .only(FsdpVersions::kV1Only)
          .def("true")
          .help("FSDP1 only; FSDP2 always keeps the original parameters")
          .to(F, &FsdpConfig::use_orig_params),
      Row("fsdp_config.fsdp_cpu_ram_efficient_loading", V::kBool)
          .flag("fsdp_cpu_ram_efficient_loading")
          .env("FSDP_CPU_RAM_EFFICIENT_LOADING")
          .def("true")
          .help("model.pretrained: only rank 0 reads the Hugging Face folder and sends each rank its rows (false: "
                "each rank reads its own); a checkpoint is read by each rank, its own rows")
          .to(F, &FsdpConfig::cpu_ram_efficient_loading),
      Row("fsdp_config.fsdp_sync_module_states", V::kBool)
          .flag("fsdp_sync_module_states")
          .env("FSDP_SYNC_MODULE_STATES")
          .only(FsdpVersions::kV1Only)
          .def("true")
          .help("FSDP1 only: broadcast rank 0's weights at start")
          .to(F, &FsdpConfig::sync_module_states),
      Row("fsdp_config.fsdp_activation_checkpointing", V::kBool)
          .flag("fsdp_activation_checkpointing")
          .env("FSDP_ACTIVATION_CHECKPOINTING")
          .def("false")
          .help("Recompute each unit's activations in backward instead of storing them")
          .to(F, &FsdpConfig::activation_checkpointing),
      Row("fsdp_config.fsdp_ignored_modules", V::kString)
          .flag("fsdp_ignored_modules")
          .env("FSDP_IGNORED_MODULES")
          .def("")
          .help("Regex over module names (full match); matching modules are not sharded")
          .to(F, &FsdpConfig::ignored_modules),

      // ---- parallelism_config (FSDP2) ----
      Row("parallelism_config.parallelism_config_dp_replicate_size", V::kInt)
          .flag("parallelism_config_dp_replicate_size")
          .env("PARALLELISM_CONFIG_DP_REPLICATE_SIZE")
          .range(1)
          .def("1")
          .help("HSDP: number of replicas (each holds a full sharded copy)")
          .to(P, &ParallelismConfig::dp_replicate_size),
      Row("parallelism_config.parallelism_config_dp_shard_size", V::kInt)
          .flag("parallelism_config_dp_shard_size")
          .env("PARALLELISM_CONFIG_DP_SHARD_SIZE")
          .range(1)
          .def("1")
          .help("HSDP: ranks that shard one replica (replicate x shard x tp = num_processes)")
          .to(P, &ParallelismConfig::dp_shard_size),
      Row("parallelism_config.parallelism_config_tp_size", V::kInt)
          .flag("parallelism_config_tp_size")
          .env("PARALLELISM_CONFIG_TP_SIZE")
          .range(1)
          .def("1")
          .help("Tensor parallel: ranks each layer's weights are split over (heads, MLP rows, vocabulary), with "
                "sequence parallel between layers; innermost in the mesh (dp_replicate x dp_shard x cp x tp), so a "
                "group is consecutive ranks. Alone, dp_shard_size is num_processes / (tp_size x cp_size)")
          .to(P, &ParallelismConfig::tp_size),
      Row("parallelism_config.parallelism_config_cp_size", V::kInt)
          .flag("parallelism_config_cp_size")
          .env("PARALLELISM_CONFIG_CP_SIZE")
          .range(1)
          .def("1")
          .help("Context parallel: ranks each sequence is split over (2 x cp_size chunks, rank i holding chunks i "
                "and 2cp-1-i); they read the same batch, and FSDP shards over dp_shard x cp. In the mesh "
                "dp_replicate x dp_shard x cp x tp")
          .to(P, &ParallelismConfig::cp_size),
      Row("parallelism_config.parallelism_config_cp_backend", V::kEnum)
          .flag("parallelism_config_cp_backend")
          .env("PARALLELISM_CONFIG_CP_BACKEND")
          .choices({"torch"})
          .def("torch")
          .help("Context parallel's implementation (Accelerate's only one: torch, FSDP2's)")
          .to(P, &ParallelismConfig::cp_backend),
      Row("parallelism_config.parallelism_config_cp_comm_strategy", V::kEnum)
          .flag("parallelism_config_cp_comm_strategy")
          .env("PARALLELISM_CONFIG_CP_COMM_STRATEGY")
          .choices({"allgather", "alltoall"})
          .def("allgather")
          .help("Context parallel's K/V exchange: allgather (gathered before attention, gradients reduce-scattered) "
                "or alltoall (a ring: blocks passed around the group, no rank holds the whole sequence's K/V)")
          .to(P, &ParallelismConfig::cp_comm_strategy),
      Row("parallelism_config.parallelism_config_sp_size", V::kInt)
          .flag("parallelism_config_sp_size")
          .env("PARALLELISM_CONFIG_SP_SIZE")
          .range(1)
          .def("1")
          .help("Ulysses sequence parallel: ranks each sequence is split over in contiguous blocks, swapped for "
                "heads around attention (all-to-all); heads and kv heads must divide by it. Not with cp_size")
          .to(P, &ParallelismConfig::sp_size),
      Row("parallelism_config.parallelism_config_ep_size", V::kInt)
          .flag("parallelism_config_ep_size")
          .env("PARALLELISM_CONFIG_EP_SIZE")
          .range(1)
          .def("1")
          .help("Expert parallel (fsdptrain extension key: Accelerate has none): ranks of the FSDP shard group "
                "(dp_shard x cp) that split each mixture-of-experts layer's experts, rank i of a group holding the "
                "i-th num_experts / ep_size; tokens reach their experts through all-to-all, and the experts are "
                "sharded over the shard group / ep_size. Must divide dp_shard x cp and the model's num_experts")
          .extension()
          .to(P, &ParallelismConfig::ep_size),
      Row("parallelism_config.parallelism_config_sp_backend", V::kEnum)
          .flag("parallelism_config_sp_backend")
          .env("PARALLELISM_CONFIG_SP_BACKEND")
          .choices({"deepspeed"})
          .def("deepspeed")
          .help("Sequence parallel's implementation in Accelerate (DeepSpeed's ALST/Ulysses); fsdptrain runs its own "
                "Ulysses beside FSDP")
          .to(P, &ParallelismConfig::sp_backend),
      Row("parallelism_config.parallelism_config_sp_seq_length", V::kString)
          .flag("parallelism_config_sp_seq_length")
          .env("PARALLELISM_CONFIG_SP_SEQ_LENGTH")
          .def("")
          .help("With sp_seq_length_is_variable: false, every batch's sequence length (must be "
                "train.sequence_length)")
          .to(P, &ParallelismConfig::sp_seq_length),
      Row("parallelism_config.parallelism_config_sp_seq_length_is_variable", V::kBool)
          .flag("parallelism_config_sp_seq_length_is_variable")
          .env("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE")
          .def("true")
          .help("Whether batches' sequence lengths may vary (fsdptrain's are train.sequence_length)")
          .to(P, &ParallelismConfig::sp_seq_length_is_variable),
      Row("parallelism_config.parallelism_config_sp_attn_implementation", V::kString)
          .flag("parallelism_config_sp_attn_implementation")
          .env("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION")
          .def("sdpa")
          .help("Attention under sequence parallel in Accelerate: sdpa, flash_attention_2 or flash_attention_3 "
                "(fsdptrain picks its kernels itself: flash attention where the device has it)")
          .to(P, &ParallelismConfig::sp_attn_implementation),

      // ---- the built-in trainer (fsdptrain extension sections) ----
      Row("model.config", V::kString)
          .def("")
          .help("Hugging Face config.json of the model to train: Llama, Mistral, Qwen2/2.5, Qwen3, Gemma 2/3/4, OLMo "
                "2/3, SmolLM3, Granite 3, Phi-3/3.5/4, the mixtures of experts Qwen3-MoE, Qwen2-MoE, Mixtral, "
                "gpt-oss, GLM-4.5, DeepSeek-V2, DeepSeek-V3 and GLM-4.7-Flash, or the hybrids Qwen3.5/3.6, Qwen3.5-MoE "
                "and Qwen3-Next (see configs/models/)")
          .extension()
          .to(&Config::model, &ModelConfig::config),
      Row("model.pretrained", V::kString)
          .def("")
          .help("A Hugging Face folder (config.json + safetensors, tokenizer.json) to start from, or its Hub id "
                "(ORG/NAME) in the Hugging Face cache (a folder of that name wins); its config.json is the model "
                "unless model.config is also given, which must then match it")
          .extension()
          .to(&Config::model, &ModelConfig::pretrained),
      Row("model.revision", V::kString)
          .def("main")
          .help("With model.pretrained as a Hub id: the branch, tag or commit of it in the cache (from_pretrained's "
                "revision)")
          .extension()
          .to(&Config::model, &ModelConfig::revision),
      Row("model.gradient_checkpointing", V::kBool)
          .def("false")
          .note("false; true with model.pretrained (TRL's)")
          .help("Transformers' and TRL's switch (gradient_checkpointing): true turns on "
                "fsdp_config.fsdp_activation_checkpointing, which does the same")
          .extension()
          .to(&Config::model, &ModelConfig::gradient_checkpointing),
      Row("model.text_only", V::kBool)
          .def("false")
          .help("With a Gemma3ForConditionalGeneration, Gemma4ForConditionalGeneration, "
                "Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration or "
                "Mistral3ForConditionalGeneration folder (text and vision): "
                "train its text model, leaving the "
                "vision tower out of the run and its exports (its *ForCausalLM folders); without it such a folder "
                "is refused")
          .extension()
          .to(&Config::model, &ModelConfig::text_only),
      Row("data.path", V::kString)
          .def("")
          .help("Training data: text files, .jsonl or .json (documents, prompt/completion or conversation records; a "
                ".json array too; .gz/.zst too), .parquet or .arrow tables of the same records, a folder datasets' "
                "save_to_disk wrote, llm.c .bin token shards, or a glob")
          .extension()
          .to(&Config::data, &DataConfig::path),
      Row("data.dataset", V::kString)
          .def("")
          .help("Training data by its Hub id (ORG/NAME), as load_dataset names it: its files in the Hugging Face "
                "cache (Parquet, Arrow or JSON; hf download ORG/NAME --repo-type dataset puts them there); instead "
                "of data.path")
          .extension()
          .to(&Config::data, &DataConfig::dataset),
      Row("data.split", V::kString)
          .def("train")
          .help("With data.dataset, or a save_to_disk folder of several splits: the split to train on")
          .extension()
          .to(&Config::data, &DataConfig::split),
      Row("data.config", V::kString)
          .def("")
          .help("With data.dataset: the subset (load_dataset's name), for a dataset of several; default: its only or "
                "\"default\" one")
          .extension()
          .to(&Config::data, &DataConfig::config),
      Row("data.revision", V::kString)
          .def("main")
          .help("With data.dataset: the branch, tag (refs/convert/parquet) or commit of it in the cache")
          .extension()
          .to(&Config::data, &DataConfig::revision),
      Row("data.field", V::kString)
          .def("text")
          .help("JSONL: the field holding each document (records with \"prompt\" and \"completion\" train on the "
                "completions)")
          .extension()
          .to(&Config::data, &DataConfig::field),
      Row("data.tokenizer", V::kString)
          .def("")
          .help("The tokenizer for text data: a tokenizer.json or a model folder; default: model.pretrained's. Text "
                "is tokenized once into data.cache_dir")
          .extension()
          .to(&Config::data, &DataConfig::tokenizer),
      Row("data.cache_dir", V::kString)
          .def("")
          .note("fsdptrain-cache beside train.output_dir")
          .help("Where text tokenized for training is kept and found again while the inputs are unchanged")
          .extension()
          .to(&Config::data, &DataConfig::cache_dir),
      Row("data.eval_fraction", V::kFloat)
          .range(0)
          .def("0.05")
          .note("0.05; 0 with model.pretrained (Trainer evaluates only when asked)")
          .help("Fraction of the sequences held out for evaluation (0 to 0.5); not used with data.eval_path")
          .extension()
          .to(&Config::data, &DataConfig::eval_fraction),
      Row("data.eval_path", V::kString)
          .def("")
          .help("Held-out data of your own (the same kinds of file as data.path, tokenized the same way), or the Hub "
                "id (ORG/NAME) of a dataset in the Hugging Face cache (its split data.eval_split, else test); the "
                "training data is then used whole")
          .extension()
          .to(&Config::data, &DataConfig::eval_path),
      Row("data.eval_split", V::kString)
          .def("")
          .help("A split of data.dataset (or of a save_to_disk DatasetDict at data.path) held out for evaluation, "
                "as TRL's dataset_test_split; with data.eval_path as a Hub id, the split of that dataset")
          .extension()
          .to(&Config::data, &DataConfig::eval_split),
      Row("data.packing", V::kEnum)
          .choices(enum_names(kPackingNames))
          .def("auto")
          .help("How records fill sequences: masked (packed, each record attending only within itself, positions "
                "restarting per record, as TRL's padding-free packing), plain (packed, one causal mask across them), "
                "pad (one record per sequence, padded); auto: masked for prompt/completion and chat records, plain "
                "for text")
          .extension()
          .to(&Config::data, &DataConfig::packing),
      Row("data.chat_template", V::kString)
          .def("")
          .note("the tokenizer folder's (chat_template.jinja, or tokenizer_config.json's chat_template); with "
                "assistant-only loss, TRL's training variant of it where data.training_templates has one")
          .help("For conversation records: a Jinja chat template file to render them with instead of the model's "
                "(TRL's *_training.jinja variants, whose {% generation %} blocks mark the assistant's tokens); "
                "model: the model's own, never a training variant")
          .extension()
          .to(&Config::data, &DataConfig::chat_template),
      Row("data.training_templates", V::kString)
          .def("")
          .note("TRL's chat_templates folder in the active Python environment, when TRL is installed")
          .help("A folder of chat templates NAME.jinja and their training variants NAME_training.jinja (TRL's "
                "trl/chat_templates): with assistant-only loss and data.chat_template unset, a model whose template "
                "is NAME.jinja byte for byte renders its conversations with NAME_training.jinja, as TRL's "
                "SFTTrainer does; none: never")
          .extension()
          .to(&Config::data, &DataConfig::training_templates),
      Row("data.chat_template_max_output", V::kInt)
          .range(1)
          .def("67108864")
          .help("Bytes one render of a chat template may write (64 MiB): a template comes with a model from the "
                "Hub, and one that loops without end is refused, naming this limit")
          .extension()
          .to(&Config::data, &DataConfig::chat_template_max_output),
      Row("data.chat_template_max_iterations", V::kInt)
          .range(1)
          .def("10000000")
          .help("Steps one render of a chat template may take: loop iterations, list items and KiB of strings "
                "made")
          .extension()
          .to(&Config::data, &DataConfig::chat_template_max_iterations),
      Row("data.chat_template_max_depth", V::kInt)
          .range(1, 10000)
          .def("200")
          .help("How deep a chat template may nest expressions, blocks and macro calls (its parser and renderer "
                "recurse once a level)")
          .extension()
          .to(&Config::data, &DataConfig::chat_template_max_depth),
      Row("data.chat_template_max_string", V::kInt)
          .range(1)
          .def("67108864")
          .help("Bytes of the longest string one render of a chat template may make (64 MiB), a message's "
                "content included")
          .extension()
          .to(&Config::data, &DataConfig::chat_template_max_string),
      Row("data.assistant_only_loss", V::kBool)
          .def("true")
          .note("true; false with model.pretrained (TRL's)")
          .help("For conversation records: the loss counts the assistant's turns only (TRL's assistant_only_loss); "
                "false: every token (conversational prompt/completion records always count the completion only "
                "when true)")
          .extension()
          .to(&Config::data, &DataConfig::assistant_only_loss),
      Row("train.output_dir", V::kString)
          .def("")
          .note("runs/<config file name>, beside the config file")
          .help("The run's folder (Trainer's output_dir): its checkpoints, Hugging Face export, metrics, TensorBoard "
                "events, profiles and run.json go under it unless their own keys say otherwise. Relative paths in a "
                "config file are read from the file's folder, those given with --set from the working directory")
          .extension()
          .to(&Config::train, &TrainConfig::output_dir),
      Row("train.steps", V::kInt)
          .range(1)
          .def("100")
          .help("Optimizer steps to train (or give train.epochs)")
          .extension()
          .to(&Config::train, &TrainConfig::steps),
      Row("train.epochs", V::kFloat)
          .range(0)
          .def("0")
          .note("0; 3 with model.pretrained and no train.steps (TRL's num_train_epochs)")
          .help("Train for this many passes over the training data instead of train.steps (0: use train.steps); "
                "the steps are counted once the data is read. Given on the command line, it overrides the file's "
                "train.steps")
          .extension()
          .to(&Config::train, &TrainConfig::epochs),
      Row("train.micro_batch_size", V::kInt)
          .range(1)
          .def("4")
          .note("4; 8 with model.pretrained (TRL's per_device_train_batch_size)")
          .help("Sequences per rank per micro-batch")
          .extension()
          .to(&Config::train, &TrainConfig::micro_batch_size),
      Row("train.gradient_accumulation_steps", V::kInt)
          .range(1)
          .def("1")
          .help("Micro-batches per optimizer step (gradients reduced once, on the last)")
          .extension()
          .to(&Config::train, &TrainConfig::gradient_accumulation_steps),
      Row("train.sequence_length", V::kInt)
          .range(1)
          .def("128")
          .note("128; 1024 with model.pretrained (TRL's max_length), at most its max_position_embeddings")
          .help("Tokens per sequence")
          .extension()
          .to(&Config::train, &TrainConfig::sequence_length),
      Row("train.seed", V::kInt)
          .range(0)
          .def("1234")
          .help("Seed of the initial weights and the data order (the same on any number of processes)")
          .extension()
          .to(&Config::train, &TrainConfig::seed),
      Row("train.eval_interval", V::kInt)
          .range(0)
          .def("0")
          .help("Evaluate on held-out data every N steps (0: only at the end)")
          .extension()
          .to(&Config::train, &TrainConfig::eval_interval),
      Row("train.eval_batches", V::kInt)
          .range(1)
          .def("4")
          .help("Micro-batches per evaluation, per rank")
          .extension()
          .to(&Config::train, &TrainConfig::eval_batches),
      Row("train.skip_nonfinite_loss", V::kBool)
          .def("false")
          .help("Skip a step whose loss is NaN or inf instead of stopping the run")
          .extension()
          .to(&Config::train, &TrainConfig::skip_nonfinite_loss),
      Row("train.moe_load_balance_coeff", V::kFloat)
          .range(0)
          .def("0")
          .help("Auxiliary-loss-free load balancing of a mixture of experts (DeepSeek-V3; TorchTitan's "
                "load_balance_coeff, 1e-3 there): each sparse layer keeps a per-expert bias, added to the "
                "router's scores to choose the top-k experts (never to their weights), and after each step moves "
                "it by this much toward the experts that received fewer tokens than the mean; 0: off")
          .extension()
          .to(&Config::train, &TrainConfig::moe_load_balance_coeff),
      Row("optimizer.lr", V::kFloat)
          .def("3e-4")
          .note("3e-4; 2e-5 with model.pretrained (TRL's SFTConfig)")
          .help("AdamW peak learning rate")
          .extension()
          .to(&Config::optimizer, &OptimConfig::lr),
      Row("optimizer.beta1", V::kFloat)
          .range(0)
          .def("0.9")
          .help("AdamW beta1")
          .extension()
          .to(&Config::optimizer, &OptimConfig::beta1),
      Row("optimizer.beta2", V::kFloat)
          .range(0)
          .def("0.95")
          .note("0.95; 0.999 with model.pretrained (Trainer's)")
          .help("AdamW beta2")
          .extension()
          .to(&Config::optimizer, &OptimConfig::beta2),
      Row("optimizer.eps", V::kFloat)
          .def("1e-8")
          .help("AdamW epsilon")
          .extension()
          .to(&Config::optimizer, &OptimConfig::eps),
      Row("optimizer.weight_decay", V::kFloat)
          .range(0)
          .def("0.1")
          .note("0.1; 0 with model.pretrained (Trainer's)")
          .help("AdamW decoupled weight decay (matrices and embeddings only)")
          .extension()
          .to(&Config::optimizer, &OptimConfig::weight_decay),
      Row("optimizer.grad_clip", V::kFloat)
          .range(0)
          .def("1.0")
          .help("Clip the global gradient norm to this (0: no clipping)")
          .extension()
          .to(&Config::optimizer, &OptimConfig::grad_clip),
      Row("schedule.type", V::kEnum)
          .choices(enum_names(kScheduleTypeNames))
          .def("cosine")
          .note("cosine; linear with model.pretrained (Trainer's)")
          .help("Learning-rate schedule after warmup: cosine or linear decay to lr * min_lr_ratio, or constant")
          .extension()
          .to(&Config::schedule, &ScheduleConfig::type),
      Row("schedule.warmup_steps", V::kInt)
          .range(0)
          .def("10")
          .note("10; 0 with model.pretrained (Trainer's)")
          .help("Steps of linear warmup from 0 to the peak learning rate")
          .extension()
          .to(&Config::schedule, &ScheduleConfig::warmup_steps),
      Row("schedule.warmup_ratio", V::kFloat)
          .range(0)
          .def("0")
          .help("The warmup as a fraction of the run's steps (Trainer's warmup_ratio: ceil(ratio x steps) steps), "
                "instead of schedule.warmup_steps")
          .extension()
          .to(&Config::schedule, &ScheduleConfig::warmup_ratio),
      Row("schedule.min_lr_ratio", V::kFloat)
          .range(0)
          .def("0.1")
          .note("0.1; 0 with model.pretrained (Trainer's linear decay ends at 0)")
          .help("Final learning rate as a fraction of the peak (0 to 1)")
          .extension()
          .to(&Config::schedule, &ScheduleConfig::min_lr_ratio),
      Row("checkpoint.dir", V::kString)
          .def("")
          .note("<train.output_dir>/checkpoints")
          .help("Save training checkpoints (weights, AdamW state, step, data position, RNG) as <dir>/step-<N>, in "
                "the format of fsdp_state_dict_type; none (or empty): no checkpoints")
          .extension()
          .to(&Config::checkpoint, &CheckpointConfig::dir),
      Row("checkpoint.interval", V::kInt)
          .range(0)
          .def("0")
          .note("0; 500 with model.pretrained (Trainer's save_steps)")
          .help("Also save a checkpoint every N steps (0: only at the end)")
          .extension()
          .to(&Config::checkpoint, &CheckpointConfig::interval),
      Row("checkpoint.keep", V::kInt)
          .range(0)
          .def("0")
          .help("Keep the newest N complete checkpoints and delete older ones (0: keep all)")
          .extension()
          .to(&Config::checkpoint, &CheckpointConfig::keep),
      Row("checkpoint.keep_best", V::kBool)
          .def("false")
          .help("Also keep the checkpoint with the lowest held-out loss (evaluated at each save), whatever "
                "checkpoint.keep prunes")
          .extension()
          .to(&Config::checkpoint, &CheckpointConfig::keep_best),
      Row("checkpoint.direct_io", V::kBool)
          .def("true")
          .help("Write checkpoints from their staging buffer straight to the disk (O_DIRECT), and read them on a "
                "resume straight into the model, allocating no page cache for them, where the file system takes it "
                "(elsewhere through the page cache); false: always through the page cache, for a file system whose "
                "direct I/O is slow")
          .extension()
          .to(&Config::checkpoint, &CheckpointConfig::direct_io),
      Row("checkpoint.resume", V::kString)
          .def("")
          .help("Continue a run: 'latest' (the newest complete checkpoint in checkpoint.dir, or a fresh start when "
                "there is none) or a checkpoint folder; empty: start fresh")
          .extension()
          .to(&Config::checkpoint, &CheckpointConfig::resume),
      Row("checkpoint.resume_new_batch", V::kBool)
          .def("false")
          .help("Resume a checkpoint with another global batch (processes x micro batch x accumulation) than the run "
                "that saved it, whose steps and learning rates then change; without it such a resume is refused, "
                "saying what would change")
          .extension()
          .to(&Config::checkpoint, &CheckpointConfig::resume_new_batch),
      Row("checkpoint.export_dir", V::kString)
          .def("")
          .note("<train.output_dir>/export")
          .help("Write the trained model as a Hugging Face folder <export_dir>/step-<N> (loadable by transformers' "
                "from_pretrained and fsdptrain generate, with the tokenizer and chat template files) at the end of "
                "training; none (or empty): no model is written")
          .extension()
          .to(&Config::checkpoint, &CheckpointConfig::export_dir),
      Row("checkpoint.export_interval", V::kInt)
          .range(0)
          .def("0")
          .help("Also export every N steps (0: only at the end)")
          .extension()
          .to(&Config::checkpoint, &CheckpointConfig::export_interval),
      Row("checkpoint.export_merged", V::kBool)
          .def("false")
          .help("With LoRA: export the adapters folded into the base as a whole Hugging Face model, instead of a "
                "PEFT adapter folder (adapter_config.json, adapter_model.safetensors)")
          .extension()
          .to(&Config::checkpoint, &CheckpointConfig::export_merged),
      Row("checkpoint.export_dtype", V::kEnum)
          .choices(enum_names(kExportDtypeNames))
          .def("auto")
          .help("The dtype of an export's weights (and of its config.json's torch_dtype), as transformers' "
                "save_pretrained writes a model in its dtype: auto (model.pretrained's torch_dtype; float32 for a "
                "model trained from model.config), float32, bfloat16 or float16. A PEFT adapter stays float32, "
                "as PEFT saves it")
          .extension()
          .to(&Config::checkpoint, &CheckpointConfig::export_dtype),
      Row("lora.r", V::kInt)
          .range(0)
          .def("0")
          .help("LoRA rank: train low-rank adapters beside the frozen model instead of every parameter (PEFT's "
                "LoraConfig; 8 or 16 are common); 0: full fine-tuning")
          .extension()
          .to(&Config::lora, &LoraConfig::r),
      Row("lora.alpha", V::kFloat)
          .range(0)
          .def("8")
          .help("LoRA alpha: the adapters' output is scaled by alpha / r (alpha / sqrt(r) with use_rslora)")
          .extension()
          .to(&Config::lora, &LoraConfig::alpha),
      Row("lora.dropout", V::kFloat)
          .range(0, 1)
          .def("0")
          .help("Dropout on the adapters' input while training (0 to 1)")
          .extension()
          .to(&Config::lora, &LoraConfig::dropout),
      Row("lora.target_modules", V::kList)
          .def("")
          .note("q_proj,v_proj")
          .help("Linear layers that get adapters: short names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                "down_proj), full module names, a regular expression over full names, or all-linear")
          .extension()
          .to(&Config::lora, &LoraConfig::target_modules),
      Row("lora.use_rslora", V::kBool)
          .def("false")
          .help("Rank-stabilised LoRA: scale by alpha / sqrt(r)")
          .extension()
          .to(&Config::lora, &LoraConfig::use_rslora),
      Row("lora.modules_to_save", V::kList)
          .def("")
          .help("Modules trained whole beside the adapters and saved with them (lm_head, embed_tokens, norm)")
          .extension()
          .to(&Config::lora, &LoraConfig::modules_to_save),
      Row("lora.target_parameters", V::kList)
          .def("")
          .help("A mixture of experts' stacked weights that get adapters, one per expert (PEFT's target_parameters): "
                "mlp.experts.gate_up_proj, mlp.experts.down_proj, and the router's weight, mlp.gate.weight; with "
                "these alone (no target_modules) no linear layer is adapted. Needs lora.dropout 0")
          .extension()
          .to(&Config::lora, &LoraConfig::target_parameters),
      Row("lora.rank_pattern", V::kMap)
          .def("")
          .parse(parse_patterns(true))
          .help(
              "Ranks other than lora.r, by module (PEFT's rank_pattern): {q_proj: 16, .*\\.experts\\.gate_up_proj: 4}; "
              "an adapter takes the first pattern its module's name ends in (a name, its last parts or a regular "
              "expression), else lora.r")
          .extension()
          .to(&Config::lora, &LoraConfig::rank_pattern),
      Row("lora.alpha_pattern", V::kMap)
          .def("")
          .parse(parse_patterns(false))
          .help("Alphas other than lora.alpha, by module (PEFT's alpha_pattern), matched as lora.rank_pattern")
          .extension()
          .to(&Config::lora, &LoraConfig::alpha_pattern),
      Row("lora.layers_to_transform", V::kList)
          .def("")
          .parse(parse_layers)
          .help("Only these decoder layers' lora.target_modules get adapters (PEFT's layers_to_transform; layers "
                "count from 0); a module named in full, and lora.target_parameters, whatever its layer")
          .extension()
          .to(&Config::lora, &LoraConfig::layers_to_transform),
      Row("lora.layers_pattern", V::kList)
          .def("")
          .help("The name before the layer's number that lora.layers_to_transform reads (PEFT's layers_pattern: "
                "layers); empty: the first number in a module's name after two parts of it (model.layers.N)")
          .extension()
          .to(&Config::lora, &LoraConfig::layers_pattern),
      Row("lora.init", V::kString)
          .def("")
          .help("A PEFT adapter folder (adapter_config.json, adapter_model.safetensors) to start from, to continue "
                "an adapter; empty: PEFT's initialisation (A random from train.seed, B zero)")
          .extension()
          .to(&Config::lora, &LoraConfig::init),
      Row("logging.interval", V::kInt)
          .range(1)
          .def("10")
          .help("Print metrics every N steps")
          .extension()
          .to(&Config::logging, &LoggingConfig::interval),
      Row("logging.metrics_file", V::kString)
          .def("")
          .note("<train.output_dir>/metrics.jsonl")
          .help("Append one JSON line of metrics per logging step to this file (rank 0); none (or empty): none")
          .extension()
          .to(&Config::logging, &LoggingConfig::metrics_file),
      Row("logging.tensorboard_dir", V::kString)
          .def("")
          .note("<train.output_dir>/tensorboard")
          .help("Write TensorBoard event files here (rank 0): train/loss, eval/loss, learning rate, grad norm, "
                "tokens/s, MFU, peak memory, step time, and the resolved config as text; none (or empty): none")
          .extension()
          .to(&Config::logging, &LoggingConfig::tensorboard_dir),
      Row("logging.peak_tflops", V::kFloat)
          .range(0)
          .def("0")
          .help("Peak TFLOP/s of one device for MFU (0: from fsdptrain's table of known GPUs)")
          .extension()
          .to(&Config::logging, &LoggingConfig::peak_tflops),
      Row("logging.profile_steps", V::kList)
          .flag("profile")
          .flag_alone()
          .parse(parse_profile_steps)
          .def("")
          .help("Trace these steps with LibTorch's profiler, [first, last]: one Chrome/Perfetto trace per rank in "
                "logging.profile_dir, with the FSDP phases named (gather, reduce, optimizer) and, on a GPU, the "
                "kernels and NCCL collectives. --profile alone: steps 3 and 4")
          .extension()
          .apply(apply_profile_steps),
      Row("logging.profile_dir", V::kString)
          .def("")
          .note("<train.output_dir>/profile")
          .help("Where logging.profile_steps writes its traces: rank<R>.steps-<first>-<last>.json")
          .extension()
          .to(&Config::logging, &LoggingConfig::profile_dir),
      Row("logging.verbose", V::kBool)
          .flag("verbose")
          .env(env::kVerbose)
          .def("false")
          .help("The built-in trainer prints the whole resolved config first (it is in the run folder's run.json "
                "either way)")
          .extension()
          .to(&Config::logging, &LoggingConfig::verbose),
      // ---- engine: how the trainer computes (the same results, to the rounding) ----
      Row("engine.kernels", V::kEnum)
          .env(env::kKernels)
          .choices(enum_names(kKernelProviderNames))
          .def("auto")
          .help("Who computes the model's ops: host (the CPU's own kernels: fused RMSNorm, rotary and SwiGLU, "
                "oneDNN's products, the loss by token chunks), portable (the kernels a GPU runs, launched by "
                "ATen's loops on any device: on the CPU it runs the GPU's arithmetic), reference (ATen's ops one "
                "by one, to compare against); auto: host on the CPU, portable on a GPU")
          .extension()
          .to(&Config::engine, &EngineConfig::kernels),
      Row("engine.onednn_products", V::kEnum)
          .env(env::kOnednnProducts)
          .choices(enum_names(kOnednnProductsNames))
          .def("large")
          .help("With the host kernels, which float32 products (and attention) run on oneDNN rather than "
                "LibTorch's mm and SDPA: large (those big enough to pay oneDNN's fixed cost per call), all, off")
          .extension()
          .to(&Config::engine, &EngineConfig::onednn_products),
      Row("engine.float8", V::kEnum)
          .env(env::kFloat8)
          .choices(enum_names(kFloat8TrainingNames))
          .def("none")
          .help("float8 training of the decoder layers' linear products, as torchao's recipes (the loss head, "
                "embeddings, norms and attention stay in bf16): tensorwise (one scale a tensor; e4m3 inputs and "
                "weights, e5m2 gradients) or rowwise (a scale a row, all e4m3, scales powers of 2). GPUs of "
                "compute capability 8.9 and up (Ada, Hopper), with mixed_precision: bf16; none: bf16 products")
          .extension()
          .to(&Config::engine, &EngineConfig::float8),
      Row("engine.float8_all_gather", V::kBool)
          .env(env::kFloat8AllGather)
          .def("true")
          .help("With engine.float8: tensorwise and FSDP over more than one rank: gather the weights of the float8 "
                "products in float8 (e4m3, one scale a weight from one all-reduce of the ranks' largest magnitudes, "
                "as torchao's enable_fsdp_float8_all_gather): half the bytes of a bf16 gather, the same bits in the "
                "products; false: gather them in bf16 and cast them in each product")
          .extension()
          .to(&Config::engine, &EngineConfig::float8_all_gather),
      Row("engine.read_ahead", V::kEnum)
          .env(env::kReadAhead)
          .choices(enum_names(kReadAheadNames))
          .def("auto")
          .help("Read the next step's batches on a thread while the step runs; auto: on a GPU (on the CPU the "
                "thread would take turns with the step's own threads)")
          .extension()
          .to(&Config::engine, &EngineConfig::read_ahead),
      Row("engine.host_cache", V::kBool)
          .env(env::kHostCache)
          .def("true")
          .help("CPU runs: keep freed large host blocks for reuse (the step allocates the same sizes every time) "
                "instead of returning them to the system allocator")
          .extension()
          .to(&Config::engine, &EngineConfig::host_cache),
      Row("engine.offload_overlap", V::kBool)
          .env(env::kOffloadOverlap)
          .def("true")
          .help("With fsdp_offload_params: apply each unit's optimizer update on the host when the next forward "
                "gathers the unit, so the host updates unit k+1 while unit k's weights go up to the GPU and "
                "compute (the same results); false: the whole update at the step, before any upload")
          .extension()
          .to(&Config::engine, &EngineConfig::offload_overlap),
      Row("engine.offload_keep_on_device", V::kBool)
          .env(env::kOffloadKeepOnDevice)
          .def("true")
          .help("With fsdp_offload_params on a GPU: keep each unit's weights on the GPU in the compute dtype from "
                "their upload until the unit's next update (2 bytes a parameter over the shard group in bf16), so "
                "backward and every accumulated micro-batch find them there instead of uploading the fp32 shards "
                "again; false: upload at every gather, as FSDP2's CPUOffloadPolicy does, for the least GPU memory")
          .extension()
          .to(&Config::engine, &EngineConfig::offload_keep_on_device),
      Row("engine.sync_debug", V::kBool)
          .env(env::kSyncDebug)
          .def("false")
          .help("CUDA: stop with an error naming the op when anything inside a training step waits for the GPU "
                "(LibTorch's sync debug mode)")
          .extension()
          .to(&Config::engine, &EngineConfig::sync_debug),
      Row("engine.dump_gradients", V::kString)
          .env(env::kDumpGradients)
          .def("")
          .help("A folder: every trainable parameter's full gradient of each step (averaged over the ranks, "
                "before clipping) as step-<N>.safetensors, to compare with another trainer; waits for the device "
                "every step. Empty: none")
          .extension()
          .to(&Config::engine, &EngineConfig::dump_gradients),
  };
  assign_consumers(t);
  return t;
}

}  // namespace

std::vector<std::string> unused_by_trainer(const ResolvedConfig& rc) {
  std::vector<std::string> out;
  for (const ResolvedValue& v : rc.values) {
    const OptionSpec& spec = *v.spec;
    if (spec.used_by != 0 || spec.type == ValueType::kIgnored || !rc.is_set(spec.key) || v.value == spec.default_value)
      continue;
    if (spec.versions == FsdpVersions::kV1Only && rc.typed.fsdp.version == 2) continue;  // validation's business
    out.push_back(str(spec.key, ": ", v.value, " (", v.origin.describe(), ") is not used by the built-in trainer",
                      spec.env.empty() ? "" : " (programs get it as " + spec.env + ")",
                      "; FSDP2 has no such setting, so this run behaves as without it"));
  }
  return out;
}

const std::vector<OptionSpec>& all_options() {
  static const std::vector<OptionSpec> table = build_table();
  return table;
}

const OptionSpec* find_option(const std::string& key) {
  for (const auto& o : all_options())
    if (o.key == key) return &o;
  return nullptr;
}

const OptionSpec* find_option_by_flag(const std::string& flag) {
  std::string f = flag;
  std::replace(f.begin(), f.end(), '-', '_');
  for (const auto& o : all_options())
    if (!o.flag.empty() && o.flag == f) return &o;
  return nullptr;
}

std::vector<std::string> option_sections() {
  std::vector<std::string> out;
  for (const auto& o : all_options()) {
    std::string s = o.section();
    if (!s.empty() && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

std::string OptionSpec::section() const {
  auto dot = key.find('.');
  return dot == std::string::npos ? std::string() : key.substr(0, dot);
}

std::string OptionSpec::leaf() const {
  auto dot = key.find('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

// The environment's reader holds the rule (util/env.h), so a variable and a key read alike.
std::optional<bool> parse_bool(const std::string& text) {
  return fsdp::parse_bool(text);
}

std::string OptionSpec::type_name() const {
  switch (type) {
    case ValueType::kBool:
      return "bool";
    case ValueType::kInt:
      return "int";
    case ValueType::kFloat:
      return "float";
    case ValueType::kString:
      return "string";
    case ValueType::kEnum:
      return join(choices, "|");
    case ValueType::kList:
      return "list";
    case ValueType::kGpuIds:
      return "all|ids";
    case ValueType::kMap:
      return "map";
    case ValueType::kIgnored:
      return "ignored";
  }
  return "?";
}

namespace {

// One value type each: the canonical text of `t`, or nullopt with *error set.
using Canonical = std::optional<std::string>;

Canonical fail(std::string* error, std::string message) {
  *error = std::move(message);
  return std::nullopt;
}

Canonical canonical_bool(const std::string& t, std::string* error) {
  if (auto b = parse_bool(t)) return std::string(*b ? "true" : "false");
  return fail(error, str("expected true or false, got ", quoted(t)));
}

Canonical canonical_int(const OptionSpec& spec, const std::string& t, std::string* error) {
  auto n = parse_int(t);
  if (!n) return fail(error, str("expected a whole number, got ", quoted(t)));
  if ((spec.min_value && *n < *spec.min_value) || (spec.max_value && *n > *spec.max_value))
    return fail(error, spec.max_value ? str("expected a whole number from ", *spec.min_value, " to ", *spec.max_value,
                                            ", got ", *n)
                                      : str("expected a whole number >= ", *spec.min_value, ", got ", *n));
  return std::to_string(*n);
}

// Positive unless the row allows a lower bound (range(0): zero means "off" for that key).
Canonical canonical_float(const OptionSpec& spec, const std::string& t, std::string* error) {
  auto d = parse_float(t);
  if (d && (spec.min_value ? *d >= static_cast<double>(*spec.min_value) : *d > 0)) return t;
  return fail(error, spec.min_value ? str("expected a number >= ", *spec.min_value, ", got ", quoted(t))
                                    : str("expected a positive number, got ", quoted(t)));
}

Canonical canonical_enum(const OptionSpec& spec, const std::string& t, std::string* error) {
  if (const std::optional<size_t> i = find_any_case(spec.choices, t)) return spec.choices[*i];
  if (spec.int_aliases) {
    if (auto n = parse_int(t); n && *n >= 1 && *n <= static_cast<long long>(spec.choices.size()))
      return spec.choices[*n - 1];
  }
  for (const auto& [value, reason] : spec.unsupported)
    if (to_upper(t) == value) return fail(error, str(quoted(t), " is not supported: ", reason));
  std::string msg = str("expected one of ", join(spec.choices, ", "));
  if (spec.int_aliases) msg += str(" (or 1-", spec.choices.size(), ")");
  msg += str(", got ", quoted(t));
  if (t.empty() || to_lower(t) == "false") msg += " (an unquoted NO/no/off in YAML 1.1 reads as false: quote it)";
  if (auto near = closest_match(t, spec.choices)) msg += str("; did you mean ", *near, "?");
  return fail(error, msg);
}

std::vector<std::string> items_of(const RawValue& raw, const std::string& t) {
  return raw.shape == RawValue::Shape::kSequence ? raw.items : split(t, ',');
}

Canonical canonical_list(const RawValue& raw, const std::string& t) {
  std::vector<std::string> out;
  for (auto& i : items_of(raw, t)) {
    std::string v = trim(i);
    if (!v.empty()) out.push_back(v);
  }
  return join(out, ",");
}

Canonical canonical_gpu_ids(const RawValue& raw, const std::string& t, std::string* error) {
  const std::vector<std::string> items = items_of(raw, t);
  if (raw.shape == RawValue::Shape::kScalar && to_lower(t) == "all") return std::string("all");
  std::vector<std::string> out;
  for (auto& i : items) {
    auto n = parse_int(i);
    if (!n || *n < 0)
      return fail(error, str("expected all or comma-separated GPU indices such as 0,1, got ",
                             quoted(t.empty() ? join(items, ",") : t)));
    std::string id = std::to_string(*n);
    if (std::find(out.begin(), out.end(), id) != out.end())
      return fail(error, str("GPU ", id, " is listed twice in ", quoted(t)));
    out.push_back(id);
  }
  if (out.empty()) return fail(error, "expected all or comma-separated GPU indices such as 0,1, got nothing");
  return join(out, ",");
}

}  // namespace

std::optional<std::string> canonicalize(const OptionSpec& spec, const RawValue& raw, std::string* error) {
  using Shape = RawValue::Shape;
  if (raw.shape == Shape::kNull) return std::string();  // null: unset, the default applies
  if (spec.parse) return spec.parse(raw, error);
  if (spec.type == ValueType::kIgnored) return std::string();
  if (raw.shape == Shape::kMap) return fail(error, "expected a single value, got a mapping");
  if (raw.shape == Shape::kSequence && spec.type != ValueType::kList && spec.type != ValueType::kGpuIds)
    return fail(error, "expected a single value, got a list");
  const std::string t = trim(raw.text);
  switch (spec.type) {
    case ValueType::kBool:
      return canonical_bool(t, error);
    case ValueType::kInt:
      return canonical_int(spec, t, error);
    case ValueType::kFloat:
      return canonical_float(spec, t, error);
    case ValueType::kString:
      return t;
    case ValueType::kEnum:
      return canonical_enum(spec, t, error);
    case ValueType::kList:
      return canonical_list(raw, t);
    case ValueType::kGpuIds:
      return canonical_gpu_ids(raw, t, error);
    case ValueType::kMap:  // every map key has a parse of its own (above)
      return fail(error, "expected a mapping");
    case ValueType::kIgnored:
      break;
  }
  return std::string();
}

}  // namespace fsdp::config

#include "config/validate.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "config/resolved.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hub_cache.h"
#include "util/regex.h"
#include "util/strings.h"

namespace fsdp::config {

namespace {

struct Checker {
  const ResolvedConfig& rc;
  Diagnostics& diags;
  std::string to_fsdp2_hint() const {
    return rc.file.empty() ? "run `fsdptrain to-fsdp2` on the config"
                           : "run `fsdptrain to-fsdp2 --config_file " + rc.file + " --overwrite`";
  }
  // Where to point: the key's own position, or the file itself when the value is a default.
  std::string location(const std::string& key) const {
    const Origin& o = rc.get(key).origin;
    if (o.kind == OriginKind::kDefault || o.kind == OriginKind::kDerived) return rc.file;
    return origin_location(o);
  }
  void error(const std::string& key, const std::string& message, const std::string& hint = "") {
    diags.error(location(key), key, message, hint);
  }
  void warning(const std::string& key, const std::string& message, const std::string& hint = "") {
    diags.warning(location(key), key, message, hint);
  }
  bool set(const std::string& key) const { return rc.is_set(key); }
  // The first key of `section` the user set, or "" when none.
  std::string first_set_in(const std::string& section) const {
    for (const auto& v : rc.values)
      if (v.spec->section() == section && set(v.spec->key)) return v.spec->key;
    return "";
  }
};

void check_launch(Checker& c) {
  const LaunchConfig& l = c.rc.typed.launch;
  if (c.rc.get("num_processes").value.empty()) {
    c.error("num_processes",
            "not set; with distributed_type " + c.rc.get("distributed_type").value +
                " the number of processes must be given",
            "add num_processes: N (the total across all machines) or pass --num_processes N");
    return;
  }
  // A refused distributed_type (DEEPSPEED, MULTI_XPU) was already reported; NO is only its stand-in.
  if (l.distributed_type == DistributedType::kNo && l.num_processes > 1 && !c.diags.has_error_for("distributed_type"))
    c.error("distributed_type", str("NO runs a single process, but num_processes is ", l.num_processes),
            "use distributed_type: FSDP to shard over the processes");
  if (l.num_processes % l.num_machines != 0)
    c.error("num_processes",
            str(l.num_processes, " processes cannot be split evenly over ", l.num_machines,
                " machines (num_processes is the total across all machines)"),
            str("use a multiple of ", l.num_machines, ", such as ",
                l.num_machines * ((l.num_processes + l.num_machines - 1) / l.num_machines)));
  if (l.machine_rank >= l.num_machines)
    c.error("machine_rank", str("is ", l.machine_rank, " but there are only ", l.num_machines, " machines"),
            str("use 0..", l.num_machines - 1));
  for (const auto& [key, seconds] : {std::pair<const char*, double>{"monitor_interval", l.monitor_interval},
                                     {"rdzv_timeout", l.rdzv_timeout},
                                     {"dist_timeout", l.dist_timeout}})
    if (!(seconds > 0)) c.error(key, str("must be a number of seconds > 0, got ", seconds));
  if (l.num_machines > 1) {
    if (l.main_process_ip.empty())
      c.error("main_process_ip", str("required when num_machines is ", l.num_machines),
              "set it to the address of machine 0 that every machine can reach");
    if (l.main_process_port == 0)
      c.error("main_process_port", "0 (pick a free port) works on one machine only: the others cannot know the port",
              "choose a fixed port such as 29500");
  }
  if (l.gpu_ids != "all" && !l.use_cpu && l.distributed_type != DistributedType::kMultiCpu) {
    int ids = static_cast<int>(split(l.gpu_ids, ',').size());
    if (ids < l.processes_per_machine())
      c.error("gpu_ids",
              str("lists ", ids, " GPU(s) (", l.gpu_ids, ") but each machine runs ", l.processes_per_machine(),
                  " processes"),
              "list one GPU per process, or use gpu_ids: all");
  }
}

// fsdp_reshard_after_forward: N in an FSDP2 file: a divisor of the shard group, best one machine's
// processes (backward's gathers then stay inside a machine).
void check_partial_reshard(Checker& c) {
  const Config& cfg = c.rc.typed;
  const int n = cfg.fsdp.reshard_after_forward_size, shard = effective_fsdp_layout(cfg).fsdp_shard_size();
  const char* key = "fsdp_config.fsdp_reshard_after_forward";
  std::vector<std::string> divisors;
  for (int d = 2; d < shard; ++d)
    if (shard % d == 0) divisors.push_back(std::to_string(d));
  const std::string choices = divisors.empty() ? str("true or false (", shard, " ranks have no divisor between)")
                                               : str(join(divisors, ", "), ", or true / false");
  // `accelerate to-fsdp2` copies FSDP1's strategy number here (2 = SHARD_GRAD_OP): say what it meant.
  const std::optional<ShardingStrategy> numbered = strategy_numbered(n);
  const std::string legacy = numbered ? str("; if `accelerate to-fsdp2` wrote this file, ", n, " is FSDP1's strategy ",
                                            enum_name(*numbered, kShardingStrategyNames), ", which is ",
                                            reshards_after_forward(*numbered) ? "true" : "false", " here")
                                      : "";
  if (n > shard || shard % n != 0) {
    c.error(key, str("is ", n, " ranks, which does not divide the shard group's ", plural(shard, "rank"), legacy),
            str("use one of ", choices));
    return;
  }
  // As fully_shard: the whole group is not partial resharding (it is true), and may be a misreading.
  // The hint writes what the number meant: FSDP1's strategy where it reads as one, else fully_shard's.
  const std::string meant = numbered && !reshards_after_forward(*numbered) ? "false" : "true";
  if (n == shard)
    c.error(key, str("is the whole shard group (", plural(shard, "rank"), "), which is not partial resharding", legacy),
            divisors.empty() ? str("write ", meant) : str("write ", meant, ", or one of ", join(divisors, ", ")));
  const int per_machine = cfg.launch.processes_per_machine();
  const int tp = effective_fsdp_layout(cfg).tp_size;  // a shard group's N members span N tensor-parallel groups
  if (n < shard && cfg.launch.num_machines > 1 && n * tp > per_machine)
    c.warning(key,
              str(n, " ranks span machines (", per_machine, " processes each): backward's gathers cross the network"),
              str("use ", per_machine / tp, " to keep them inside a machine"));
}

void check_fsdp(Checker& c) {
  const Config& cfg = c.rc.typed;
  const FsdpConfig& f = cfg.fsdp;
  const bool any_fsdp_key = !c.first_set_in("fsdp_config").empty();
  if (cfg.launch.distributed_type != DistributedType::kFsdp) {
    if (any_fsdp_key)
      c.warning("distributed_type", str("is ", c.rc.get("distributed_type").value, ", so fsdp_config is ignored"),
                "set distributed_type: FSDP to shard");
    return;
  }
  const bool v2 = f.version == 2;
  if (v2) {
    for (const auto& v : c.rc.values) {
      if (v.spec->versions != FsdpVersions::kV1Only || !c.set(v.spec->key)) continue;
      std::string why = v.spec->key == "fsdp_config.fsdp_forward_prefetch"
                            ? "FSDP2 has no forward prefetch switch (it prefetches the next unit itself)"
                            : "an FSDP1 key that FSDP2 does not have";
      c.error(v.spec->key, why, c.to_fsdp2_hint());
    }
    if (f.reshard_after_forward_strategy)
      c.error("fsdp_config.fsdp_reshard_after_forward",
              str("FSDP2 expects true or false, got the FSDP1 strategy ",
                  enum_name(*f.reshard_after_forward_strategy, kShardingStrategyNames)),
              c.to_fsdp2_hint());
  } else {
    if (f.reshard_after_forward_size > 0 && !strategy_numbered(f.reshard_after_forward_size))
      c.error("fsdp_config.fsdp_reshard_after_forward",
              str("is ", f.reshard_after_forward_size,
                  ", but an FSDP1 config numbers sharding strategies 1-5 there; a number of ranks to stay sharded "
                  "over after forward is FSDP2's partial resharding"),
              c.to_fsdp2_hint());
    if (f.sharding_strategy && f.reshard_after_forward_strategy &&
        *f.sharding_strategy != *f.reshard_after_forward_strategy)
      c.error("fsdp_config.fsdp_reshard_after_forward",
              str("names the strategy ", enum_name(*f.reshard_after_forward_strategy, kShardingStrategyNames),
                  " but fsdp_sharding_strategy is ", enum_name(*f.sharding_strategy, kShardingStrategyNames)),
              "keep one of the two keys");
    if (f.cpu_ram_efficient_loading && !f.sync_module_states && c.set("fsdp_config.fsdp_sync_module_states"))
      c.error("fsdp_config.fsdp_sync_module_states",
              "must be true with fsdp_cpu_ram_efficient_loading (rank 0 loads the weights and the others receive them)",
              "set fsdp_sync_module_states: true or fsdp_cpu_ram_efficient_loading: false");
  }
  if (f.state_dict_type == StateDictType::kLocalStateDict)
    c.error("fsdp_config.fsdp_state_dict_type",
            v2 ? "FSDP2 does not support LOCAL_STATE_DICT"
               : "LOCAL_STATE_DICT is not supported by fsdptrain (its files only load on the same world size)",
            "use SHARDED_STATE_DICT (reshardable to any number of ranks) or FULL_STATE_DICT (a Hugging Face folder)");
  if (f.auto_wrap_policy == WrapPolicy::kNoWrap && f.activation_checkpointing)
    c.error("fsdp_config.fsdp_activation_checkpointing",
            "needs units to checkpoint, but fsdp_auto_wrap_policy is NO_WRAP",
            "use fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP");
  if (f.auto_wrap_policy == WrapPolicy::kSizeBasedWrap && f.min_num_params <= 0)
    c.error("fsdp_config.fsdp_min_num_params", "must be > 0 with SIZE_BASED_WRAP (0 would wrap nothing)",
            "a typical value is 100000000");
  if (f.auto_wrap_policy != WrapPolicy::kTransformerBasedWrap && !f.transformer_layer_cls_to_wrap.empty())
    c.warning("fsdp_config.fsdp_transformer_layer_cls_to_wrap",
              str("ignored because fsdp_auto_wrap_policy is ", enum_name(f.auto_wrap_policy, kWrapPolicyNames)));
  if (f.auto_wrap_policy != WrapPolicy::kSizeBasedWrap && c.set("fsdp_config.fsdp_min_num_params"))
    c.warning("fsdp_config.fsdp_min_num_params",
              str("ignored because fsdp_auto_wrap_policy is ", enum_name(f.auto_wrap_policy, kWrapPolicyNames)));
  if (!f.ignored_modules.empty()) {
    try {
      const Regex re(f.ignored_modules, "fsdp_config.fsdp_ignored_modules");
    } catch (const InputError& e) {
      c.error("fsdp_config.fsdp_ignored_modules", str("is not a valid regular expression: ", e.what()));
    }
  }
  if (v2 && f.reshard_after_forward_size > 0) check_partial_reshard(c);
  if (!v2) {
    if (is_hybrid(f.fsdp1_strategy()) && cfg.launch.num_machines == 1)
      c.warning(f.sharding_strategy ? "fsdp_config.fsdp_sharding_strategy" : "fsdp_config.fsdp_reshard_after_forward",
                "hybrid sharding on one machine shards over all its processes (no replicas)");
  }
}

// Tensor parallel: what the config alone decides (the model's sizes are checked against tp_size when
// the trainer reads config.json, before any worker starts).
void check_tensor_parallel(Checker& c) {
  const Config& cfg = c.rc.typed;
  const int tp = cfg.parallelism.tp_size;
  const char* key = "parallelism_config.parallelism_config_tp_size";
  const int per_machine = cfg.launch.processes_per_machine();
  if (per_machine % tp != 0)
    c.warning(key,
              str(tp, " does not divide the ", per_machine,
                  " processes of a machine: some tensor-parallel groups span machines, and every layer's "
                  "collectives then cross the network"),
              "a tp_size that divides the GPUs of one machine (8 is common)");
  if (cfg.train.sequence_length % tp != 0)
    c.error(key,
            str(tp, " does not divide train.sequence_length ", cfg.train.sequence_length,
                " (sequence parallel splits each sequence over the tensor-parallel ranks)"),
            "a sequence_length that is a multiple of tp_size");
  // LoRA: a column-parallel projection's lora_B is split with its rows, a row-parallel one's lora_A
  // with its columns (model/parallel/tensor_parallel.h). Not yet: dropout (each tp rank would draw
  // its own mask over the same gathered inputs) and the experts' adapters.
  if (cfg.lora.enabled() && cfg.lora.dropout > 0)
    c.error(key, str("lora.dropout ", cfg.lora.dropout, " is not drawn alike by the tensor-parallel ranks yet"),
            "set lora.dropout: 0 under tp_size > 1, or train with tp_size: 1");
  if (cfg.lora.enabled() && !cfg.lora.target_parameters.empty())
    c.error(key, "lora.target_parameters (the experts' adapters) are not trained under tensor parallel yet",
            "train them with tp_size: 1 (FSDP shards them), or leave out lora.target_parameters");
}

// Context parallel (cp_size) or Ulysses (sp_size): what the split needs of the sequence and the data
// (the model's heads and windows are checked by the trainer, which reads config.json).
void check_sequence_split(Checker& c) {
  const Config& cfg = c.rc.typed;
  const ParallelismConfig& p = cfg.parallelism;
  const bool ulysses = p.sp_size > 1;
  const char* key =
      ulysses ? "parallelism_config.parallelism_config_sp_size" : "parallelism_config.parallelism_config_cp_size";
  // Each rank's tokens must also split over the tensor-parallel ranks (sequence parallel between layers).
  const long long m = 1LL * (ulysses ? p.sp_size : 2 * p.cp_size) * std::max(1, p.tp_size);
  const long long t = cfg.train.sequence_length;
  if (t % m != 0) {
    const long long below = t / m * m, above = below + m;
    c.error("train.sequence_length",
            str(t, " does not split into ", m, ulysses ? " blocks (sp_size" : " chunks (2 x cp_size",
                p.tp_size > 1 ? " x tp_size" : "", ")"),
            str("use a multiple of ", m, below > 0 ? str(": ", below, " or ", above) : str(": ", above)));
  }
  const int per_machine = cfg.launch.processes_per_machine();
  if (p.sequence_size() * std::max(1, p.tp_size) > per_machine)
    c.warning(key,
              str("x tp_size spans machines (", per_machine,
                  " processes each): every layer's attention then "
                  "exchanges K/V across the network"),
              "keep cp_size x tp_size within one machine's GPUs");
  if (!ulysses && cfg.data.packing == Packing::kMasked)
    c.error("data.packing",
            "masked packing (records packed into a row, each attending only to itself) is not split by context "
            "parallel",
            "use packing: pad or plain, or Ulysses (parallelism_config_sp_size), which keeps packed records whole");
  if (ulysses && !p.sp_seq_length_is_variable) {
    const std::optional<long long> n = parse_int(p.sp_seq_length);
    if (!n || *n != t)
      c.error("parallelism_config.parallelism_config_sp_seq_length",
              p.sp_seq_length.empty() ? std::string("is unset, but sp_seq_length_is_variable is false")
                                      : str("is ", p.sp_seq_length, ", but every batch is train.sequence_length ", t),
              str("set it to ", t, ", or sp_seq_length_is_variable: true"));
  }
  for (const char* unsupported : {"eager", "flex_attention"})
    if (p.sp_attn_implementation == unsupported)
      c.error("parallelism_config.parallelism_config_sp_attn_implementation",
              str(unsupported, " cannot run under sequence parallel (Accelerate refuses it too)"),
              "sdpa, flash_attention_2 or flash_attention_3");
}

// Expert parallel: carved out of the FSDP shard group (dp_shard x cp); the model's experts are
// checked by the trainer, which reads config.json.
void check_expert_parallel(Checker& c) {
  const Config& cfg = c.rc.typed;
  const int ep = cfg.parallelism.ep_size;
  const char* key = "parallelism_config.parallelism_config_ep_size";
  const FsdpLayout layout = effective_fsdp_layout(cfg);
  const int shard = layout.fsdp_shard_size();
  if (shard % ep != 0)
    c.error(key,
            str(ep, " does not divide the FSDP shard group (dp_shard_size x cp_size = ", shard,
                " ranks), out of which expert parallel's groups are carved"),
            shard > 1 ? str("an ep_size that divides ", shard) : std::string("set ep_size: 1 (one rank shards alone)"));
  if (cfg.fsdp.activation_checkpointing)
    c.error(key, "expert parallel with activation checkpointing is not implemented yet",
            "set fsdp_config.fsdp_activation_checkpointing: false, or parallelism_config_ep_size: 1");
}

void check_parallelism(Checker& c) {
  const Config& cfg = c.rc.typed;
  const ParallelismConfig& p = cfg.parallelism;
  const std::string first = c.first_set_in("parallelism_config");
  if (first.empty()) return;
  if (cfg.launch.distributed_type != DistributedType::kFsdp || cfg.fsdp.version != 2) {
    c.error(first, "parallelism_config needs FSDP2 (distributed_type: FSDP and fsdp_version: 2)",
            cfg.launch.distributed_type == DistributedType::kFsdp ? c.to_fsdp2_hint() : "set distributed_type: FSDP");
    return;
  }
  if (p.tp_size > 1) check_tensor_parallel(c);
  if (p.ep_size > 1) check_expert_parallel(c);
  if (p.cp_size > 1 && p.sp_size > 1)
    c.error("parallelism_config.parallelism_config_sp_size",
            str("is ", p.sp_size, " beside parallelism_config_cp_size ", p.cp_size,
                ": context parallel and Ulysses sequence parallel split the same sequence, one at a time"),
            "set one of them to 1");
  else if (p.sequence_size() > 1)
    check_sequence_split(c);
  if (c.set("parallelism_config.parallelism_config_cp_comm_strategy") && p.cp_size <= 1)
    c.warning("parallelism_config.parallelism_config_cp_comm_strategy",
              "ignored because parallelism_config_cp_size is 1");
  const long long product = 1LL * p.dp_replicate_size * p.dp_shard_size * p.tp_size * p.cp_size * p.sp_size;
  const bool all_one = product == 1;
  // tp, cp or sp alone: the data-parallel ranks are the rest (dp_shard_size = num_processes / them).
  const int split = p.tp_size * p.sequence_size();
  const bool dp_inferred =
      p.dp_replicate_size == 1 && p.dp_shard_size == 1 && split > 1 && cfg.launch.num_processes % split == 0;
  if (!all_one && !dp_inferred && product != cfg.launch.num_processes)
    c.error(c.set("parallelism_config.parallelism_config_dp_shard_size")
                ? "parallelism_config.parallelism_config_dp_shard_size"
                : first,
            str("dp_replicate_size x dp_shard_size x tp_size", p.cp_size > 1 ? " x cp_size" : "",
                p.sp_size > 1 ? " x sp_size" : "", " = ", p.dp_replicate_size, " x ", p.dp_shard_size, " x ", p.tp_size,
                p.cp_size > 1 ? str(" x ", p.cp_size) : "", p.sp_size > 1 ? str(" x ", p.sp_size) : "", " = ", product,
                ", but num_processes is ", cfg.launch.num_processes),
            "the product of the parallelism sizes must equal num_processes");
}

void check_lora(Checker& c) {
  const LoraConfig& l = c.rc.typed.lora;
  if (!l.enabled()) {
    for (const char* key : {"lora.alpha", "lora.dropout", "lora.target_modules", "lora.use_rslora",
                            "lora.modules_to_save", "lora.target_parameters", "lora.rank_pattern", "lora.alpha_pattern",
                            "lora.layers_to_transform", "lora.layers_pattern", "lora.init", "checkpoint.export_merged"})
      if (c.rc.is_set(key))
        c.warning(key, "has no effect without LoRA (lora.r is 0: every parameter is trained)",
                  "set lora.r (8 or 16 are common) to train adapters");
    return;
  }
  if (!(l.dropout >= 0 && l.dropout < 1))
    c.error("lora.dropout", str("must be at least 0 and below 1, got ", l.dropout), "0 (the default) or 0.05 to 0.1");
  if (!(l.alpha > 0)) c.error("lora.alpha", str("must be above 0, got ", l.alpha), "16 or 2 x lora.r are common");
  if (!l.target_parameters.empty() && l.dropout > 0)
    c.error("lora.dropout",
            str("is ", l.dropout, " with lora.target_parameters: the experts' adapters are added to their stacked "
                "weights (PEFT's ParamWrapper), where dropout on the input has no place"),
            "set lora.dropout: 0 (PEFT refuses it too)");
  if (!l.target_parameters.empty() && c.rc.typed.parallelism.ep_size > 1)
    c.error("lora.target_parameters",
            "adapts the experts, whose adapters expert parallel does not split over its ranks",
            "set parallelism_config_ep_size: 1 (FSDP shards the experts and their adapters), or adapt attention "
            "alone (lora.target_modules)");
  if (!l.layers_pattern.empty() && l.layers_to_transform.empty())
    c.error("lora.layers_pattern", "is set without lora.layers_to_transform, which it is read for",
            "set lora.layers_to_transform to the layers to adapt, or remove lora.layers_pattern (PEFT refuses it too)");
  if (!l.init.empty() && !file_exists(l.init + "/adapter_model.safetensors"))
    c.error("lora.init",
            !is_directory(l.init) && hub::is_repo_id(l.init)
                ? str("is no folder here, and ", hub::not_cached(hub::RepoType::kModel, l.init, "main"))
                : str(quoted(l.init), " holds no adapter_model.safetensors"),
            "give a folder PEFT's save_pretrained wrote (adapter_config.json, adapter_model.safetensors)");
  if (c.rc.typed.model.pretrained.empty())
    c.warning("lora.r", "is set but model.pretrained is not: the adapters train beside a randomly initialised model",
              "set model.pretrained to the Hugging Face folder to adapt");
}

// float8 (engine.float8): bf16 products on GPUs, one weight scale over the whole weight.
void check_float8(Checker& c) {
  const Config& t = c.rc.typed;
  if (t.engine.float8 == Float8Training::kNone) {
    if (t.engine.float8_all_gather && c.set("engine.float8_all_gather"))
      c.warning("engine.float8_all_gather", "gathers the weights of float8 products, and engine.float8 is none",
                "set engine.float8: tensorwise, or remove engine.float8_all_gather");
    return;
  }
  const char* key = "engine.float8";
  if (t.launch.use_cpu)
    c.error(key, "makes GPU products faster (compute capability 8.9 and up); a CPU run would only emulate them",
            "remove engine.float8 for a CPU run (or set use_cpu: false on a GPU machine)");
  if (t.launch.mixed_precision != MixedPrecision::kBf16)
    c.error(key,
            str("runs with bf16 compute, and mixed_precision is ",
                enum_name(t.launch.mixed_precision, kMixedPrecisionNames)),
            "set mixed_precision: bf16");
  if (t.lora.enabled())
    c.error(key, "does not train LoRA adapters yet (the frozen weights would be cast to float8 at every step)",
            "set engine.float8: none to train adapters");
  if (t.parallelism.tp_size > 1)
    c.error(key, "does not run under tensor parallel yet (each rank's block of a weight would take its own scale)",
            "set parallelism_config_tp_size: 1, or engine.float8: none");
  if (t.engine.float8 == Float8Training::kRowwise && t.engine.float8_all_gather && c.set("engine.float8_all_gather"))
    c.error("engine.float8_all_gather",
            "gathers each weight in float8 with one scale for the whole weight (tensorwise's); rowwise scales each "
            "weight by rows in forward and by columns in backward, so its weights are gathered in bf16",
            "set engine.float8: tensorwise, or remove engine.float8_all_gather");
}

void check_training(Checker& c) {
  const Config& t = c.rc.typed;
  if (t.model.gradient_checkpointing && !t.fsdp.activation_checkpointing)
    c.error("model.gradient_checkpointing",
            "is true and fsdp_config.fsdp_activation_checkpointing false: both name the same recompute",
            "keep one of them");
  if (t.schedule.warmup_ratio >= 1) c.error("schedule.warmup_ratio", str("must be below 1, got ", t.schedule.warmup_ratio));
  if (t.schedule.warmup_ratio > 0 && c.rc.is_set("schedule.warmup_steps") && t.schedule.warmup_steps > 0)
    c.error("schedule.warmup_ratio", "and schedule.warmup_steps are both set", "give one (Trainer's warmup_ratio is "
            "ceil(ratio x steps) warmup steps)");
  auto positive = [&](const char* key, double v) {
    if (!(v > 0)) c.error(key, str("must be > 0, got ", v));
  };
  auto fraction = [&](const char* key, double v, double hi) {
    if (!(v >= 0 && v <= hi)) c.error(key, str("must be between 0 and ", hi, ", got ", v));
  };
  positive("optimizer.lr", t.optimizer.lr);
  positive("optimizer.eps", t.optimizer.eps);
  fraction("optimizer.beta1", t.optimizer.beta1, 0.999999);
  fraction("optimizer.beta2", t.optimizer.beta2, 0.999999);
  fraction("optimizer.weight_decay", t.optimizer.weight_decay, 1.0);
  if (t.optimizer.grad_clip < 0)
    c.error("optimizer.grad_clip", str("must be >= 0 (0: no clipping), got ", t.optimizer.grad_clip));
  fraction("schedule.min_lr_ratio", t.schedule.min_lr_ratio, 1.0);
  fraction("data.eval_fraction", t.data.eval_fraction, 0.5);
  if (t.logging.peak_tflops < 0) c.error("logging.peak_tflops", str("must be >= 0, got ", t.logging.peak_tflops));
  // A fine-tuning default interval (loader.h) with checkpoints off is no mistake: nothing is saved.
  if (t.checkpoint.dir.empty() && t.checkpoint.interval > 0 && c.rc.is_set("checkpoint.interval"))
    c.error("checkpoint.interval", "is set but checkpoint.dir is empty",
            "set checkpoint.dir to the folder the checkpoints go to");
  if (t.checkpoint.dir.empty() && t.checkpoint.resume == "latest")
    c.error("checkpoint.resume", "is 'latest' but checkpoint.dir is empty",
            "set checkpoint.dir to the folder holding the run's step-N checkpoints, or give a checkpoint folder");
  if (t.checkpoint.keep_best && t.checkpoint.dir.empty())
    c.error("checkpoint.keep_best", "is true but checkpoint.dir is off", "let checkpoint.dir have its default");
  if (t.checkpoint.keep_best && t.data.eval_fraction <= 0 && t.data.eval_path.empty())
    c.error("checkpoint.keep_best", "is true but nothing is held out to judge the checkpoints by",
            "set data.eval_fraction above 0, or data.eval_path to held-out data");
  if (t.checkpoint.keep_best && t.checkpoint.keep == 0)
    c.warning("checkpoint.keep_best", "has no effect with checkpoint.keep 0 (every checkpoint is kept)",
              "set checkpoint.keep to how many of the newest to keep besides the best");
  check_lora(c);
  check_float8(c);
  // train.epochs over train.steps when given later (--set train.epochs=2 on a file with steps); both
  // in one place is a contradiction.
  auto layer = [&](const std::string& key) {
    switch (c.rc.get(key).origin.kind) {
      case OriginKind::kFile:
        return 1;
      case OriginKind::kScheduler:
        return 2;
      case OriginKind::kSet:
        return 3;
      case OriginKind::kFlag:
        return 4;
      default:
        return 0;
    }
  };
  // (A fine-tuning run's epochs are TRL's default only where train.steps is not set.)
  if (t.train.epochs > 0 && layer("train.epochs") > 0 && layer("train.steps") >= layer("train.epochs"))
    c.error("train.epochs", "and train.steps are both set", "give one: epochs over the data, or a number of steps");
}

// "data/x.bin" or, for a relative path a config file wrote, both places it was looked for.
std::string places_tried(const Checker& c, const std::string& key) {
  const ResolvedValue& v = c.rc.get(key);
  if (v.value.empty() || v.value[0] == '/' || v.origin.kind != OriginKind::kFile || c.rc.file.empty())
    return quoted(v.value);
  return str(quoted(v.value), " (from the working directory) or ", quoted(parent_folder(c.rc.file) + "/" + v.value),
             " (beside the config file)");
}

// data.path (files, a glob, a save_to_disk folder) or data.dataset (a Hub id in the cache) names data.
void check_data_paths(Checker& c) {
  const DataConfig& d = c.rc.typed.data;
  if (!hub::is_revision(d.revision)) {
    c.error("data.revision", hub::bad_revision(d.revision), "main is the default");
    return;
  }
  if (!d.dataset.empty()) {
    if (!d.path.empty())
      c.error("data.dataset", str("and data.path are both set (", quoted(d.dataset), ", ", quoted(d.path), ")"),
              "give one: the Hub id of a dataset in the Hugging Face cache, or files");
    else if (const hub::DatasetFiles f = hub::dataset_files(d.dataset, d.config, d.split, d.revision); !f.error.empty())
      c.error("data.dataset", f.error, "");
    return;
  }
  for (const char* key : {"data.split", "data.config", "data.revision"})
    if (c.rc.is_set(key) && !(std::string(key) == "data.split" && hub::is_saved_dataset(d.path)))
      c.warning(key, "has no effect without data.dataset", "set data.dataset to the Hub id of the dataset");
  if (d.path.empty()) return;
  if (is_directory(d.path) && hub::is_saved_dataset(d.path)) {
    if (const hub::DatasetFiles f = hub::saved_dataset_files(d.path, d.split); !f.error.empty())
      c.error("data.path", f.error, "");
    return;
  }
  const std::vector<std::string> files = glob_paths(d.path);
  if (files.empty())
    c.error("data.path", str("matches no file at ", places_tried(c, "data.path")),
            hub::is_repo_id(d.path) && !hub::find_snapshot(hub::RepoType::kDataset, d.path, "main").empty()
                ? str("to read the Hub dataset ", d.path, " from the Hugging Face cache, set data.dataset: ", d.path)
                : "give a text file, a .jsonl or .parquet file, llm.c .bin shards, or a glob such as data/*.bin");
  for (const std::string& f : files)
    if (is_directory(f)) {
      c.error("data.path", str(quoted(f), " is a folder"),
              str("a glob such as ", folder_glob(f), " reads the files in it"));
      break;
    }
}

// A dataset's error, whose fix names data.split, for the key that chose this split.
std::string for_key(std::string error, const std::string& key) {
  const std::string said = "set data.split";
  if (ends_with(error, said)) error.replace(error.size() - said.size(), said.size(), "set " + key);
  return error;
}

// The held-out data (data.eval_split of the dataset, data.eval_path's files or Hub dataset) exists.
void check_eval_data(Checker& c) {
  const DataConfig& d = c.rc.typed.data;
  if (d.eval_path.empty() && !d.eval_split.empty()) {
    const bool saved = !d.path.empty() && is_directory(d.path) && hub::is_saved_dataset(d.path);
    if (d.dataset.empty() && !saved) {
      c.error("data.eval_split", str("names the split ", quoted(d.eval_split), ", and there is no dataset to take it from"),
              "set data.dataset to the Hub id of a dataset in the Hugging Face cache, or give data.eval_path");
    } else if (d.eval_split == d.split) {
      c.error("data.eval_split", str("is the training split (data.split ", quoted(d.split), ")"),
              "name a split held out from training, such as test");
    } else {
      const hub::DatasetFiles f = saved ? hub::saved_dataset_files(d.path, d.eval_split)
                                        : hub::dataset_files(d.dataset, d.config, d.eval_split, d.revision);
      if (!f.error.empty()) c.error("data.eval_split", for_key(f.error, "data.eval_split"), "");
    }
    return;
  }
  if (d.eval_path.empty()) return;
  const std::vector<std::string> files = glob_paths(d.eval_path);
  if (!files.empty()) {
    if (!d.eval_split.empty() && !(is_directory(d.eval_path) && hub::is_saved_dataset(d.eval_path)))
      c.warning("data.eval_split", str("has no effect with data.eval_path's files (", quoted(d.eval_path), ")"),
                "remove one of them");
    for (const std::string& f : files)
      if (is_directory(f) && !hub::is_saved_dataset(f)) {
        c.error("data.eval_path", str(quoted(f), " is a folder"),
                str("a glob such as ", folder_glob(f), " reads the files in it"));
        break;
      }
    return;
  }
  if (hub::is_repo_id(d.eval_path) && !hub::find_snapshot(hub::RepoType::kDataset, d.eval_path, "main").empty()) {
    if (const hub::DatasetFiles f = hub::dataset_files(d.eval_path, "", d.hub_eval_split(), "main"); !f.error.empty())
      c.error("data.eval_path", for_key(f.error, "data.eval_split"), "");
    return;
  }
  // A split's name written as a path (data.eval_path: test) is the common slip.
  const bool split_name = !d.dataset.empty() && hub::dataset_files(d.dataset, d.config, d.eval_path, d.revision).error.empty();
  // An ORG/NAME that is no file is a Hub id the cache lacks: say how to fetch it (a bare word is
  // more likely a split's name or a file's).
  const bool hub_id = !split_name && hub::is_repo_id(d.eval_path) && d.eval_path.find('/') != std::string::npos;
  c.error("data.eval_path",
          str("matches no file at ", places_tried(c, "data.eval_path"),
              hub_id ? str(", and ", hub::not_cached(hub::RepoType::kDataset, d.eval_path, "main")) : ""),
          split_name ? str("to hold out the split ", d.eval_path, " of data.dataset, write data.eval_split: ", d.eval_path)
                     : "give held-out files (as data.path takes), or the Hub id of a dataset in the Hugging Face cache");
}

// The files the trainer reads exist, before any worker starts.
void check_input_paths(Checker& c) {
  const ModelConfig& m = c.rc.typed.model;
  if (!m.config.empty() && is_directory(m.config))
    c.error("model.config", str(quoted(m.config), " is a folder"),
            "give its config.json, or use model.pretrained to start from a Hugging Face folder");
  else if (!m.config.empty() && !file_exists(m.config))
    c.error("model.config", str("no file at ", places_tried(c, "model.config")),
            "give a Hugging Face config.json, such as configs/models/tiny/config.json");
  if (!hub::is_revision(m.revision))
    c.error("model.revision", hub::bad_revision(m.revision), "main is the default");
  else if (!m.pretrained.empty() && !file_exists(m.pretrained + "/config.json")) {
    if (!is_directory(m.pretrained) && hub::is_repo_id(m.pretrained))
      c.error("model.pretrained",
              str("is no folder here, and ", hub::not_cached(hub::RepoType::kModel, m.pretrained, m.revision)),
              "or give the model's folder");
    else
      c.error("model.pretrained",
              str(is_directory(m.pretrained) ? quoted(m.pretrained) + " has no config.json"
                                             : "no folder at " + places_tried(c, "model.pretrained")),
              "give a Hugging Face model folder (config.json and safetensors weights), or its Hub id (ORG/NAME) in "
              "the Hugging Face cache");
  }
  check_data_paths(c);
  check_eval_data(c);
}

}  // namespace

void validate_config(const ResolvedConfig& rc, Diagnostics& diags) {
  Checker c{rc, diags};
  check_launch(c);
  check_fsdp(c);
  check_parallelism(c);
  check_training(c);
  check_input_paths(c);
}

namespace {

// item(0), ..., item(count - 1) joined by `separator`; past four, the first two, "..." and the last two.
std::string elided(int count, const std::function<std::string(int)>& item, const char* separator) {
  std::vector<std::string> shown;
  for (int k = 0; k < count; ++k) {
    if (count > 4 && k == 2) {
      shown.push_back("...");
      k = count - 2;
    }
    shown.push_back(item(k));
  }
  return join(shown, separator);
}

}  // namespace

// "tensor parallel over 2 (tp groups: ranks 0-1, 2-3; shard groups: 0,2 / 1,3)": the mesh
// (dp_replicate, dp_shard, tp), tp innermost; a shard group is the ranks of one tp index.
std::string FsdpLayout::describe_tensor_parallel() const {
  const int shard_size = fsdp_shard_size();  // the cp ranks are members of the shard groups
  const int groups = replicate_size * shard_size;
  const std::string tp_groups = elided(
      groups, [&](int g) { return str(g * tp_size, "-", (g + 1) * tp_size - 1); }, ", ");
  const std::string dp_groups = elided(
      replicate_size * tp_size,
      [&](int k) {
        const int replica = k / tp_size, t = k % tp_size;
        return elided(
            shard_size, [&](int s) { return std::to_string((replica * shard_size + s) * tp_size + t); }, ",");
      },
      " / ");
  return str("tensor parallel over ", tp_size, " (tp groups: ranks ", tp_groups, "; shard groups: ", dp_groups, ")");
}

// "context parallel over 2 (alltoall, the K/V ring; cp groups: ranks 0,1 / 2,3)".
std::string FsdpLayout::describe_context_parallel() const {
  const int groups = replicate_size * shard_size * tp_size;
  const std::string cp_groups = elided(
      groups,
      [&](int k) {
        const int data = k / tp_size, t = k % tp_size;  // data = replica * shard_size + shard index
        return elided(
            cp_size, [&](int c) { return std::to_string((data * cp_size + c) * tp_size + t); }, ",");
      },
      " / ");
  const bool ulysses = cp_kind == "ulysses";
  return str(ulysses ? "Ulysses sequence parallel over " : "context parallel over ", cp_size, " (",
             ulysses                 ? "all-to-all from tokens to heads and back"
             : cp_kind == "alltoall" ? "alltoall: a ring of K/V blocks"
                                     : "allgather of K/V",
             "; ", ulysses ? "sp" : "cp", " groups: ranks ", cp_groups, ")");
}

// "expert parallel over 2 (ep groups: ranks 0,1 / 2,3; the experts sharded over ranks 0,2 / 1,3)": ep
// consecutive members of each shard group (one replica's, one tp index's), and the members at one
// place in their ep groups.
std::string FsdpLayout::describe_expert_parallel() const {
  const int shard = fsdp_shard_size(), per = shard / ep_size;
  auto rank = [&](int replica, int t, int member) { return std::to_string((replica * shard + member) * tp_size + t); };
  const int outer = replicate_size * tp_size;  // (replica, tp index) pairs, each with its shard group
  // In each shard group, n groups of `size` members: group g's i-th is member g * spacing + i * step.
  auto groups = [&](int n, int size, int spacing, int step) {
    return elided(
        outer * n,
        [&](int k) {
          const int g = k % n, replica = k / n / tp_size, t = k / n % tp_size;
          return elided(size, [&](int i) { return rank(replica, t, g * spacing + i * step); }, ",");
        },
        " / ");
  };
  const std::string ep_groups = groups(per, ep_size, ep_size, 1), expert_shards = groups(ep_size, per, 1, ep_size);
  return str("expert parallel over ", ep_size, " (ep groups: ranks ", ep_groups, "; the experts sharded over ",
             per == 1 ? "no other rank" : "ranks " + expert_shards, ")");
}

std::string FsdpLayout::describe() const {
  if (!sharded) return "no sharding (parameters replicated on every process)";
  const int shard_size = fsdp_shard_size();
  std::string layout = str("reshard_after_forward=", reshard_after_forward ? "true" : "false", ", ");
  if (post_forward_size > 0) {  // N consecutive members of each shard group
    const int groups = replicate_size * shard_size / post_forward_size;
    // Under tensor parallel a group's members are the ranks of one tp index, tp_size apart.
    const std::string shown =
        tp_size == 1
            ? elided(
                  groups, [&](int g) { return str(g * post_forward_size, "-", (g + 1) * post_forward_size - 1); }, ", ")
            : elided(
                  groups * tp_size,
                  [&](int k) {
                    std::vector<std::string> members;
                    for (int i = 0; i < post_forward_size; ++i)
                      members.push_back(std::to_string((k / tp_size * post_forward_size + i) * tp_size + k % tp_size));
                    return join(members, ",");
                  },
                  " / ");
    layout = str("reshard_after_forward=", post_forward_size,
                 " (between forward and backward each unit stays sharded over ranks ", shown, "), ");
  }
  if (replicate_size > 1)
    layout += str("HSDP: ", replicate_size, " replicas x ", shard_size, " shards");
  else
    layout += str("sharded over ", plural(shard_size, "rank"));
  if (cp_size > 1)
    layout += str(" (dp_shard ", this->shard_size, " x ", cp_kind == "ulysses" ? "sp " : "cp ", cp_size, ")");
  if (cp_size > 1) layout += ", " + describe_context_parallel();
  if (tp_size > 1) layout += ", " + describe_tensor_parallel();
  if (ep_size > 1) layout += ", " + describe_expert_parallel();
  if (version == 1)
    return str("FSDP1 ", fsdp1_strategy, " (programs get FSDP_VERSION=1; the built-in trainer runs it as FSDP2, ",
               layout, ")");
  return "FSDP2, " + layout;
}

bool float8_weights_gathered(const Config& config) {
  const FsdpLayout l = effective_fsdp_layout(config);
  return config.engine.float8 == Float8Training::kTensorwise && config.engine.float8_all_gather && l.sharded &&
         l.fsdp_shard_size() > 1 && l.tp_size == 1 && !config.fsdp.offload_params;
}

FsdpLayout effective_fsdp_layout(const Config& config) {
  FsdpLayout layout;
  const int world = config.launch.num_processes;
  if (config.launch.distributed_type != DistributedType::kFsdp) {
    layout.replicate_size = world;
    layout.shard_size = 1;
    return layout;
  }
  layout.sharded = true;
  if (config.fsdp.version == 2) {
    layout.reshard_after_forward = config.fsdp.reshard_after_forward;
    const ParallelismConfig& p = config.parallelism;
    const bool dp_unset = p.dp_replicate_size == 1 && p.dp_shard_size == 1;
    layout.tp_size = std::max(1, p.tp_size);
    layout.cp_size = std::max(1, p.sequence_size());
    if (layout.cp_size > 1) layout.cp_kind = p.cp_size > 1 ? p.cp_comm_strategy : "ulysses";
    layout.ep_size = std::max(1, p.ep_size);
    layout.replicate_size = dp_unset ? 1 : p.dp_replicate_size;
    layout.shard_size = dp_unset ? std::max(1, world / (layout.tp_size * layout.cp_size)) : p.dp_shard_size;
    const int n = config.fsdp.reshard_after_forward_size, shards = layout.fsdp_shard_size();
    if (n > 1 && n < shards && shards % n == 0) layout.post_forward_size = n;
    return layout;
  }
  const int machines = std::max(1, config.launch.num_machines);
  const ShardingStrategy s = config.fsdp.fsdp1_strategy();
  layout.version = 1;
  layout.fsdp1_strategy = enum_name(s, kShardingStrategyNames);
  layout.reshard_after_forward = reshards_after_forward(s);
  if (s == ShardingStrategy::kNoShard) {
    layout.replicate_size = world;  // every rank keeps a full copy
    layout.shard_size = 1;
  } else if (is_hybrid(s)) {
    layout.replicate_size = machines;  // one replica per machine
    layout.shard_size = world / machines;
  } else {
    layout.replicate_size = 1;
    layout.shard_size = world;
  }
  return layout;
}

}  // namespace fsdp::config

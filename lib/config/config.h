// Typed, per-area configuration: what the rest of fsdptrain reads after the config has been loaded,
// merged (flag > --set > file > default) and validated. Each struct mirrors one area of an
// Accelerate config file; the option table (option.h) is the only place that fills them.
//
// Enum spellings live next to each enum (k...Names, in declaration order) so the option table,
// validation and printing all use one list.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::config {

enum class DistributedType { kNo, kMultiCpu, kMultiGpu, kFsdp };
inline constexpr std::array<const char*, 4> kDistributedTypeNames = {"NO", "MULTI_CPU", "MULTI_GPU", "FSDP"};

enum class MixedPrecision { kNo, kFp16, kBf16 };
inline constexpr std::array<const char*, 3> kMixedPrecisionNames = {"no", "fp16", "bf16"};

// FSDP1's sharding strategies, in Accelerate's order (its legacy integers 1..5 index this list).
enum class ShardingStrategy { kFullShard, kShardGradOp, kNoShard, kHybridShard, kHybridShardZero2 };
inline constexpr std::array<const char*, 5> kShardingStrategyNames = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD",
                                                                      "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"};

enum class WrapPolicy { kTransformerBasedWrap, kSizeBasedWrap, kNoWrap };
inline constexpr std::array<const char*, 3> kWrapPolicyNames = {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"};

enum class BackwardPrefetch { kBackwardPre, kBackwardPost, kNoPrefetch };
inline constexpr std::array<const char*, 3> kBackwardPrefetchNames = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"};

enum class StateDictType { kFullStateDict, kLocalStateDict, kShardedStateDict };
inline constexpr std::array<const char*, 3> kStateDictTypeNames = {"FULL_STATE_DICT", "LOCAL_STATE_DICT",
                                                                   "SHARDED_STATE_DICT"};

// Accelerate's numbering of the strategies, 1-5 in kShardingStrategyNames' order; none otherwise.
inline std::optional<ShardingStrategy> strategy_numbered(long long n) {
  if (n < 1 || n > static_cast<long long>(kShardingStrategyNames.size())) return std::nullopt;
  return static_cast<ShardingStrategy>(n - 1);
}
// FULL_SHARD and HYBRID_SHARD free parameters after forward; the ZeRO-2 style ones do not.
inline bool reshards_after_forward(ShardingStrategy s) {
  return s == ShardingStrategy::kFullShard || s == ShardingStrategy::kHybridShard;
}
inline bool is_hybrid(ShardingStrategy s) {
  return s == ShardingStrategy::kHybridShard || s == ShardingStrategy::kHybridShardZero2;
}

template <typename Enum, size_t N>
const char* enum_name(Enum e, const std::array<const char*, N>& names) {
  return names[static_cast<size_t>(e)];
}

// The enum whose canonical name is `name` (exact match), or nullopt.
template <typename Enum, size_t N>
std::optional<Enum> enum_from_name(const std::string& name, const std::array<const char*, N>& names) {
  for (size_t i = 0; i < N; ++i)
    if (name == names[i]) return static_cast<Enum>(i);
  return std::nullopt;
}

template <size_t N>
std::vector<std::string> enum_names(const std::array<const char*, N>& names) {
  return std::vector<std::string>(names.begin(), names.end());
}

// Top-level Accelerate keys, plus the launcher's own flags (max_restarts, ...).
struct LaunchConfig {
  std::string compute_environment = "LOCAL_MACHINE";
  DistributedType distributed_type = DistributedType::kNo;
  MixedPrecision mixed_precision = MixedPrecision::kNo;
  bool use_cpu = false;
  bool debug = false;
  int num_processes = 1;  // total over all machines
  int num_machines = 1;
  int machine_rank = 0;
  std::string main_process_ip;  // empty = not given (127.0.0.1 on one machine)
  int main_process_port = 29500;
  std::string rdzv_backend = "static";
  bool same_network = true;
  std::string gpu_ids = "all";  // "all" or "0,1,3"
  bool enable_cpu_affinity = false;
  int max_restarts = 0;
  double monitor_interval = 0.1;  // seconds
  double rdzv_timeout = 300;      // seconds
  double dist_timeout = 600;      // seconds, per collective

  int processes_per_machine() const { return num_machines > 0 ? num_processes / num_machines : num_processes; }
};

// `fsdp_config`: the keys of FSDP1 and FSDP2 with Accelerate's names.
struct FsdpConfig {
  int version = 1;
  bool reshard_after_forward = true;
  std::optional<ShardingStrategy> sharding_strategy;  // fsdp_sharding_strategy (FSDP1)
  // A strategy name written in fsdp_reshard_after_forward, as Accelerate's wizard does for FSDP1.
  std::optional<ShardingStrategy> reshard_after_forward_strategy;
  // An integer N >= 2 written there: FSDP2's partial resharding (stay sharded over N ranks between
  // forward and backward); in an FSDP1 file, Accelerate's strategy number (2-5). 0: none.
  int reshard_after_forward_size = 0;
  bool offload_params = false;
  WrapPolicy auto_wrap_policy = WrapPolicy::kTransformerBasedWrap;
  std::vector<std::string> transformer_layer_cls_to_wrap;  // empty = the model's declared layer classes
  int64_t min_num_params = 100000000;
  std::optional<BackwardPrefetch> backward_prefetch;
  StateDictType state_dict_type = StateDictType::kFullStateDict;
  bool forward_prefetch = false;
  bool use_orig_params = true;
  bool cpu_ram_efficient_loading = true;
  bool sync_module_states = true;
  bool activation_checkpointing = false;
  std::string ignored_modules;  // regex, full-matched against module names; empty = none

  // FSDP1's effective strategy: fsdp_sharding_strategy, else a strategy named in
  // fsdp_reshard_after_forward, else the boolean (true: FULL_SHARD, false: SHARD_GRAD_OP).
  ShardingStrategy fsdp1_strategy() const;
};

// `parallelism_config` (FSDP2): HSDP is dp_replicate_size x dp_shard_size.
struct ParallelismConfig {
  int dp_replicate_size = 1;
  int dp_shard_size = 1;
  int tp_size = 1;
  int cp_size = 1;
  std::string cp_backend = "torch";
  std::string cp_comm_strategy = "allgather";  // or "alltoall" (the ring)
  int sp_size = 1;                             // Ulysses
  int ep_size = 1;  // expert parallel (fsdptrain extension key: Accelerate has none)
  std::string sp_backend = "deepspeed";
  std::string sp_seq_length;  // "" = None
  bool sp_seq_length_is_variable = true;
  std::string sp_attn_implementation = "sdpa";
  // The ranks that split each sequence (cp or sp, at most one above 1).
  int sequence_size() const { return cp_size > 1 ? cp_size : sp_size; }
};

// ---- The built-in trainer's sections (fsdptrain extension keys; Accelerate has no trainer). ----

struct ModelConfig {
  std::string config;                   // a Hugging Face config.json (model/config/hf_config.h: its families)
  std::string pretrained;               // a Hugging Face folder to start from (its config.json and weights)
  std::string revision = "main";        // of pretrained given as a Hub id (the loader finds its snapshot)
  bool gradient_checkpointing = false;  // Transformers' switch; use fsdp_activation_checkpointing
  bool text_only = false;               // a text-and-vision folder: train its text model, the vision tower left out
};

enum class Packing { kAuto, kMasked, kPlain, kPad };
inline constexpr std::array<const char*, 4> kPackingNames = {"auto", "masked", "plain", "pad"};

// Paths of the trainer's sections are resolved by the loader: inputs found from the working
// directory or beside the config file, outputs (the run folder and what goes under it) made absolute;
// an output "" is off.
struct DataConfig {
  std::string path;             // text, .jsonl, .parquet, llm.c .bin shards, a glob of them, a save_to_disk folder
  std::string dataset;          // a Hub dataset id, read from the Hugging Face cache, instead of path
  std::string split = "train";  // of dataset (or of a save_to_disk DatasetDict)
  std::string config;           // of dataset: its subset ("": the only or default one)
  std::string revision = "main";
  double eval_fraction = 0.05;  // sequences held out at the end for evaluation
  std::string eval_path;        // held-out data of its own ("": eval_fraction of path)
  std::string eval_split;       // of dataset: a split held out for evaluation (TRL's dataset_test_split)
  std::string field = "text";   // JSONL: the field holding each document
  std::string tokenizer;        // a tokenizer.json or a folder with one; "" for model.pretrained's
  std::string cache_dir;        // where tokenized text is kept (data/prepare.h)
  Packing packing = Packing::kAuto;
  std::string chat_template;        // a .jinja file for conversations instead of the model's ("", or "model")
  std::string training_templates;   // TRL's chat_templates folder ("": found; "none": none), training_template.h
  bool assistant_only_loss = true;  // conversations: the loss counts the assistant's turns only
  // What one render of a chat template may take (chat::TemplateLimits: a template from the Hub is
  // untrusted input).
  int64_t chat_template_max_output = int64_t{64} << 20;
  int64_t chat_template_max_iterations = 10000000;
  int chat_template_max_depth = 200;
  int64_t chat_template_max_string = int64_t{64} << 20;

  // The split of eval_path given as a Hub id: eval_split, else TRL's dataset_test_split default.
  std::string hub_eval_split() const { return eval_split.empty() ? "test" : eval_split; }
};

struct TrainConfig {
  std::string output_dir;  // the run's folder, absolute
  int64_t steps = 100;
  double epochs = 0;             // > 0: steps from the data (TrainingRun::steps)
  int64_t micro_batch_size = 4;  // sequences per rank per micro-batch
  int64_t gradient_accumulation_steps = 1;
  int64_t sequence_length = 128;
  int64_t seed = 1234;
  int64_t eval_interval = 0;  // 0: evaluate only at the end
  int64_t eval_batches = 4;
  bool skip_nonfinite_loss = false;  // skip a step whose loss is NaN/inf instead of stopping
  // Auxiliary-loss-free load balancing of a mixture of experts (TorchTitan's load_balance_coeff); 0: off.
  double moe_load_balance_coeff = 0;
};

struct OptimConfig {
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // 0: no clipping
};

enum class ScheduleType { kCosine, kLinear, kConstant };
inline constexpr std::array<const char*, 3> kScheduleTypeNames = {"cosine", "linear", "constant"};

struct ScheduleConfig {
  ScheduleType type = ScheduleType::kCosine;
  int64_t warmup_steps = 10;
  double warmup_ratio = 0;  // > 0: warmup_steps = ceil(ratio x the run's steps), as Trainer's warmup_ratio
  double min_lr_ratio = 0.1;  // the schedule ends at lr * min_lr_ratio
};

enum class ExportDtype { kAuto, kFloat32, kBfloat16, kFloat16 };
inline constexpr std::array<const char*, 4> kExportDtypeNames = {"auto", "float32", "bfloat16", "float16"};

struct CheckpointConfig {
  std::string dir;              // training checkpoints: <dir>/step-<N> (format: fsdp_state_dict_type)
  int64_t interval = 0;         // save every N steps (0: only at the end); needs dir
  int64_t keep = 0;             // complete checkpoints kept, newest first (0: all)
  bool keep_best = false;       // also keep the checkpoint with the lowest held-out loss
  bool direct_io = true;        // saves and resumes past the page cache (O_DIRECT) where the file system takes it
  std::string resume;           // "", "latest" (the newest under dir) or a checkpoint folder
  bool resume_new_batch = false;  // resume with another global batch (its steps and learning rates change)
  std::string export_dir;       // Hugging Face folders written here: step-<N>
  int64_t export_interval = 0;  // also every N steps (0: only at the end)
  bool export_merged = false;   // with LoRA: the adapters folded into a whole Hugging Face model
  ExportDtype export_dtype = ExportDtype::kAuto;  // exported weights (auto: model.pretrained's torch_dtype, else fp32)
};

// LoRA adapters (PEFT's LoraConfig; model/lora/lora.h): r 0 trains every parameter.
struct LoraConfig {
  int64_t r = 0;
  double alpha = 8;
  double dropout = 0;
  std::vector<std::string> target_modules;  // empty: q_proj, v_proj
  bool use_rslora = false;
  std::vector<std::string> modules_to_save;
  std::vector<std::string> target_parameters;  // a mixture of experts' stacked weights (PEFT's)
  // PEFT's rank_pattern and alpha_pattern: (module pattern, value), in the order given.
  std::vector<std::pair<std::string, int64_t>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
  std::vector<int64_t> layers_to_transform;  // PEFT's: empty, every layer
  std::vector<std::string> layers_pattern;
  std::string init;  // a PEFT adapter folder to start from
  bool enabled() const { return r > 0; }
};

struct LoggingConfig {
  int64_t interval = 10;
  std::string metrics_file;     // JSONL, one line per logging step (rank 0); run.json goes beside it
  std::string tensorboard_dir;  // TensorBoard event files (rank 0); "" = none
  double peak_tflops = 0;       // per device, for MFU; 0: from the table of known GPUs
  // Steps [profile_first, profile_last] traced by the profiler; 0: none; kProfileAuto: the default window.
  int64_t profile_first = 0, profile_last = 0;
  std::string profile_dir = "profile";  // one Chrome trace per rank
  bool verbose = false;                 // the trainer prints the whole resolved config first
};

// The engine's switches (fsdptrain extension keys), each also a FSDPTRAIN_* variable `launch` exports.
// Who computes the decoder's ops (model/kernels/provider.h: the names are the same, in one order).
enum class KernelProvider { kAuto, kHost, kPortable, kReference };
inline constexpr std::array<const char*, 4> kKernelProviderNames = {"auto", "host", "portable", "reference"};
enum class OnednnProducts { kLarge, kAll, kOff };
inline constexpr std::array<const char*, 3> kOnednnProductsNames = {"large", "all", "off"};
enum class ReadAhead { kAuto, kOn, kOff };
inline constexpr std::array<const char*, 3> kReadAheadNames = {"auto", "on", "off"};
enum class Float8Training { kNone, kTensorwise, kRowwise };  // model/kernels/float8.h's recipes
inline constexpr std::array<const char*, 3> kFloat8TrainingNames = {"none", "tensorwise", "rowwise"};

struct EngineConfig {
  KernelProvider kernels = KernelProvider::kAuto;
  OnednnProducts onednn_products = OnednnProducts::kLarge;
  Float8Training float8 = Float8Training::kNone;  // the decoder layers' products in float8 (GPUs)
  bool float8_all_gather = true;  // tensorwise over more than one rank: those products' weights gathered in float8
  ReadAhead read_ahead = ReadAhead::kAuto;        // auto: on a GPU
  bool host_cache = true;                         // CPU runs: fsdp/host_cache.h's allocator
  bool offload_overlap = true;                    // offload: each unit's host update when the next forward needs it
  bool offload_keep_on_device = true;  // offload: each unit's param_dtype shard kept on the device until updated
  bool sync_debug = false;             // CUDA: a synchronizing op inside a step is an error
  std::string dump_gradients;          // a folder: each step's full gradients ("": none)
};

// logging.profile_steps given without steps (`--profile`): steps 3 and 4, after the warm-up.
constexpr int64_t kProfileAuto = -1;

struct Config {
  LaunchConfig launch;
  FsdpConfig fsdp;
  ParallelismConfig parallelism;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optimizer;
  ScheduleConfig schedule;
  LoggingConfig logging;
  CheckpointConfig checkpoint;
  LoraConfig lora;
  EngineConfig engine;
};

// What actually runs: every FSDP1 strategy and FSDP2 setting reduced to one FSDP2 layout.
// world = replicate_size x shard_size.
struct FsdpLayout {
  bool sharded = false;        // false: no FSDP (distributed_type is not FSDP)
  int version = 2;             // fsdp_version: what Python programs run (FSDP_VERSION); the trainer is FSDP2 always
  std::string fsdp1_strategy;  // FSDP1: the sharding strategy's name
  bool reshard_after_forward = true;
  int replicate_size = 1;
  int shard_size = 1;
  int post_forward_size = 0;  // partial resharding: N ranks of each shard group (1 < N < shard_size); 0: none
  int tp_size = 1;            // tensor parallel: ranks each layer's weights are split over (innermost)
  // Context parallel (cp_size) or Ulysses (sp_size): ranks each sequence is split over, between the
  // data-parallel dimensions and tp; FSDP shards over shard_size x cp_size.
  int cp_size = 1;
  std::string cp_kind;  // "allgather", "alltoall" or "ulysses" when cp_size > 1
  // Expert parallel: ep_size consecutive members of each shard group split every sparse layer's
  // experts; the experts are sharded over the shard group's members at one place in theirs.
  int ep_size = 1;
  int fsdp_shard_size() const { return shard_size * cp_size; }
  // "FSDP2, reshard_after_forward=true, sharded over 8 ranks"; FSDP1 files say so, and what the
  // built-in trainer runs instead.
  std::string describe() const;
  std::string describe_tensor_parallel() const;
  std::string describe_context_parallel() const;
  std::string describe_expert_parallel() const;
};

FsdpLayout effective_fsdp_layout(const Config& config);

// Whether the float8 products' weights are gathered in float8 (engine.float8: tensorwise with
// engine.float8_all_gather, FSDP over more than one rank, no offload, no tensor parallel): what the
// engine does (fsdp/float8_gather.h), as `config show` and estimate-memory say it.
bool float8_weights_gathered(const Config& config);

}  // namespace fsdp::config

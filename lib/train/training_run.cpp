#include "train/training_run.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#if FSDP_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/hf.h"
#include "ckpt/peft.h"
#include "ckpt/pretrained.h"
#include "ckpt/safetensors_torch.h"
#include "ckpt/sources.h"
#include "config/loader.h"
#include "config/show.h"
#include "config/training_template.h"
#include "data/prepare.h"
#include "model/kernels/float8.h"
#include "model/kernels/float8_products.h"
#include "model/kernels/provider.h"
#include "model/parallel/context_parallel.h"
#include "model/parallel/expert_parallel.h"
#include "model/parallel/tensor_parallel.h"
#include "optim/schedule.h"
#include "train/metrics.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/log.h"
#include "util/strings.h"

namespace fsdp::train {

namespace {

// (rows, cols) int64 on the host; pinned when it goes to a GPU, so the copy there need not wait.
at::Tensor host_tensor(const std::vector<int64_t>& v, int64_t rows, int64_t cols, bool pinned) {
  at::Tensor t = at::empty({rows, cols}, at::TensorOptions().dtype(at::kLong).pinned_memory(pinned));
  std::memcpy(t.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

// (B, T) host tensors of a batch's positions and segments, with the record lengths flash attention
// takes; none for unpacked rows.
model::Packed packed_rows(const data::Batch& b, int64_t rows, int64_t seq_len, bool pinned) {
  if (b.positions.empty()) return {};
  return model::with_lengths(
      model::Packed{host_tensor(b.positions, rows, seq_len, pinned), host_tensor(b.segments, rows, seq_len, pinned)});
}

// data.packing: auto is masked when the data marks its records (prompt/completion, chat), plain
// for text.
data::Packing packing_of(const config::Config& c, const data::TokenStream& tokens) {
  switch (c.data.packing) {
    case config::Packing::kPlain:
      return data::Packing::kPlain;
    case config::Packing::kMasked:
      return data::Packing::kMasked;
    case config::Packing::kPad:
      return data::Packing::kPad;
    case config::Packing::kAuto:
      break;
  }
  if (!tokens.has_records()) return data::Packing::kPlain;
  // Context parallel splits rows into chunks, which records packed behind each other would cross.
  const config::FsdpLayout layout = config::effective_fsdp_layout(c);
  return layout.cp_size > 1 && layout.cp_kind != "ulysses" ? data::Packing::kPad : data::Packing::kMasked;
}

std::string packing_note(const data::SequenceReader& r, int64_t seq_len) {
  switch (r.packing()) {
    case data::Packing::kPlain:
      return "";
    case data::Packing::kMasked:
      return "; records packed, each attending only to itself (data.packing: masked)";
    case data::Packing::kPad:
      return str("; one record per sequence, padded (data.packing: pad)",
                 r.truncated()
                     ? str(", ", plural(r.truncated(), "record"), " longer than ", seq_len + 1, " tokens cut short")
                     : "");
  }
  return "";
}

// Sum over the data-parallel ranks of a double (the loss sum, a token count): over the world, of
// which each tensor-parallel group's `tp` ranks hold the same value.
double global_sum(dist::ProcessGroup& world, double v, const c10::Device& device, int tp) {
  if (world.size() == 1) return v;
  at::Tensor t = at::full({1}, v, at::TensorOptions().dtype(at::kDouble).device(device));
  world.all_reduce(t).wait();
  return t.item<double>() / tp;
}

// Every rank's value of v, in rank order (collective).
std::vector<double> per_rank(dist::ProcessGroup& world, double v, const c10::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(device);
  at::Tensor mine = at::full({1}, v, opts), all = at::empty({world.size()}, opts);
  if (world.size() == 1) return {v};
  world.all_gather(all, mine).wait();
  const at::Tensor host = all.cpu();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + world.size());
}

// "1.2 GiB, 1.1 GiB": every rank's peak resident host memory so far (collective).
std::string host_peaks(dist::ProcessGroup& world, const c10::Device& device) {
  std::string out;
  for (double b : per_rank(world, static_cast<double>(peak_memory_bytes(c10::Device(c10::kCPU))), device))
    out += (out.empty() ? "" : ", ") + format_bytes(static_cast<long long>(b));
  return out;
}

// With engine.sync_debug on a GPU, a host wait for the device (item(), a blocking copy, a
// synchronize) while this is alive throws: LibTorch's sync debug mode, which tests use to prove that
// a step's queued work waits for nothing.
class NoDeviceWaits {
 public:
  explicit NoDeviceWaits(bool on) : on_(on) { set(on_); }
  ~NoDeviceWaits() {
    if (on_) set(false);
  }
  NoDeviceWaits(const NoDeviceWaits&) = delete;
  NoDeviceWaits& operator=(const NoDeviceWaits&) = delete;

 private:
  static void set(bool error) {
#if FSDP_HAVE_CUDA
    c10::cuda::warning_state().set_sync_debug_mode(error ? c10::cuda::SyncDebugMode::L_ERROR
                                                         : c10::cuda::SyncDebugMode::L_DISABLED);
#else
    (void)error;
#endif
  }
  bool on_;
};

// The config's dist_timeout as read here, not again from the FSDPTRAIN_DIST_TIMEOUT `launch` exports it in.
dist::ProcessGroup init_group(const dist::WorkerContext& context, const config::LaunchConfig& launch) {
  dist::GroupOptions options;
  options.backend = context.backend;
  options.context = context;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(launch.dist_timeout * 1000));
  return dist::init_process_group(options);
}

// The Hub id of a model folder in the Hugging Face cache (.../models--ORG--NAME/snapshots/COMMIT),
// as from_pretrained was given it; "" for a folder of another kind.
std::string hub_id_of(const std::string& folder) {
  const std::string snapshots = parent_folder(lexically_normal(folder));
  const std::string repo = base_name(parent_folder(snapshots));
  if (base_name(snapshots) != "snapshots" || !starts_with(repo, "models--")) return "";
  std::string id = repo.substr(std::string("models--").size());
  if (const size_t sep = id.find("--"); sep != std::string::npos) id.replace(sep, 2, "/");
  return id;
}

// adapter_config.json's target_modules as PEFT saves them: the names the config asked for (q_proj,
// v_proj), not the path of every module they matched; all-linear as PEFT expands it, every adapted
// module's path; a pattern PEFT would read otherwise (a regex) keeps those paths too, which say
// exactly what was adapted.
std::vector<std::string> peft_target_modules(const config::LoraConfig& lora, const std::vector<std::string>& adapted) {
  if (lora.target_modules.empty() && !lora.target_parameters.empty()) return {};  // the experts alone
  const std::vector<std::string> asked =
      lora.target_modules.empty() ? std::vector<std::string>{"q_proj", "v_proj"} : lora.target_modules;
  std::vector<std::string> out;
  auto add = [&](const std::string& name) {
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  };
  for (const std::string& item : asked) {
    if (item == "all-linear") {
      for (const std::string& m : adapted) add(m);
    } else if (std::all_of(item.begin(), item.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) ||
                                                                          c == '_' || c == '.'; })) {
      add(item);
    } else {
      return adapted;
    }
  }
  return out;
}

// "4 linear layers", "4 linear layers and 2 stacked expert weights (r per expert)", "... and 1 router
// weight", or the parameters alone. `parameters`: lora_target_parameters' names.
std::string lora_targets_said(int64_t linear, const std::vector<std::string>& parameters) {
  const auto routers =
      std::count_if(parameters.begin(), parameters.end(), [](const std::string& p) { return ends_with(p, ".weight"); });
  const auto experts = static_cast<int64_t>(parameters.size()) - routers;
  std::vector<std::string> parts;
  if (linear > 0 || parameters.empty()) parts.push_back(plural(linear, "linear layer"));
  if (experts > 0) parts.push_back(plural(experts, "stacked expert weight") + " (r per expert)");
  if (routers > 0) parts.push_back(plural(routers, "router weight"));
  std::string out = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) out += (i + 1 == parts.size() ? " and " : ", ") + parts[i];
  return out;
}

// With rank_pattern or alpha_pattern: "; by lora.rank_pattern and alpha_pattern: 2 at r 2 (scaling 4), 1 at
// r 8 (scaling 1)": the adapters whose rank or alpha the patterns change, grouped. Empty without patterns.
std::string lora_patterns_said(const model::LoraSettings& s, const std::vector<std::string>& keys) {
  if (!s.has_patterns()) return "";
  std::map<std::pair<int64_t, double>, int64_t> groups;
  for (const std::string& key : keys)
    if (s.rank_of(key) != s.r || s.alpha_of(key) != s.alpha) ++groups[{s.rank_of(key), s.alpha_of(key)}];
  std::vector<std::string> parts;
  for (const auto& [shape, n] : groups) {
    model::LoraSettings one = s;
    one.r = shape.first;
    one.alpha = shape.second;
    parts.push_back(str(n, " at r ", shape.first, ", alpha ", shape.second, " (scaling ", one.scaling(), ")"));
  }
  const char* which = s.rank_pattern.empty()    ? "lora.alpha_pattern"
                      : s.alpha_pattern.empty() ? "lora.rank_pattern"
                                                : "lora.rank_pattern and alpha_pattern";
  return str("; by ", which, ": ", parts.empty() ? "none changed" : join(parts, ", "));
}

// Under context parallel (allgather or the ring), the windowed layers that send each rank only the
// keys and values their windows let its queries see (model/parallel/context_parallel.h): "12 of 24 layers
// (sliding window 128) receive only the K/V their windows see: at most 254 of the other ranks' 3072 keys
// (from 2 of their 6 chunks of 512 tokens)". Empty where no layer does.
std::string window_exchange_said(const model::DecoderConfig& mc, int cp_size, const std::string& cp_kind,
                                 int64_t seq_len) {
  const model::ContextParallel group =
      model::ContextParallel::shapes_only(cp_size, model::sequence_split_named(cp_kind));
  std::map<int64_t, int64_t> layers;  // window -> layers that exchange
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l)
    if (const int64_t w = mc.is_linear(l) ? 0 : mc.plan(l).window; w > 0 && model::exchanges_window(group, seq_len, w))
      ++layers[w];
  std::vector<std::string> parts;
  const int64_t others = 2 * (cp_size - 1), chunk = seq_len / (2 * cp_size);
  for (const auto& [window, n] : layers)
    parts.push_back(str(n, " of ", mc.num_hidden_layers, " layers (sliding window ", window,
                        ") receive only the K/V their windows see: at most ",
                        model::keys_received(group, seq_len, window), " of the other ranks' ", others * chunk,
                        " keys (from ", model::chunks_received(group, seq_len, window), " of their ", others,
                        " chunks of ", chunk, " tokens)"));
  return join(parts, "; ");
}

}  // namespace

TrainingRun::TrainingRun(const dist::WorkerContext& context, const config::ResolvedConfig& resolved, std::ostream& out,
                         const TrainHooks& hooks)
    : context_(context),
      resolved_(resolved),
      config_(resolved.typed),
      out_(out),
      world_(init_group(context, config_.launch)),
      tp_size_(std::max(1, config::effective_fsdp_layout(config_).tp_size)),
      cp_size_(std::max(1, config::effective_fsdp_layout(config_).cp_size)),
      model_config_(model_config_of(config_)) {
  // The resolved config's first and last lines (the file, how it runs); the whole table with --verbose.
  const std::string table = config::format_resolved(resolved, config::ShowFormat::kTable);
  if (config_.logging.verbose) {
    say(table);
  } else {
    for (const std::string& line : split(table, '\n'))
      if (starts_with(line, "# config:") || starts_with(line, "# runs as:")) say(line + "\n");
  }
  // Where a default run folder goes is not where a Trainer user looks (its output_dir is relative to
  // the working directory): say so.
  const config::Origin& folder = resolved.get("train.output_dir").origin;
  say(str("[train] run folder: ", config_.train.output_dir, " (",
          folder.kind == config::OriginKind::kDerived && !resolved.file.empty()
              ? "beside the config file, train.output_dir's default; "
              : "",
          "run.json there holds the resolved config", config_.logging.verbose ? "" : "; launch --verbose prints it",
          ")\n"));
  if (const std::string defaults = config::describe_run_defaults(resolved); !defaults.empty())
    say(str("[train] ", defaults, "\n"));
  for (const std::string& kept : config::kept_fine_tuning_defaults(resolved)) say(str("[train] kept: ", kept, "\n"));
  if (const std::string t = config::describe_training_template(resolved); !t.empty()) say(str("[train] ", t, "\n"));
  if (!config_.launch.use_cpu && !context_.device.is_cuda())
    say("[train] warning: the config asks for GPUs (use_cpu is false), but this machine shows none: training on "
        "the CPU. Set use_cpu: true (or --cpu) to say so\n");
  if (config_.train.sequence_length > model_config_.max_position_embeddings) {
    // A trained model never saw those positions; an untrained one learns them, but should say so.
    check_positions(config_, model_config_);
    say(str("[train] warning: train.sequence_length ", config_.train.sequence_length,
            " is beyond max_position_embeddings ", model_config_.max_position_embeddings, " in ",
            model_config_path(config_),
            "; this model starts untrained and learns those positions, but the config.json "
            "its checkpoints and exports carry says ",
            model_config_.max_position_embeddings, ": raise it there to match\n"));
  }
  read_data();  // first: a bad path fails in a second, before any model is built
  model::kernels::set_kernel_choice(
      {model::kernels::provider_named(config::enum_name(config_.engine.kernels, config::kKernelProviderNames)),
       model::kernels::onednn_products_named(
           config::enum_name(config_.engine.onednn_products, config::kOnednnProductsNames))});
  if (config_.engine.float8 != config::Float8Training::kNone) model::kernels::check_float8_device(context_.device);
  model::set_float8_recipe(
      model::float8_recipe_named(config::enum_name(config_.engine.float8, config::kFloat8TrainingNames)));
  build_model();
  const config::FsdpLayout layout = config::effective_fsdp_layout(config_);  // cp 1 exchanges nothing: ""
  if (const std::string exchanged =
          window_exchange_said(model_config_, layout.cp_size, layout.cp_kind, config_.train.sequence_length);
      !exchanged.empty())
    say(str("[train] context parallel: ", exchanged, "\n"));
  build_checkpointer(hooks);
}

// The token streams of data.path (and data.eval_path), their split into training and held-out
// sequences, the loader, and the number of steps (train.steps, or train.epochs over the data).
void TrainingRun::read_data() {
  const int64_t T = config_.train.sequence_length;
  // The launcher tokenized text already; this finds its cache (or makes it, run without a launcher).
  auto read = [&](const data::DataOptions& o) {
    const data::DataPlan plan = data::prepare_data(o);
    data::TokenStream s = data::read_tokens(plan.path, config_.data.field);
    s.check_below(model_config_.vocab_size,
                  plan.kind == data::DataKind::kTokenize
                      ? str("the tokenizer ", plan.tokenizer, " does not fit the model; give the model's own")
                      : str("raise vocab_size in ", model_config_path(config_), " (byte-level text needs 257)"));
    s.check_prompts_fit(T);
    return s;
  };
  tokens_ = read(data_options_of(config_, model_config_.vocab_size));
  const std::optional<data::DataOptions> eval_options = eval_data_options_of(config_, model_config_.vocab_size);
  const bool own_eval = eval_options.has_value();
  const std::string eval_name = own_eval ? data::input_name(*eval_options) : "";
  if (own_eval) eval_tokens_ = read(*eval_options);
  const data::Packing packing = packing_of(config_, tokens_);
  if (config_.data.packing == config::Packing::kAuto && packing == data::Packing::kPad)
    say("[train] data.packing auto: one record to a row (pad), not packed (masked): context parallel splits each row "
        "into chunks, which records packed behind each other would cross\n");
  reader_ = std::make_unique<data::SequenceReader>(tokens_, T, packing, config_.data.path);
  split_ = data::split_sequences(reader_->count(), own_eval ? 0 : config_.data.eval_fraction, config_.data.path);
  if (own_eval) {
    eval_reader_ = std::make_unique<data::SequenceReader>(eval_tokens_, T, packing, eval_name);
    split_.eval_sequences = eval_reader_->count();
  }
  every_target_counts_ = !tokens_.has_mask() && packing == data::Packing::kPlain;
  loader_ =
      std::make_unique<data::DistributedLoader>(*reader_, 0, split_.train_sequences, config_.train.micro_batch_size,
                                                dp_rank(), dp_size(), static_cast<uint64_t>(config_.train.seed));
  const config::TrainConfig& t = config_.train;
  const int64_t per_step = sequences_per_step();
  steps_ = t.epochs > 0 ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil(
                                                   t.epochs * static_cast<double>(split_.train_sequences) / per_step)))
                        : t.steps;
  say(str("[train] data: ", plural(static_cast<long long>(tokens_.files().size()), "file"), ", ", tokens_.size(),
          " tokens; ", split_.train_sequences, " training and ", split_.eval_sequences, " held-out sequences of ", T,
          " tokens",
          own_eval ? str(" (held out: ", eval_options->dataset.empty() ? std::string("data.eval_path") : eval_name, ")")
                   : "",
          tokens_.has_mask() ? "; the loss counts only the tokens marked as targets (completions, assistant turns; "
                               "prompts are inputs, not targets)"
                             : "",
          packing_note(*reader_, T),
          t.epochs > 0 ? str("; ", t.epochs, t.epochs == 1 ? " epoch is " : " epochs are ", steps_, " steps of ", per_step,
                             " sequences")
                       : "",
          "\n"));
}

namespace {

// A mixture of experts on the model line: what a token passes through, how expert parallel splits
// the experts, and what becomes of the auxiliary loss; "" for a dense model.
std::string experts_summary(const model::DecoderConfig& c, int ep_size, int shard_size) {
  const model::MoeConfig& m = c.moe;
  if (m.num_experts == 0) return "";
  int64_t sparse = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) sparse += c.is_moe(l) ? 1 : 0;
  return str(" (", static_cast<int64_t>(c.active_parameter_count()), " active a token: ", m.experts_per_token, " of ",
             m.num_experts, " experts in ", sparse, " of ", c.num_hidden_layers, " layers",
             ep_size > 1 ? str("; expert parallel over ", ep_size, " ranks, ", m.num_experts / ep_size,
                               " experts each, sharded over ", plural(shard_size / ep_size, "rank"), ";")
                         : std::string(","),
             m.gemma4 ? std::string(" beside each layer's MLP; no auxiliary loss in Gemma 4, its value logged")
             : m.grouped_router       ? str(" and shared experts; no auxiliary loss in ",
                                            model::family_names(c.family).architecture, ", its value logged")
             : m.output_router_logits ? str(" the auxiliary loss times ", m.router_aux_loss_coef, " added")
                                      : std::string(" the auxiliary loss logged, not added (output_router_logits)"),
             ")");
}

// What the run says of a pretrained folder's form beside its load line: block FP8 weights read dequantized, a
// multimodal folder's text model alone ("" for neither).
std::string pretrained_notes(const model::DecoderConfig& c, const std::string& folder) {
  std::string notes;
  if (!c.fp8_block.empty())
    notes +=
        str("[train] ", folder, "'s weights are block FP8 (quantization_config \"fp8\", blocks of ", c.fp8_block[0],
            " x ", c.fp8_block[1], "): read as each value times its block's scale, as transformers dequantizes ",
            "them; the run trains and exports unquantized weights\n");
  if (c.text_of_multimodal)
    notes += str("[train] ", folder, " is ", c.multimodal_architecture,
                 ": its text model trains (model.text_only), its vision tower is left out, and the exports are ",
                 model::family_names(c.family).architecture, " folders\n");
  return notes;
}

}  // namespace

// The model, one layer at a time, each sharded as the engine takes it: no rank holds it whole.
// Not FSDP (MULTI_CPU/MULTI_GPU): the plan replicates over every rank, plain data parallel.
void TrainingRun::build_model() {
  const Clock::time_point started = Clock::now();
  std::unique_ptr<ckpt::HfCheckpoint> pretrained;
  if (!config_.model.pretrained.empty()) pretrained = std::make_unique<ckpt::HfCheckpoint>(config_.model.pretrained);
  FsdpPlan plan = fsdp_plan_from_config(config_, context_.device);
  for (std::string& c : plan.options.layer_classes) c = model::our_class_name(c, model_config_.family);
  fsdp::DeviceMesh mesh = fsdp::make_mesh(world_, plan.replicate_size, plan.shard_size, plan.post_forward_size,
                                          plan.tp_size, plan.cp_size, plan.ep_size);
  std::shared_ptr<model::ExpertParallel> ep;
  if (mesh.ep) {  // each sparse layer's experts are a unit of their own over the experts' mesh
    ep = std::make_shared<model::ExpertParallel>(*mesh.ep);
    plan.options.expert_classes = {"Experts"};
  }
  std::shared_ptr<model::ContextParallel> cp;
  if (mesh.cp) cp = std::make_shared<model::ContextParallel>(*mesh.cp, model::sequence_split_named(plan.cp_kind));
  std::shared_ptr<model::TensorParallel> tp;
  if (mesh.tp) {
    tp = std::make_shared<model::TensorParallel>(*mesh.tp);
    plan.options.tensor_parallel = [mc = model_config_](const std::string& name) {
      return model::tensor_parallel_slice(mc, name);
    };
  }
  const model::MoeConfig& moe = model_config_.moe;
  lm_ = model::CausalLM(model_config_, /*free_after_create=*/true, tp, cp, ep);
  if (config_.engine.float8 == config::Float8Training::kTensorwise && config_.engine.float8_all_gather)
    plan.options.float8_gather = model::float8_gather_options(*lm_);  // used where a unit gathers over ranks
  start_balancing();
  // Activation checkpointing runs each router again in backward: the auxiliary loss's gradient goes
  // to it there instead of through a loss term.
  if (plan.options.activation_checkpointing && moe.output_router_logits && moe.router_aux_loss_coef > 0)
    lm_->aux_loss_in_backward();
  const model::LoraSettings lora = lora_settings_of(config_);
  std::optional<ckpt::PeftAdapter> adapter;
  if (lora.enabled()) {
    model::add_lora(*lm_, lora, /*free_after_create=*/true);
    if (!config_.lora.init.empty()) adapter = ckpt::read_peft_adapter(config_.lora.init);
  }
  const uint64_t seed = static_cast<uint64_t>(config_.train.seed);
  if (pretrained) {  // checked before anything is built; the weights are loaded into the shards below
    pretrained->check_matches(model::describe(model_config_));
    plan.options.init = [seed](const std::string& name, at::IntArrayRef shape) {
      return model::is_lora_parameter(name) ? model::lora_init(seed, name, shape) : at::zeros(shape);
    };
  } else {
    plan.options.init = [mc = model_config_, seed](const std::string& name, at::IntArrayRef shape) {
      return model::init_parameter(mc, seed, name, shape);
    };
    plan.options.init_range = [mc = model_config_, seed](const std::string& name, at::IntArrayRef shape, int64_t begin,
                                                         int64_t count) {
      return model::init_parameter_range(mc, seed, name, shape, begin, count);
    };
  }
  sharded_ = fsdp::fully_shard(*lm_, model::decoder_traits(model_config_), std::move(mesh), plan.options);
  if (pretrained) {
    const bool efficient = config_.fsdp.cpu_ram_efficient_loading;
    const std::string before = host_peaks(world_, context_.device);
    const Clock::time_point t = Clock::now();
    ckpt::load_pretrained(*sharded_, config_.model.pretrained, world_, efficient,
                          model::describe(model_config_).layout);
    say(str("[train] loaded ", config_.model.pretrained, " in ", format_seconds(seconds_since(t)), " (",
            efficient ? "rank 0 read it and sent each rank its rows" : "each rank read its own rows",
            "); peak host memory per rank: ", before, " before, ", host_peaks(world_, context_.device), " after\n"));
    say(pretrained_notes(model_config_, config_.model.pretrained));
  }
  if (adapter) {
    ckpt::load_adapter(*sharded_, lora, *adapter);
    say(str("[lora] the adapters start from ", config_.lora.init, "\n"));
  }
  if (lora.enabled()) {  // PEFT's print_trainable_parameters, counted the same way
    const model::LoraCounts n = model::lora_counts(*lm_);
    char percent[32];
    std::snprintf(percent, sizeof percent, "%.4f",
                  100.0 * static_cast<double>(n.trainable) / static_cast<double>(n.all));
    const std::string saved = lora.modules_to_save.empty() ? "" : ", training " + join(lora.modules_to_save, ", ");
    const std::vector<std::string> linear = model::lora_target_names(*lm_, lora);
    const std::vector<std::string> experts = model::lora_target_parameters(*lm_, lora);
    std::vector<std::string> keys = linear;
    keys.insert(keys.end(), experts.begin(), experts.end());
    say(str("[lora] r ", lora.r, ", alpha ", lora.alpha, " (scaling ", lora.scaling(), ") on ",
            lora_targets_said(static_cast<int64_t>(linear.size()), experts), lora_patterns_said(lora, keys), saved,
            "; trainable params: ", n.trainable, " || all params: ", n.all, " || trainable%: ", percent, "\n"));
    if (const std::string note = model::peft_moe_target_note(model_config_, lora); !note.empty())
      say(str("[lora] ", note, "\n"));
  }
  const config::OptimConfig& o = config_.optimizer;
  adamw_ = std::make_unique<optim::ShardedAdamW>(
      *sharded_, optim::AdamWOptions{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, config_.engine.offload_overlap});
  const auto bytes = sharded_->persistent_bytes();
  say(str("[train] model: ", model_config_.num_parameters(), " parameters",
          experts_summary(model_config_, plan.ep_size, plan.fsdp_shard_size()), ", ", sharded_->groups().size(),
          " units; per rank ", format_bytes(bytes.params),
          lora.enabled() ? " of shards (frozen ones in the compute dtype) + " : " of fp32 shards + ",
          format_bytes(bytes.grads), " of gradients + ", format_bytes(adamw_->state_bytes()), " of AdamW state; ",
          plural(world_.size(), "rank"), " on ", context_.device.str(),
          world_.is_local() ? "" : " over " + world_.backend_name(), "; built in ",
          format_seconds(seconds_since(started)), "\n"));
}

void TrainingRun::build_checkpointer(const TrainHooks& hooks) {
  const config::CheckpointConfig& c = config_.checkpoint;
  if (c.dir.empty() && c.resume.empty()) return;
  ckpt::CheckpointOptions options;
  options.dir = c.dir;
  options.keep = c.keep;
  options.keep_best = c.keep_best;
  options.format = config_.fsdp.state_dict_type == config::StateDictType::kShardedStateDict ? ckpt::Format::kSharded
                                                                                            : ckpt::Format::kFull;
  options.fs = hooks.checkpoint_fs;
  options.direct_io = c.direct_io;
  options.frozen_from_base = config_.lora.enabled();
  options.log = context_.is_main() ? &out_ : nullptr;
  if (!c.dir.empty()) claim_checkpoint_dir(options.fs ? *options.fs : ckpt::local_file_system());
  checkpointer_ =
      std::make_unique<ckpt::Checkpointer>(*sharded_, *adamw_, model::describe(model_config_), world_, options);
}

// Rank 0 locks checkpoint.dir for the run and checks it before step 1 (writable, no damaged
// checkpoint, room for one more); every rank stops when that fails.
void TrainingRun::claim_checkpoint_dir(ckpt::FileSystem& fs) {
  const config::CheckpointConfig& c = config_.checkpoint;
  std::string failure;
  if (world_.rank() == 0) {
    try {
      dir_lock_ = std::make_unique<ckpt::DirLock>(c.dir);
      ckpt::check_checkpoint_dir(c.dir, ckpt::checkpoint_bytes(model_config_.num_parameters()), c.keep, fs);
    } catch (const InputError& e) {
      failure = e.what();
    }
  }
  ckpt::agree(world_, context_.device, failure, "checkpoint.dir");
}

int64_t TrainingRun::resume() {
  const config::CheckpointConfig& c = config_.checkpoint;
  if (c.resume.empty()) return 1;
  const std::string path = c.resume == "latest" ? ckpt::latest_checkpoint(c.dir) : c.resume;
  if (path.empty()) {
    say(str("[train] checkpoint.resume is latest, but ",
            c.dir.empty() ? "checkpoint.dir is off" : c.dir + " holds no complete checkpoint",
            ": starting at step 1\n"));
    return 1;
  }
  // The batch before any weight is read, so a refusal costs nothing (a state that does not read is
  // the loader's to report, with the rest of the checkpoint's checks).
  if (const std::optional<nlohmann::json> state = try_read_json_file(path + "/" + ckpt::kState)) {
    std::optional<ckpt::TrainingState> early;
    try {
      early = ckpt::parse_state(*state, path);
    } catch (const InputError&) {
    }
    if (early) check_resumed_batch(*early, path);
  }
  const std::string before = host_peaks(world_, context_.device);
  const ckpt::TrainingState saved = checkpointer_->resume(path, state_at(0));
  say(str("[train] peak host memory per rank: ", before, " before loading, ", host_peaks(world_, context_.device),
          " after\n"));
  restore_selection_biases(saved, path);
  loader_->set_position({saved.loader_epoch, saved.loader_offset});
  consumed_ = loader_->position();
  resumed_from_ = saved.step;
  return saved.step + 1;
}

// A balanced run's biases continue from the checkpoint's; one saved without balancing starts them at 0.
void TrainingRun::restore_selection_biases(const ckpt::TrainingState& saved, const std::string& path) {
  if (!step_routed_.defined()) return;
  const std::vector<model::MoeBlockImpl*> blocks = lm_->sparse_blocks();
  if (saved.expert_bias.empty()) {
    say(str("[train] ", path, " was saved without train.moe_load_balance_coeff: the experts' selection biases start at 0\n"));
    return;
  }
  FSDP_CHECK(saved.expert_bias.size() == blocks.size(), "[ckpt] ", path, " holds selection biases of ",
             saved.expert_bias.size(), " sparse layers, but the model has ", blocks.size(),
             "; resume from a checkpoint of this model");
  for (size_t l = 0; l < blocks.size(); ++l) {
    const std::vector<double>& v = saved.expert_bias[l];
    FSDP_CHECK(static_cast<int64_t>(v.size()) == blocks[l]->selection_bias.numel(), "[ckpt] ", path,
               " holds a selection bias of ", v.size(), " experts for sparse layer ", l, ", but the model has ",
               blocks[l]->selection_bias.numel(), "; resume from a checkpoint of this model");
    blocks[l]->selection_bias.copy_(at::tensor(v, at::kDouble).to(at::kFloat));
  }
}

double TrainingRun::learning_rate_at(int64_t step, int64_t steps) const {
  optim::ScheduleOptions schedule = schedule_of(config_);
  if (config_.schedule.warmup_ratio > 0)  // Trainer's: ceil(ratio x the run's steps)
    schedule.warmup_steps = static_cast<int64_t>(std::ceil(config_.schedule.warmup_ratio * static_cast<double>(steps)));
  return optim::learning_rate(schedule, config_.optimizer.lr, step, steps);
}

int64_t TrainingRun::sequences_per_step() const {
  const config::TrainConfig& t = config_.train;
  return dp_size() * t.micro_batch_size * t.gradient_accumulation_steps;
}

void TrainingRun::check_resumed_batch(const ckpt::TrainingState& saved, const std::string& path) const {
  const int64_t now = sequences_per_step();
  if (saved.global_batch == 0 || saved.global_batch == now) return;
  const config::TrainConfig& t = config_.train;
  // What the run would have been at the saved batch: its steps (train.epochs count them from the
  // batch) and so the next step's learning rate.
  const int64_t then = t.epochs > 0 ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil(
                                                              t.epochs * static_cast<double>(split_.train_sequences) /
                                                              static_cast<double>(saved.global_batch))))
                                    : steps_;
  const int64_t next = saved.step + 1;
  std::string changes = str("each step trains on ", now, " sequences instead of ", saved.global_batch);
  if (then != steps_) changes += str(", the run is ", steps_, " steps instead of ", then, " (train.epochs ", t.epochs, ")");
  const double lr_now = learning_rate_at(next, steps_), lr_then = learning_rate_at(next, then);
  if (lr_now != lr_then) changes += str(", and step ", next, "'s learning rate is ", lr_now, " instead of ", lr_then);
  if (config_.checkpoint.resume_new_batch) {
    say(str("[train] resuming at another global batch (checkpoint.resume_new_batch): ", changes, "\n"));
    return;
  }
  throw InputError(str("[train] ", path, " was saved by a run of ", saved.global_batch,
                       " sequences a step; this run's global batch is ", now, " (", dp_size(),
                       " data-parallel ranks x train.micro_batch_size ", t.micro_batch_size,
                       " x train.gradient_accumulation_steps ", t.gradient_accumulation_steps, "): ", changes,
                       ". Set checkpoint.resume_new_batch: true to continue so, or give the run the saved batch"));
}

double TrainingRun::tokens_per_step() const {
  const config::TrainConfig& t = config_.train;
  return static_cast<double>(dp_size() * t.micro_batch_size * t.sequence_length * t.gradient_accumulation_steps);
}

// The summed token losses of one micro-batch, through the sharded model.
at::Tensor TrainingRun::loss_sum(const at::Tensor& inputs, const at::Tensor& targets, const model::Packed& packed) {
  const at::Tensor x = inputs.to(context_.device, /*non_blocking=*/true);
  const at::Tensor y = targets.to(context_.device, /*non_blocking=*/true);
  const model::Packed rows = packed.defined() ? packed.to(context_.device) : model::Packed{};
  return sharded_->forward({x, y},
                           [&](const TensorList& in) { return TensorList{lm_->loss_sum(in[0], in[1], rows)}; })[0];
}

at::Tensor TrainingRun::loss_sum(const data::Batch& b, int64_t rows) {
  const int64_t T = config_.train.sequence_length;
  return loss_sum(host_tensor(b.inputs, rows, T, false), host_tensor(b.targets, rows, T, false),
                  packed_rows(b, rows, T, false));
}

StepBatches TrainingRun::read_batches() {
  const config::TrainConfig& t = config_.train;
  const bool pinned = context_.device.is_cuda();
  StepBatches b;
  for (int64_t micro = 0; micro < t.gradient_accumulation_steps; ++micro) {
    const data::Batch batch = loader_->next();
    b.inputs.push_back(host_tensor(batch.inputs, t.micro_batch_size, t.sequence_length, pinned));
    b.targets.push_back(host_tensor(batch.targets, t.micro_batch_size, t.sequence_length, pinned));
    b.packed.push_back(packed_rows(batch, t.micro_batch_size, t.sequence_length, pinned));
    b.counted += static_cast<double>(batch.counted_targets());
  }
  b.after = loader_->position();
  return b;
}

// This step's batches. On a GPU they were read ahead while the last step ran, and the next step's
// read starts now; on CPU the cores are busy computing, so a helper thread would only take turns
// with the step (it measured 6 % slower on 2 cores), and they are read now (engine.read_ahead
// chooses otherwise).
StepBatches TrainingRun::take_batches() {
  RECORD_USER_SCOPE("data");
  const config::ReadAhead ahead = config_.engine.read_ahead;
  if (ahead == config::ReadAhead::kOff || (ahead == config::ReadAhead::kAuto && !context_.device.is_cuda()))
    return read_batches();
  StepBatches b = next_batches_.valid() ? next_batches_.get() : read_batches();
  next_batches_ = std::async(std::launch::async, [this] { return read_batches(); });
  return b;
}

// The global batch's counted targets, as a (1) double tensor on the device: every target, unless
// the data has prompts or record boundaries; then the ranks' counts summed there (no host wait).
at::Tensor TrainingRun::global_targets(double local) {
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(context_.device);
  if (every_target_counts_) return at::full({1}, tokens_per_step(), opts);
  at::Tensor t = at::full({1}, local, opts);
  if (world_.size() > 1) world_.all_reduce(t, dist::ReduceOp::kSum, "counted targets").wait();
  // A tensor-parallel group's ranks, and a context-parallel group's, counted the same batch.
  return tp_size() * cp_size_ > 1 ? t / (tp_size() * cp_size_) : t;
}

std::optional<StepResult> TrainingRun::train_step(int64_t step, bool stop) {
  RECORD_USER_SCOPE(str("step ", step));
  const double lr = learning_rate_at(step, steps_);
  adamw_->set_lr(lr);
  const StepBatches batches = take_batches();
  consumed_ = batches.after;
  const bool check = context_.device.is_cuda() && config_.engine.sync_debug;
  at::Tensor counted, loss_sum;
  {
    const NoDeviceWaits queued(check);
    counted = global_targets(batches.counted);
    loss_sum = forward_backward(batches, counted);
  }
  // The step before's numbers, read while this step's work runs on the device.
  std::optional<StepResult> previous;
  if (pending_) previous = finish_step();
  const NoDeviceWaits queued(check);
  if (stop) loss_sum.narrow(0, 1, 1).fill_(1.0);  // reduced with the loss: every rank learns it at the same step
  queue_update(step, lr, loss_sum, counted);
  return previous;
}

// Forward and backward of every micro-batch; returns this rank's loss sum and a stop flag (0), (2)
// double on the device.
// The loss is the mean over the global batch's counted targets (all of them, but for prompts'):
// each rank's loss sum is scaled so the ranks' averaged gradients are that mean's.
at::Tensor TrainingRun::forward_backward(const StepBatches& batches, const at::Tensor& counted) {
  // Per rank that fully_shard averages the gradients over: the data-parallel ranks and each one's
  // context-parallel ranks, which hold parts of its tokens (tensor-parallel ranks each compute their
  // part of the same loss's).
  const int averaged = dp_size() * cp_size_;
  const double per_rank = tokens_per_step() / averaged;
  const at::Tensor per_rank_masked = !every_target_counts_ ? counted.clamp_min(1.0) / averaged : at::Tensor();
  // loss sum, stop flag, and for a mixture of experts the aux loss and each expert's load.
  const model::MoeConfig& moe = lm_->config.moe;
  at::Tensor reduced = at::zeros({moe.num_experts > 0 ? 3 + moe.num_experts : 2},
                                 at::TensorOptions().dtype(at::kDouble).device(context_.device));
  at::Tensor loss_sum = reduced.narrow(0, 0, 1);
  const double micro_batches = static_cast<double>(batches.inputs.size());
  for (size_t micro = 0; micro < batches.inputs.size(); ++micro) {
    sharded_->set_requires_gradient_sync(micro + 1 == batches.inputs.size());
    at::Tensor loss;
    {
      RECORD_USER_SCOPE(str("forward micro-batch ", micro));
      loss = this->loss_sum(batches.inputs[micro], batches.targets[micro], batches.packed[micro]);
    }
    RECORD_USER_SCOPE(str("backward micro-batch ", micro));
    at::Tensor objective =
        per_rank_masked.defined() ? loss / per_rank_masked.to(loss.scalar_type()).reshape({}) : loss / per_rank;
    // A mixture of experts with output_router_logits: each micro-batch's auxiliary load-balancing
    // loss times router_aux_loss_coef, as transformers adds it to each forward's loss (the ranks'
    // and micro-batches' mean, as their gradients average). Logged either way, with the load.
    // Under activation checkpointing its gradient joins the routers' in backward instead (the same sum).
    const bool added = moe.output_router_logits && moe.router_aux_loss_coef > 0;
    const bool in_backward = added && config_.fsdp.activation_checkpointing;
    const double coef = moe.router_aux_loss_coef / micro_batches;
    if (const at::Tensor aux = in_backward ? lm_->router_aux_gradient(coef) : lm_->router_aux_loss(); aux.defined()) {
      if (added && !in_backward) objective = objective + aux.to(objective.scalar_type()) * coef;
      reduced.narrow(0, 2, 1).add_(aux.detach().to(at::kDouble) / micro_batches);
      reduced.narrow(0, 3, moe.num_experts).add_(lm_->expert_load().to(at::kDouble));
    }
    if (step_routed_.defined()) {
      c10::NoGradGuard no_grad;
      const std::vector<model::MoeBlockImpl*> blocks = lm_->sparse_blocks();
      for (size_t l = 0; l < blocks.size(); ++l)
        step_routed_[static_cast<int64_t>(l)].add_(blocks[l]->last.routed_per_expert);
    }
    objective.backward();
    loss_sum.add_(loss.detach());
  }
  balance_experts();
  return reduced;
}

void TrainingRun::start_balancing() {
  const double coeff = config_.train.moe_load_balance_coeff;
  if (coeff <= 0) return;
  const int64_t experts = model_config_.moe.num_experts;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(context_.device);
  const std::vector<model::MoeBlockImpl*> blocks = lm_->sparse_blocks();
  for (model::MoeBlockImpl* b : blocks) b->selection_bias = at::zeros({experts}, fp32);
  step_routed_ = at::zeros({static_cast<int64_t>(blocks.size()), experts}, fp32);
  say(str("[train] auxiliary-loss-free balancing over ", plural(static_cast<int64_t>(blocks.size()), "sparse layer"),
          ": each chooses its experts with a per-expert bias that moves by ", coeff,
          " a step toward the experts below the mean load (train.moe_load_balance_coeff)\n"));
}

void TrainingRun::balance_experts() {
  if (!step_routed_.defined()) return;
  c10::NoGradGuard no_grad;
  // Every rank routes its own tokens (data, context, tensor and expert parallel alike): the sum over
  // all of them is the step's whole load.
  if (world_.size() > 1) world_.all_reduce(step_routed_, dist::ReduceOp::kSum, "experts' load for balancing").wait();
  const std::vector<model::MoeBlockImpl*> blocks = lm_->sparse_blocks();
  for (size_t l = 0; l < blocks.size(); ++l)
    model::update_selection_bias(blocks[l]->selection_bias, step_routed_[static_cast<int64_t>(l)],
                                 config_.train.moe_load_balance_coeff);
  step_routed_.zero_();
}

std::vector<std::vector<double>> TrainingRun::selection_biases() const {
  std::vector<std::vector<double>> out;
  if (!step_routed_.defined()) return out;
  for (const model::MoeBlockImpl* b : lm_->sparse_blocks()) {
    const at::Tensor host = b->selection_bias.to(at::kCPU, at::kDouble).contiguous();
    out.emplace_back(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
  }
  return out;
}

// engine.dump_gradients DIR: every trainable parameter's full gradient of each step (averaged over
// the ranks, before clipping), as DIR/step-N.safetensors, for comparing with another trainer.
// Collective; it waits for the device.
void TrainingRun::dump_gradients(int64_t step) const {
  const std::string& dir = config_.engine.dump_gradients;
  if (dir.empty()) return;
  const auto grads = sharded_->gather_full_gradients();
  if (world_.rank() != 0) return;
  make_directories(dir);
  ckpt::save_safetensors(str(dir, "/step-", step, ".safetensors"), grads);
}

// Clips and applies the gradients on the device, skipping the update there when the loss or the
// norm is not finite or nothing was counted; then starts the copy of the step's numbers to the host.
void TrainingRun::queue_update(int64_t step, double lr, at::Tensor loss_sum, const at::Tensor& counted) {
  if (world_.size() > 1) world_.all_reduce(loss_sum, dist::ReduceOp::kSum, "loss").wait();
  // Every tp rank computed the whole loss; the aux loss and the load are parts of theirs (each rank routes its
  // own sequence block), which the sum adds up.
  if (tp_size() > 1) loss_sum.narrow(0, 0, 1).div_(tp_size());
  dump_gradients(step);
  const at::Tensor norm = optim::grad_norm(*sharded_);
  // loss, stop, counted, norm (and a mixture of experts' aux loss and load)
  const at::Tensor stats = at::cat({loss_sum.narrow(0, 0, 2), counted, norm.to(loss_sum.device()),
                                    loss_sum.narrow(0, 2, loss_sum.size(0) - 2)});
  // Clipped inside AdamW's kernel (the gradients divided there): no pass over them of its own.
  adamw_->step(at::logical_or(stats.isfinite().all().logical_not(), counted.eq(0).all()),
               optim::clip_divisor(norm, config_.optimizer.grad_clip));
  sharded_->zero_grad();
  PendingStep p;
  p.step = step;
  p.lr = lr;
  if (context_.device.is_cuda()) {
    p.host = at::empty({stats.size(0)}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
    p.host.copy_(stats, /*non_blocking=*/true);
    const c10::impl::VirtualGuardImpl guard(context_.device.type());
    p.copied.emplace(context_.device.type());
    p.copied->record(guard.getStream(context_.device));
  } else {
    p.host = stats;
  }
  pending_ = std::move(p);
}

StepResult TrainingRun::finish_step() {
  FSDP_ASSERT(pending_.has_value(), "finish_step without a queued step");
  const PendingStep p = std::move(*pending_);
  pending_.reset();
  if (p.copied) p.copied->synchronize();
  return judge(p);
}

// A step's numbers, read: the result, or Error for a non-finite one (unless train.skip_nonfinite_loss).
StepResult TrainingRun::judge(const PendingStep& p) const {
  const double* v = p.host.data_ptr<double>();
  const double loss_sum = v[0], counted = v[2];
  StepResult r;
  r.step = p.step;
  r.lr = p.lr;
  r.stop = v[1] > 0;
  r.grad_norm = v[3];
  if (const int64_t extra = p.host.size(0) - 4; extra > 0) {  // a mixture of experts
    r.aux_loss = v[4] / static_cast<double>(dp_size() * cp_size_);
    r.expert_load.assign(v + 5, v + 4 + extra);
  }
  if (counted == 0) {
    r.skipped = "the global batch holds no target token (only prompts); step skipped";
    return r;
  }
  r.loss = loss_sum / counted;
  if (std::isfinite(r.loss) && std::isfinite(r.grad_norm)) return r;
  // Every rank read the same numbers, so every rank skips or throws alike.
  const std::string what =
      std::isfinite(r.loss) ? str("the gradient norm is ", r.grad_norm) : str("the loss is ", r.loss);
  if (!config_.train.skip_nonfinite_loss)
    throw Error(str("[train] ", what, " at step ", p.step, "; lower optimizer.lr (it was ", p.lr,
                    "), check the data, or set train.skip_nonfinite_loss: true to skip such steps"));
  r.skipped = what + "; step skipped (train.skip_nonfinite_loss)";
  return r;
}

// The mean loss over the held-out sequences: up to train.eval_batches micro-batches per rank, the
// sequences dealt round-robin over the ranks. Every rank runs the same number of forward passes (the
// gathers are collective): a rank past the end runs a batch whose targets all count for nothing.
double TrainingRun::evaluate() {
  const int64_t T = config_.train.sequence_length, n = split_.eval_sequences, w = dp_size();
  if (n == 0) return std::numeric_limits<double>::quiet_NaN();
  const data::SequenceReader& reader = eval_reader_ ? *eval_reader_ : *reader_;
  const int64_t first = eval_reader_ ? 0 : split_.train_sequences;
  const int64_t b = std::min<int64_t>(config_.train.micro_batch_size, (n + w - 1) / w);
  const int64_t passes = std::min<int64_t>(config_.train.eval_batches, (n + w * b - 1) / (w * b));
  c10::NoGradGuard no_grad;
  double sum = 0, count = 0;
  for (int64_t pass = 0; pass < passes; ++pass) {
    data::Batch batch;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t k = (pass * b + i) * w + dp_rank();  // this rank's i-th sequence of the pass
      reader.append(first + std::min(k, n - 1), batch);
      if (k >= n) std::fill(batch.targets.end() - T, batch.targets.end(), data::kIgnoreTarget);
    }
    count += static_cast<double>(batch.counted_targets());
    sum += loss_sum(batch, b).item<double>();
  }
  // The ranks of a cp group hold parts of the loss sum, but each counted the whole batch's targets.
  return global_sum(world_, sum, context_.device, tp_size()) /
         global_sum(world_, count, context_.device, tp_size() * cp_size_);
}

ckpt::TrainingState TrainingRun::state_at(int64_t step) const {
  ckpt::TrainingState s;
  s.step = step;
  s.optimizer_steps = adamw_->steps();
  s.loader_epoch = consumed_.epoch;  // the loader itself may have read ahead
  s.loader_offset = consumed_.offset;
  s.seed = config_.train.seed;
  s.sequence_length = config_.train.sequence_length;
  s.train_sequences = split_.train_sequences;
  s.world_size = world_.size();
  s.global_batch = sequences_per_step();
  s.expert_bias = selection_biases();
  if (config_.lora.enabled()) s.lora = lora_settings_of(config_).scales();
  return s;
}

void TrainingRun::save_checkpoint(int64_t step, std::optional<double> eval_loss) {
  ckpt::TrainingState state = state_at(step);
  state.eval_loss = eval_loss;
  checkpointer_->save(state);
}

void TrainingRun::reserve_checkpoint_memory() {
  if (!checkpointing()) return;
  const Clock::time_point t0 = Clock::now();
  const uint64_t bytes = checkpointer_->reserve();
  say(str("[ckpt] ", format_bytes(static_cast<long long>(bytes)), " of ", context_.device.is_cuda() ? "pinned " : "",
          "host memory reserved for saves on rank 0 (", format_seconds(seconds_since(t0)),
          "): each save copies the rank's part there, and training goes on while "
          "it is written\n"));
}

void TrainingRun::wait_for_checkpoint() {
  if (checkpointer_) checkpointer_->wait();
}

std::string TrainingRun::offload_note() const {
  if (!config_.fsdp.offload_params || !adamw_) return "";
  const optim::ShardedAdamW::HostUpdates& host = adamw_->host_updates();
  int64_t per_update = 0;
  for (const auto& g : sharded_->groups()) per_update += g->trainable_numel();
  if (host.params == 0 || host.nanoseconds == 0 || per_update == 0) return "";
  const double seconds = 1e-9 * static_cast<double>(host.nanoseconds.load());
  const double ms = 1e3 * seconds * static_cast<double>(per_update) / static_cast<double>(host.params.load());
  // fused AdamW reads the parameter, its gradient and both moments and writes all but the gradient
  const double bytes = 28.0 * static_cast<double>(host.params.load());
  char line[320];
  std::snprintf(line, sizeof line,
                "[train] offload: AdamW on the host took %.*f ms an update over %lld parameters on rank %d "
                "(%.1f GB/s of the 28 bytes a parameter it reads and writes): host memory's speed bounds an "
                "offloaded step from below\n",
                ms < 10 ? 1 : 0, ms, static_cast<long long>(per_update), world_.rank(), bytes / seconds / 1e9);
  return line;
}

void TrainingRun::barrier() {
  if (world_.size() > 1) world_.barrier().wait();
}

void TrainingRun::export_hf(int64_t step) {
  const std::string dir = str(config_.checkpoint.export_dir, "/step-", step);
  const Clock::time_point t = Clock::now();
  const ckpt::ExtraFiles extra = text_files();
  if (world_.rank() == 0) replace_own_export(dir, step);
  const model::LoraSettings lora = lora_settings_of(config_);
  const bool peft = lora.enabled() && !config_.checkpoint.export_merged;
  const auto [dtype, dtype_why] = export_dtype();
  if (peft) {
    // The base as the run was given it: a Hub id stays one (the cache's snapshot is this machine's path),
    // with its revision when that is not main, as PEFT's LoraConfig(revision=...) writes it.
    const std::string& base = config_.model.pretrained;
    const std::string id = base.empty() ? "" : hub_id_of(absolute_path(base));
    const std::string revision = id.empty() || config_.model.revision == "main" ? "" : config_.model.revision;
    ckpt::export_peft(*sharded_, lora, peft_target_modules(config_.lora, model::lora_target_names(*lm_, lora)),
                      base.empty() ? "" : id.empty() ? absolute_path(base) : id, revision, dir, extra);
  } else if (lora.enabled()) {
    ckpt::export_merged(*sharded_, model::describe(model_config_), lora, model_config_.moe.gpt_oss, dir, extra, dtype);
  } else {
    ckpt::export_hf(*sharded_, model::describe(model_config_), dir, extra, ckpt::kDefaultMaxShardBytes, dtype);
  }
  if (world_.rank() == 0) write_file_atomic(dir + "/" + kExportNote, export_note(step));
  if (world_.rank() == 0 && step_routed_.defined()) {  // what transformers' classes have no place for
    nlohmann::json biases = nlohmann::json::object();
    const std::vector<std::vector<double>> values = selection_biases();
    int64_t l = 0;
    for (int64_t i = 0; i < model_config_.num_hidden_layers; ++i)
      if (model_config_.plan(i).moe)  // the block's path (Gemma 4's router is the layer's own)
        biases[str("model.layers.", i, model_config_.moe.gemma4 ? ".router" : ".mlp")] =
            values.at(static_cast<size_t>(l++));
    write_file_atomic(dir + "/expert_selection_bias.json",
                      nlohmann::json{{"train.moe_load_balance_coeff", config_.train.moe_load_balance_coeff},
                                     {"note", "added to the router's scores to choose the top-k experts, not to their "
                                              "weights; transformers' class routes without it"},
                                     {"selection_bias", biases}}
                              .dump(2) +
                          "\n");
  }
  std::string names;
  for (const auto& [name, from] : extra) names += (names.empty() ? "; with " : ", ") + name;
  say(str("[train] exported ",
          peft             ? "a PEFT adapter folder"
          : lora.enabled() ? "the merged model as a Hugging Face folder"
                           : "a Hugging Face folder",
          peft ? "" : str(" (", dtype_why, ")"), " to ", dir, " in ", format_seconds(seconds_since(t)), names, "\n"));
}

// checkpoint.export_dtype, and how this run came to it.
std::pair<ckpt::Dtype, std::string> TrainingRun::export_dtype() const {
  using config::ExportDtype;
  switch (config_.checkpoint.export_dtype) {
    case ExportDtype::kFloat32:
      return {ckpt::Dtype::kF32, "float32"};
    case ExportDtype::kBfloat16:
      return {ckpt::Dtype::kBF16, "bfloat16"};
    case ExportDtype::kFloat16:
      return {ckpt::Dtype::kF16, "float16"};
    case ExportDtype::kAuto:
      break;
  }
  if (config_.model.pretrained.empty()) return {ckpt::Dtype::kF32, "float32"};
  const std::string& d = model_config_.dtype;  // the pretrained folder's torch_dtype
  const std::string why = str(", as model.pretrained's torch_dtype");
  if (d == "bfloat16") return {ckpt::Dtype::kBF16, "bfloat16" + why};
  if (d == "float16") return {ckpt::Dtype::kF16, "float16" + why};
  return {ckpt::Dtype::kF32, d == "float32" ? "float32" + why : "float32"};
}

// What an export holds besides the weights, so it is a whole Hugging Face folder that transformers
// and fsdptrain generate read alone: every tokenizer, template and generation file of the tokenizer's
// folder and of model.pretrained (the first folder that has a name wins).
ckpt::ExtraFiles TrainingRun::text_files() const {
  std::vector<std::string> folders;
  const std::string& tok = config_.data.tokenizer;
  if (!tok.empty()) folders.push_back(is_directory(tok) ? tok : parent_folder(tok));
  if (!config_.model.pretrained.empty()) folders.push_back(config_.model.pretrained);
  return ckpt::model_text_files(folders);
}

// Which run wrote an export: a resumed run replaces the exports of steps after its checkpoint that
// its own earlier attempt wrote (a crash between an export and the next save), and nothing else.
std::string TrainingRun::export_note(int64_t step) const {
  return nlohmann::json{{"checkpoint_dir", config_.checkpoint.dir.empty() ? "" : absolute_path(config_.checkpoint.dir)},
                        {"step", step}}
             .dump(2) +
         "\n";
}

void TrainingRun::replace_own_export(const std::string& dir, int64_t step) const {
  if (!file_exists(dir) || resumed_from_ == 0 || step <= resumed_from_ || config_.checkpoint.dir.empty()) return;
  const std::optional<nlohmann::json> note = try_read_json_file(dir + "/" + kExportNote);
  const bool own = note && note->is_object() &&
                   note->value("checkpoint_dir", std::string()) == absolute_path(config_.checkpoint.dir);
  if (!own) return;  // another run's: export_hf refuses to overwrite it
  remove_tree(dir);
  say(str("[train] replaced ", dir, ", which this run wrote before it stopped at a step after its last checkpoint\n"));
}

void TrainingRun::say(const std::string& line) const {
  if (context_.is_main()) out_ << line << std::flush;
}

}  // namespace fsdp::train

#include "train/run_config.h"

#include "model/config/description.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hub_cache.h"

namespace fsdp::train {

std::string model_config_path(const config::Config& cfg) {
  return cfg.model.config.empty() ? cfg.model.pretrained + "/config.json" : cfg.model.config;
}

model::DecoderConfig model_config_of(const config::Config& cfg, std::vector<std::string>* warnings) {
  FSDP_CHECK(!cfg.model.config.empty() || !cfg.model.pretrained.empty(),
             "[train] neither model.config nor model.pretrained is set; give a Hugging Face config.json (such as "
             "configs/models/tiny/config.json) or a Hugging Face model folder to start from");
  const std::string path = model_config_path(cfg);
  model::DecoderConfig c = model::load_llama_config(path, warnings);
  FSDP_CHECK(!c.text_of_multimodal || cfg.model.text_only, "[train] ", path, " is ", c.multimodal_architecture,
             " (text and vision); fsdptrain trains its text model alone: set model.text_only: true to train that, "
             "leaving out the vision tower, and the exports are ",
             model::family_names(c.family).architecture, " folders");
  FSDP_CHECK(c.text_of_multimodal || !cfg.model.text_only,
             "[train] model.text_only is for a model of text and vision "
             "(Gemma3ForConditionalGeneration, Gemma4ForConditionalGeneration, Qwen3_5ForConditionalGeneration, "
             "Qwen3_5MoeForConditionalGeneration, Mistral3ForConditionalGeneration); ",
             path, " is ", model::family_names(c.family).architecture, ", text only already: remove model.text_only");
  return c;
}

void check_positions(const config::Config& config, const model::DecoderConfig& model) {
  // Ministral 3's query scale (its own bound; max_position_embeddings' is the check below).
  FSDP_CHECK(model.query_scale_beta <= 0 || config.train.sequence_length <= model.query_scale_positions,
             "[train] train.sequence_length ", config.train.sequence_length, ": ",
             model::family_names(model.family).architecture, " scales its queries past position ",
             model.query_scale_positions, " (rope_parameters' llama_4_scaling_beta, ", model_config_path(config),
             "), which fsdptrain does not compute; set train.sequence_length to ", model.query_scale_positions,
             " or less");
  FSDP_CHECK(config.model.pretrained.empty() || config.train.sequence_length <= model.max_position_embeddings,
             "[train] train.sequence_length ", config.train.sequence_length,
             " is beyond the model's max_position_embeddings ", model.max_position_embeddings, " (",
             model_config_path(config), "); positions past it were never trained. Lower train.sequence_length");
}

chat::TemplateLimits template_limits_of(const config::Config& config) {
  chat::TemplateLimits l;
  l.max_output_bytes = config.data.chat_template_max_output;
  l.max_iterations = config.data.chat_template_max_iterations;
  l.max_depth = config.data.chat_template_max_depth;
  l.max_string_bytes = config.data.chat_template_max_string;
  return l;
}

data::DataOptions data_options_of(const config::Config& config, int64_t vocab_size) {
  data::DataOptions o;
  o.path = config.data.path;
  o.dataset = config.data.dataset;
  o.split = config.data.split;
  o.config = config.data.config;
  o.revision = config.data.revision;
  o.field = config.data.field;
  o.tokenizer = config.data.tokenizer;
  o.pretrained = config.model.pretrained;
  o.cache_dir = config.data.cache_dir;
  o.vocab_size = vocab_size;
  o.chat_template = config.data.chat_template == "model" ? "" : config.data.chat_template;
  o.assistant_only_loss = config.data.assistant_only_loss;
  o.template_limits = template_limits_of(config);
  return o;
}

std::optional<data::DataOptions> eval_data_options_of(const config::Config& config, int64_t vocab_size) {
  const config::DataConfig& d = config.data;
  if (d.eval_path.empty() && d.eval_split.empty()) return std::nullopt;
  data::DataOptions o = data_options_of(config, vocab_size);
  if (d.eval_path.empty()) {  // a split of the training dataset (or of its save_to_disk DatasetDict)
    o.split = d.eval_split;
  } else if (glob_paths(d.eval_path).empty() && hub::is_repo_id(d.eval_path)) {  // a Hub dataset of its own
    o.path.clear();
    o.dataset = d.eval_path;
    o.config.clear();
    o.revision = "main";
    o.split = d.hub_eval_split();
  } else {  // files of its own (or a save_to_disk folder: its data.eval_split, else data.split)
    o.path = d.eval_path;
    o.dataset.clear();
    if (!d.eval_split.empty()) o.split = d.eval_split;
  }
  return o;
}

FsdpPlan fsdp_plan_from_config(const config::Config& config, c10::Device device) {
  FsdpPlan plan;
  FsdpOptions& o = plan.options;
  switch (config.launch.mixed_precision) {
    case config::MixedPrecision::kNo:
      break;
    case config::MixedPrecision::kBf16:
      o.mixed_precision.param_dtype = at::kBFloat16;
      break;
    case config::MixedPrecision::kFp16:
      o.mixed_precision.param_dtype = at::kHalf;
      break;
  }
  o.mixed_precision.reduce_dtype = at::kFloat;
  o.keep_in_fp32 = model::kept_in_fp32;  // a router's stored bias, as transformers keeps it
  switch (config.fsdp.auto_wrap_policy) {
    case config::WrapPolicy::kTransformerBasedWrap:
      o.wrap_policy = fsdp::WrapPolicy::kTransformerBasedWrap;
      break;
    case config::WrapPolicy::kSizeBasedWrap:
      o.wrap_policy = fsdp::WrapPolicy::kSizeBasedWrap;
      break;
    case config::WrapPolicy::kNoWrap:
      o.wrap_policy = fsdp::WrapPolicy::kNoWrap;
      break;
  }
  o.layer_classes = config.fsdp.transformer_layer_cls_to_wrap;
  o.ignored_modules = config.fsdp.ignored_modules;
  o.min_num_params = config.fsdp.min_num_params;
  o.offload_params = config.fsdp.offload_params;
  o.offload_keep_on_device = config.engine.offload_keep_on_device;
  o.activation_checkpointing = config.fsdp.activation_checkpointing;
  o.device = device;
  o.host_cache = config.engine.host_cache;
  const config::FsdpLayout layout = config::effective_fsdp_layout(config);
  o.reshard_after_forward = layout.reshard_after_forward;
  plan.replicate_size = layout.replicate_size;
  plan.shard_size = layout.shard_size;
  plan.post_forward_size = layout.post_forward_size;
  plan.tp_size = layout.tp_size;
  plan.cp_size = layout.cp_size;
  plan.cp_kind = layout.cp_kind;
  plan.ep_size = layout.ep_size;
  return plan;
}

optim::ScheduleOptions schedule_of(const config::Config& config) {
  optim::ScheduleOptions s;
  switch (config.schedule.type) {
    case config::ScheduleType::kCosine:
      s.decay = optim::Decay::kCosine;
      break;
    case config::ScheduleType::kLinear:
      s.decay = optim::Decay::kLinear;
      break;
    case config::ScheduleType::kConstant:
      s.decay = optim::Decay::kConstant;
      break;
  }
  s.warmup_steps = config.schedule.warmup_steps;
  s.min_lr_ratio = config.schedule.min_lr_ratio;
  return s;
}

model::LoraSettings lora_settings_of(const config::Config& config) {
  const config::LoraConfig& l = config.lora;
  model::LoraSettings s;
  s.r = l.r;
  s.alpha = l.alpha;
  s.dropout = l.dropout;
  s.use_rslora = l.use_rslora;
  s.target_modules = l.target_modules;
  s.modules_to_save = l.modules_to_save;
  s.target_parameters = l.target_parameters;
  s.rank_pattern = l.rank_pattern;
  s.alpha_pattern = l.alpha_pattern;
  s.layers_to_transform = l.layers_to_transform;
  s.layers_pattern = l.layers_pattern;
  return s;
}

}  // namespace fsdp::train

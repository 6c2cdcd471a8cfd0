#include "config/trainer_keys.h"

#include <yaml-cpp/yaml.h>

#include <optional>

#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::config {

namespace {

// Trainer's TrainingArguments and TRL's SFTConfig / ScriptArguments / ModelConfig, by the name they
// give each, and the fsdptrain key that means the same.
struct TrainerKey {
  const char* name;
  const char* ours;
  const char* whose;
};

const TrainerKey kTrainerKeys[] = {
    {"learning_rate", "optimizer.lr", "Trainer's"},
    {"weight_decay", "optimizer.weight_decay", "Trainer's"},
    {"adam_beta1", "optimizer.beta1", "Trainer's"},
    {"adam_beta2", "optimizer.beta2", "Trainer's"},
    {"adam_epsilon", "optimizer.eps", "Trainer's"},
    {"max_grad_norm", "optimizer.grad_clip", "Trainer's"},
    {"lr_scheduler_type", "schedule.type", "Trainer's"},
    {"warmup_steps", "schedule.warmup_steps", "Trainer's"},
    {"warmup_ratio", "schedule.warmup_ratio", "Trainer's"},
    {"num_train_epochs", "train.epochs", "Trainer's"},
    {"max_steps", "train.steps", "Trainer's"},
    {"per_device_train_batch_size", "train.micro_batch_size", "Trainer's"},
    {"gradient_accumulation_steps", "train.gradient_accumulation_steps", "Trainer's"},
    {"seed", "train.seed", "Trainer's"},
    {"output_dir", "train.output_dir", "Trainer's"},
    {"eval_steps", "train.eval_interval", "Trainer's"},
    {"save_steps", "checkpoint.interval", "Trainer's"},
    {"save_total_limit", "checkpoint.keep", "Trainer's"},
    {"resume_from_checkpoint", "checkpoint.resume", "Trainer's"},
    {"logging_steps", "logging.interval", "Trainer's"},
    {"logging_dir", "logging.tensorboard_dir", "Trainer's"},
    {"bf16", "mixed_precision", "Trainer's"},
    {"gradient_checkpointing", "model.gradient_checkpointing", "Trainer's"},
    {"model_name_or_path", "model.pretrained", "TRL's"},
    {"model_revision", "model.revision", "TRL's"},
    {"dataset_name", "data.dataset", "TRL's"},
    {"dataset_config", "data.config", "TRL's"},
    {"dataset_train_split", "data.split", "TRL's"},
    {"dataset_test_split", "data.eval_split", "TRL's"},
    {"dataset_text_field", "data.field", "TRL's"},
    {"max_length", "train.sequence_length", "TRL's"},
    {"max_seq_length", "train.sequence_length", "TRL's (before 0.20)"},
    {"packing", "data.packing", "TRL's"},
    {"padding_free", "data.packing", "TRL's"},
    {"assistant_only_loss", "data.assistant_only_loss", "TRL's"},
    {"chat_template_path", "data.chat_template", "TRL's"},
    // TRL's ModelConfig: its LoRA, read with use_peft: true (the loader applies that switch).
    {"lora_r", "lora.r", "TRL's"},
    {"lora_alpha", "lora.alpha", "TRL's"},
    {"lora_dropout", "lora.dropout", "TRL's"},
    {"lora_target_modules", "lora.target_modules", "TRL's"},
    {"lora_modules_to_save", "lora.modules_to_save", "TRL's"},
    {"lora_target_parameters", "lora.target_parameters", "TRL's"},
    {"use_rslora", "lora.use_rslora", "TRL's"},
};

const TrainerKey* find_trainer_key(const std::string& name) {
  for (const TrainerKey& k : kTrainerKeys)
    if (name == k.name) return &k;
  return nullptr;
}

std::optional<bool> bool_of(const RawValue& raw) {
  return raw.shape == RawValue::Shape::kScalar ? parse_bool(raw.text) : std::nullopt;
}

// The value in fsdptrain's spelling; nullopt when the key sets nothing (Trainer's "unset" values).
// (A value that does not read is reported here, and also sets nothing.)
std::optional<RawValue> translated(const TrainerKey& k, RawValue raw, Diagnostics& diags) {
  const std::string key = k.name;
  const std::string text = raw.shape == RawValue::Shape::kScalar ? to_lower(trim(raw.text)) : "";
  auto expect_bool = [&]() -> std::optional<bool> {
    std::optional<bool> b = bool_of(raw);
    if (!b) diags.error_at(raw.origin, key, str("expected true or false, got ", quoted(raw.text)));
    return b;
  };
  if (key == "max_steps" && text == "-1") return std::nullopt;  // Trainer's "count steps from the epochs"
  if (key == "save_total_limit" && (raw.shape == RawValue::Shape::kNull || text == "none")) {
    raw.shape = RawValue::Shape::kScalar;  // Trainer's None keeps every checkpoint: checkpoint.keep 0
    raw.text = "0";
  } else if (key == "lr_scheduler_type" && (text == "constant_with_warmup" || text == "cosine_with_min_lr")) {
    raw.text = text == "constant_with_warmup" ? "constant" : "cosine";  // ours warm up first, then decay or hold
  } else if (key == "bf16") {
    const std::optional<bool> b = expect_bool();
    if (!b || !*b) return std::nullopt;
    raw.text = "bf16";
  } else if (key == "packing" || key == "padding_free") {
    // TRL's packing (best-fit, positions restarting per record) and its padding-free batches attend
    // within each record, as data.packing masked does; packing false is one record to a row.
    const std::optional<bool> b = expect_bool();
    if (!b || (key == "padding_free" && !*b)) return std::nullopt;
    raw.text = *b ? "masked" : "pad";
  } else if (key == "resume_from_checkpoint" && (text == "true" || text == "false")) {
    raw.text = text == "true" ? "latest" : "";  // Trainer's True: the newest checkpoint of output_dir
  }
  raw.origin.detail = str("as ", k.whose, " ", key);
  return raw;
}

// Keys of Trainer's and TRL's that decide nothing fsdptrain computes: accepted, each warned of with
// why (a recipe runs unchanged, and nothing is silently ignored).
const std::pair<const char*, const char*> kNoEffect[] = {
    {"attn_implementation", "fsdptrain chooses its attention kernels itself (engine.kernels)"},
    {"torch_dtype", "the weights train in float32, computed in mixed_precision's dtype; exports use "
                    "checkpoint.export_dtype"},
    {"dtype", "the weights train in float32, computed in mixed_precision's dtype; exports use checkpoint.export_dtype"},
    {"model_init_kwargs", "the model is built from model.pretrained's config.json, its weights in float32"},
    {"per_device_eval_batch_size", "held-out batches are train.micro_batch_size sequences"},
    {"logging_strategy", "logging.interval counts steps (logging_steps)"},
    {"save_strategy", "checkpoint.interval counts steps (save_steps)"},
    {"run_name", "a run is named by its folder (output_dir)"},
    {"dataset_num_proc", "the launcher tokenizes once, on its own threads"},
    {"overwrite_output_dir", "a run folder that holds another run is refused; checkpoint.resume continues one"},
    {"do_train", "launch trains"},
    {"do_eval", "evaluation follows eval_strategy/eval_steps (train.eval_interval)"},
    {"remove_unused_columns", "records are read by their fields (prompt/completion, messages, data.field)"},
    {"ddp_find_unused_parameters", "FSDP2 needs no such search"},
    {"use_liger_kernel", "fsdptrain's kernels are its own (a fused loss included)"},
    {"hub_model_id", "fsdptrain does not upload (push_to_hub)"},
};

// The keys that are no value of ours: report_to, push_to_hub, eval_strategy, completion_only_loss,
// kNoEffect's, optim, gradient_checkpointing_kwargs. True when `key` is one of them.
bool read_special_key(const std::string& key, const YAML::Node& node, const RawValue& raw, Diagnostics& diags,
                      std::vector<std::pair<const OptionSpec*, RawValue>>& out) {
  const Origin& origin = raw.origin;
  auto set = [&](const char* ours, const std::string& value) {
    RawValue v = raw;
    v.shape = RawValue::Shape::kScalar;
    v.text = value;
    v.items.clear();
    v.origin.detail = str("as Trainer's ", key, ": ", raw.shape == RawValue::Shape::kScalar ? raw.text : "...");
    out.emplace_back(find_option(ours), v);
  };
  if (key == "report_to") {
    std::vector<std::string> to = raw.shape == RawValue::Shape::kSequence ? raw.items : std::vector<std::string>{};
    if (raw.shape == RawValue::Shape::kScalar) to = {raw.text};
    bool none = raw.shape == RawValue::Shape::kNull, tensorboard = false;
    for (const std::string& t : to) {
      const std::string v = to_lower(trim(t));
      if (v == "none" || v.empty()) {
        none = true;
      } else if (v == "tensorboard" || v == "all") {
        tensorboard = true;
      } else {
        diags.error_at(origin, key,
               str("names ", quoted(t), ", which fsdptrain does not report to: it writes TensorBoard event files "
                                        "(logging.tensorboard_dir) and metrics.jsonl (logging.metrics_file)"),
               "write report_to: tensorboard (or none), and point your tracker at those files");
        return true;
      }
    }
    if (none && !tensorboard) set("logging.tensorboard_dir", "none");
    return true;
  }
  if (key == "push_to_hub") {
    const std::optional<bool> b = bool_of(raw);
    if (!b)
      diags.error_at(origin, key, str("expected true or false, got ", quoted(raw.text)), "");
    else if (*b)
      diags.error_at(origin, key, "is not done by fsdptrain: a run writes its Hugging Face folders locally",
             "remove it, and upload the export when the run ends: hf upload ORG/NAME <checkpoint.export_dir>/step-N");
    return true;
  }
  if (key == "eval_strategy" || key == "evaluation_strategy") {
    const std::string v = raw.shape == RawValue::Shape::kScalar ? to_lower(trim(raw.text)) : "";
    if (v == "no")
      set("data.eval_fraction", "0");
    else if (v == "epoch")
      diags.error_at(origin, key, "epoch is not an interval fsdptrain evaluates at",
             "write eval_strategy: steps and eval_steps: N (train.eval_interval)");
    else if (v != "steps")
      diags.error_at(origin, key, str("expected no, steps or epoch, got ", quoted(raw.text)), "");
    return true;
  }
  if (key == "completion_only_loss") {
    const std::optional<bool> b = raw.shape == RawValue::Shape::kNull ? std::optional<bool>(true) : bool_of(raw);
    if (!b)
      diags.error_at(origin, key, str("expected true, false or null, got ", quoted(raw.text)), "");
    else if (!*b)
      diags.error_at(origin, key,
             "false is not offered: fsdptrain's loss on prompt/completion records counts the completion only "
             "(TRL's default)",
             "remove it, or write the records as text (data.field) for a loss on every token");
    return true;
  }
  for (const auto& [name, why] : kNoEffect)
    if (key == name) {
      diags.warning_at(origin, key, str("has no effect in fsdptrain: ", why), "remove it to silence this");
      return true;
    }
  if (key == "optim") {  // Trainer's AdamW spellings are fsdptrain's one optimizer
    const std::string v = raw.shape == RawValue::Shape::kScalar ? to_lower(trim(raw.text)) : "";
    if (v != "adamw_torch" && v != "adamw_torch_fused" && v != "adamw_hf")
      diags.error_at(origin, key, str(quoted(raw.text), " is not fsdptrain's optimizer, AdamW"),
             "write optim: adamw_torch (or leave it out)");
    return true;
  }
  if (key == "gradient_checkpointing_kwargs") {
    if (raw.shape == RawValue::Shape::kNull) return true;
    if (!node.IsMap()) {
      diags.error_at(origin, key, "expected a mapping such as {use_reentrant: false}", "");
      return true;
    }
    for (const auto& kv : node)
      if (kv.first.Scalar() != "use_reentrant")
        diags.error_at(origin, key + "." + kv.first.Scalar(), "is not a setting of fsdptrain's activation checkpointing",
               "use_reentrant is the one read (either value: fsdptrain recomputes each layer the same way)");
    return true;
  }
  return false;
}

}  // namespace

bool read_trainer_key(const std::string& key, const YAML::Node& node, const RawValue& raw, Diagnostics& diags,
                      std::vector<std::pair<const OptionSpec*, RawValue>>& out) {
  if (read_special_key(key, node, raw, diags, out)) return true;
  const TrainerKey* k = find_trainer_key(key);
  if (!k) return false;
  std::optional<RawValue> v = translated(*k, raw, diags);
  // TRL hands dataset_name to load_dataset, which also takes a local file or folder: data.path then.
  const bool path = key == "dataset_name" && raw.shape == RawValue::Shape::kScalar && !glob_paths(raw.text).empty();
  if (v) out.emplace_back(find_option(path ? "data.path" : k->ours), std::move(*v));
  return true;
}

std::string trainer_key_meaning(const std::string& key) {
  const TrainerKey* k = find_trainer_key(key);
  return k ? k->ours : "";
}

}  // namespace fsdp::config

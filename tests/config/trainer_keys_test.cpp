// Issue 63: what a user of Trainer or TRL writes means what it means there — read as our keys, with
// their origin; what fsdptrain does not do is refused by name; held-out data from the same dataset.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "config/show.h"
#include "config/test_support.h"
#include "util/files.h"

using namespace fsdp;
using namespace fsdp::config;
using namespace fsdp::config::testing;

namespace {

// A folder with a config.json (model.pretrained) and a JSONL file (data.path), removed at the end.
struct Folder {
  std::string dir = "/tmp/fsdp_trainer_keys_test_" + std::to_string(::getpid());
  Folder() {
    make_directories(dir);
    std::ofstream(dir + "/config.json") << R"({"model_type": "llama", "max_position_embeddings": 4096})";
    std::ofstream(dir + "/train.jsonl") << "{\"content\": \"a\"}\n";
  }
  ~Folder() { remove_tree(dir); }
  std::string base() const {
    return std::string(kFsdp2Base) + "model_name_or_path: " + dir + "\ndata:\n  path: " + dir + "/train.jsonl\n";
  }
};

}  // namespace

TEST_CASE("a TRL SFTConfig recipe's keys are read as ours, each naming the key it was written as") {
  Folder f;
  Loaded l = load_text(f.base() +
                       "learning_rate: 1.0e-4\n"
                       "num_train_epochs: 2\n"
                       "max_steps: -1\n"
                       "per_device_train_batch_size: 2\n"
                       "gradient_accumulation_steps: 4\n"
                       "max_length: 256\n"
                       "warmup_ratio: 0.1\n"
                       "lr_scheduler_type: cosine_with_min_lr\n"
                       "save_total_limit: null\n"
                       "save_steps: 50\n"
                       "logging_steps: 5\n"
                       "gradient_checkpointing: true\n"
                       "gradient_checkpointing_kwargs: {use_reentrant: false}\n"
                       "bf16: true\n"
                       "report_to: none\n"
                       "packing: false\n"
                       "assistant_only_loss: true\n"
                       "completion_only_loss: null\n"
                       "eval_strategy: steps\n"
                       "eval_steps: 20\n"
                       "seed: 42\n"
                       "push_to_hub: false\n"
                       "dataset_text_field: content\n");
  REQUIRE_MESSAGE(l.errors() == "", l.errors());
  const Config& t = l.rc.typed;
  CHECK(t.model.pretrained == f.dir);
  CHECK(t.optimizer.lr == doctest::Approx(1e-4));
  CHECK(t.train.epochs == 2);
  CHECK(t.train.micro_batch_size == 2);
  CHECK(t.train.gradient_accumulation_steps == 4);
  CHECK(t.train.sequence_length == 256);
  CHECK(t.schedule.warmup_ratio == doctest::Approx(0.1));
  CHECK(t.schedule.type == ScheduleType::kCosine);
  CHECK(t.checkpoint.keep == 0);
  CHECK(t.checkpoint.interval == 50);
  CHECK(t.logging.interval == 5);
  CHECK(t.model.gradient_checkpointing);
  CHECK(t.fsdp.activation_checkpointing);
  CHECK(t.launch.mixed_precision == MixedPrecision::kBf16);
  CHECK(t.logging.tensorboard_dir.empty());  // report_to: none
  CHECK(t.data.packing == Packing::kPad);    // one record to a row, as TRL's packing: false
  CHECK(t.data.assistant_only_loss);
  CHECK(t.train.eval_interval == 20);
  CHECK(t.train.seed == 42);
  CHECK(t.data.field == "content");
  CHECK(l.rc.get("optimizer.lr").origin.describe() == "test.yaml:8:1 (as Trainer's learning_rate)");
  CHECK(l.rc.get("train.steps").origin.kind == OriginKind::kDefault);  // max_steps -1: the epochs count
  CHECK(l.rc.get("fsdp_config.fsdp_activation_checkpointing").origin.describe() ==
        "derived: model.gradient_checkpointing: true (test.yaml:19:1 (as Trainer's gradient_checkpointing))");
  // The first lines of a run name what the recipe's switches became.
  CHECK(format_resolved(l.rc, ShowFormat::kTable)
            .find("# runs as: FSDP2, reshard_after_forward=true, sharded over 4 ranks; mixed_precision bf16, "
                  "activation checkpointing on, offload off\n") != std::string::npos);
  // TRL's defaults are not taken where the recipe speaks.
  CHECK(describe_run_defaults(l.rc).find("micro_batch_size") == std::string::npos);
  CHECK(kept_fine_tuning_defaults(l.rc).empty());  // packing written
}

TEST_CASE("Trainer's keys fsdptrain does not act on are refused by name, with what to do") {
  Folder f;
  auto errors_of = [&](const std::string& extra) { return load_text(f.base() + extra).errors(); };
  CHECK(errors_of("report_to: wandb\n").find("report_to: names \"wandb\", which fsdptrain does not report to") !=
        std::string::npos);
  CHECK(errors_of("report_to: [tensorboard]\n") == "");
  CHECK(errors_of("push_to_hub: true\n").find("hf upload ORG/NAME <checkpoint.export_dir>/step-N") !=
        std::string::npos);
  CHECK(errors_of("eval_strategy: epoch\n").find("eval_steps: N") != std::string::npos);
  CHECK(errors_of("completion_only_loss: false\n").find("completion_only_loss: false is not offered") !=
        std::string::npos);
  CHECK(errors_of("gradient_checkpointing_kwargs: {preserve_rng_state: false}\n")
            .find("gradient_checkpointing_kwargs.preserve_rng_state: is not a setting") != std::string::npos);
  CHECK(errors_of("bf16: maybe\n").find("bf16: expected true or false") != std::string::npos);
  // The same value twice, under both names: which wins would be a guess.
  CHECK(errors_of("learning_rate: 1e-4\noptimizer:\n  lr: 2e-4\n")
            .find("optimizer.lr: duplicate key (first written at line 8 as learning_rate)") != std::string::npos);
  CHECK(errors_of("optimizer:\n  lr: 2e-4\nlearning_rate: 1e-4\n")
            .find("learning_rate: is read as optimizer.lr, which is already written (first written at line 9)") !=
        std::string::npos);
  // Gradient checkpointing on and activation checkpointing off contradict each other.
  const std::string both = f.base() + "gradient_checkpointing: true\n";
  CHECK(load_text(both.substr(0, both.find("  fsdp_version: 2\n")) + "  fsdp_version: 2\n" +
                  "  fsdp_activation_checkpointing: false\n" + both.substr(both.find("model_name_or_path")))
            .errors()
            .find("model.gradient_checkpointing: is true and fsdp_config.fsdp_activation_checkpointing false") !=
        std::string::npos);
  CHECK(errors_of("warmup_ratio: 0.1\nwarmup_steps: 5\n").find("schedule.warmup_ratio: and schedule.warmup_steps "
                                                               "are both set") != std::string::npos);
  CHECK(errors_of("warmup_ratio: 1.5\n").find("schedule.warmup_ratio: must be below 1") != std::string::npos);
}

TEST_CASE("model.gradient_checkpointing turns activation checkpointing on, as under Trainer") {
  Loaded l = load_text(std::string(kFsdp2Base) + "model:\n  config: " + FSDP_SOURCE_DIR +
                       "/configs/models/tiny/config.json\n  gradient_checkpointing: true\n");
  REQUIRE_MESSAGE(l.errors() == "", l.errors());
  CHECK(l.rc.typed.fsdp.activation_checkpointing);
  Loaded both = load_text(std::string(kFsdp2Base) + "  fsdp_activation_checkpointing: true\nmodel:\n  config: " +
                          FSDP_SOURCE_DIR + "/configs/models/tiny/config.json\n  gradient_checkpointing: true\n");
  CHECK_MESSAGE(both.errors() == "", both.errors());  // the same thing said twice is no contradiction
}

TEST_CASE("held-out data: a split of the dataset, a Hub dataset of its own, and a bad data.eval_path named") {
  char name[] = "/tmp/fsdptrain-eval-hub-XXXXXX";
  const std::string cache = ::mkdtemp(name);
  ::setenv("HF_HUB_CACHE", cache.c_str(), 1);
  const std::string commit(40, 'e');
  const std::string chats = hub_repo(cache, "datasets--org--chats", commit) + "/data/";
  make_directories(chats);
  write_file_atomic(chats + "train-00000-of-00001.jsonl", "{\"text\": \"a\"}\n");
  write_file_atomic(chats + "test-00000-of-00001.jsonl", "{\"text\": \"b\"}\n");
  const std::string other = hub_repo(cache, "datasets--org--other", commit) + "/data/";
  make_directories(other);
  write_file_atomic(other + "validation.jsonl", "{\"text\": \"c\"}\n");
  const std::string base = std::string(kFsdp2Base) + "model:\n  config: " + FSDP_SOURCE_DIR +
                           "/configs/models/tiny/config.json\ndata:\n  dataset: org/chats\n";
  auto errors_of = [&](const std::string& extra) { return load_text(base + extra).errors(); };
  CHECK(errors_of("  eval_split: test\n") == "");
  CHECK(errors_of("dataset_test_split: test\n") == "");  // TRL's name for it
  CHECK(errors_of("  eval_split: validation\n").find("data.eval_split: \"org/chats\" has no split \"validation\" "
                                                     "(its splits: test, train); set data.eval_split") !=
        std::string::npos);
  CHECK(errors_of("  eval_split: train\n").find("data.eval_split: is the training split") != std::string::npos);
  CHECK(errors_of("  eval_path: org/other\n  eval_split: validation\n") == "");
  CHECK(errors_of("  eval_path: org/other\n").find("data.eval_path: \"org/other\" has no split \"test\"") !=
        std::string::npos);  // its split is validation
  // A split's name written where a path goes: the key named before any worker starts, and the fix.
  const std::string slip = errors_of("  eval_path: test\n");
  CHECK(slip.find("data.eval_path: matches no file") != std::string::npos);
  CHECK(slip.find("write data.eval_split: test") != std::string::npos);
  CHECK(errors_of("  eval_path: org/absent\n").find("hf download org/absent --repo-type dataset") !=
        std::string::npos);
  Loaded no_dataset = load_text(std::string(kFsdp2Base) + "data:\n  eval_split: test\n");
  CHECK(no_dataset.errors().find("data.eval_split: names the split \"test\", and there is no dataset") !=
        std::string::npos);
  ::unsetenv("HF_HUB_CACHE");
  remove_tree(cache);
}

TEST_CASE("TRL's use_peft trains LoRA with its ModelConfig's defaults; its lora_* keys alone do nothing, as there") {
  Folder f;
  Loaded on = load_text(f.base() + "use_peft: true\nlora_target_modules: all-linear\nlora_r: 8\n");
  REQUIRE_MESSAGE(on.errors() == "", on.errors());
  CHECK(on.rc.typed.lora.r == 8);
  CHECK(on.rc.typed.lora.alpha == 32);
  CHECK(on.rc.typed.lora.dropout == doctest::Approx(0.05));
  CHECK(on.rc.typed.lora.target_modules == std::vector<std::string>{"all-linear"});
  CHECK(on.rc.get("lora.alpha").origin.describe() == "test.yaml:8:1 (TRL's default with use_peft: true)");
  Loaded off = load_text(f.base() + "lora_r: 8\n");
  CHECK(off.errors() == "");
  CHECK_FALSE(off.rc.typed.lora.enabled());
  CHECK(off.warnings().find("lora_r: has no effect without use_peft: true (as under TRL)") != std::string::npos);
}

TEST_CASE("a TRL recipe beside the Accelerate config (--recipe): its keys over the file's, its paths from here") {
  Folder f;
  ConfigInputs in;
  in.file = "accelerate.yaml";
  in.text = std::string(kFsdp2Base) + "mixed_precision: 'no'\ndata:\n  path: " + f.dir + "/train.jsonl\n";
  in.has_file = true;
  in.recipe_file = "recipe.yaml";
  in.recipe_text = "model_name_or_path: " + f.dir + "\nbf16: true\noutput_dir: out/run\nnum_train_epochs: 1\n";
  Diagnostics diags;
  const ResolvedConfig rc = load_config(in, diags);
  std::string errors;
  for (const auto& e : diags.errors()) errors += e + "\n";
  REQUIRE_MESSAGE(errors == "", errors);  // no distributed_type asked of the recipe
  CHECK(rc.typed.launch.mixed_precision == MixedPrecision::kBf16);  // the recipe's over the file's
  CHECK(rc.get("mixed_precision").origin.describe() == "recipe.yaml:2:1 (as Trainer's bf16)");
  CHECK(rc.typed.train.output_dir == absolute_path("out/run"));  // Trainer's output_dir: from the working directory
  CHECK(rc.typed.train.epochs == 1);
}

TEST_CASE("Trainer's max_steps overrides its num_train_epochs, as there, and says so") {
  Folder f;
  Loaded l = load_text(f.base() + "num_train_epochs: 2\nmax_steps: 5\n");
  REQUIRE_MESSAGE(l.errors() == "", l.errors());
  CHECK(l.rc.typed.train.steps == 5);
  CHECK(l.rc.typed.train.epochs == 0);
  CHECK(l.warnings().find("num_train_epochs: has no effect: max_steps is set (as under Trainer)") != std::string::npos);
  // max_steps -1 (Trainer's "unset") leaves the epochs to count.
  Loaded epochs = load_text(f.base() + "num_train_epochs: 2\nmax_steps: -1\n");
  REQUIRE_MESSAGE(epochs.errors() == "", epochs.errors());
  CHECK(epochs.rc.typed.train.epochs == 2);
}

TEST_CASE("a recipe's keys that decide nothing here load, each warned of with why; another optimizer is refused") {
  Folder f;
  Loaded l = load_text(f.base() + "attn_implementation: flash_attention_2\nmodel_init_kwargs: {torch_dtype: bfloat16}\n"
                                  "optim: adamw_torch_fused\nrun_name: sft\n");
  REQUIRE_MESSAGE(l.errors() == "", l.errors());
  CHECK(l.warnings().find("attn_implementation: has no effect in fsdptrain: fsdptrain chooses its attention kernels") !=
        std::string::npos);
  CHECK(l.warnings().find("model_init_kwargs: has no effect in fsdptrain") != std::string::npos);
  CHECK(l.warnings().find("run_name: has no effect in fsdptrain") != std::string::npos);
  CHECK(l.warnings().find("optim") == std::string::npos);  // AdamW under Trainer's name: what runs
  CHECK(load_text(f.base() + "optim: adafactor\n").errors().find("optim: \"adafactor\" is not fsdptrain's optimizer") !=
        std::string::npos);
}

TEST_CASE("with assistant-only loss, a model whose template is one of TRL's trains on TRL's training variant") {
  Folder f;
  const std::string trl = f.dir + "/trl/chat_templates";
  make_directories(trl);
  std::ofstream(trl + "/chatml.jinja") << "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
  std::ofstream(trl + "/chatml_training.jinja")
      << "{% for m in messages %}<{{ m.role }}>{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}";
  std::ofstream(trl + "/other.jinja") << "{{ messages }}";
  std::ofstream(trl + "/other_training.jinja") << "{% generation %}{{ messages }}{% endgeneration %}";
  // The model's template, byte for byte TRL's chatml.jinja, as tokenizer_config.json holds it.
  std::ofstream(f.dir + "/tokenizer_config.json")
      << R"({"chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"})";
  auto chat_template = [&](const std::vector<std::string>& sets) {
    Loaded l = load_text(f.base(), sets);
    REQUIRE_MESSAGE(l.errors() == "", l.errors());
    return l.rc.get("data.chat_template");
  };
  const std::vector<std::string> trained = {"data.training_templates=" + trl, "data.assistant_only_loss=true"};
  const ResolvedValue v = chat_template(trained);
  CHECK(v.value == trl + "/chatml_training.jinja");
  CHECK(v.origin.kind == OriginKind::kDerived);
  CHECK(v.origin.detail.find("TRL's training variant of the model's chat template chatml.jinja (from "
                             "data.training_templates " + trl + ")") == 0);
  // TRL's default (every token counted), the model's own asked for, no folder, another template: none.
  CHECK(chat_template({"data.training_templates=" + trl}).value == "");
  CHECK(chat_template({trained[0], trained[1], "data.chat_template=model"}).value == "model");
  CHECK(chat_template({"data.training_templates=none", trained[1]}).value == "");
  std::ofstream(f.dir + "/tokenizer_config.json") << R"({"chat_template": "{{ messages }} "})";
  CHECK(chat_template(trained).value == "");
  // Found in an activated environment where TRL is installed.
  std::ofstream(f.dir + "/tokenizer_config.json") << R"({"chat_template": "{{ messages }}"})";
  const std::string venv = f.dir + "/venv";
  make_directories(venv + "/lib/python3.12/site-packages/trl");
  REQUIRE(::symlink(trl.c_str(), (venv + "/lib/python3.12/site-packages/trl/chat_templates").c_str()) == 0);
  ::setenv("VIRTUAL_ENV", venv.c_str(), 1);
  const ResolvedValue found = chat_template({trained[1]});
  ::unsetenv("VIRTUAL_ENV");
  CHECK(found.value == venv + "/lib/python3.12/site-packages/trl/chat_templates/other_training.jinja");
  CHECK(found.origin.detail.find("(from the installed TRL's " + venv) != std::string::npos);
}

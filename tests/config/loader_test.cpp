// Loading: YAML 1.1 traps, unknown keys with suggestions, precedence and origins.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "config/test_support.h"
#include "config/yaml_writer.h"

using namespace fsdp::config;
using namespace fsdp::config::testing;

TEST_CASE("an Accelerate FSDP1 file as the wizard writes it loads unchanged") {
  Loaded l = load_text(
      "compute_environment: LOCAL_MACHINE\n"
      "debug: false\n"
      "distributed_type: FSDP\n"
      "downcast_bf16: 'no'\n"
      "fsdp_config:\n"
      "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
      "  fsdp_backward_prefetch: BACKWARD_PRE\n"
      "  fsdp_reshard_after_forward: FULL_SHARD\n"
      "  fsdp_state_dict_type: FULL_STATE_DICT\n"
      "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n"
      "  fsdp_ignored_modules: null\n"
      "machine_rank: 0\n"
      "main_training_function: main\n"
      "mixed_precision: bf16\n"
      "num_machines: 1\n"
      "num_processes: 2\n"
      "rdzv_backend: static\n"
      "same_network: true\n"
      "tpu_env: []\n"
      "tpu_use_cluster: false\n"
      "tpu_use_sudo: false\n"
      "use_cpu: false\n");
  CHECK_MESSAGE(l.errors() == "", l.errors());
  CHECK(l.warnings() == "");
  CHECK(l.rc.typed.fsdp.version == 1);
  CHECK(l.rc.typed.fsdp.fsdp1_strategy() == ShardingStrategy::kFullShard);
  CHECK(l.rc.typed.launch.mixed_precision == MixedPrecision::kBf16);
  CHECK(l.rc.typed.fsdp.transformer_layer_cls_to_wrap == std::vector<std::string>{"LlamaDecoderLayer"});
  CHECK(l.rc.typed.fsdp.ignored_modules == "");
}

TEST_CASE("YAML 1.1 traps read as the user meant") {
  SUBCASE("unquoted NO / no as enum strings") {
    Loaded l = load_text("distributed_type: NO\nmixed_precision: NO\n");
    CHECK(l.errors() == "");
    CHECK(l.rc.typed.launch.distributed_type == DistributedType::kNo);
    CHECK(l.rc.typed.launch.mixed_precision == MixedPrecision::kNo);
  }
  SUBCASE("gpu_ids: 0 (an int) and a YAML list") {
    Loaded a = load_text("distributed_type: NO\ngpu_ids: 0\n");
    CHECK(a.errors() == "");
    CHECK(a.value("gpu_ids") == "0");
    Loaded b = load_text("distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: [0, 3]\n");
    CHECK(b.errors() == "");
    CHECK(b.value("gpu_ids") == "0,3");
  }
  SUBCASE("1e8 and 1.0e+8 are the integer 100000000") {
    for (const char* v : {"1e8", "1.0e+8", "100000000"}) {
      Loaded l = load_text(std::string(kFsdp2Base) +
                           "  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: " + v + "\n");
      CHECK_MESSAGE(l.errors() == "", l.errors());
      CHECK(l.rc.typed.fsdp.min_num_params == 100000000);
    }
  }
  SUBCASE("True, yes, on and quoted \"true\" are all true") {
    for (const char* v : {"True", "yes", "on", "\"true\"", "'TRUE'", "1"}) {
      Loaded l = load_text(std::string(kFsdp2Base) + "  fsdp_offload_params: " + v + "\n");
      CHECK_MESSAGE(l.errors() == "", v);
      CHECK(l.rc.typed.fsdp.offload_params);
    }
  }
  SUBCASE("lower-case enum names and Accelerate's integers 1-5") {
    Loaded l = load_text(
        "distributed_type: fsdp\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: 2\n"
        "  fsdp_auto_wrap_policy: size_based_wrap\n  fsdp_state_dict_type: 3\n");
    CHECK(l.errors() == "");
    CHECK(l.value("fsdp_config.fsdp_sharding_strategy") == "SHARD_GRAD_OP");
    CHECK(l.value("fsdp_config.fsdp_auto_wrap_policy") == "SIZE_BASED_WRAP");
    CHECK(l.value("fsdp_config.fsdp_state_dict_type") == "SHARDED_STATE_DICT");
  }
  SUBCASE("num_processes: -1 means not set, as Accelerate writes it") {
    Loaded l = load_text("distributed_type: FSDP\nnum_processes: -1\n");
    CHECK(l.errors().find("num_processes: not set") != std::string::npos);
  }
}

TEST_CASE("bad values name the file position, the key, what was expected and what was found") {
  Loaded l = load_text(std::string(kFsdp2Base) + "  fsdp_reshard_after_forward: maybe\n");
  CHECK(l.errors().find("test.yaml:5:3: fsdp_config.fsdp_reshard_after_forward: expected true, false, or a number of "
                        "ranks N >= 2") == 0);
  CHECK(l.errors().find("got \"maybe\"") != std::string::npos);

  Loaded e = load_text("distributed_type: FSDP\nnum_processes: 2\nmixed_precision: bf8\n");
  CHECK(e.errors().find("test.yaml:3:1: mixed_precision: expected one of no, fp16, bf16, got \"bf8\"") == 0);

  Loaded n = load_text("distributed_type: FSDP\nnum_processes: two\n");
  CHECK(n.errors().find("test.yaml:2:1: num_processes: expected a whole number >= 1, got \"two\"") == 0);

  Loaded p = load_text("distributed_type: NO\nmain_process_port: 70000\n");
  CHECK(p.errors().find("main_process_port: expected a whole number from 0 to 65535, got 70000") != std::string::npos);

  Loaded m = load_text("distributed_type: FSDP\nnum_processes: [1, 2]\n");
  CHECK(m.errors().find("num_processes: expected a whole number") != std::string::npos);
}

TEST_CASE("values Accelerate knows but fsdptrain does not support get a reason") {
  CHECK(load_text("distributed_type: DEEPSPEED\n").errors().find("\"DEEPSPEED\" is not supported: DeepSpeed") !=
        std::string::npos);
  CHECK(load_text("distributed_type: NO\nmixed_precision: fp8\n").errors().find("for float8 training set mixed_precision: bf16 and engine.float8") !=
        std::string::npos);
  CHECK(load_text("distributed_type: NO\ncompute_environment: AMAZON_SAGEMAKER\n").errors().find("SageMaker") !=
        std::string::npos);
}

TEST_CASE("regression: a refused distributed_type is one error, not also NO's single-process rule") {
  for (const char* type : {"DEEPSPEED", "MULTI_XPU"}) {
    const Loaded l = load_text(std::string("distributed_type: ") + type + "\nnum_processes: 4\n");
    CAPTURE(l.errors());
    CHECK(l.diags.error_count() == 1);
    CHECK(l.errors().find("runs a single process") == std::string::npos);
  }
}

TEST_CASE("unknown keys are errors with the closest known key, at every level") {
  Loaded l = load_text(std::string(kFsdp2Base) +
                       "  fsdp_ofload_params: true\nnum_proceses: 2\nfsdp_offload_params: true\n"
                       "learning_rate_schedule: 3\n");
  const std::string e = l.errors();
  CHECK(e.find("test.yaml:5:3: fsdp_config.fsdp_ofload_params: unknown key (Accelerate would silently ignore it) "
               "(hint: did you mean fsdp_config.fsdp_offload_params?)") != std::string::npos);
  CHECK(e.find("test.yaml:6:1: num_proceses: unknown key (hint: did you mean num_processes?)") != std::string::npos);
  CHECK(e.find("test.yaml:7:1: fsdp_offload_params: unknown key (hint: it belongs under fsdp_config: "
               "(as fsdp_config.fsdp_offload_params))") != std::string::npos);
  CHECK(e.find("learning_rate_schedule: unknown key (hint: see `fsdptrain config keys`") != std::string::npos);
  CHECK(l.diags.error_count() == 4);
}

// A new user's first day: PEFT's LoraConfig spellings under lora: got no hint (lora.rank is far from
// lora.r by spelling).
TEST_CASE("PEFT's LoRA key names point at ours") {
  Loaded l = load_text(std::string(kFsdp2Base) + "lora:\n  rank: 8\n  lora_alpha: 16\n  lora_dropout: 0.1\n");
  const std::string e = l.errors();
  CHECK(e.find("lora.rank: unknown key (hint: did you mean lora.r?)") != std::string::npos);
  CHECK(e.find("lora.lora_alpha: unknown key (hint: did you mean lora.alpha?)") != std::string::npos);
  CHECK(e.find("lora.lora_dropout: unknown key (hint: did you mean lora.dropout?)") != std::string::npos);
}

// PEFT's rank_pattern and alpha_pattern are mappings: written as one in YAML or --set, kept in their order.
TEST_CASE("lora.rank_pattern, alpha_pattern and layers_to_transform as PEFT's LoraConfig takes them") {
  const std::string base = std::string(kFsdp2Base) + "lora:\n  r: 8\n";
  Loaded l = load_text(base +
                       "  rank_pattern: {v_proj: 4, '.*\\.0\\.self_attn\\.q_proj': 16}\n"
                       "  alpha_pattern:\n    down_proj: 2.5\n  layers_to_transform: [0, 2]\n"
                       "  layers_pattern: layers\n");
  CHECK(l.errors() == "");
  CHECK(l.value("lora.rank_pattern") == R"({"v_proj":4,".*\\.0\\.self_attn\\.q_proj":16})");  // as JSON, in order
  const LoraConfig& lora = l.rc.typed.lora;
  CHECK(lora.rank_pattern ==
        std::vector<std::pair<std::string, int64_t>>{{"v_proj", 4}, {R"(.*\.0\.self_attn\.q_proj)", 16}});
  CHECK(lora.alpha_pattern == std::vector<std::pair<std::string, double>>{{"down_proj", 2.5}});
  // config keys calls them maps; config show --format yaml writes them as YAML's flow mapping, which reads back.
  CHECK(find_option("lora.rank_pattern")->type_name() == "map");
  const std::string written = yaml_scalar("lora.rank_pattern", l.value("lora.rank_pattern"));
  CHECK(written == R"({"v_proj":4,".*\\.0\\.self_attn\\.q_proj":16})");
  const Loaded again = load_text(base + "  rank_pattern: " + written + "\n");
  CHECK(again.errors() == "");
  CHECK(again.rc.typed.lora.rank_pattern == lora.rank_pattern);
  CHECK(lora.layers_to_transform == std::vector<int64_t>{0, 2});
  CHECK(lora.layers_pattern == std::vector<std::string>{"layers"});
  // On the command line, as YAML or as the JSON fsdptrain writes; one layer alone.
  Loaded set = load_text(
      base, {"lora.rank_pattern={q_proj: 2}", R"(lora.alpha_pattern={"q_proj": 4})", "lora.layers_to_transform=3"});
  CHECK(set.errors() == "");
  CHECK(set.rc.typed.lora.rank_pattern == std::vector<std::pair<std::string, int64_t>>{{"q_proj", 2}});
  CHECK(set.rc.typed.lora.alpha_pattern == std::vector<std::pair<std::string, double>>{{"q_proj", 4}});
  CHECK(set.rc.typed.lora.layers_to_transform == std::vector<int64_t>{3});
  // Bad values are refused naming the key and the entry.
  const std::string bad = load_text(base +
                                    "  rank_pattern: {q_proj: 0, v_proj: 2}\n  alpha_pattern: [q_proj]\n"
                                    "  layers_to_transform: [first]\n")
                              .errors();
  CHECK(bad.find("lora.rank_pattern: expected a mapping of module patterns to ranks, such as {q_proj: 16, "
                 "down_proj: 8}; \"q_proj\" is \"0\" (a rank is a whole number from 1)") != std::string::npos);
  CHECK(bad.find("lora.alpha_pattern: expected a mapping of module patterns to alphas") != std::string::npos);
  CHECK(bad.find("lora.layers_to_transform: expected the numbers of the decoder layers to adapt") != std::string::npos);
  CHECK(load_text(base + "  rank_pattern: {'(q_proj': 4}\n")
            .errors()
            .find("lora.rank_pattern: the pattern \"(q_proj\"") != std::string::npos);
  CHECK(load_text(base + "  layers_pattern: layers\n")
            .errors()
            .find("lora.layers_pattern: is set without lora.layers_to_transform") != std::string::npos);
}

TEST_CASE("unprefixed fsdp_config keys and the pre-1.0 prefetch alias are read as Accelerate's launcher reads them") {
  Loaded l = load_text(
      "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  sharding_strategy: SHARD_GRAD_OP\n"
      "  fsdp_backward_prefetch_policy: BACKWARD_POST\n");
  CHECK(l.errors() == "");
  CHECK(l.value("fsdp_config.fsdp_sharding_strategy") == "SHARD_GRAD_OP");
  CHECK(l.value("fsdp_config.fsdp_backward_prefetch") == "BACKWARD_POST");
  CHECK(l.warnings().find("rename it to fsdp_backward_prefetch") != std::string::npos);
}

TEST_CASE("duplicate keys are an error naming both lines") {
  Loaded l = load_text("distributed_type: NO\ndebug: false\ndebug: true\n");
  CHECK(l.errors().find("test.yaml:3:1: debug: duplicate key (first written at line 2)") == 0);
}

TEST_CASE("empty, non-mapping and syntactically broken files") {
  CHECK(load_text("").errors().find("the config file is empty") != std::string::npos);
  CHECK(load_text("- a\n- b\n").errors().find("expected a mapping of keys") != std::string::npos);
  CHECK(load_text("distributed_type: FSDP\nfsdp_config: [\n").errors().find("test.yaml:") == 0);
  CHECK(load_text("num_processes: 2\n").errors().find("distributed_type: missing") != std::string::npos);
}

TEST_CASE("legacy fp16: true becomes mixed_precision fp16; a contradiction is an error") {
  Loaded l = load_text("distributed_type: NO\nfp16: true\n");
  CHECK(l.errors() == "");
  CHECK(l.rc.typed.launch.mixed_precision == MixedPrecision::kFp16);
  CHECK(load_text("distributed_type: NO\nfp16: true\nmixed_precision: bf16\n").errors().find("contradicts") !=
        std::string::npos);
}

TEST_CASE("TPU and other ignored keys load; non-default values warn") {
  Loaded quiet = load_text(
      "distributed_type: NO\ntpu_env: []\ntpu_use_cluster: false\ndowncast_bf16: 'no'\n"
      "main_training_function: main\ndynamo_config: {}\n");
  CHECK(quiet.errors() == "");
  CHECK(quiet.warnings() == "");
  Loaded loud = load_text("distributed_type: NO\ntpu_name: my-tpu\ndynamo_config:\n  dynamo_backend: INDUCTOR\n");
  CHECK(loud.errors() == "");
  CHECK(loud.warnings().find("tpu_name: accepted for compatibility with Accelerate and ignored: TPU only") !=
        std::string::npos);
  CHECK(loud.warnings().find("dynamo_config: accepted") != std::string::npos);
}

TEST_CASE("one precedence rule for every key: flag > --set > file > default, with origins") {
  const std::string file = std::string(kFsdp2Base) +
                           "  fsdp_offload_params: false\nrdzv_backend: c10d\nsame_network: false\n"
                           "enable_cpu_affinity: true\n";
  Loaded l = load_text(file, {"num_processes=8", "fsdp_config.fsdp_offload_params=true"}, {{"num_processes", "2"}});
  CHECK(l.errors() == "");
  CHECK(l.value("num_processes") == "2");
  CHECK(l.rc.get("num_processes").origin.describe() == "--num_processes");
  CHECK(l.value("fsdp_config.fsdp_offload_params") == "true");
  CHECK(l.rc.get("fsdp_config.fsdp_offload_params").origin.describe() == "--set fsdp_config.fsdp_offload_params=true");
  CHECK(l.rc.get("fsdp_config.fsdp_version").origin.describe() == "test.yaml:4:3");
  CHECK(l.rc.get("mixed_precision").origin.describe() == "default");
  // Keys Accelerate never applies from the file (its CLI defaults shadow them) take effect here.
  CHECK(l.rc.typed.launch.rdzv_backend == "c10d");
  CHECK_FALSE(l.rc.typed.launch.same_network);
  CHECK(l.rc.typed.launch.enable_cpu_affinity);
}

TEST_CASE("--set accepts short spellings, resets with an empty value, and rejects unknown keys") {
  Loaded l =
      load_text(kFsdp2Base, {"offload_params=true", "fsdp_config.activation_checkpointing=yes", "mixed_precision="});
  CHECK(l.errors() == "");
  CHECK(l.rc.typed.fsdp.offload_params);
  CHECK(l.rc.typed.fsdp.activation_checkpointing);
  CHECK(l.value("mixed_precision") == "no");
  Loaded bad = load_text(kFsdp2Base, {"fsdp_config.fsdp_ofload_params=true", "novalue"});
  CHECK(bad.errors().find("--set fsdp_config.fsdp_ofload_params=true: fsdp_config.fsdp_ofload_params: unknown key "
                          "(hint: did you mean fsdp_config.fsdp_offload_params?)") != std::string::npos);
  CHECK(bad.errors().find("--set novalue: expected KEY=VALUE") != std::string::npos);
}

TEST_CASE("defaults: one documented choice where Accelerate's layers disagree") {
  Loaded v1 = load_text("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_offload_params: false\n");
  CHECK(v1.rc.typed.fsdp.version == 1);  // what `accelerate launch` does with no fsdp_version
  CHECK(v1.value("fsdp_config.fsdp_state_dict_type") == "FULL_STATE_DICT");
  CHECK(v1.rc.typed.fsdp.auto_wrap_policy == WrapPolicy::kTransformerBasedWrap);
  CHECK(v1.rc.typed.fsdp.cpu_ram_efficient_loading);
  Loaded v2 = load_text(kFsdp2Base);
  CHECK(v2.value("fsdp_config.fsdp_state_dict_type") == "SHARDED_STATE_DICT");
  CHECK(v2.rc.get("fsdp_config.fsdp_state_dict_type").origin.describe() == "derived: FSDP2's default");
  Loaded none = load_text("distributed_type: NO\n");
  CHECK(none.rc.typed.launch.num_processes == 1);
}

TEST_CASE("a fine-tuning run (model.pretrained) gets TRL SFTTrainer's defaults where the config is silent") {
  const std::string dir = "/tmp/fsdp_loader_test_" + std::to_string(::getpid());
  REQUIRE(std::system(("mkdir -p " + dir).c_str()) == 0);
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama", "max_position_embeddings": 512})";
  const std::string base = std::string(kFsdp2Base) + "data:\n  path: " + dir + "/config.json\n";
  const std::string ft = base + "model:\n  pretrained: " + dir + "\n";
  SUBCASE("each default is TRL's, says where it came from, and the sequence fits the model's positions") {
    Loaded l = load_text(ft + "optimizer:\n  lr: 1e-4\n");
    REQUIRE_MESSAGE(l.errors() == "", l.errors());
    CHECK(l.rc.typed.optimizer.lr == doctest::Approx(1e-4));  // the config's own value stays
    CHECK(l.rc.get("optimizer.lr").origin.kind == OriginKind::kFile);
    CHECK(l.rc.typed.optimizer.beta2 == doctest::Approx(0.999));
    CHECK(l.rc.typed.optimizer.weight_decay == 0);
    CHECK(l.rc.typed.schedule.type == ScheduleType::kLinear);
    CHECK(l.rc.typed.schedule.warmup_steps == 0);
    CHECK(l.rc.typed.schedule.min_lr_ratio == 0);
    CHECK(l.rc.typed.data.eval_fraction == 0);
    CHECK(l.rc.typed.checkpoint.interval == 500);
    CHECK(l.rc.typed.checkpoint.keep == 0);  // save_total_limit None: every one kept
    CHECK(l.rc.typed.train.epochs == 3);
    CHECK(l.rc.typed.train.micro_batch_size == 8);
    CHECK(l.rc.typed.data.assistant_only_loss == false);
    CHECK(l.rc.typed.model.gradient_checkpointing);
    CHECK(l.rc.typed.fsdp.activation_checkpointing);  // what gradient checkpointing is here
    CHECK(l.rc.get("fsdp_config.fsdp_activation_checkpointing").origin.describe() ==
          "derived: model.gradient_checkpointing: true (derived: fine-tuning default (TRL's SFTConfig), as "
          "model.pretrained is set)");
    CHECK(l.rc.typed.data.packing == Packing::kAuto);  // kept, and the start of the run says why
    REQUIRE(kept_fine_tuning_defaults(l.rc).size() == 1);
    CHECK(kept_fine_tuning_defaults(l.rc)[0].rfind("data.packing auto, not TRL's packing false", 0) == 0);
    CHECK(l.rc.typed.train.sequence_length == 512);  // TRL's 1024, capped
    CHECK(l.rc.get("optimizer.beta2").origin.describe() ==
          "derived: fine-tuning default (TRL's SFTConfig), as model.pretrained is set");
    CHECK(l.rc.get("train.sequence_length").origin.describe().find("capped at the model's max_position_embeddings") !=
          std::string::npos);
    CHECK(describe_run_defaults(l.rc) ==
          "fine-tuning defaults (TRL SFTTrainer's; model.pretrained is set): optimizer.beta2 0.999, "
          "optimizer.weight_decay 0, schedule.type linear, schedule.warmup_steps 0, schedule.min_lr_ratio 0, "
          "train.sequence_length 512, train.epochs 3, train.micro_batch_size 8, model.gradient_checkpointing true, "
          "data.assistant_only_loss false, data.eval_fraction 0, checkpoint.interval 500, checkpoint.keep 0");
  }
  SUBCASE("TRL's epochs and gradient checkpointing give way to what the config says, and to what cannot take them") {
    Loaded l = load_text(ft + "train:\n  steps: 7\n");
    REQUIRE_MESSAGE(l.errors() == "", l.errors());
    CHECK(l.rc.typed.train.epochs == 0);  // train.steps counts the run
    CHECK(l.rc.typed.train.steps == 7);
    Loaded off = load_text(std::string(kFsdp2Base) + "  fsdp_activation_checkpointing: false\ndata:\n  path: " + dir +
                           "/config.json\nmodel:\n  pretrained: " + dir + "\n");
    REQUIRE_MESSAGE(off.errors() == "", off.errors());
    CHECK_FALSE(off.rc.typed.fsdp.activation_checkpointing);
    CHECK_FALSE(off.rc.typed.model.gradient_checkpointing);
    Loaded no_wrap = load_text(std::string(kFsdp2Base) + "  fsdp_auto_wrap_policy: NO_WRAP\ndata:\n  path: " + dir +
                               "/config.json\nmodel:\n  pretrained: " + dir + "\n");
    REQUIRE_MESSAGE(no_wrap.errors() == "", no_wrap.errors());
    CHECK_FALSE(no_wrap.rc.typed.fsdp.activation_checkpointing);
    CHECK(kept_fine_tuning_defaults(no_wrap.rc).at(0) ==
          "model.gradient_checkpointing false, not TRL's true: fsdp_auto_wrap_policy NO_WRAP has no layers to recompute");
    std::ofstream(dir + "/config.json") << R"({"max_position_embeddings": 512, "output_router_logits": true})";
    Loaded moe = load_text(ft);
    REQUIRE_MESSAGE(moe.errors() == "", moe.errors());
    CHECK(moe.rc.typed.fsdp.activation_checkpointing);  // the auxiliary loss's gradient reaches the recomputed routers
    Loaded ep = load_text(ft, {"parallelism_config.parallelism_config_ep_size=2"});
    CHECK_FALSE(ep.rc.typed.fsdp.activation_checkpointing);
    CHECK(kept_fine_tuning_defaults(ep.rc).at(0) ==
          "model.gradient_checkpointing false, not TRL's true: expert parallel (parallelism_config_ep_size) is not "
          "recomputed yet");
    CHECK(kept_fine_tuning_defaults(off.rc).size() == 1);  // the config's own choice needs no reason: packing's only
  }
  SUBCASE("with the lr from --set and no cap needed") {
    std::ofstream(dir + "/config.json") << R"({"max_position_embeddings": 4096})";
    Loaded l = load_text(ft, {"optimizer.lr=5e-5"});
    CHECK(l.rc.typed.optimizer.lr == doctest::Approx(5e-5));
    CHECK(l.rc.typed.train.sequence_length == 1024);
  }
  SUBCASE("a pretraining run (model.config) keeps the table's, and says so") {
    Loaded l = load_text(base + "model:\n  config: " + dir + "/config.json\ntrain:\n  sequence_length: 64\n");
    REQUIRE_MESSAGE(l.errors() == "", l.errors());
    CHECK(l.rc.typed.optimizer.lr == doctest::Approx(3e-4));
    CHECK(l.rc.typed.schedule.type == ScheduleType::kCosine);
    CHECK(l.rc.typed.data.eval_fraction == doctest::Approx(0.05));
    CHECK(l.rc.typed.checkpoint.interval == 0);
    CHECK(describe_run_defaults(l.rc).rfind("pretraining defaults (model.config without model.pretrained; "
                                            "fine-tuning runs get TRL's): optimizer.lr 3e-4, optimizer.beta2 0.95, ",
                                            0) == 0);
    CHECK(describe_run_defaults(l.rc).find("train.sequence_length") == std::string::npos);  // set: not a default
  }
  REQUIRE(std::system(("rm -rf " + dir).c_str()) == 0);
}

TEST_CASE("issue 40: a flow list or map left open is named where it opened, not only where the parser gave up") {
  Loaded l = load_text("distributed_type: FSDP\ntrain:\n  steps: [10\n  seed: 3\nnum_processes: 2\n");
  CHECK(l.errors().find("test.yaml:4:7:") != std::string::npos);  // where yaml-cpp stopped
  CHECK(l.errors().find("end of sequence flow not found (the '[' opened at line 3, column 10 is not closed)") !=
        std::string::npos);
  Loaded quoted = load_text("distributed_type: FSDP\nmodel:\n  config: \"a[b\"\n  x: {y: 1\n");
  CHECK(quoted.errors().find("(the '{' opened at line 4, column 6 is not closed)") != std::string::npos);
}

// Cross-key rules: every rule reports at the key that must change, and all problems come at once.
#include <doctest/doctest.h>

#include "config/show.h"
#include "config/test_support.h"

using namespace fsdp::config;
using namespace fsdp::config::testing;

namespace {
bool has(const Loaded& l, const std::string& needle) {
  return l.errors().find(needle) != std::string::npos;
}
bool warns(const Loaded& l, const std::string& needle) {
  return l.warnings().find(needle) != std::string::npos;
}
}  // namespace

TEST_CASE("launch topology rules") {
  CHECK(has(load_text("distributed_type: FSDP\nnum_processes: 6\nnum_machines: 4\nmain_process_ip: h0\n"),
            "test.yaml:2:1: num_processes: 6 processes cannot be split evenly over 4 machines"));
  CHECK(has(load_text("distributed_type: FSDP\nnum_processes: 4\nnum_machines: 2\n"),
            "test.yaml: main_process_ip: required when num_machines is 2"));
  CHECK(
      has(load_text(
              "distributed_type: FSDP\nnum_processes: 4\nnum_machines: 2\nmain_process_ip: h0\nmain_process_port: 0\n"),
          "main_process_port: 0 (pick a free port) works on one machine only"));
  CHECK(has(
      load_text("distributed_type: FSDP\nnum_processes: 4\nnum_machines: 2\nmain_process_ip: h0\nmachine_rank: 2\n"),
      "test.yaml:5:1: machine_rank: is 2 but there are only 2 machines (hint: use 0..1)"));
  CHECK(has(load_text("distributed_type: FSDP\nnum_processes: 4\ngpu_ids: 0,1\n"),
            "gpu_ids: lists 2 GPU(s) (0,1) but each machine runs 4 processes"));
  CHECK(load_text("distributed_type: FSDP\nnum_processes: 4\nuse_cpu: true\ngpu_ids: 0\n").errors() == "");
  CHECK(has(load_text("distributed_type: NO\nnum_processes: 4\n"), "distributed_type: NO runs a single process"));
  CHECK(has(load_text("distributed_type: FSDP\n"), "num_processes: not set"));
  CHECK(load_text("distributed_type: FSDP\nnum_processes: 8\nnum_machines: 2\nmain_process_ip: 10.0.0.1\n").errors() ==
        "");
}

TEST_CASE("FSDP1 keys in an FSDP2 config are errors that suggest to-fsdp2") {
  Loaded l =
      load_text(std::string(kFsdp2Base) +
                "  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_backward_prefetch: BACKWARD_PRE\n"
                "  fsdp_forward_prefetch: true\n  fsdp_use_orig_params: true\n  fsdp_sync_module_states: true\n");
  CHECK(l.diags.error_count() == 5);
  CHECK(has(l,
            "test.yaml:5:3: fsdp_config.fsdp_sharding_strategy: an FSDP1 key that FSDP2 does not have "
            "(hint: run `fsdptrain to-fsdp2 --config_file test.yaml --overwrite`)"));
  CHECK(has(l, "fsdp_config.fsdp_forward_prefetch: FSDP2 has no forward prefetch switch"));
  CHECK(has(load_text(std::string(kFsdp2Base) + "  fsdp_reshard_after_forward: SHARD_GRAD_OP\n"),
            "fsdp_reshard_after_forward: FSDP2 expects true or false, got the FSDP1 strategy SHARD_GRAD_OP"));
}

TEST_CASE("FSDP rules that Accelerate only finds after the workers started, or never") {
  CHECK(has(load_text(std::string(kFsdp2Base) + "  fsdp_state_dict_type: LOCAL_STATE_DICT\n"),
            "fsdp_config.fsdp_state_dict_type: FSDP2 does not support LOCAL_STATE_DICT"));
  CHECK(has(
      load_text(std::string(kFsdp2Base) + "  fsdp_auto_wrap_policy: NO_WRAP\n  fsdp_activation_checkpointing: true\n"),
      "fsdp_activation_checkpointing: needs units to checkpoint, but fsdp_auto_wrap_policy is NO_WRAP"));
  CHECK(has(load_text(std::string(kFsdp2Base) + "  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 0\n"),
            "fsdp_min_num_params: must be > 0 with SIZE_BASED_WRAP"));
  CHECK(has(load_text(std::string(kFsdp2Base) + "  fsdp_ignored_modules: 'layers.(0\n"),
            "fsdp_ignored_modules: is not a valid regular expression"));
  CHECK(warns(load_text(std::string(kFsdp2Base) +
                        "  fsdp_auto_wrap_policy: NO_WRAP\n  fsdp_transformer_layer_cls_to_wrap: X\n"),
              "fsdp_transformer_layer_cls_to_wrap: ignored because fsdp_auto_wrap_policy is NO_WRAP"));
  CHECK(warns(load_text("distributed_type: MULTI_GPU\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n"),
              "distributed_type: is MULTI_GPU, so fsdp_config is ignored"));
}

TEST_CASE("RAM-efficient loading needs sync_module_states in FSDP1 only (no spurious FSDP2 error)") {
  const char* v1 =
      "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_cpu_ram_efficient_loading: true\n"
      "  fsdp_sync_module_states: false\n";
  CHECK(has(load_text(v1), "fsdp_sync_module_states: must be true with fsdp_cpu_ram_efficient_loading"));
  CHECK(load_text(std::string(kFsdp2Base) + "  fsdp_cpu_ram_efficient_loading: true\n").errors() == "");
}

TEST_CASE("FSDP1 strategies are honoured wherever they are written, and conflicts are errors") {
  auto layout = [](const std::string& text) { return effective_fsdp_layout(load_text(text).rc.typed); };
  const std::string head =
      "distributed_type: FSDP\nnum_processes: 8\nnum_machines: 2\nmain_process_ip: h0\nfsdp_config:\n";
  FsdpLayout sgo = layout(head + "  fsdp_reshard_after_forward: SHARD_GRAD_OP\n");
  CHECK(sgo.sharded);
  CHECK_FALSE(sgo.reshard_after_forward);
  CHECK(sgo.shard_size == 8);
  FsdpLayout hyb = layout(head + "  fsdp_sharding_strategy: 5\n");
  CHECK(hyb.replicate_size == 2);
  CHECK(hyb.shard_size == 4);
  CHECK_FALSE(hyb.reshard_after_forward);
  FsdpLayout noshard = layout(head + "  fsdp_sharding_strategy: no_shard\n");
  CHECK(noshard.replicate_size == 8);
  CHECK(noshard.shard_size == 1);
  CHECK(has(load_text(head + "  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n"),
            "fsdp_reshard_after_forward: names the strategy SHARD_GRAD_OP but fsdp_sharding_strategy is FULL_SHARD"));
}

TEST_CASE("fsdp_reshard_after_forward: N is partial resharding in FSDP2 and a strategy number in FSDP1") {
  const std::string head =
      "distributed_type: FSDP\nnum_processes: 8\nnum_machines: 2\nmain_process_ip: h0\nfsdp_config:\n";
  const std::string v2 = head + "  fsdp_version: 2\n";
  auto layout = [](const std::string& text) {
    const Loaded l = load_text(text);
    REQUIRE_MESSAGE(l.errors() == "", l.errors());
    return effective_fsdp_layout(l.rc.typed);
  };
  const FsdpLayout partial = layout(v2 + "  fsdp_reshard_after_forward: 4\n");
  CHECK(partial.reshard_after_forward);
  CHECK(partial.post_forward_size == 4);
  CHECK(partial.shard_size == 8);
  CHECK(partial.describe().find("reshard_after_forward=4 (between forward and backward each unit stays sharded over "
                                "ranks 0-3, 4-7)") != std::string::npos);
  // With HSDP the groups are inside each shard group.
  const FsdpLayout hsdp = layout(v2 +
                                 "  fsdp_reshard_after_forward: 2\nparallelism_config:\n"
                                 "  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 4\n");
  CHECK(hsdp.post_forward_size == 2);
  CHECK(hsdp.describe().find("ranks 0-1, 2-3, 4-5, 6-7") != std::string::npos);
  // The same integer in an FSDP1 file is Accelerate's strategy number: 2 is SHARD_GRAD_OP.
  const FsdpLayout v1 = layout(head + "  fsdp_reshard_after_forward: 2\n");
  CHECK(v1.fsdp1_strategy == "SHARD_GRAD_OP");
  CHECK(v1.post_forward_size == 0);
  CHECK(has(load_text(head + "  fsdp_reshard_after_forward: 8\n"),
            "is 8, but an FSDP1 config numbers sharding strategies 1-5 there"));
  // Refused: a size that does not divide the shard group; warned: the whole group, or one that spans machines.
  CHECK(has(load_text(v2 + "  fsdp_reshard_after_forward: 3\n"),
            "is 3 ranks, which does not divide the shard group's 8 ranks; if `accelerate to-fsdp2` wrote this file, 3 "
            "is FSDP1's strategy NO_SHARD, which is false here (hint: use one of 2, 4, or true / false)"));
  CHECK(has(load_text(v2 + "  fsdp_reshard_after_forward: 16\n"), "does not divide the shard group's 8 ranks"));
  CHECK(has(load_text(v2 + "  fsdp_reshard_after_forward: 8\n"),
            "is the whole shard group (8 ranks), which is not partial resharding (hint: write true, or one of 2, 4)"));
  // What `accelerate to-fsdp2` writes for FSDP1's SHARD_GRAD_OP (2) on two processes: named, not run as true.
  CHECK(has(load_text("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n"
                      "  fsdp_reshard_after_forward: 2\n"),
            "if `accelerate to-fsdp2` wrote this file, 2 is FSDP1's strategy SHARD_GRAD_OP, which is false here "
            "(hint: write false)"));  // issue 63: the hint writes what it meant, not true
  const Loaded spans = load_text(
      "distributed_type: FSDP\nnum_processes: 8\nnum_machines: 4\nmain_process_ip: h0\n"
      "fsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: 4\n");
  CHECK(warns(spans, "4 ranks span machines (2 processes each): backward's gathers cross the network"));
}

TEST_CASE("parallelism_config: HSDP and TP sizes must multiply to num_processes; CP refused") {
  const std::string base = std::string(kFsdp2Base) + "parallelism_config:\n";
  Loaded ok = load_text(base + "  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 2\n");
  CHECK(ok.errors() == "");
  FsdpLayout l = effective_fsdp_layout(ok.rc.typed);
  CHECK(l.replicate_size == 2);
  CHECK(l.shard_size == 2);
  CHECK(has(load_text(base + "  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 3\n"),
            "dp_replicate_size x dp_shard_size x tp_size = 2 x 3 x 1 = 6, but num_processes is 4"));
  // Tensor parallel: tp innermost; alone, the data-parallel ranks are the rest.
  Loaded tp = load_text(base + "  parallelism_config_tp_size: 2\n");
  CHECK(tp.errors() == "");
  FsdpLayout t = effective_fsdp_layout(tp.rc.typed);
  CHECK(t.tp_size == 2);
  CHECK(t.shard_size == 2);
  CHECK(t.describe() ==
        "FSDP2, reshard_after_forward=true, sharded over 2 ranks, tensor parallel over 2 (tp groups: ranks 0-1, 2-3; "
        "shard groups: 0,2 / 1,3)");
  CHECK(has(load_text(base + "  parallelism_config_tp_size: 2\n  parallelism_config_dp_shard_size: 3\n"),
            "1 x 3 x 2 = 6, but num_processes is 4"));
  CHECK(has(load_text(base + "  parallelism_config_tp_size: 3\n"), "but num_processes is 4"));
  CHECK(has(load_text(base + "  parallelism_config_tp_size: 2\ntrain:\n  sequence_length: 33\n"),
            "2 does not divide train.sequence_length 33"));
  // LoRA splits with its layers under tp; its dropout and the experts' adapters do not yet.
  CHECK(load_text(base + "  parallelism_config_tp_size: 2\nlora:\n  r: 8\n").errors() == "");
  CHECK(has(load_text(base + "  parallelism_config_tp_size: 2\nlora:\n  r: 8\n  dropout: 0.05\n"),
            "lora.dropout 0.05 is not drawn alike by the tensor-parallel ranks yet (hint: set lora.dropout: 0"));
  CHECK(has(load_text(base + "  parallelism_config_tp_size: 2\nlora:\n  r: 8\n  target_parameters: [gate_up_proj]\n"),
            "lora.target_parameters (the experts' adapters) are not trained under tensor parallel yet"));
  CHECK(warns(load_text(std::string("num_machines: 2\nmachine_rank: 0\nmain_process_ip: 10.0.0.1\n") + kFsdp2Base +
                        "parallelism_config:\n  parallelism_config_tp_size: 4\n"),
              "some tensor-parallel groups span machines"));
  CHECK(
      has(load_text(
              "distributed_type: FSDP\nnum_processes: 4\nparallelism_config:\n  parallelism_config_dp_shard_size: 4\n"),
          "parallelism_config needs FSDP2"));
  // All sizes 1: plain FSDP over the world (Accelerate silently turns this into pure replication).
  FsdpLayout plain = effective_fsdp_layout(load_text(base + "  parallelism_config_dp_shard_size: 1\n").rc.typed);
  CHECK(plain.replicate_size == 1);
  CHECK(plain.shard_size == 4);
}

TEST_CASE("every problem is reported at once") {
  Loaded l = load_text(
      "distributed_type: FSDP\nnum_processes: 3\nnum_machines: 2\nmixed_precision: bf8\n"
      "fsdp_config:\n  fsdp_version: 2\n  fsdp_offload_params: maybe\n  fsdp_bogus: 1\n");
  CHECK(l.diags.error_count() == 5);  // bf8, maybe, fsdp_bogus, 3 % 2, main_process_ip
}

TEST_CASE("the lora section: ranges, a missing adapter folder, and keys that do nothing without lora.r") {
  const std::string base = "distributed_type: FSDP\nnum_processes: 2\nuse_cpu: true\n";
  CHECK(has(load_text(base + "lora:\n  r: 8\n  dropout: 2\n"), "lora.dropout: must be at least 0 and below 1, got 2"));
  CHECK(has(load_text(base + "lora:\n  r: 8\n  alpha: 0\n"), "lora.alpha: must be above 0, got 0"));
  CHECK(has(load_text(base + "lora:\n  r: 8\n  init: /no/such/adapter\n"),
            "lora.init: \"/no/such/adapter\" holds no adapter_model.safetensors"));
  const Loaded off = load_text(base + "lora:\n  alpha: 32\ncheckpoint:\n  export_merged: true\n");
  CHECK(off.errors() == "");
  CHECK(warns(off, "lora.alpha: has no effect without LoRA"));
  CHECK(warns(off, "checkpoint.export_merged: has no effect without LoRA"));
  CHECK(load_text(base + "lora:\n  r: 16\n  alpha: 32\n  dropout: 0.05\n  target_modules: all-linear\n").errors() ==
        "");
}

TEST_CASE("float8: refused where it cannot run, its all-gather named in the run line and refused with rowwise") {
  const std::string gpu = std::string(kFsdp2Base) + "mixed_precision: bf16\n";
  CHECK(
      has(load_text(std::string(kFsdp2Base) + "mixed_precision: bf16\nuse_cpu: true\nengine:\n  float8: tensorwise\n"),
          "engine.float8: makes GPU products faster"));
  CHECK(has(load_text(std::string(kFsdp2Base) + "mixed_precision: fp16\nengine:\n  float8: tensorwise\n"),
            "engine.float8: runs with bf16 compute, and mixed_precision is fp16"));
  const Loaded tensorwise = load_text(gpu + "engine:\n  float8: tensorwise\n");
  CHECK(tensorwise.errors() == "");
  CHECK(format_resolved(tensorwise.rc, ShowFormat::kTable)
            .find("; mixed_precision bf16, float8 tensorwise products (their weights gathered in float8), "
                  "activation checkpointing off") != std::string::npos);
  const Loaded plain_gather = load_text(gpu + "engine:\n  float8: tensorwise\n  float8_all_gather: false\n");
  CHECK(format_resolved(plain_gather.rc, ShowFormat::kTable)
            .find("; mixed_precision bf16, float8 tensorwise products, activation") != std::string::npos);
  // Rowwise scales by rows and then by columns: its weights gather in bf16, said when asked otherwise.
  CHECK(load_text(gpu + "engine:\n  float8: rowwise\n").errors() == "");
  CHECK(has(load_text(gpu + "engine:\n  float8: rowwise\n  float8_all_gather: true\n"),
            "engine.float8_all_gather: gathers each weight in float8 with one scale for the whole weight"));
  CHECK(warns(load_text(gpu + "engine:\n  float8_all_gather: true\n"),
              "engine.float8_all_gather: gathers the weights of float8 products, and engine.float8 is none"));
}

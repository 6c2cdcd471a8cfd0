// The wizard through a stream (as from a pipe), with re-asking and preset answers.
#include "config/wizard.h"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <sstream>

#include "config/test_support.h"
#include "util/error.h"
#include "util/files.h"

using namespace fsdp;
using namespace fsdp::config;
using namespace fsdp::config::testing;

namespace {
struct Run {
  WizardResult result;
  std::string transcript;
};
Run run(const std::string& input, const std::map<std::string, std::string>& preset = {}) {
  std::istringstream in(input);
  std::ostringstream out;
  Run r;
  r.result = run_wizard(in, out, preset, /*interactive=*/false);
  r.transcript = out.str();
  return r;
}
std::string value_of(const WizardResult& r, const std::string& key) {
  for (const auto& [k, v] : r.values)
    if (k == key) return v;
  return "<absent>";
}
// FSDP2 answers every FSDP question (resharding, SHARDED state dict, transformer units, no offload,
// no checkpointing, no parallelism config), with the machine's and the case's own answers on top.
std::map<std::string, std::string> fsdp2_preset(const std::map<std::string, std::string>& own) {
  std::map<std::string, std::string> preset = {{"debug", "no"},
                                               {"use_fsdp", "yes"},
                                               {"fsdp_config.fsdp_version", "2"},
                                               {"fsdp_config.fsdp_reshard_after_forward", "yes"},
                                               {"fsdp_config.fsdp_offload_params", "no"},
                                               {"fsdp_config.fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"},
                                               {"use_model_layer_classes", "yes"},
                                               {"fsdp_config.fsdp_state_dict_type", "SHARDED_STATE_DICT"},
                                               {"fsdp_config.fsdp_cpu_ram_efficient_loading", "yes"},
                                               {"fsdp_config.fsdp_activation_checkpointing", "no"},
                                               {"use_parallelism_config", "no"},
                                               {"model.pretrained", ""}};
  for (const auto& [k, v] : own) preset[k] = v;
  return preset;
}
}  // namespace

TEST_CASE("all defaults (multi-GPU, FSDP2) give a valid FSDP2 config") {
  // Enter for every question.
  Run r = run(std::string(40, '\n'));
  Loaded l = load_text(r.result.yaml);
  CHECK_MESSAGE(l.errors() == "", l.errors());
  CHECK(l.rc.typed.launch.distributed_type == DistributedType::kFsdp);
  CHECK(l.rc.typed.fsdp.version == 2);
  CHECK(l.rc.typed.fsdp.reshard_after_forward);
  CHECK(l.value("fsdp_config.fsdp_state_dict_type") == "SHARDED_STATE_DICT");
  CHECK(r.transcript.find("How many processes (GPUs) should be used in total, across ALL machines?") !=
        std::string::npos);
}

TEST_CASE("questions come in Accelerate's order and bad answers are re-asked with a message") {
  const std::string answers =
      "3\n"     // machine type: multi-GPU
      "2\n"     // machines
      "5\n1\n"  // rank 5 is refused, then 1
      "10.0.0.1\n"
      "0\n29501\n"    // port 0 refused with several machines
      "\n"            // same network
      "\n"            // debug
      "maybe\nyes\n"  // FSDP? re-asked
      "1\n"           // FSDP version 1
      "SHARD_GRAD_OP\n"
      "no\n"        // offload
      "2\n"         // SIZE_BASED_WRAP
      "abc\n1e7\n"  // min params re-asked, 1e7 accepted
      "\n"          // backward prefetch
      "\n"          // state dict
      "\n\n"        // forward prefetch, use_orig_params
      "\n"          // ram efficient loading
      "\n"          // activation checkpointing
      "3\n4\n"      // processes: 3 is not a multiple of 2
      "0,1\n"       // gpu ids
      "bf16\n";
  Run r = run(answers);
  const std::string& t = r.transcript;
  CHECK(t.find("Please try again: the rank must be 0..1.") != std::string::npos);
  CHECK(t.find("Please try again: port 0 cannot be used with several machines.") != std::string::npos);
  CHECK(t.find("Please enter yes or no.") != std::string::npos);
  CHECK(t.find("Please try again: expected a whole number, got \"abc\".") != std::string::npos);
  CHECK(t.find("Please try again: the total must be a multiple of the 2 machines.") != std::string::npos);
  CHECK(t.find("Which type of machine") < t.find("How many different machines"));
  CHECK(t.find("FullyShardedDataParallel") < t.find("FSDP version"));
  CHECK(t.find("state dict type") < t.find("activation checkpointing"));
  CHECK(t.find("activation checkpointing") < t.find("How many processes"));
  CHECK(t.find("How many processes") < t.find("mixed precision"));
  CHECK(value_of(r.result, "fsdp_config.fsdp_sharding_strategy") == "SHARD_GRAD_OP");
  CHECK(value_of(r.result, "fsdp_config.fsdp_min_num_params") == "10000000");
  CHECK(value_of(r.result, "machine_rank") == "1");
  CHECK(value_of(r.result, "num_processes") == "4");
  CHECK(value_of(r.result, "mixed_precision") == "bf16");
  Loaded l = load_text(r.result.yaml);
  CHECK_MESSAGE(l.errors() == "", l.errors());
  CHECK(l.rc.typed.fsdp.fsdp1_strategy() == ShardingStrategy::kShardGradOp);
}

TEST_CASE("preset answers are not asked; a complete set needs no input at all") {
  std::map<std::string, std::string> preset = {{"machine_type", "multi-CPU"},
                                               {"num_machines", "1"},
                                               {"debug", "no"},
                                               {"use_fsdp", "yes"},
                                               {"fsdp_config.fsdp_version", "2"},
                                               {"fsdp_config.fsdp_reshard_after_forward", "no"},
                                               {"fsdp_config.fsdp_offload_params", "no"},
                                               {"fsdp_config.fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"},
                                               {"use_model_layer_classes", "yes"},
                                               {"fsdp_config.fsdp_state_dict_type", "FULL_STATE_DICT"},
                                               {"fsdp_config.fsdp_cpu_ram_efficient_loading", "yes"},
                                               {"fsdp_config.fsdp_activation_checkpointing", "yes"},
                                               {"use_parallelism_config", "yes"},
                                               {"parallelism_config.parallelism_config_dp_replicate_size", "2"},
                                               {"parallelism_config.parallelism_config_dp_shard_size", "2"},
                                               {"use_context_parallel", "no"},
                                               {"num_processes", "4"},
                                               {"mixed_precision", "no"},
                                               {"model.pretrained", ""}};
  Run r = run("", preset);
  CHECK(r.transcript == "");
  Loaded l = load_text(r.result.yaml);
  CHECK_MESSAGE(l.errors() == "", l.errors());
  CHECK(l.rc.typed.launch.use_cpu);
  CHECK_FALSE(l.rc.typed.fsdp.reshard_after_forward);
  CHECK(effective_fsdp_layout(l.rc.typed).replicate_size == 2);
}

TEST_CASE("FSDP2 on several machines offers partial resharding over one machine's processes") {
  std::map<std::string, std::string> preset = fsdp2_preset({{"machine_type", "multi-GPU"},
                                                            {"num_machines", "2"},
                                                            {"machine_rank", "0"},
                                                            {"main_process_ip", "10.0.0.1"},
                                                            {"main_process_port", "29500"},
                                                            {"same_network", "yes"},
                                                            {"use_context_parallel", "no"},
                                                            {"num_processes", "16"},
                                                            {"gpu_ids", "all"},
                                                            {"use_partial_reshard", "yes"},
                                                            {"mixed_precision", "bf16"}});
  Run r = run("", preset);
  CHECK(r.transcript == "");
  Loaded l = load_text(r.result.yaml);
  CHECK_MESSAGE(l.errors() == "", l.errors());
  CHECK(r.result.yaml.find("fsdp_reshard_after_forward: 8") != std::string::npos);
  CHECK(effective_fsdp_layout(l.rc.typed).post_forward_size == 8);
  // On one machine there is nothing to keep inside: the question is not asked.
  preset["num_machines"] = "1";
  preset["num_processes"] = "8";
  Run one = run("", preset);
  CHECK(one.result.yaml.find("fsdp_reshard_after_forward: true") != std::string::npos);
}

TEST_CASE("FSDP2 asks for context parallel: cp_size and its strategy, and processes that split by it") {
  const std::map<std::string, std::string> preset = fsdp2_preset({{"machine_type", "multi-CPU"},
                                                                  {"num_machines", "1"},
                                                                  {"use_context_parallel", "yes"},
                                                                  {"mixed_precision", "no"}});
  // cp_size 1 is re-asked; 6 processes do not split into groups of 4.
  Run r = run("1\n4\n2\n6\n8\n", preset);
  CHECK(r.transcript.find("Please try again: it must be 2 or more.") != std::string::npos);
  CHECK(r.transcript.find("Please try again: the total must be a multiple of cp_size 4.") != std::string::npos);
  Loaded l = load_text(r.result.yaml);
  CHECK_MESSAGE(l.errors() == "", l.errors());
  CHECK(l.rc.typed.parallelism.cp_size == 4);
  CHECK(l.rc.typed.parallelism.cp_comm_strategy == "alltoall");
  CHECK(effective_fsdp_layout(l.rc.typed).shard_size == 2);  // 8 processes: dp_shard 2 x cp 4
}

TEST_CASE("bad presets, unknown ids and input that ends early are errors") {
  CHECK_THROWS_WITH_AS(run("", {{"num_processes", "lots"},
                                {"machine_type", "multi-GPU"},
                                {"num_machines", "1"},
                                {"debug", "no"},
                                {"use_fsdp", "no"}}),
                       doctest::Contains("answer for num_processes: expected a whole number"), InputError);
  CHECK_THROWS_WITH_AS(run("", {{"num_procs", "2"}}), doctest::Contains("did you mean num_processes?"), InputError);
  // Input that ends before a question without a default (two machines: the main machine's address).
  CHECK_THROWS_WITH_AS(run("3\n2\n"), doctest::Contains("input ended before"), InputError);
}

TEST_CASE("regression: without a terminal, questions the answers leave out take their defaults (README example)") {
  // The README's answers file plus --fsdp_offload_params true, and no more input.
  const std::map<std::string, std::string> readme = {{"machine_type", "multi-GPU"},
                                                     {"num_machines", "1"},
                                                     {"debug", "no"},
                                                     {"use_fsdp", "yes"},
                                                     {"fsdp_config.fsdp_version", "2"},
                                                     {"num_processes", "8"},
                                                     {"fsdp_config.fsdp_offload_params", "true"}};
  Run r = run("", readme);
  Loaded l = load_text(r.result.yaml);
  CHECK_MESSAGE(l.errors() == "", l.errors());
  CHECK(l.diags.warnings().empty());
  CHECK(l.rc.typed.launch.num_processes == 8);
  CHECK(l.rc.typed.fsdp.offload_params);
  CHECK(r.transcript.find("(default)") != std::string::npos);
}

TEST_CASE("on a machine without GPUs the wizard defaults to CPU processes and says processes") {
  std::istringstream in("");
  std::ostringstream out;
  const WizardResult r = run_wizard(in, out, {}, /*interactive=*/false, /*gpus=*/0);
  Loaded l = load_text(r.yaml);
  CHECK_MESSAGE(l.errors() == "", l.errors());
  CHECK(l.rc.typed.launch.use_cpu);
  CHECK(out.str().find("[multi-CPU]") != std::string::npos);
  CHECK(out.str().find("How many processes should be used in total") != std::string::npos);
  CHECK(out.str().find("(GPUs)") == std::string::npos);
}

// Issue 27: the wizard's config could not run the built-in trainer (no model, no data).
TEST_CASE("the wizard asks for the trainer's model and data, and writes them as absolute paths with a run folder") {
  const std::string model = std::string(FSDP_SOURCE_DIR) + "/configs/models/tiny";
  Run r = run("", {{"machine_type", "multi-CPU"},
                   {"num_processes", "2"},
                   {"model.pretrained", model},
                   {"data.path", std::string(FSDP_SOURCE_DIR) + "/lib/*/*.cpp"}});
  CHECK(value_of(r.result, "model.pretrained") == model);
  CHECK(value_of(r.result, "data.path") == std::string(FSDP_SOURCE_DIR) + "/lib/*/*.cpp");
  CHECK(value_of(r.result, "train.output_dir").find("/runs/tiny") != std::string::npos);
  CHECK(value_of(r.result, "fsdp_config.fsdp_transformer_layer_cls_to_wrap") == "<absent>");  // the family's class
  // No model: nothing of the trainer's is written.
  Run none = run("", {{"machine_type", "multi-CPU"}, {"num_processes", "2"}, {"model.pretrained", ""}});
  CHECK(value_of(none.result, "data.path") == "<absent>");
  CHECK_THROWS_WITH_AS(run("", {{"machine_type", "multi-CPU"}, {"model.pretrained", "/nonexistent"}}),
                       doctest::Contains("holds no config.json"), InputError);
}

// Issue 42: a model and a dataset named by their Hub ids, in the Hugging Face cache, stay ids.
TEST_CASE("the wizard takes a cached model's and dataset's Hub ids, and names the fetch command for others") {
  char name[] = "/tmp/fsdptrain-wizard-hub-XXXXXX";
  const std::string cache = ::mkdtemp(name);
  ::setenv("HF_HUB_CACHE", cache.c_str(), 1);
  const std::string commit(40, 'c');
  write_file_atomic(hub_repo(cache, "models--org--tiny", commit) + "/config.json",
                    read_file(std::string(FSDP_SOURCE_DIR) + "/configs/models/tiny/config.json"));
  write_file_atomic(hub_repo(cache, "datasets--org--chats", commit) + "/train.jsonl", "{\"text\": \"a\"}\n");
  Run r = run("", {{"machine_type", "multi-CPU"},
                   {"num_processes", "2"},
                   {"model.pretrained", "org/tiny"},
                   {"data.path", "org/chats"}});
  CHECK(value_of(r.result, "model.pretrained") == "org/tiny");
  CHECK(value_of(r.result, "data.dataset") == "org/chats");
  CHECK(value_of(r.result, "data.path") == "<absent>");
  CHECK(value_of(r.result, "train.output_dir").find("/runs/tiny") != std::string::npos);
  Loaded written = load_text(r.result.yaml);  // the config it writes finds both in the cache
  CHECK_MESSAGE(written.errors() == "", written.errors());
  CHECK(written.rc.typed.model.pretrained == cache + "/models--org--tiny/snapshots/" + commit);
  CHECK(written.rc.typed.data.dataset == "org/chats");
  CHECK_THROWS_WITH_AS(run("", {{"machine_type", "multi-CPU"}, {"model.pretrained", "org/absent"}}),
                       doctest::Contains("hf download org/absent"), InputError);
  ::unsetenv("HF_HUB_CACHE");
  remove_tree(cache);
}

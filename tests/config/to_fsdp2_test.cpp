// to-fsdp2: goldens for every example in configs/fsdp1, and the rules that make it lossless or loud.
#include "config/to_fsdp2.h"

#include <doctest/doctest.h>

#include <filesystem>

#include "config/test_support.h"
#include "util/error.h"
#include "util/files.h"

using namespace fsdp;
using namespace fsdp::config;
using namespace fsdp::config::testing;

namespace {
const std::string kConfigs = std::string(FSDP_SOURCE_DIR) + "/configs";

std::string convert(const std::string& text) {
  return convert_to_fsdp2(text, "in.yaml").output;
}

std::string error_of(const std::string& text) {
  try {
    convert_to_fsdp2(text, "in.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("golden conversions: configs/fsdp1/X.yaml -> configs/fsdp2/X.yaml, which validates and converts to itself") {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kConfigs + "/fsdp1")) {
    const std::string name = entry.path().filename().string();
    CAPTURE(name);
    const std::string input = read_file(entry.path().string());
    const std::string golden = read_file(kConfigs + "/fsdp2/" + name);
    ToFsdp2Result r = convert_to_fsdp2(input, name);
    CHECK(r.converted);
    CHECK(r.output == golden);
    CHECK(r.lossy.empty() == (name != "no_shard.yaml"));
    Loaded l = load_text(golden);
    CHECK_MESSAGE(l.errors() == "", l.errors());
    CHECK(l.rc.typed.fsdp.version == 2);
    ToFsdp2Result again = convert_to_fsdp2(golden, name);  // idempotent
    CHECK_FALSE(again.converted);
    CHECK(again.output == golden);
    ++checked;
  }
  CHECK(checked >= 7);
}

TEST_CASE("comments, key order and quoting are kept") {
  const std::string in =
      "# my cluster\ndistributed_type: FSDP\nmixed_precision: 'bf16'  # quoted on purpose\nfsdp_config:\n"
      "  # the strategy\n  fsdp_sharding_strategy: FULL_SHARD  # keep memory low\n  fsdp_offload_params: false\n"
      "num_processes: 2\n";
  CHECK(convert(in) ==
        "# my cluster\ndistributed_type: FSDP\nmixed_precision: 'bf16'  # quoted on purpose\nfsdp_config:\n"
        "  # the strategy\n  fsdp_reshard_after_forward: true  # keep memory low\n  fsdp_offload_params: false\n"
        "  fsdp_version: 2\n  fsdp_state_dict_type: FULL_STATE_DICT\nnum_processes: 2\n");
}

TEST_CASE("strategy mapping: names in any case, integers 1-5, and the wizard's reshard_after_forward spelling") {
  auto reshard_of = [](const std::string& strategy_line) {
    Loaded l = load_text(convert("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  " + strategy_line + "\n"));
    REQUIRE_MESSAGE(l.errors() == "", l.errors());
    return l.rc.typed.fsdp.reshard_after_forward;
  };
  CHECK(reshard_of("fsdp_sharding_strategy: full_shard"));
  CHECK_FALSE(reshard_of("fsdp_sharding_strategy: shard_grad_op"));
  CHECK(reshard_of("fsdp_sharding_strategy: 1"));
  CHECK_FALSE(reshard_of("fsdp_sharding_strategy: 2"));
  CHECK_FALSE(reshard_of("fsdp_reshard_after_forward: SHARD_GRAD_OP"));
  CHECK_FALSE(reshard_of("fsdp_reshard_after_forward: 2"));  // FSDP1's numbering: SHARD_GRAD_OP
  CHECK(reshard_of("fsdp_reshard_after_forward: 1"));
  CHECK(reshard_of("sharding_strategy: FULL_SHARD"));  // unprefixed, as Accelerate's launcher accepts
}

TEST_CASE("HYBRID_SHARD becomes HSDP: one replica per machine") {
  Loaded l =
      load_text(convert("distributed_type: FSDP\nnum_processes: 16\nnum_machines: 4\nmain_process_ip: h\n"
                        "fsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD_ZERO2\n"));
  REQUIRE(l.errors() == "");
  FsdpLayout layout = effective_fsdp_layout(l.rc.typed);
  CHECK(layout.replicate_size == 4);
  CHECK(layout.shard_size == 4);
  CHECK_FALSE(layout.reshard_after_forward);
  CHECK(error_of("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n")
            .find("HYBRID_SHARD needs num_processes") != std::string::npos);
}

TEST_CASE("lossy changes are listed (refused by the command unless --force)") {
  auto lossy = [](const std::string& fsdp_lines) {
    return convert_to_fsdp2("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n" + fsdp_lines, "in.yaml").lossy;
  };
  CHECK(lossy("  fsdp_sharding_strategy: NO_SHARD\n").size() == 1);
  CHECK(lossy("  fsdp_state_dict_type: LOCAL_STATE_DICT\n").size() == 1);
  CHECK(lossy("  fsdp_forward_prefetch: true\n").size() == 1);
  CHECK(lossy("  fsdp_use_orig_params: false\n").size() == 1);
  CHECK(lossy("  fsdp_forward_prefetch: false\n  fsdp_use_orig_params: true\n  fsdp_backward_prefetch: NO_PREFETCH\n")
            .empty());
}

TEST_CASE("inputs that cannot be converted are refused with the reason") {
  CHECK(error_of("") == "in.yaml: the config file is empty");
  CHECK(error_of("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: FULL\n")
            .find("in.yaml:4:3: fsdp_config.fsdp_sharding_strategy: expected one of FULL_SHARD") == 0);
  CHECK(error_of("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_ofload_params: true\n")
            .find("unknown key (did you mean fsdp_offload_params?)") != std::string::npos);
  CHECK(error_of("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
                 "  fsdp_reshard_after_forward: SHARD_GRAD_OP\n")
            .find("keep one of the two keys") != std::string::npos);
  CHECK(
      error_of("distributed_type: FSDP\nnum_processes: 3\nnum_machines: 2\nfsdp_config:\n  fsdp_offload_params: true\n")
          .find("the converted config does not validate") == 0);
  CHECK(error_of("distributed_type: FSDP\nfsdp_config: {fsdp_sharding_strategy: 1}\n").find("flow style") !=
        std::string::npos);
}

TEST_CASE("nothing to convert: no fsdp_config, or already FSDP2 (also as the string \"2\")") {
  for (const char* in :
       {"distributed_type: NO\n", "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: '2'\n"}) {
    ToFsdp2Result r = convert_to_fsdp2(in, "in.yaml");
    CHECK_FALSE(r.converted);
    CHECK(r.output == in);
  }
}

TEST_CASE("regression: a file without num_processes converts (SLURM scripts pass it to the launcher)") {
  const std::string slurm =
      "compute_environment: LOCAL_MACHINE\n"
      "distributed_type: FSDP\n"
      "fsdp_config:\n"
      "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
      "  fsdp_backward_prefetch: BACKWARD_PRE\n"
      "  fsdp_cpu_ram_efficient_loading: true\n"
      "  fsdp_forward_prefetch: false\n"
      "  fsdp_offload_params: false\n"
      "  fsdp_sharding_strategy: FULL_SHARD\n"
      "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
      "  fsdp_sync_module_states: true\n"
      "  fsdp_use_orig_params: true\n"
      "mixed_precision: fp16\n"
      "rdzv_backend: c10d\n";
  const ToFsdp2Result r = convert_to_fsdp2(slurm, "fsdp_config.yaml");
  CHECK(r.converted);
  CHECK(r.lossy.empty());
  CHECK(r.output.find("fsdp_reshard_after_forward: true") != std::string::npos);
  CHECK(r.output.find("num_processes") == std::string::npos);
}

TEST_CASE("regression: FSDP1 keys in an FSDP2 file are converted, so validate's hint fixes the file") {
  const std::string mixed =
      "distributed_type: FSDP\n"
      "num_processes: 2\n"
      "fsdp_config:\n"
      "  fsdp_version: 2\n"
      "  fsdp_sharding_strategy: SHARD_GRAD_OP  # FSDP1's name\n"
      "  fsdp_backward_prefetch: BACKWARD_PRE\n"
      "  fsdp_offload_params: false\n";
  const ToFsdp2Result r = convert_to_fsdp2(mixed, "mixed.yaml");
  CHECK(r.converted);
  CHECK(r.output.find("fsdp_reshard_after_forward: false  # FSDP1's name") != std::string::npos);
  CHECK(r.output.find("fsdp_backward_prefetch") == std::string::npos);
  CHECK(r.output.find("fsdp_offload_params: false") != std::string::npos);
  CHECK(load_text(r.output).errors() == "");
  // Both keys, disagreeing: refused, naming them.
  const std::string both =
      "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n"
      "  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_reshard_after_forward: false\n";
  CHECK_THROWS_WITH_AS(convert_to_fsdp2(both, "both.yaml"), doctest::Contains("FULL_SHARD disagrees with"),
                       fsdp::InputError);
  // Nothing of FSDP1's: nothing to convert.
  CHECK_FALSE(convert_to_fsdp2("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n", "v2.yaml")
                  .converted);
}

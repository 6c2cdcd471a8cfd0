// Faults and bad input (issue 19): each case once lost work or gave a wrong or missing message.
// Each runs fsdptrain as a user would and checks the exit code, the message, and that nothing was
// lost: two runs in one checkpoint.dir, a checkpoint.dir that is a file, far too many workers, a
// full disk, damaged checkpoints, bad data and model files, a launcher without machine 0, and
// configs far too large to list.
#include <doctest/doctest.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/file_system.h"
#include "support/train_run.h"
#include "util/strings.h"

namespace {

using fsdp::testing::ChildProcess;
using fsdp::testing::copy_of_made_once;
using fsdp::testing::exists;
using fsdp::testing::fsdptrain_in_source;
using fsdp::testing::read_bytes;
using fsdp::testing::Result;
using fsdp::testing::sh;
using fsdp::testing::temp_path;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The tiny model on fsdptrain's own sources, 2 CPU ranks, FULL or SHARDED checkpoints.
std::string write_config(const std::string& name, const std::string& state_dict_type = "SHARDED_STATE_DICT") {
  const std::string path = temp_path(name + ".yaml");
  std::ofstream(path) << "distributed_type: FSDP\nuse_cpu: true\nnum_processes: 2\nmixed_precision: 'no'\n"
                         "fsdp_config:\n  fsdp_version: 2\n  fsdp_state_dict_type: "
                      << state_dict_type
                      << "\nmodel:\n  config: configs/models/tiny/config.json\ndata:\n  path: lib/*/*.cpp\n"
                         "train:\n  steps: 12\n  sequence_length: 32\n  micro_batch_size: 4\n  eval_interval: 0\n"
                         "optimizer:\n  lr: 3.0e-3\nlogging:\n  interval: 6\n";
  return path;
}

Result launch(const std::string& config, const std::vector<std::string>& sets) {
  std::vector<std::string> args{"launch", "--config", config, "--main_process_port", "0"};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  return fsdptrain_in_source(args);
}

// The built-in trainer through ckpt_worker, whose checkpoint file system fails on cue.
Result launch_with_fault(const std::string& config, const std::vector<std::string>& sets,
                         const std::vector<std::string>& fault) {
  std::vector<std::string> args{"launch",         "--config", config, "--main_process_port", "0", "--",
                                FSDP_CKPT_WORKER, "train",    config};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  args.insert(args.end(), fault.begin(), fault.end());
  return fsdptrain_in_source(args);
}

// Rewrites one file of a checkpoint and its manifest entry, so only the contents disagree.
void rewrite_with_manifest(const std::string& checkpoint, const std::string& name, const std::string& text) {
  std::ofstream(checkpoint + "/" + name, std::ios::binary) << text;
  nlohmann::json m = nlohmann::json::parse(read_bytes(checkpoint + "/manifest.json"));
  m["files"][name] = {{"bytes", text.size()},
                      {"crc32c", fsdp::ckpt::crc_hex(fsdp::ckpt::crc32c(text.data(), text.size()))}};
  std::ofstream(checkpoint + "/manifest.json") << m.dump(2) << "\n";
}

long long du_bytes(const std::string& path) {
  const std::string out = temp_path("du.txt");
  sh("du -sb " + path + " | cut -f1 > " + out);
  return std::stoll(read_bytes(out));
}

int cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  return CPU_COUNT(&set);
}

}  // namespace

TEST_CASE("case 1: a second run in the same checkpoint.dir is refused while the first holds it") {
  const std::string cfg = write_config("lock"), dir = temp_path("lock");
  sh("rm -rf " + dir);
  // The first run trains for a long time; its rank 0 holds the lock from before step 1.
  // (Few output lines: the test reads them only at the end.)
  ChildProcess first("/bin/sh",
                     {"-c", "cd " + std::string(FSDP_SOURCE_DIR) + " && exec \"$0\" \"$@\"", FSDP_BINARY, "launch",
                      "--config", cfg, "--main_process_port", "0", "--set", "checkpoint.dir=" + dir, "--set",
                      "checkpoint.interval=20", "--set", "train.steps=100000", "--set", "logging.interval=100000"});
  for (int i = 0; i < 600 && read_bytes(dir + "/.fsdptrain.lock").empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(has(read_bytes(dir + "/.fsdptrain.lock"), "pid"));

  // The launcher refuses before any worker starts ...
  const Result second = launch(cfg, {"checkpoint.dir=" + dir, "checkpoint.interval=2"});
  INFO(second.out, second.err);
  CHECK(second.code == 2);
  CHECK(has(second.err, "checkpoint.dir \"" + dir + "\" is in use by another run (host "));
  CHECK(has(second.err, "another checkpoint.dir"));
  CHECK_FALSE(has(second.out, "[train] data:"));
  // ... and so does rank 0 of a program that runs the trainer itself.
  const Result program = launch_with_fault(cfg, {"checkpoint.dir=" + dir, "checkpoint.interval=2"}, {});
  INFO(program.out, program.err);
  CHECK(program.code != 0);
  CHECK(has(program.err, "is in use by another run (host "));

  // Ctrl-C: the first run saves its step and stops (issue 40), releasing the lock.
  first.signal(SIGINT);
  const Result ended = first.wait(std::chrono::seconds(120));
  CHECK(ended.code == 75);
  CHECK(has(ended.out, "[train] stopped at step "));
  CHECK(has(ended.err, "continue it with:"));
  // Once the first run has ended, the folder is free again.
  const Result after = launch(cfg, {"checkpoint.dir=" + dir, "train.steps=2"});
  INFO(after.out, after.err);
  CHECK(after.code == 0);
  sh("rm -rf " + dir + " " + cfg);
}

TEST_CASE("case 2: a checkpoint.dir that is a file is refused before step 1, by validate and by launch") {
  const std::string cfg = write_config("isfile"), file = temp_path("isfile_dir");
  sh("echo x > " + file);
  for (const std::string& dir : {file, file + "/below"}) {
    INFO(dir);
    const Result v = fsdptrain_in_source({"config", "validate", cfg, "--set", "checkpoint.dir=" + dir});
    CHECK(v.code == 2);
    CHECK(has(v.err, "checkpoint.dir \"" + dir + "\": \"" + file + "\" is a file"));
    const Result l = launch(cfg, {"checkpoint.dir=" + dir});
    CHECK(l.code == 2);
    CHECK(has(l.err, "is a file, so no checkpoint can be saved there"));
    CHECK_FALSE(has(l.out, "step 1/"));
  }
  sh("rm -f " + file + " " + cfg);
}

TEST_CASE("case 3: more workers than the machine can run are refused before any starts") {
  const int n = cores();
  const Result r = fsdptrain_in_source({"launch", "--cpu", "--distributed_type", "MULTI_CPU", "--num_processes",
                                        "10000", "--main_process_port", "0", "--", "/bin/true"});
  INFO(r.out, r.err);
  CHECK(r.code == 2);
  CHECK(has(r.err, "num_processes asks for 10000 workers on this machine, which has " + fsdp::plural(n, "core")));
  CHECK(has(r.err, "at most " + std::to_string(4 * n)));
  CHECK(has(r.err, "--oversubscribe"));
  // Overridable: the dry run of 4 x cores + 1 workers prints their plan.
  const Result over =
      fsdptrain_in_source({"launch", "--cpu", "--distributed_type", "MULTI_CPU", "--num_processes",
                           std::to_string(4 * n + 1), "--oversubscribe", "--dry-run", "--", "/bin/true"});
  INFO(over.err);
  CHECK(over.code == 0);
  CHECK(has(over.out, "# rank " + std::to_string(4 * n)));
}

TEST_CASE("case 4: a full disk names what was needed and free and keep; with keep >= 2 a resume makes room") {
  const std::string cfg = write_config("full", "FULL_STATE_DICT"), dir = temp_path("full");
  sh("rm -rf " + dir);
  const std::vector<std::string> sets{"checkpoint.dir=" + dir, "checkpoint.interval=6", "checkpoint.keep=2"};
  SUBCASE("a save fails with ENOSPC") {
    const Result r = launch_with_fault(cfg, sets, {"--fault", "enospc", "--at-save", "2", "--after-bytes", "1000"});
    INFO(r.out, r.err);
    CHECK(r.code == 1);
    CHECK(has(r.err, "the disk is full: saving " + dir + "/step-00000012 needs about "));
    CHECK(has(r.err, "was free"));
    CHECK(has(r.err, "checkpoint.keep (now 2)"));
    CHECK(exists(dir + "/step-00000006/manifest.json"));  // the previous one is intact
    CHECK_FALSE(exists(dir + "/step-00000012.tmp"));      // and the partial save is gone
    // The root cause is the first failure the launcher names, not a peer's lost connection.
    CHECK(has(r.err, "[launch] rank 0 (machine 0, pid "));
    CHECK(has(r.err, ") failed first:\nerror: [ckpt] the disk is full"));
  }
  SUBCASE("resuming on a disk too full for one more checkpoint") {
    const Result r = launch(cfg, sets);
    INFO(r.out, r.err);
    REQUIRE(r.code == 0);
    const long long used = du_bytes(dir), one = du_bytes(dir + "/step-00000012");
    // A disk with half a checkpoint free: keep 2 lets the save remove step 6 first.
    const std::string disk = std::to_string(used + one / 2);
    const std::vector<std::string> resume{"checkpoint.dir=" + dir, "checkpoint.interval=6", "checkpoint.keep=2",
                                          "checkpoint.resume=latest", "train.steps=18"};
    const Result ok = launch_with_fault(cfg, resume, {"--disk-bytes", disk});
    INFO(ok.out, ok.err);
    CHECK(ok.code == 0);
    CHECK(has(ok.out, "removed " + dir + "/step-00000006 before saving " + dir + "/step-00000018"));
    CHECK(exists(dir + "/step-00000012/manifest.json"));
    CHECK(exists(dir + "/step-00000018/manifest.json"));
    // keep 1 would leave no checkpoint while the new one is written: refused before step 1.
    std::vector<std::string> keep1 = resume;
    keep1[2] = "checkpoint.keep=1";
    keep1[4] = "train.steps=24";
    const Result refused = launch_with_fault(cfg, keep1, {"--disk-bytes", std::to_string(du_bytes(dir) + one / 2)});
    INFO(refused.out, refused.err);
    CHECK(refused.code != 0);
    CHECK(has(refused.err, "a checkpoint of this model needs "));
    CHECK(has(refused.err, "checkpoint.keep (now 1) to 2 or more"));
    CHECK_FALSE(has(refused.out, "step 19/"));
  }
  sh("rm -rf " + dir + " " + cfg);
}

TEST_CASE("cases 5-7: damaged checkpoints are named and never resumed past or overwritten") {
  const std::string cfg = write_config("damaged"), dir = temp_path("damaged");
  copy_of_made_once(dir, [&](const std::string& folder) {
    const Result r = launch(cfg, {"checkpoint.dir=" + folder, "checkpoint.interval=6"});
    INFO(r.out, r.err);
    REQUIRE(r.code == 0);
  });
  const std::string newest = dir + "/step-00000012";
  auto resume = [&](const std::string& what) {
    return launch(cfg,
                  {"checkpoint.dir=" + dir, "checkpoint.interval=6", "checkpoint.resume=" + what, "train.steps=18"});
  };
  SUBCASE("5: the newest has no manifest.json") {
    sh("rm " + newest + "/manifest.json");
    const Result bad = resume("latest");
    INFO(bad.out, bad.err);
    CHECK(bad.code == 2);
    CHECK(has(bad.err, newest + " has no manifest.json: the checkpoint is damaged"));
    CHECK(exists(newest + "/trainer_state.json"));  // left as it was
    // Not resuming does not overwrite it either.
    const Result fresh = launch(cfg, {"checkpoint.dir=" + dir, "checkpoint.interval=6"});
    CHECK(fresh.code == 2);
    CHECK(has(fresh.err, "the checkpoint is damaged"));
  }
  SUBCASE("6: a SHARDED checkpoint without index.json") {
    sh("rm " + newest + "/index.json");
    const Result bad = resume(newest);
    INFO(bad.out, bad.err);
    CHECK(bad.code == 2);
    CHECK(has(bad.err, newest + "/index.json is missing; the checkpoint is incomplete"));
    CHECK_FALSE(has(bad.err, "model.safetensors"));
  }
  SUBCASE("7: trainer_state.json contradicts the folder and the data, with matching checksums") {
    nlohmann::json state = nlohmann::json::parse(read_bytes(newest + "/trainer_state.json"));
    state["step"] = 11;
    rewrite_with_manifest(newest, "trainer_state.json", state.dump(2));
    Result bad = resume(newest);
    INFO(bad.out, bad.err);
    CHECK(bad.code == 2);
    CHECK(has(bad.err, "says step 11 but the folder is step-00000012"));
    state["step"] = 12;
    state["loader"]["offset"] = 1000000000000000LL;
    rewrite_with_manifest(newest, "trainer_state.json", state.dump(2));
    bad = resume(newest);
    CHECK(bad.code == 2);
    CHECK(has(bad.err, "the data loader's offset 1000000000000000 lies beyond the data's"));
    CHECK_FALSE(has(bad.out, "step 13/"));
  }
  sh("rm -rf " + dir + " " + cfg);
}

TEST_CASE("cases 8-11: bad data and model files are named with the field, file and position") {
  const std::string cfg = write_config("badinput"), shard = temp_path("big.bin"), model = temp_path("model.json");
  SUBCASE("8: a uint32 id of 2^31 or more") {
    {
      std::ofstream out(shard, std::ios::binary);
      int32_t header[256] = {20240801, 7, 40};
      out.write(reinterpret_cast<const char*>(header), sizeof(header));
      for (uint32_t i = 0; i < 40; ++i) {
        const uint32_t id = i == 17 ? 0x80000001u : i;
        out.write(reinterpret_cast<const char*>(&id), 4);
      }
    }
    const Result r = launch(cfg, {"data.path=" + shard});
    INFO(r.out, r.err);
    CHECK(r.code == 2);
    CHECK(has(r.err, shard + ": token 17 (byte 1092) is id 2147483649"));
    CHECK_FALSE(has(r.err, "index out of range"));
  }
  SUBCASE("9: data.path is a folder") {
    const std::string folder = std::string(FSDP_SOURCE_DIR) + "/lib";
    const Result r = launch(cfg, {"data.path=" + folder});
    INFO(r.out, r.err);
    CHECK(r.code == 2);
    CHECK(has(r.err, "is a folder"));
    CHECK(has(r.err, folder + "/*.txt"));  // a glob of what the folder holds (lib/CMakeLists.txt)
  }
  const std::string tiny = read_bytes(std::string(FSDP_SOURCE_DIR) + "/configs/models/tiny/config.json");
  SUBCASE("10: hidden_size not a multiple of num_attention_heads") {
    nlohmann::json j = nlohmann::json::parse(tiny);
    j.erase("head_dim");
    j["hidden_size"] = 100;
    j["num_attention_heads"] = 3;
    j["num_key_value_heads"] = 3;
    std::ofstream(model) << j.dump(2);
    const Result r = launch(cfg, {"model.config=" + model});
    INFO(r.out, r.err);
    CHECK(r.code == 2);
    CHECK(has(r.err, "hidden_size 100 is not a multiple of num_attention_heads 3"));
  }
  SUBCASE("11: every shape field's range") {
    for (const char* field : {"num_hidden_layers", "vocab_size", "intermediate_size", "num_key_value_heads"}) {
      nlohmann::json j = nlohmann::json::parse(tiny);
      j[field] = -1;
      std::ofstream(model) << j.dump(2);
      const Result r = fsdptrain_in_source({"config", "validate", cfg, "--set", "model.config=" + model});
      INFO(field, r.err);
      CHECK(r.code == 2);
      CHECK(has(r.err, std::string(field) + " is -1; it must be a whole number >= 1"));
      CHECK_FALSE(has(r.err, "has no class"));
    }
  }
  std::remove(shard.c_str());
  std::remove(model.c_str());
  std::remove(cfg.c_str());
}

TEST_CASE("case 13: machine 1 without machine 0 ends at --rdzv_timeout with one message") {
  const Result r = fsdptrain_in_source({"launch", "--cpu", "--distributed_type", "MULTI_CPU", "--num_machines", "2",
                                        "--machine_rank", "1", "--main_process_ip", "127.0.0.1", "--main_process_port",
                                        "1", "--num_processes", "2", "--rdzv_timeout", "5", "--", "/bin/true"});
  INFO(r.out, r.err);
  CHECK(r.code != 0);
  CHECK(has(r.err, "cannot reach the rendezvous at 127.0.0.1:1 within 5 s: nothing accepted a connection there"));
  CHECK_FALSE(has(r.err, "Exception raised from"));
  CHECK_FALSE(has(r.err, "frame #"));
  CHECK_FALSE(has(r.err, "[W"));
}

TEST_CASE("config files: a million unknown keys give 50 lines and a count; loops and folders are named") {
  const std::string big = temp_path("big.yaml"), loop = temp_path("loop.yaml"), folder = temp_path("conf_dir");
  {
    std::ofstream out(big);
    out << "distributed_type: FSDP\n";
    for (int i = 0; i < 100000; ++i) out << "unknown_key_" << i << ": 1\n";
  }
  const Result r = fsdptrain_in_source({"config", "validate", big});
  CHECK(r.code == 2);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') <= 55);
  CHECK(has(r.err, "more errors (the first 50 are listed"));
  CHECK(has(r.err, "errors in the config"));

  sh("rm -rf " + loop + " " + folder + " && ln -s " + loop + " " + loop + " && mkdir " + folder);
  const Result l = fsdptrain_in_source({"config", "validate", loop});
  CHECK(l.code == 2);
  CHECK(has(l.err, "a loop of symbolic links"));
  const Result d = fsdptrain_in_source({"launch", "--config", folder, "--", "/bin/true"});
  CHECK(d.code == 2);
  CHECK(has(d.err, "config file " + folder + " is a folder, not a file"));
  sh("rm -rf " + loop + " " + folder + " " + big);
}

TEST_CASE("issue 28 case 12: a run that crashed between an export and its next checkpoint resumes and re-exports") {
  const std::string cfg = write_config("reexport"), dir = temp_path("reexport_ckpt"), exp = temp_path("reexport_hf");
  sh("rm -rf " + dir + " " + exp);
  const std::vector<std::string> sets{"checkpoint.dir=" + dir, "checkpoint.interval=4", "checkpoint.export_dir=" + exp,
                                      "checkpoint.export_interval=6"};
  // Saves at 4, exports at 6, dies in the save of step 8.
  const Result crashed = launch_with_fault(cfg, sets, {"--fault", "crash", "--at-save", "2", "--after-bytes", "0"});
  INFO(crashed.out, crashed.err);
  REQUIRE(crashed.code != 0);
  REQUIRE(exists(exp + "/step-6/model.safetensors"));
  REQUIRE(exists(dir + "/step-00000004/manifest.json"));
  std::vector<std::string> resume = sets;
  resume.push_back("checkpoint.resume=latest");
  const Result resumed = launch(cfg, resume);
  INFO(resumed.out, resumed.err);
  CHECK(resumed.code == 0);
  CHECK(has(resumed.out, "replaced " + exp + "/step-6, which this run wrote before it stopped"));
  CHECK(exists(exp + "/step-6/fsdptrain_export.json"));
  CHECK(exists(exp + "/step-12/model.safetensors"));
  // Another run's export in the same place is still refused, never replaced.
  const std::string other = write_config("reexport_other"), other_dir = temp_path("reexport_other_ckpt");
  sh("rm -rf " + other_dir);
  std::vector<std::string> theirs{"checkpoint.dir=" + other_dir, "checkpoint.interval=4",
                                  "checkpoint.export_dir=" + exp, "checkpoint.export_interval=6",
                                  "checkpoint.resume=latest"};
  sh("mkdir -p " + other_dir + " && cp -r " + dir + "/step-00000004 " + other_dir + "/");
  const Result refused = launch(other, theirs);
  CHECK(refused.code != 0);
  CHECK(has(refused.err, "already exists; export into a new folder"));
  sh("rm -rf " + dir + " " + exp + " " + other_dir + " " + cfg + " " + other);
}

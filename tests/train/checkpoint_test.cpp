// Checkpoints end to end, through the real launcher and trainer on the tiny Llama: exact resume
// (2N steps against N + save + resume + N, bit for bit) in both formats; resharding 4 -> 2 -> 3 -> 1
// (every tensor, optimizer state included, comes back identical; training continues with the same
// losses), FULL saves with each rank writing its rows in place or sending them to rank 0; a crash in the middle of a
// save leaves the previous checkpoint loadable; truncated, corrupt, incomplete and mismatched checkpoints are refused
// with the reason; keep; merge-weights; pretrained weights loaded with and without cpu_ram_efficient_loading.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "support/train_run.h"

namespace {

using fsdp::testing::copy_of_made_once;
using fsdp::testing::exists;
using fsdp::testing::fsdptrain_in_source;
using fsdp::testing::losses_by_step;
using fsdp::testing::read_bytes;
using fsdp::testing::Result;
using fsdp::testing::run_in_source;
using fsdp::testing::sh;
using fsdp::testing::temp_path;

// The names in a checkpoint folder, sorted.
std::vector<std::string> ckpt_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The tiny model on fsdptrain's own sources; short sequences so a run takes seconds.
std::string write_config(const std::string& name, const std::string& state_dict_type) {
  const std::string path = temp_path(name + ".yaml");
  std::ofstream(path) << "distributed_type: FSDP\nuse_cpu: true\nnum_processes: 2\nmixed_precision: 'no'\n"
                         "fsdp_config:\n  fsdp_version: 2\n  fsdp_state_dict_type: "
                      << state_dict_type
                      << "\nmodel:\n  config: configs/models/tiny/config.json\ndata:\n  path: lib/*/*.cpp\n"
                         "train:\n  steps: 12\n  sequence_length: 32\n  eval_interval: 0\n  eval_batches: 1\n"
                         "optimizer:\n  lr: 3.0e-3\nlogging:\n  interval: 1\n";
  return path;
}

// fsdptrain launch CONFIG on `world` ranks with `batch` sequences each, plus --set overrides.
Result train(const std::string& config, int world, int batch, const std::vector<std::string>& sets) {
  std::vector<std::string> args{"launch",
                                "--config",
                                config,
                                "--main_process_port",
                                "0",
                                "--num_processes",
                                std::to_string(world),
                                "--set",
                                "train.micro_batch_size=" + std::to_string(batch)};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  return fsdptrain_in_source(args);
}

// The same through ckpt_worker (a file system that fails on cue).
Result train_with_fault(const std::string& config, int world, int batch, const std::vector<std::string>& sets,
                        const std::vector<std::string>& fault) {
  std::vector<std::string> args{
      "launch",         "--config", config, "--main_process_port", "0", "--num_processes", std::to_string(world), "--",
      FSDP_CKPT_WORKER, "train",    config};
  std::vector<std::string> all = sets;
  all.push_back("num_processes=" + std::to_string(world));
  all.push_back("train.micro_batch_size=" + std::to_string(batch));
  for (const std::string& s : all) args.insert(args.end(), {"--set", s});
  args.insert(args.end(), fault.begin(), fault.end());
  return fsdptrain_in_source(args);
}

// max_shard_bytes: FULL's Hugging Face shards above this ("" for the default, 5 GB).
Result resave(int world, const std::string& checkpoint, const std::string& out, const std::string& format,
              const std::string& max_shard_bytes = "") {
  std::vector<std::string> args{"launch",
                                "--cpu",
                                "--distributed_type",
                                world > 1 ? "MULTI_CPU" : "NO",
                                "--num_processes",
                                std::to_string(world),
                                "--main_process_port",
                                "0",
                                "--",
                                FSDP_CKPT_WORKER,
                                "resave",
                                "configs/models/tiny/config.json",
                                checkpoint,
                                out,
                                format};
  if (!max_shard_bytes.empty()) args.push_back(max_shard_bytes);
  return fsdptrain_in_source(args);
}

void check_same_losses(const std::map<int64_t, double>& want, const std::map<int64_t, double>& got, int64_t first,
                       int64_t last, double rtol) {
  for (int64_t s = first; s <= last; ++s) {
    INFO("step ", s);
    REQUIRE(want.count(s) == 1);
    REQUIRE(got.count(s) == 1);
    if (rtol == 0)
      CHECK(got.at(s) == want.at(s));
    else
      CHECK(std::abs(got.at(s) - want.at(s)) <= rtol * std::abs(want.at(s)));
  }
  CHECK(got.begin()->first == first);
}

// Trains 4 steps on 2 ranks into a fresh checkpoint.dir `dir`; returns its step-4 checkpoint.
std::string four_step_checkpoint(const std::string& cfg, const std::string& dir) {
  sh("rm -rf " + dir);
  const Result r = train(cfg, 2, 4, {"checkpoint.dir=" + dir, "train.steps=4"});
  INFO(r.out, r.err);
  REQUIRE(r.code == 0);
  return dir + "/step-00000004";
}

}  // namespace

TEST_CASE("a save that finds the last one still writing says how long training waited for it, and why") {
  // A disk that takes 150 ms a write, saves every step: each save waits for the one before.
  const std::string cfg = write_config("slow_disk", "SHARDED_STATE_DICT"), dir = temp_path("slow_disk");
  sh("rm -rf " + dir);
  const Result r = train_with_fault(cfg, 2, 4, {"checkpoint.dir=" + dir, "checkpoint.interval=1", "train.steps=3"},
                                    {"--write-delay-ms", "150"});
  INFO(r.out, r.err);
  REQUIRE(r.code == 0);
  const size_t first = r.out.find("[ckpt] saved " + dir + "/step-00000001");
  const size_t second = r.out.find("[ckpt] saved " + dir + "/step-00000002");
  REQUIRE(first != std::string::npos);
  REQUIRE(second != std::string::npos);
  const std::string first_line = r.out.substr(first, r.out.find('\n', first) - first);
  const std::string second_line = r.out.substr(second, r.out.find('\n', second) - second);
  CHECK(first_line.find("for the last save to finish") == std::string::npos);  // nothing was writing
  CHECK(second_line.find("of it for the last save to finish: saves come faster than the disk takes them; a longer "
                         "checkpoint.interval hides them") != std::string::npos);
  CHECK(exists(dir + "/step-00000003/manifest.json"));
}

TEST_CASE("exact resume: 12 steps equal 6 + save + resume + 6, bit for bit") {
  // engine.read_ahead on: the next step's data is read ahead (as on a GPU), and the checkpoint
  // still records where the steps taken left the data, not where the read-ahead did.
  for (const std::string ahead : {"off", "on"})
    for (const std::string type : {"SHARDED_STATE_DICT", "FULL_STATE_DICT"}) {
      SUBCASE((type + (ahead == "on" ? " with data read ahead" : "")).c_str()) {
        const std::string read_ahead = "engine.read_ahead=" + ahead;
        const std::string cfg = write_config("exact", type), a = temp_path("exact_a"), b = temp_path("exact_b");
        sh("rm -rf " + a + " " + b + " " + a + ".jsonl " + b + ".jsonl && mkdir -p " + b);
        const Result ra =
            train(cfg, 2, 4,
                  {"checkpoint.dir=" + a, "checkpoint.interval=6", "logging.metrics_file=" + a + ".jsonl", read_ahead});
        INFO(ra.out, ra.err);
        REQUIRE(ra.code == 0);
        REQUIRE(exists(a + "/step-00000006/manifest.json"));
        REQUIRE(exists(a + "/step-00000012/manifest.json"));
        // The run stopped after step 6: only that checkpoint exists.
        sh("cp -r " + a + "/step-00000006 " + b + "/");
        const Result rb = train(
            cfg, 2, 4,
            {"checkpoint.dir=" + b, "checkpoint.resume=latest", "logging.metrics_file=" + b + ".jsonl", read_ahead});
        INFO(rb.out, rb.err);
        REQUIRE(rb.code == 0);
        CHECK(rb.out.find("[ckpt] loaded " + b + "/step-00000006 (step 6") != std::string::npos);
        check_same_losses(losses_by_step(a + ".jsonl"), losses_by_step(b + ".jsonl"), 7, 12, 0.0);
        // Parameters and AdamW state at step 12: the same bytes.
        const std::vector<std::string> files =
            type == "FULL_STATE_DICT"
                ? std::vector<std::string>{"model.safetensors", "optimizer.safetensors"}
                : std::vector<std::string>{"shard-00000-of-00002.safetensors", "shard-00001-of-00002.safetensors"};
        for (const std::string& f : files) {
          INFO(f);
          const std::string x = read_bytes(a + "/step-00000012/" + f), y = read_bytes(b + "/step-00000012/" + f);
          CHECK(x.size() > 1000);
          CHECK(x == y);
        }
        sh("rm -rf " + a + " " + b + " " + a + ".jsonl " + b + ".jsonl " + cfg);
      }
    }
}

// Issue 63: resuming with another global batch re-planned the run silently (another step count with
// train.epochs, other learning rates). It is refused, saying what would change, unless asked for.
TEST_CASE("a resume at another global batch says what changes and needs checkpoint.resume_new_batch") {
  const std::string cfg = write_config("batch", "SHARDED_STATE_DICT"), dir = temp_path("batch");
  sh("rm -rf " + dir);
  const Result saved = train(cfg, 2, 4, {"checkpoint.dir=" + dir, "checkpoint.interval=6"});
  INFO(saved.out, saved.err);
  REQUIRE(saved.code == 0);
  sh("rm -rf " + dir + "/step-00000012");
  // 2 ranks x 2 sequences: half the saved run's 8 a step.
  const Result refused = train(cfg, 2, 2, {"checkpoint.dir=" + dir, "checkpoint.resume=latest"});
  CHECK(refused.code != 0);
  CHECK(refused.err.find("was saved by a run of 8 sequences a step; this run's global batch is 4 (2 data-parallel "
                         "ranks x train.micro_batch_size 2 x train.gradient_accumulation_steps 1): each step trains "
                         "on 4 sequences instead of 8") != std::string::npos);
  CHECK(refused.err.find("Set checkpoint.resume_new_batch: true") != std::string::npos);
  const Result taken =
      train(cfg, 2, 2, {"checkpoint.dir=" + dir, "checkpoint.resume=latest", "checkpoint.resume_new_batch=true"});
  INFO(taken.out, taken.err);
  CHECK(taken.code == 0);
  CHECK(taken.out.find("[train] resuming at another global batch (checkpoint.resume_new_batch): each step trains on "
                       "4 sequences instead of 8") != std::string::npos);
  sh("rm -rf " + dir + " " + cfg);
}

// Offloaded, each unit's optimizer update is held until the next forward needs the unit
// (engine.offload_overlap): a save between steps must store the update as if it had been applied at
// the step, and a resume must not have a held update written over what it loaded.
TEST_CASE("offload: updates held until each unit is needed save, resume and train as updates at the step") {
  const std::string cfg = write_config("offload", "SHARDED_STATE_DICT"), a = temp_path("offload_a"),
                    b = temp_path("offload_b"), c = temp_path("offload_c");
  sh("rm -rf " + a + " " + b + " " + c + " " + a + ".jsonl " + b + ".jsonl " + c + ".jsonl && mkdir -p " + b);
  auto run = [&](const std::string& dir, const std::vector<std::string>& more) {
    std::vector<std::string> sets = {"checkpoint.dir=" + dir, "checkpoint.interval=6",
                                     "logging.metrics_file=" + dir + ".jsonl", "fsdp_config.fsdp_offload_params=true"};
    sets.insert(sets.end(), more.begin(), more.end());
    const Result r = train(cfg, 2, 4, sets);
    INFO(r.out, r.err);
    REQUIRE(r.code == 0);
    return r;
  };
  const Result ra = run(a, {});
  const Result rc = run(c, {"engine.offload_overlap=false"});
  // Both ways, the run ends saying what the host's AdamW cost: the floor of an offloaded step.
  for (const Result* r : {&ra, &rc}) {
    const std::regex cost(
        R"(\[train\] offload: AdamW on the host took [0-9.]+ ms an update over (\d+) parameters on rank 0 )"
        R"(\(([0-9.]+) GB/s of the 28 bytes a parameter it reads and writes\))");
    std::smatch m;
    INFO(r->out);
    REQUIRE(std::regex_search(r->out, m, cost));
    CHECK(std::stoll(m[1]) > 1000);  // rank 0's trainable shard of the tiny model
    CHECK(std::stod(m[2]) > 0.0);
  }
  sh("cp -r " + a + "/step-00000006 " + b + "/");
  const Result rb = run(b, {"checkpoint.resume=latest"});
  CHECK(rb.out.find("[ckpt] loaded " + b + "/step-00000006 (step 6") != std::string::npos);
  check_same_losses(losses_by_step(c + ".jsonl"), losses_by_step(a + ".jsonl"), 1, 12, 0.0);
  check_same_losses(losses_by_step(a + ".jsonl"), losses_by_step(b + ".jsonl"), 7, 12, 0.0);
  for (const std::string step : {"step-00000006", "step-00000012"})
    for (const std::string f : {"shard-00000-of-00002.safetensors", "shard-00001-of-00002.safetensors"}) {
      INFO(step, "/", f);
      const std::string x = read_bytes(c + "/" + step + "/" + f);
      CHECK(x.size() > 1000);
      CHECK(read_bytes(a + "/" + step + "/" + f) == x);
      if (step == "step-00000012") CHECK(read_bytes(b + "/" + step + "/" + f) == x);
    }
  sh("rm -rf " + a + " " + b + " " + c + " " + a + ".jsonl " + b + ".jsonl " + c + ".jsonl " + cfg);
}

// Issue 16: shards are read in place; the windows that cross from one shard into the next, the
// permutation and the resume position do not depend on how the data is split into files.
TEST_CASE("exact resume on data in several llm.c shards read in place") {
  const std::string cfg = write_config("shards", "SHARDED_STATE_DICT"), data = temp_path("shards_data"),
                    a = temp_path("shards_a"), b = temp_path("shards_b");
  sh("rm -rf " + data + " " + a + " " + b + " && mkdir -p " + data + " " + b);
  uint32_t state = 12345;
  for (int k = 0; k < 3; ++k) {  // 3 shards of 20001 tokens (uint16), byte-level ids below 257
    std::ofstream out(data + "/part_" + std::to_string(k) + ".bin", std::ios::binary);
    int32_t header[256] = {20240520, 1, 20001};
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    for (int i = 0; i < 20001; ++i) {
      state = state * 1664525u + 1013904223u;
      const uint16_t id = static_cast<uint16_t>((state >> 8) % 257);
      out.write(reinterpret_cast<const char*>(&id), 2);
    }
  }
  const std::vector<std::string> common{"data.path=" + data + "/part_*.bin", "checkpoint.interval=6"};
  auto with = [&](std::vector<std::string> sets, const std::string& dir) {
    sets.insert(sets.end(), common.begin(), common.end());
    sets.insert(sets.end(), {"checkpoint.dir=" + dir, "logging.metrics_file=" + dir + ".jsonl"});
    return sets;
  };
  const Result ra = train(cfg, 2, 4, with({}, a));
  INFO(ra.out, ra.err);
  REQUIRE(ra.code == 0);
  CHECK(ra.out.find("[train] data: 3 files, 60003 tokens") != std::string::npos);
  sh("cp -r " + a + "/step-00000006 " + b + "/");
  const Result rb = train(cfg, 2, 4, with({"checkpoint.resume=latest"}, b));
  INFO(rb.out, rb.err);
  REQUIRE(rb.code == 0);
  check_same_losses(losses_by_step(a + ".jsonl"), losses_by_step(b + ".jsonl"), 7, 12, 0.0);
  sh("rm -rf " + data + " " + a + " " + b + " " + a + ".jsonl " + b + ".jsonl " + cfg);
}

TEST_CASE("resharding 4 -> 2 -> 3 -> 1 keeps every tensor, and training continues with the same losses") {
  const std::string cfg = write_config("reshard", "SHARDED_STATE_DICT"), r4 = temp_path("r4"), r2 = temp_path("r2"),
                    r3 = temp_path("r3"), f1 = temp_path("f1"), f0 = temp_path("f0"), f3 = temp_path("f3"),
                    g2 = temp_path("g2"), s3 = temp_path("s3"), s1 = temp_path("s1");
  const std::string folders =
      r4 + " " + r2 + " " + r3 + " " + f1 + " " + f0 + " " + f3 + " " + g2 + " " + s3 + " " + s1;
  sh("rm -rf " + folders + " " + r4 + "*.jsonl");
  // A global batch of 12 sequences on every world size: 4 x 3, 2 x 6, 3 x 4, 1 x 12.
  const Result ref =
      train(cfg, 4, 3, {"checkpoint.dir=" + r4, "checkpoint.interval=6", "logging.metrics_file=" + r4 + ".jsonl"});
  INFO(ref.out, ref.err);
  REQUIRE(ref.code == 0);
  const std::string step = "/step-00000006";
  for (const auto& [world, from, to, format] : std::vector<std::tuple<int, std::string, std::string, std::string>>{
           {2, r4, r2, "sharded"},
           {3, r2, r3, "sharded"},
           {1, r3, f1, "full"},
           {1, r4, f0, "full"},
           // FULL from 3 ranks writing their rows in place (uneven: 3 does not divide every row
           // count), and from 2 ranks sending them to rank 0
           {3, r4, f3, "full"},
           {2, r4, g2, "full-gathered"}}) {
    const Result r = resave(world, from + step, to, format);
    INFO(from, " -> ", to, r.out, r.err);
    REQUIRE(r.code == 0);
    const bool in_place = r.out.find("(FULL_STATE_DICT, each of " + std::to_string(world) + " ranks wrote its rows)") !=
                          std::string::npos;
    CHECK(in_place == (format == "full" && world > 1));
  }
  CHECK(read_bytes(r2 + step + "/index.json").find("\"world_size\": 2") != std::string::npos);
  CHECK(read_bytes(r3 + step + "/index.json").find("\"world_size\": 3") != std::string::npos);
  // 4 -> 2 -> 3 -> 1 against 4 -> 1, and the FULL saves of 3 and 2 ranks: the same bytes, weights and
  // AdamW state, and the same checksums in the manifests (rows written in place: rank 0 joined the
  // ranks' pieces' checksums).
  const nlohmann::json manifest = nlohmann::json::parse(read_bytes(f0 + step + "/manifest.json"))["files"];
  for (const std::string f : {"model.safetensors", "optimizer.safetensors"}) {
    INFO(f);
    const std::string x = read_bytes(f0 + step + "/" + f);
    CHECK(x.size() > 1000);
    for (const std::string& other : {f1, f3, g2}) {
      INFO(other);
      CHECK(x == read_bytes(other + step + "/" + f));
      CHECK(nlohmann::json::parse(read_bytes(other + step + "/manifest.json"))["files"][f] == manifest[f]);
    }
  }
  CHECK(ckpt_files(f3 + step) == ckpt_files(f0 + step));  // no marker or temporary file left
  // In place into Hugging Face shards of 200 KB (several files and their index), then back to one
  // rank and one file: the bytes of the 4 -> 1 save.
  const Result split = resave(3, r4 + step, s3, "full", "200000");
  INFO(split.out, split.err);
  REQUIRE(split.code == 0);
  CHECK(split.out.find("each of 3 ranks wrote its rows") != std::string::npos);
  CHECK(exists(s3 + step + "/model.safetensors.index.json"));
  CHECK(exists(s3 + step + "/model-00002-of-00003.safetensors"));
  const Result joined = resave(1, s3 + step, s1, "full");
  INFO(joined.out, joined.err);
  REQUIRE(joined.code == 0);
  for (const std::string f : {"model.safetensors", "optimizer.safetensors"})
    CHECK(read_bytes(s1 + step + "/" + f) == read_bytes(f0 + step + "/" + f));
  // Training continues from each: the losses of the 4-rank run, within float tolerance (the
  // reductions add in another order).
  const auto want = losses_by_step(r4 + ".jsonl");
  for (const auto& [world, batch, dir] :
       std::vector<std::tuple<int, int, std::string>>{{2, 6, r2}, {3, 4, r3}, {1, 12, f1}}) {
    const std::string m = dir + ".jsonl";
    const Result r =
        train(cfg, world, batch, {"checkpoint.dir=" + dir, "checkpoint.resume=latest", "logging.metrics_file=" + m});
    INFO("W=", world, r.out, r.err);
    REQUIRE(r.code == 0);
    check_same_losses(want, losses_by_step(m), 7, 12, 1e-5);
  }
  sh("rm -rf " + folders + " " + temp_path("r*.jsonl") + " " + temp_path("f1.jsonl") + " " + cfg);
}

TEST_CASE("a crash in the middle of a save leaves the previous checkpoint, and resuming from it is exact") {
  const std::string cfg = write_config("crash", "SHARDED_STATE_DICT"), dir = temp_path("crash"),
                    ref = temp_path("crash_ref");
  sh("rm -rf " + dir + " " + ref + " " + dir + "*.jsonl " + ref + "*.jsonl");
  const std::vector<std::string> sets{"checkpoint.interval=4"};
  auto with = [&](std::vector<std::string> s, const std::string& d) {
    s.insert(s.end(), {"checkpoint.dir=" + d, "logging.metrics_file=" + d + ".jsonl"});
    return s;
  };
  const Result r = train(cfg, 2, 4, with(sets, ref));
  INFO(r.out, r.err);
  REQUIRE(r.code == 0);

  SUBCASE("the process dies") {
    // Rank 1 dies 2000 bytes into its shard file of the second save (step 8).
    const Result crash = train_with_fault(
        cfg, 2, 4, with(sets, dir), {"--fault", "crash", "--at-save", "2", "--after-bytes", "2000", "--rank", "1"});
    INFO(crash.out, crash.err);
    REQUIRE(crash.code != 0);
    CHECK(crash.err.find("injected crash during save 2") != std::string::npos);
  }
  SUBCASE("a write fails") {
    const Result fail = train_with_fault(
        cfg, 2, 4, with(sets, dir), {"--fault", "error", "--at-save", "2", "--after-bytes", "2000", "--rank", "0"});
    INFO(fail.out, fail.err);
    REQUIRE(fail.code != 0);
    CHECK(fail.err.find("injected I/O error during save 2") != std::string::npos);
  }
  CHECK(exists(dir + "/step-00000004/manifest.json"));
  CHECK_FALSE(exists(dir + "/step-00000008/manifest.json"));
  const Result resumed = train(cfg, 2, 4, with({"checkpoint.interval=4", "checkpoint.resume=latest"}, dir));
  INFO(resumed.out, resumed.err);
  REQUIRE(resumed.code == 0);
  CHECK(resumed.out.find("[ckpt] loaded " + dir + "/step-00000004") != std::string::npos);
  auto got = losses_by_step(dir + ".jsonl");
  for (auto it = got.begin(); it != got.end();)
    it = it->first <= 4 ? got.erase(it) : std::next(it);  // the first attempt's
  check_same_losses(losses_by_step(ref + ".jsonl"), got, 5, 12, 0.0);
  CHECK(read_bytes(dir + "/step-00000012/shard-00000-of-00002.safetensors") ==
        read_bytes(ref + "/step-00000012/shard-00000-of-00002.safetensors"));
  CHECK_FALSE(exists(dir + "/step-00000008.tmp"));  // the cut-off save's folder is cleared by the next save
  sh("rm -rf " + dir + " " + ref + " " + dir + ".jsonl " + ref + ".jsonl " + cfg);
}

// A FULL load: each rank reads its own rows of the same files, and rank 0 joins every rank's
// pieces into each file's checksum; a byte changed in rows only rank 1 reads is found all the same.
TEST_CASE("a FULL checkpoint is read by each rank, its rows, and a changed byte anywhere is refused") {
  const std::string cfg = write_config("full_read", "FULL_STATE_DICT"), dir = temp_path("full_read");
  const std::string ck = four_step_checkpoint(cfg, dir);
  const Result ok = train(cfg, 2, 4, {"checkpoint.dir=" + dir, "checkpoint.resume=" + ck, "train.steps=5"});
  INFO(ok.out, ok.err);
  CHECK(ok.code == 0);
  CHECK(ok.out.find("[ckpt] loaded " + ck) != std::string::npos);
  for (const std::string file : {"model.safetensors", "optimizer.safetensors"}) {  // one trained checkpoint for both
    CAPTURE(file);
    const std::string path = ck + "/" + file;
    sh("cp " + path + " " + path + ".good; size=$(stat -c %s " + path + "); printf '\\x5a' | dd of=" + path +
       " bs=1 seek=$((size - 60)) conv=notrunc status=none");  // the last rows of the last tensor: rank 1's
    const Result bad = train(cfg, 2, 4, {"checkpoint.dir=" + dir, "checkpoint.resume=" + ck, "train.steps=8"});
    INFO(bad.out, bad.err);
    CHECK(bad.code == 2);
    CHECK(bad.err.find(file + " has CRC-32C") != std::string::npos);
    CHECK(bad.err.find("the file is corrupt") != std::string::npos);
    CHECK(bad.out.find("step 5/8") == std::string::npos);
    sh("mv " + path + ".good " + path);
  }
  sh("rm -rf " + dir + " " + cfg);
}

TEST_CASE("damaged, incomplete and mismatched checkpoints are refused before any step, naming the problem") {
  const std::string cfg = write_config("bad", "SHARDED_STATE_DICT"), dir = temp_path("bad");
  copy_of_made_once(dir, [&](const std::string& folder) { four_step_checkpoint(cfg, folder); });
  const std::string ck = dir + "/step-00000004", shard = ck + "/shard-00001-of-00002.safetensors";
  auto resume = [&](const std::string& path, std::vector<std::string> more = {}) {
    more.insert(more.end(), {"checkpoint.resume=" + path, "train.steps=8"});
    return train(cfg, 2, 4, more);
  };
  SUBCASE("a flipped byte") {
    sh("printf '\\x5a' | dd of=" + shard + " bs=1 seek=5000 conv=notrunc status=none");
    const Result bad = resume(ck);
    INFO(bad.out, bad.err);
    CHECK(bad.code == 2);
    CHECK(bad.err.find("shard-00001-of-00002.safetensors has CRC-32C") != std::string::npos);
    CHECK(bad.err.find("the file is corrupt") != std::string::npos);
    CHECK(bad.out.find("step 5/8") == std::string::npos);
  }
  SUBCASE("a flipped byte among the weights, found as the rows are read (checksums in the same pass)") {
    sh("size=$(stat -c %s " + shard + "); printf '\\x5a' | dd of=" + shard +
       " bs=1 seek=$((size - 100)) conv=notrunc status=none");
    const Result bad = resume(ck);
    INFO(bad.out, bad.err);
    CHECK(bad.code == 2);
    CHECK(bad.err.find("shard-00001-of-00002.safetensors has CRC-32C") != std::string::npos);
    CHECK(bad.err.find("the file is corrupt") != std::string::npos);
    CHECK(bad.err.find("another rank refused the checkpoint") != std::string::npos);  // every rank stops
    CHECK(bad.out.find("step 5/8") == std::string::npos);
  }
  SUBCASE("a truncated file") {
    sh("truncate -s 4096 " + shard);
    const Result bad = resume(ck);
    INFO(bad.out, bad.err);
    CHECK(bad.code == 2);
    CHECK(bad.err.find("is 4096 bytes but the manifest records") != std::string::npos);
  }
  SUBCASE("a save that never finished (no manifest)") {
    sh("rm " + ck + "/manifest.json");
    const Result bad = resume(ck);
    INFO(bad.out, bad.err);
    CHECK(bad.code == 2);
    CHECK(bad.err.find("has no manifest.json, so it is not a complete checkpoint") != std::string::npos);
    // A step-N folder (not .tmp) without its manifest is damaged: latest stops there, loudly, and
    // leaves the folder as it is (issue 19: it once resumed from an older one and overwrote it).
    const Result latest = resume("latest", {"checkpoint.dir=" + dir});
    INFO(latest.out, latest.err);
    CHECK(latest.code == 2);
    CHECK(latest.err.find(ck + " has no manifest.json: the checkpoint is damaged") != std::string::npos);
    CHECK(latest.err.find("move the folder away") != std::string::npos);
    CHECK(exists(shard));
  }
  SUBCASE("another model") {
    const std::string other = temp_path("other.json");
    sh("sed 's/\"num_hidden_layers\": 2/\"num_hidden_layers\": 3/' " + std::string(FSDP_SOURCE_DIR) +
       "/configs/models/tiny/config.json > " + other);
    const Result bad = resume(ck, {"model.config=" + other});
    INFO(bad.out, bad.err);
    CHECK(bad.code == 2);
    CHECK(bad.err.find("describes another model than this run's") != std::string::npos);
    std::remove(other.c_str());
  }
  SUBCASE("a Hugging Face folder given as a checkpoint") {
    const std::string hf = temp_path("bad_hf");
    sh("rm -rf " + hf);
    const Result e = train(cfg, 2, 4, {"train.steps=1", "checkpoint.export_dir=" + hf});
    REQUIRE(e.code == 0);
    const Result bad = resume(hf + "/step-1");
    INFO(bad.out, bad.err);
    CHECK(bad.code == 2);
    CHECK(bad.err.find("is a Hugging Face model folder, not a training checkpoint") != std::string::npos);
    CHECK(bad.err.find("model.pretrained") != std::string::npos);
    sh("rm -rf " + hf);
  }
  SUBCASE("other data settings") {
    const Result bad = resume(ck, {"train.sequence_length=48"});
    INFO(bad.out, bad.err);
    CHECK(bad.code == 2);
    CHECK(bad.err.find("was saved with train.sequence_length 32; this run has 48") != std::string::npos);
  }
  sh("rm -rf " + dir + " " + cfg);
}

TEST_CASE("keep deletes older checkpoints; merge-weights gives the exported Hugging Face folder") {
  const std::string cfg = write_config("keep", "SHARDED_STATE_DICT"), dir = temp_path("keep"),
                    hf = temp_path("keep_hf"), merged = temp_path("keep_merged"), split = temp_path("keep_split");
  sh("rm -rf " + dir + " " + hf + " " + merged + " " + split);
  const Result r = train(cfg, 3, 4,
                         {"checkpoint.dir=" + dir, "checkpoint.interval=2", "checkpoint.keep=2", "train.steps=8",
                          "checkpoint.export_dir=" + hf});
  INFO(r.out, r.err);
  REQUIRE(r.code == 0);
  for (int s : {2, 4}) CHECK_FALSE(exists(dir + "/step-0000000" + std::to_string(s) + "/manifest.json"));
  for (int s : {6, 8}) CHECK(exists(dir + "/step-0000000" + std::to_string(s) + "/manifest.json"));
  // The folder holding the checkpoints: its newest is merged.
  const Result m = fsdptrain_in_source({"merge-weights", dir, merged});
  INFO(m.out, m.err);
  REQUIRE(m.code == 0);
  CHECK(m.out.find("the newest checkpoint in " + dir + " is " + dir + "/step-00000008") != std::string::npos);
  CHECK(read_bytes(merged + "/model.safetensors") == read_bytes(hf + "/step-8/model.safetensors"));
  CHECK(read_bytes(merged + "/config.json") == read_bytes(hf + "/step-8/config.json"));
  // Above the size limit: shards and an index, as transformers writes them.
  const Result s = fsdptrain_in_source({"merge-weights", dir + "/step-00000006", split, "--max_shard_size", "200KB"});
  INFO(s.out, s.err);
  REQUIRE(s.code == 0);
  CHECK(exists(split + "/model.safetensors.index.json"));
  CHECK(exists(split + "/model-00001-of-00003.safetensors"));
  const Result again = fsdptrain_in_source({"merge-weights", dir, merged});
  CHECK(again.code == 2);
  CHECK(again.err.find("already exists; give a new output folder") != std::string::npos);
  const Result none = fsdptrain_in_source({"merge-weights", hf, temp_path("nothing")});
  CHECK(none.code == 2);
  CHECK(none.err.find("is neither a checkpoint") != std::string::npos);
  sh("rm -rf " + dir + " " + hf + " " + merged + " " + split + " " + cfg);
}

TEST_CASE("fine-tuning from a Hugging Face folder: the same start with and without cpu_ram_efficient_loading") {
  const std::string cfg = write_config("pre", "FULL_STATE_DICT"), hf = temp_path("pre_hf");
  sh("rm -rf " + hf + " " + hf + "*.jsonl");
  const Result r = train(cfg, 2, 4, {"train.steps=30", "checkpoint.export_dir=" + hf});
  INFO(r.out, r.err);
  REQUIRE(r.code == 0);
  std::map<int64_t, double> first;
  for (const std::string efficient : {"true", "false"}) {
    for (int world : {1, 3}) {
      const std::string m = hf + efficient + std::to_string(world) + ".jsonl";
      const Result f = train(cfg, world, 12 / world,
                             {"model.pretrained=" + hf + "/step-30", "train.steps=2", "logging.metrics_file=" + m,
                              "fsdp_config.fsdp_cpu_ram_efficient_loading=" + efficient});
      INFO(efficient, " W=", world, f.out, f.err);
      REQUIRE(f.code == 0);
      CHECK(f.out.find(efficient == "true" ? "rank 0 read it and sent each rank its rows"
                                           : "each rank read its own rows") != std::string::npos);
      const auto l = losses_by_step(m);
      REQUIRE(l.count(1) == 1);
      if (first.empty()) first = l;
      CHECK(std::abs(l.at(1) - first.at(1)) <= 1e-6 * first.at(1));
    }
  }
  // Started from trained weights: the first loss is well below a fresh model's ln(257) = 5.55.
  CHECK(first.at(1) < 5.0);
  // Import then export on 3 ranks (uneven rows): the same bytes.
  for (const std::string mode : {"efficient", "plain"}) {
    const std::string again = hf + "_again_" + mode;
    const Result x = fsdptrain_in_source({"launch", "--cpu", "--distributed_type", "MULTI_CPU", "--num_processes", "3",
                                          "--main_process_port", "0", "--", FSDP_CKPT_WORKER, "reexport",
                                          hf + "/step-30", again, mode});
    INFO(mode, x.out, x.err);
    REQUIRE(x.code == 0);
    CHECK(read_bytes(again + "/model.safetensors") == read_bytes(hf + "/step-30/model.safetensors"));
    sh("rm -rf " + again);
  }
  sh("rm -rf " + hf + " " + hf + "*.jsonl " + cfg);
}

TEST_CASE("HSDP (2 replicas x 2 shards): one replica writes, and the run continues on 2 ranks of plain FSDP") {
  for (const std::string type : {"SHARDED_STATE_DICT", "FULL_STATE_DICT"}) {
    SUBCASE(type.c_str()) {
      const std::string cfg = write_config("hsdp", type), dir = temp_path("hsdp"), two = temp_path("hsdp_two");
      sh("rm -rf " + dir + " " + two + " " + dir + ".jsonl " + two + ".jsonl && mkdir -p " + two);
      const Result r = train(cfg, 4, 3,
                             {"parallelism_config.parallelism_config_dp_replicate_size=2",
                              "parallelism_config.parallelism_config_dp_shard_size=2", "checkpoint.dir=" + dir,
                              "checkpoint.interval=6", "logging.metrics_file=" + dir + ".jsonl"});
      INFO(r.out, r.err);
      REQUIRE(r.code == 0);
      CHECK(r.out.find("HSDP: 2 replicas x 2 shards") != std::string::npos);
      if (type == "SHARDED_STATE_DICT") {
        CHECK(exists(dir + "/step-00000006/shard-00001-of-00002.safetensors"));
        CHECK_FALSE(exists(dir + "/step-00000006/shard-00002-of-00004.safetensors"));
      }
      sh("cp -r " + dir + "/step-00000006 " + two + "/");
      const Result c = train(
          cfg, 2, 6, {"checkpoint.dir=" + two, "checkpoint.resume=latest", "logging.metrics_file=" + two + ".jsonl"});
      INFO(c.out, c.err);
      REQUIRE(c.code == 0);
      check_same_losses(losses_by_step(dir + ".jsonl"), losses_by_step(two + ".jsonl"), 7, 12, 1e-5);
      sh("rm -rf " + dir + " " + two + " " + dir + ".jsonl " + two + ".jsonl " + cfg);
    }
  }
}

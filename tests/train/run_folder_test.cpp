// Issue 27, what a fine-tuning run leaves behind and says: one run folder named in the first lines,
// run.json written at the start and the end with typed values, a finished run launched again
// changing nothing, a fresh run refused in an earlier run's folder, outputs beside the config from
// any directory, held-out data of its own, epochs, keeping the best checkpoint, the family's layer
// class, and the launch's short output.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "support/train_run.h"

namespace {

using fsdp::testing::ChildProcess;
using fsdp::testing::fsdptrain_in_source;
using fsdp::testing::read_bytes;
using fsdp::testing::Result;
using fsdp::testing::temp_path;
namespace fs = std::filesystem;

const std::string kQuickstart = std::string(FSDP_SOURCE_DIR) + "/configs/quickstart.yaml";

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// `fsdptrain ARGS` run in `dir`.
Result run_in(const std::string& dir, const std::vector<std::string>& args) {
  std::vector<std::string> all{"-c", "cd " + dir + " && exec \"$0\" \"$@\"", FSDP_BINARY};
  all.insert(all.end(), args.begin(), args.end());
  return ChildProcess("/bin/sh", all, {}, {"FSDPTRAIN_CONFIG_FILE", "RANK", "WORLD_SIZE"})
      .wait(std::chrono::seconds(240));
}

// A short quickstart into `out` (4 steps unless `sets` say otherwise), with extra --set values.
Result quick(const std::string& out, const std::vector<std::string>& sets) {
  std::vector<std::string> args{"launch",
                                "--config",
                                kQuickstart,
                                "--main_process_port",
                                "0",
                                "--set",
                                "train.eval_interval=0",
                                "--set",
                                "train.output_dir=" + out};
  const bool counted = std::any_of(sets.begin(), sets.end(), [](const std::string& s) {
    return s.rfind("train.steps=", 0) == 0 || s.rfind("train.epochs=", 0) == 0;
  });
  if (!counted) args.insert(args.end(), {"--set", "train.steps=4"});
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  return fsdptrain_in_source(args);
}

std::string str_step(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_bytes(path));
}

size_t files_in(const std::string& dir) {
  if (!fs::exists(dir)) return 0;
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

std::string write_text(const std::string& path, size_t bytes) {
  std::string text;
  for (size_t i = 0; text.size() < bytes; ++i) text += "line " + std::to_string(i % 97) + " of the text\n";
  text.resize(bytes);
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("a run writes everything under one run folder; run.json says it finished, with typed values") {
  const std::string out = temp_path("folder");
  const Result r = quick(out, {});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(has(r.out, "[train] run folder: " + out + " (run.json there holds the resolved config"));
  CHECK(has(r.out, "# runs as: FSDP2"));
  CHECK_FALSE(has(r.out, "fsdp_config.fsdp_version"));  // the table only with --verbose
  for (const char* part :
       {"/run.json", "/metrics.jsonl", "/tensorboard", "/checkpoints/step-00000004", "/export/step-4/config.json"})
    CHECK_MESSAGE(fs::exists(out + part), std::string(out + part));
  const nlohmann::json j = read_json(out + "/run.json");
  CHECK(j["finished"] == true);
  CHECK(j["steps"] == 4);
  CHECK(j["export"] == out + "/export/step-4");
  CHECK(j["config"]["train.steps"] == 4);  // numbers and booleans as such, not strings
  CHECK(j["config"]["use_cpu"] == true);
  CHECK(j["config"]["optimizer.lr"].is_number_float());
  CHECK(j["config"]["train.output_dir"] == out);

  // Launched again as it was: refused, naming the finished run and the ways on; nothing changes.
  const std::string before = read_bytes(out + "/run.json");
  const size_t events = files_in(out + "/tensorboard");
  const Result again = quick(out, {});
  CHECK(again.code == 2);
  CHECK(has(again.err, "train.output_dir " + out + " holds a finished run (4 steps)"));
  CHECK(has(again.err, "--set checkpoint.resume=latest (raising train.steps)"));
  CHECK(read_bytes(out + "/run.json") == before);
  // With resume: latest, a finished run has nothing to do: it says so, exits 0 and writes nothing.
  const Result resumed = quick(out, {"checkpoint.resume=latest"});
  CHECK_MESSAGE(resumed.code == 0, resumed.err);
  CHECK(has(resumed.out, "nothing to do: the checkpoint is at step 4 and this run has 4 steps"));
  CHECK(read_bytes(out + "/run.json") == before);
  CHECK(files_in(out + "/tensorboard") == events);
  // Raising train.steps continues it; run.json then says 6 steps.
  const Result more = quick(out, {"checkpoint.resume=latest", "train.steps=6"});
  REQUIRE_MESSAGE(more.code == 0, more.err);
  CHECK(read_json(out + "/run.json")["steps"] == 6);
  CHECK(read_json(out + "/run.json")["resumed_from"] == 4);
}

TEST_CASE("outputs in a config file resolve beside it, whatever directory the launch runs in") {
  const std::string dir = temp_path("beside");
  fs::create_directories(dir + "/cfg");
  fs::create_directories(dir + "/elsewhere");
  std::string yaml = read_bytes(kQuickstart);
  yaml.replace(yaml.find("path: ../lib/*/*.cpp"), 20, "path: " + std::string(FSDP_SOURCE_DIR) + "/lib/*/*.cpp");
  yaml.replace(yaml.find("config: models/tiny/config.json"), 31,
               "config: " + std::string(FSDP_SOURCE_DIR) + "/configs/models/tiny/config.json");
  yaml.replace(yaml.find("output_dir: ../runs/quickstart"), 30, "output_dir: run");
  std::ofstream(dir + "/cfg/q.yaml") << yaml;
  const Result r = run_in(dir + "/elsewhere", {"launch", "--config", "../cfg/q.yaml", "--main_process_port", "0",
                                               "--set", "train.steps=2", "--set", "train.eval_interval=0"});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(fs::exists(dir + "/cfg/run/run.json"));
  CHECK(fs::exists(dir + "/cfg/run/checkpoints/step-00000002"));
  CHECK_FALSE(fs::exists(dir + "/elsewhere/run"));
  // The resume from there finds the checkpoints beside the config.
  const Result resumed = run_in(
      dir + "/elsewhere", {"launch", "--config", "../cfg/q.yaml", "--main_process_port", "0", "--set", "train.steps=3",
                           "--set", "train.eval_interval=0", "--set", "checkpoint.resume=latest"});
  REQUIRE_MESSAGE(resumed.code == 0, resumed.err);
  CHECK(has(resumed.out, "loaded " + dir + "/cfg/run/checkpoints/step-00000002"));
}

TEST_CASE("held-out data of its own, epochs instead of steps, and no export is said aloud") {
  const std::string dir = temp_path("epochs");
  fs::create_directories(dir);
  const std::string train = write_text(dir + "/train.txt", 16 * 40), held = write_text(dir + "/held.txt", 16 * 6);
  const Result r = quick(dir + "/run", {"data.path=" + train, "data.eval_path=" + held, "train.sequence_length=16",
                                        "train.micro_batch_size=4", "train.epochs=2", "checkpoint.export_dir=none"});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(has(r.out, "40 training and 6 held-out sequences of 16 tokens (held out: data.eval_path)"));
  CHECK(has(r.out, "2 epochs are 10 steps of 8 sequences"));
  CHECK(has(r.err, "checkpoint.export_dir is off: this run leaves training checkpoints in " + dir +
                       "/run/checkpoints but no Hugging Face folder"));
  const nlohmann::json j = read_json(dir + "/run/run.json");
  CHECK(j["steps"] == 10);
  CHECK(j["final_eval_loss"].is_number());
  CHECK(j["export"].is_null());
  CHECK_FALSE(fs::exists(dir + "/run/export"));
  // One held-out sequence on two ranks is evaluated (it once said "1 held-out" and then "nothing
  // held out": each rank needed a whole batch of its own).
  const Result one = quick(dir + "/one", {"data.path=" + write_text(dir + "/thirty.txt", 16 * 30),
                                          "train.sequence_length=16", "data.eval_fraction=0.01"});
  REQUIRE_MESSAGE(one.code == 0, one.err);
  CHECK(has(one.out, "29 training and 1 held-out sequences of 16 tokens"));
  CHECK(has(one.out, "; held-out loss "));
  CHECK_FALSE(has(one.out, "nothing held out"));
  // Both set: one is refused.
  const Result both = quick(dir + "/run2", {"train.epochs=2", "train.steps=4"});
  CHECK(both.code == 2);
  CHECK(has(both.err, "train.epochs: and train.steps are both set"));
}

TEST_CASE("checkpoint.keep_best keeps the checkpoint with the lowest held-out loss besides the newest") {
  const std::string out = temp_path("best");
  const Result r =
      quick(out, {"train.steps=8", "checkpoint.interval=2", "checkpoint.keep=1", "checkpoint.keep_best=true",
                  "optimizer.lr=0.3", "data.eval_fraction=0.01", "train.eval_batches=2"});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  // The held-out loss of every saved step, from the metrics; the lowest wins (the earliest of equals).
  std::map<int64_t, double> eval;
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("eval_loss")) eval[j["step"].get<int64_t>()] = j["eval_loss"].get<double>();
  }
  REQUIRE(eval.size() == 4);  // steps 2, 4, 6, 8: every save is judged
  int64_t best = eval.begin()->first;
  for (const auto& [step, loss] : eval)
    if (loss < eval[best]) best = step;
  std::set<std::string> kept;
  for (const auto& e : fs::directory_iterator(out + "/checkpoints"))
    if (e.path().filename().string().rfind("step-", 0) == 0) kept.insert(e.path().filename().string());
  std::set<std::string> want{"step-00000008", str_step(best)};
  CHECK(kept == want);
  const nlohmann::json state = read_json(out + "/checkpoints/" + str_step(best) + "/trainer_state.json");
  CHECK(state["eval_loss"].get<double>() == doctest::Approx(eval[best]));
  const std::string best_path = out + "/checkpoints/" + str_step(best);
  CHECK(read_json(out + "/run.json")["best_checkpoint"].get<std::string>() == best_path);
  // Nothing held out: refused before anything runs.
  const Result none =
      quick(temp_path("best2"), {"checkpoint.keep=1", "checkpoint.keep_best=true", "data.eval_fraction=0"});
  CHECK(none.code == 2);
  CHECK(has(none.err, "checkpoint.keep_best: is true but nothing is held out"));
}

TEST_CASE("the layer class defaults to the family's, a class the model lacks is refused by config validate") {
  const std::string qwen = "model.config=configs/models/qwen2.5-0.5b/config.json";
  const Result bad = fsdptrain_in_source({"config", "validate", kQuickstart, "--set", qwen, "--set",
                                          "fsdp_config.fsdp_transformer_layer_cls_to_wrap=LlamaDecoderLayer"});
  CHECK(bad.code == 2);
  CHECK(has(bad.err,
            "is a Qwen2ForCausalLM model, with no class \"LlamaDecoderLayer\"; its classes (transformers' "
            "names): "));
  // transformers' names for the family, not fsdptrain's own module names.
  for (const char* c : {"Qwen2DecoderLayer", "Qwen2Attention", "Qwen2MLP", "Qwen2RMSNorm", "Embedding", "Linear"})
    CHECK_MESSAGE(has(bad.err, c), c);
  CHECK_FALSE(has(bad.err, "LlamaMLP"));
  CHECK_FALSE(has(bad.err, "torch::nn::LinearImpl"));
  const Result theirs = fsdptrain_in_source({"config", "validate", kQuickstart, "--set", qwen, "--set",
                                             "fsdp_config.fsdp_transformer_layer_cls_to_wrap=Qwen2DecoderLayer"});
  CHECK_FALSE(has(theirs.err, "fsdp_transformer_layer_cls_to_wrap"));  // accepted (the byte data is refused next)
  CHECK(has(bad.err, "Leave the key empty for its decoder layer (Qwen2DecoderLayer)"));
  // A config's positional file, as config validate takes it, for show too.
  const Result show = fsdptrain_in_source({"config", "show", kQuickstart});
  CHECK(show.code == 0);
  CHECK(has(show.out, "# config: " + kQuickstart));
}

TEST_CASE("the launch says little: the table with --verbose, and a GPU config on a machine without one is said") {
  const std::string out = temp_path("verbose");
  const Result r = fsdptrain_in_source({"launch", "--verbose", "--config", kQuickstart, "--main_process_port", "0",
                                        "--set", "train.steps=1", "--set", "train.eval_interval=0", "--set",
                                        "train.output_dir=" + out, "--set", "use_cpu=false", "--set",
                                        "train.sequence_length=64", "--"});  // nothing after `--`: the trainer
  if (r.code == 0) {  // a machine with no GPU trains on its CPU, saying so
    CHECK(has(r.out, "fsdp_config.fsdp_version"));
    CHECK(has(r.out, "the config asks for GPUs (use_cpu is false), but this machine shows none"));
  } else {
    CHECK_MESSAGE(has(r.err, "GPU"), r.err);  // a GPU machine: other rules apply
  }
  // Positions past the config's in a model trained from scratch: learned, and said (a pretrained
  // model is refused: finetune_test).
  const Result far = quick(temp_path("far"), {"train.sequence_length=512", "train.steps=1"});
  CHECK_MESSAGE(far.code == 0, far.err);
  CHECK(has(far.out, "warning: train.sequence_length 512 is beyond max_position_embeddings 256"));
}

// The trainer end to end through the CLI: `fsdptrain launch --config configs/quickstart.yaml` with
// overrides. The same global batch on 1 or 2 workers gives the same loss curve; the quickstart's
// loss falls; bad input stops the run before any worker trains, with the key and the fix.
#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "support/train_run.h"

namespace {

using fsdp::testing::fsdptrain_in_source;
using fsdp::testing::losses;
using fsdp::testing::Result;
using fsdp::testing::temp_path;

const std::string kQuickstart = std::string(FSDP_SOURCE_DIR) + "/configs/quickstart.yaml";

// The quickstart without its logs (the user's runs/quickstart stays theirs); a test sets its own.
Result launch_with(const std::vector<std::string>& args) {
  std::vector<std::string> all{"launch",
                               "--config",
                               kQuickstart,
                               "--main_process_port",
                               "0",
                               "--set",
                               "logging.metrics_file=",
                               "--set",
                               "logging.tensorboard_dir=",
                               "--set",
                               "checkpoint.export_dir="};
  all.insert(all.end(), args.begin(), args.end());
  return fsdptrain_in_source(all);
}

}  // namespace

TEST_CASE("the same global batch on 1 and 2 workers gives the same loss curve") {
  const std::string one = temp_path("w1.jsonl"), two = temp_path("w2.jsonl");
  std::remove(one.c_str());
  std::remove(two.c_str());
  const std::vector<std::string> common{"--set", "train.steps=12",     "--set", "train.sequence_length=32",
                                        "--set", "logging.interval=1", "--set", "train.eval_interval=0"};
  std::vector<std::string> a = common, b = common;
  a.insert(a.end(),
           {"--num_processes", "1", "--set", "train.micro_batch_size=8", "--set", "logging.metrics_file=" + one});
  b.insert(b.end(),
           {"--num_processes", "2", "--set", "train.micro_batch_size=4", "--set", "logging.metrics_file=" + two});
  const Result ra = launch_with(a), rb = launch_with(b);
  INFO(ra.out, ra.err, rb.out, rb.err);
  REQUIRE(ra.code == 0);
  REQUIRE(rb.code == 0);
  const auto la = losses(one), lb = losses(two);
  REQUIRE(la.size() == 12);
  REQUIRE(lb.size() == 12);
  for (size_t i = 0; i < la.size(); ++i) CHECK(std::abs(la[i] - lb[i]) <= 1e-4 * std::abs(la[i]));
  CHECK(la.back() < la.front());
  std::remove(one.c_str());
  std::remove(two.c_str());
}

TEST_CASE("the quickstart trains: the loss falls well below its start") {
  const std::string m = temp_path("quick.jsonl");
  std::remove(m.c_str());
  const Result r = launch_with({"--set", "train.steps=200", "--set", "logging.metrics_file=" + m});
  INFO(r.out, r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("[rank 0] [train] done: 200 steps") != std::string::npos);
  CHECK(r.out.find("# runs as: FSDP2, reshard_after_forward=true, sharded over 2 ranks") != std::string::npos);
  const auto l = losses(m);
  REQUIRE(l.size() >= 2);
  CHECK(l.front() > 5.0);  // ln(257) = 5.55: an untrained byte model
  CHECK(l.back() < l.front() - 2.0);
  std::remove(m.c_str());
}

TEST_CASE("bad training input stops the run with the key and the fix") {
  // Issue 63: Trainer's name for activation checkpointing, set against ours, contradicts it.
  const Result both = launch_with(
      {"--set", "model.gradient_checkpointing=true", "--set", "fsdp_config.fsdp_activation_checkpointing=false"});
  CHECK(both.code == 2);
  CHECK(both.err.find("model.gradient_checkpointing: is true and fsdp_config.fsdp_activation_checkpointing false") !=
        std::string::npos);
  // Checked by the launcher before any worker starts: one error, not one per rank.
  const Result data = launch_with({"--set", "data.path=no/such/*.txt"});
  CHECK(data.code == 2);
  const std::string all = data.out + data.err;
  CHECK(all.find("data.path: matches no file at \"no/such/*.txt\"") != std::string::npos);
  CHECK(all.find("matches no file") == all.rfind("matches no file"));
  CHECK(all.find("[rank") == std::string::npos);
  const Result model = launch_with({"--set", "model.config=configs/models/none/config.json"});
  CHECK(model.code == 2);
  CHECK(model.err.find("model.config: no file at \"configs/models/none/config.json\"") != std::string::npos);
  CHECK(model.err.find("[rank") == std::string::npos);
  const Result folder = launch_with({"--set", "data.path=lib"});
  CHECK(folder.code == 2);
  // The hint's glob names what the folder holds (lib/CMakeLists.txt: text).
  CHECK(folder.err.find("\"lib\" is a folder (hint: a glob such as lib/*.txt reads the files in it)") !=
        std::string::npos);
  const Result lr = launch_with({"--set", "optimizer.lr=-1"});
  CHECK(lr.code == 2);
  CHECK(lr.err.find("optimizer.lr") != std::string::npos);
}

TEST_CASE("progress lines are drawn only on a terminal: a pipe gets the other lines only") {
  const Result r =
      fsdp::testing::ChildProcess(
          FSDP_BINARY,
          {"launch", "--cpu", "--distributed_type", "MULTI_CPU", "--num_processes", "1", "--main_process_port", "0",
           "--", "/bin/sh", "-c", "printf 'FSDPTRAIN_PROGRESS\\tbar %s\\nplain %s\\n' $FSDPTRAIN_PROGRESS x"},
          {}, {"FSDPTRAIN_CONFIG_FILE", "RANK", "WORLD_SIZE"})
          .wait();
  INFO(r.out, r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find("[rank 0] plain x") != std::string::npos);
  CHECK(r.out.find("bar") == std::string::npos);
}

TEST_CASE("a NaN stops the run naming the step, or is skipped when asked") {
  const std::vector<std::string> blow_up{"--set", "optimizer.lr=1e30",       "--set", "optimizer.grad_clip=0",
                                         "--set", "schedule.warmup_steps=0", "--set", "train.steps=6",
                                         "--set", "train.sequence_length=32"};
  const Result stop = launch_with(blow_up);  // step 2 is read while step 3 runs: reported late, but named
  CHECK(stop.code == 1);
  CHECK((stop.out + stop.err).find("nan at step 2; lower optimizer.lr") != std::string::npos);
  // A step that saves is read at once: the NaN stops the run before a checkpoint of it exists.
  const std::string dir = temp_path("nan_ckpt");
  (void)!std::system(("rm -rf " + dir).c_str());
  std::vector<std::string> saving = blow_up;
  saving.insert(saving.end(), {"--set", "checkpoint.dir=" + dir, "--set", "checkpoint.interval=1"});
  const Result saved = launch_with(saving);
  INFO(saved.out, saved.err);
  CHECK(saved.code == 1);
  CHECK((saved.out + saved.err).find("nan at step 2; lower optimizer.lr") != std::string::npos);
  CHECK(::access((dir + "/step-00000001/index.json").c_str(), F_OK) == 0);
  CHECK(::access((dir + "/step-00000002").c_str(), F_OK) != 0);
  (void)!std::system(("rm -rf " + dir).c_str());
  std::vector<std::string> skip = blow_up;
  skip.insert(skip.end(), {"--set", "train.skip_nonfinite_loss=true"});
  const Result skipped = launch_with(skip);
  INFO(skipped.out, skipped.err);
  CHECK(skipped.code == 0);
  CHECK(skipped.out.find("step skipped (train.skip_nonfinite_loss)") != std::string::npos);
}

TEST_CASE("--profile writes one Chrome trace per rank of the window's steps, with the FSDP phases named") {
  const std::string dir = temp_path("profile");
  (void)!std::system(("rm -rf " + dir).c_str());
  const Result r = launch_with({"--num_processes", "2", "--set", "train.steps=5", "--set", "train.sequence_length=32",
                                "--set", "logging.profile_steps=[2, 3]", "--set", "logging.profile_dir=" + dir});
  INFO(r.out, r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("profiled steps 2-3: " + dir + "/rank0.steps-2-3.json") != std::string::npos);
  CHECK((r.out + r.err).find("gpuGetDeviceCount") == std::string::npos);  // no GPU is no error
  for (int rank : {0, 1}) {
    std::ifstream in(dir + "/rank" + std::to_string(rank) + ".steps-2-3.json");
    REQUIRE(in.good());
    const nlohmann::json trace = nlohmann::json::parse(in);  // throws unless it is JSON
    std::set<std::string> names;
    for (const auto& e : trace.at("traceEvents"))
      if (e.contains("name") && e.value("cat", "") == "user_annotation") names.insert(e["name"].get<std::string>());
    INFO(rank);
    for (const char* range : {"step 2", "step 3", "data", "forward micro-batch 0", "backward micro-batch 0",
                              "fsdp gather model.layers.0", "fsdp wait gather model.layers.0",
                              "fsdp reduce model.layers.1", "fsdp finish reduce <root>", "grad norm", "optimizer"}) {
      INFO(range);
      CHECK(names.count(range) == 1);
    }
    CHECK(names.count("step 1") == 0);  // only the window
    CHECK(names.count("step 4") == 0);
    bool collective = false;
    for (const std::string& n : names) collective = collective || n.rfind("gloo reduce_scatter ", 0) == 0;
    CHECK(collective);
  }
  const Result late = launch_with({"--set", "train.steps=5", "--set", "logging.profile_steps=4,6"});
  CHECK(late.code != 0);
  CHECK(late.err.find("logging.profile_steps: [4, 6] goes past the run's last step (train.steps is 5)") !=
        std::string::npos);
  (void)!std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("a run exports a Hugging Face folder, and a second run starts from it") {
  const std::string dir = temp_path("export");
  (void)!std::system(("rm -rf " + dir).c_str());
  const std::string first = temp_path("first.jsonl"), second = temp_path("second.jsonl");
  std::remove(first.c_str());
  std::remove(second.c_str());
  const std::vector<std::string> common{"--set", "train.sequence_length=32", "--set", "logging.interval=1",
                                        "--set", "train.eval_interval=0"};
  std::vector<std::string> a = common, b = common;
  a.insert(a.end(), {"--set", "train.steps=60", "--set", "checkpoint.export_dir=" + dir, "--set",
                     "checkpoint.export_interval=30", "--set", "logging.metrics_file=" + first});
  const Result ra = launch_with(a);
  INFO(ra.out, ra.err);
  REQUIRE(ra.code == 0);
  for (const std::string step : {"step-30", "step-60"}) {
    CHECK(std::ifstream(dir + "/" + step + "/config.json").good());
    CHECK(std::ifstream(dir + "/" + step + "/model.safetensors").good());
  }
  b.insert(b.end(), {"--set", "train.steps=2", "--set", "model.pretrained=" + dir + "/step-60", "--set",
                     "logging.metrics_file=" + second});
  const Result rb = launch_with(b);
  INFO(rb.out, rb.err);
  REQUIRE(rb.code == 0);
  const auto la = losses(first), lb = losses(second);
  REQUIRE(la.size() == 60);
  REQUIRE(lb.size() == 2);
  CHECK(lb.front() < la.front() - 1.0);  // it starts trained, not from random weights
  // A folder that does not fit model.config is refused with the list of mismatches (the data: a
  // token shard, since text needs a tokenizer for this vocabulary).
  const std::string shard = temp_path("tokens.bin");
  {
    int32_t header[256] = {20240520, 1, 4096};
    std::ofstream f(shard, std::ios::binary);
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
    for (uint16_t t = 0; t < 4096; ++t) f.write(reinterpret_cast<const char*>(&t), 2);
  }
  const Result bad = launch_with({"--set", "model.config=configs/models/llama-125m/config.json", "--set",
                                  "model.pretrained=" + dir + "/step-60", "--set", "data.path=" + shard});
  std::remove(shard.c_str());
  CHECK(bad.code == 2);
  CHECK((bad.out + bad.err).find("does not match the model") != std::string::npos);
  (void)!std::system(("rm -rf " + dir).c_str());
}

namespace {

// What each rank of W holds of the quickstart's model (configs/models/tiny/config.json), computed here
// from the shapes and torch.chunk's rule: every parameter's dim 0 padded to a multiple of W, 4 bytes
// an element. Independent of fsdptrain's arithmetic.
double expected_shard_bytes(int w) {
  const nlohmann::json c =
      nlohmann::json::parse(std::ifstream(std::string(FSDP_SOURCE_DIR) + "/configs/models/tiny/config.json"));
  const int64_t V = c["vocab_size"], C = c["hidden_size"], F = c["intermediate_size"], L = c["num_hidden_layers"];
  const int64_t H = c["num_attention_heads"], K = c["num_key_value_heads"], D = c["head_dim"];
  std::vector<std::pair<int64_t, int64_t>> shapes{{V, C}, {C, 1}, {V, C}};  // embedding, final norm, head
  for (int64_t l = 0; l < L; ++l)
    for (auto s : std::vector<std::pair<int64_t, int64_t>>{
             {H * D, C}, {K * D, C}, {K * D, C}, {C, H * D}, {F, C}, {F, C}, {C, F}, {C, 1}, {C, 1}})
      shapes.push_back(s);
  int64_t elements = 0;
  for (const auto& [rows, row] : shapes) elements += (rows + w - 1) / w * row;
  return 4.0 * static_cast<double>(elements);
}

// "242.1 KiB" -> bytes
double parse_size(const std::string& text) {
  const double n = std::stod(text);
  for (const auto& [unit, scale] :
       std::vector<std::pair<std::string, double>>{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}})
    if (text.find(unit) != std::string::npos) return n * scale;
  return -1;
}

}  // namespace

namespace {

// The value printed after `label` in an estimate-memory report ("1.5 MiB"): its first two words.
std::string after(const std::string& s, const std::string& label) {
  const size_t a = s.find(label);
  if (a == std::string::npos) return std::string("(missing ") + label + ")";
  const size_t first = s.find_first_not_of(' ', a + label.size());
  return s.substr(first, s.find_first_of(" \n", s.find(' ', first) + 1) - first);
}

}  // namespace

TEST_CASE("estimate-memory's persistent rows and the run's report equal the sharded sizes") {
  for (const std::string w : {"2", "3"}) {
    const Result est = fsdptrain_in_source({"estimate-memory", "--config", kQuickstart, "--num_processes", w});
    INFO(est.out, est.err);
    REQUIRE(est.code == 0);
    const Result run =
        launch_with({"--num_processes", w, "--set", "train.steps=1", "--set", "train.sequence_length=32"});
    INFO(run.out);
    REQUIRE(run.code == 0);
    // "[train] model: ... per rank 242.1 KiB of fp32 shards + 242.1 KiB of gradients + 484.2 KiB of AdamW state"
    auto between = [](const std::string& s, const std::string& before, const std::string& after) {
      const size_t a = s.find(before);
      if (a == std::string::npos) return std::string("(missing ") + before + ")";
      const size_t b = s.find(after, a + before.size());
      return s.substr(a + before.size(), b - a - before.size());
    };
    const std::string params = between(run.out, "per rank ", " of fp32 shards");
    const std::string grads = between(run.out, "fp32 shards + ", " of gradients");
    const std::string adamw = between(run.out, "gradients + ", " of AdamW state");
    auto row = [&](const std::string& label) {
      const std::string line = between(est.out, label, "\n");
      const size_t first = line.find_first_not_of(' ');
      return line.substr(first, line.find("  ", first) - first);
    };
    CHECK(row("parameters (fp32 shards)") == params);
    CHECK(row("gradients (fp32 shards)") == grads);
    CHECK(row("AdamW state (2 x fp32)") == adamw);
    // Both print one decimal: within half a tenth of the unit (and a byte of float slack) of the shapes' sum.
    const double want = expected_shard_bytes(std::stoi(w));
    INFO("W=", w, ": ", want, " bytes of shards expected");
    CHECK(std::abs(parse_size(params) - want) <= 0.05 * 1024 + 1);
    CHECK(std::abs(parse_size(grads) - want) <= 0.05 * 1024 + 1);
    CHECK(std::abs(parse_size(adamw) - 2 * want) <= 0.05 * 1024 + 1);
  }
}

TEST_CASE("estimate-memory with offload: the weights kept on the device in bf16 are counted there") {
  auto estimate = [](const std::string& keep) {
    const Result r = fsdptrain_in_source({"estimate-memory", "--config", kQuickstart, "--num_processes", "2", "--set",
                                          "fsdp_config.fsdp_offload_params=true", "--set", "mixed_precision=bf16",
                                          "--set", "engine.offload_keep_on_device=" + keep, "--set",
                                          "train.micro_batch_size=1", "--set", "train.sequence_length=8"});
    INFO(r.out, r.err);
    REQUIRE(r.code == 0);
    return r.out;
  };
  const std::string kept = estimate("true"), uploaded = estimate("false");
  INFO(kept, uploaded);
  // Half the fp32 shards' bytes (2 of 4 a parameter), on top of what offload without them keeps.
  const double shards = parse_size(after(kept, "parameters (fp32 shards)"));
  const double on_device = parse_size(after(kept, "shards kept on the device (bf16)"));
  CHECK(on_device == doctest::Approx(shards / 2).epsilon(0.02));
  CHECK(uploaded.find("shards kept on the device") == std::string::npos);
  CHECK(parse_size(after(kept, "total on the device (as configured)")) ==
        doctest::Approx(parse_size(after(uploaded, "total on the device (as configured)")) + on_device).epsilon(0.002));
}

TEST_CASE("estimate-memory with partial resharding: the post-forward shares and backward's smaller gathers") {
  auto estimate = [](const std::string& reshard) {
    const Result r = fsdptrain_in_source({"estimate-memory", "--config", kQuickstart, "--num_processes", "4", "--set",
                                          "fsdp_config.fsdp_reshard_after_forward=" + reshard});
    INFO(r.out, r.err);
    REQUIRE(r.code == 0);
    return r.out;
  };
  const std::string partial = estimate("2"), whole = estimate("true");
  INFO(partial, whole);
  CHECK(whole.find("post-forward") == std::string::npos);
  CHECK(partial.find("inside groups of 2 ranks") != std::string::npos);
  // Over 2 ranks a rank receives half of each layer in backward: exactly the half it kept after forward.
  const std::string kept = after(partial, "post-forward shares (1/2 of each layer)");
  CHECK(kept == after(partial, "backward's"));
  CHECK(after(partial, "forward's all-gathers") == after(whole, "forward's all-gathers"));
  // Over all 4 it receives three quarters: 1.5 times as much.
  CHECK(parse_size(after(whole, "backward's")) / parse_size(kept) == doctest::Approx(1.5).epsilon(0.01));
}

TEST_CASE("estimate-memory under context parallel: activations at 1/cp, allgather's K/V on top, the ring's bytes") {
  auto estimate = [](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"estimate-memory", "--config", kQuickstart, "--num_processes", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = fsdptrain_in_source(args);
    INFO(r.out, r.err);
    REQUIRE(r.code == 0);
    return r.out;
  };
  const std::string dp = estimate({});
  const std::string ring =
      estimate({"--parallelism_config_cp_size", "2", "--parallelism_config_cp_comm_strategy", "alltoall"});
  const std::string gather = estimate({"--parallelism_config_cp_size", "2"});
  INFO(dp, ring, gather);
  CHECK(ring.find("context parallel 2, alltoall: each rank holds 1/2 of every sequence") != std::string::npos);
  const double whole = parse_size(after(dp, "activations (one micro-batch)"));
  const double halved = parse_size(after(ring, "activations (one micro-batch)"));
  CHECK(halved <= 0.55 * whole);  // half the tokens; the head's gradient is not split
  CHECK(parse_size(after(gather, "activations (one micro-batch)")) > halved);  // the gathered K/V kept
  // fp32 at cp 2: allgather sends K/V once and their gradients once; the ring sends K/V once each way
  // and their gradients twice: 2 x the bytes.
  CHECK(parse_size(after(ring, "context parallel's K/V")) ==
        doctest::Approx(2 * parse_size(after(gather, "context parallel's K/V"))).epsilon(0.01));
}

// A sliding window shorter than a chunk: allgather exchanges and keeps only the keys a rank's queries
// see, at cp 4 the last 3 of 2 of the 6 other chunks of 16 (a window of 4), a sixteenth of the K/V bytes; a
// window longer than the sequence sees every chunk.
TEST_CASE("estimate-memory under context parallel with a sliding window: the chunks its queries see") {
  auto estimate = [](int64_t window) {
    const std::string path = temp_path("mistral-window-" + std::to_string(window) + ".json");
    std::ofstream(path) << R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 257,
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 16, "sliding_window": )"
                        << window << "}\n";
    const Result r = fsdptrain_in_source({"estimate-memory", "--config", kQuickstart, "--num_processes", "4",
                                          "--parallelism_config_cp_size", "4", "--set", "model.config=" + path});
    INFO(r.out, r.err);
    REQUIRE(r.code == 0);
    return r.out;
  };
  const std::string chunk = estimate(4), longer = estimate(4096);  // sequences of 128: chunks of 16
  INFO(chunk, longer);
  CHECK(parse_size(after(chunk, "context parallel's K/V")) ==
        doctest::Approx(parse_size(after(longer, "context parallel's K/V")) / 16).epsilon(0.01));
  CHECK(parse_size(after(chunk, "activations (one micro-batch)")) <
        parse_size(after(longer, "activations (one micro-batch)")));
}

// estimate-memory's activations (one micro-batch) for the quickstart at 2 ranks with model.config the
// config.json text `json`, written to the file `name`.
double estimated_activations(const std::string& name, const std::string& json,
                             const std::vector<std::string>& sets = {}) {
  const std::string path = temp_path(name);
  std::ofstream(path) << json << "\n";
  std::vector<std::string> args = {"estimate-memory",     "--config", kQuickstart, "--num_processes", "2", "--set",
                                   "model.config=" + path};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  const Result r = fsdptrain_in_source(args);
  INFO(r.out, r.err);
  REQUIRE(r.code == 0);
  return parse_size(after(r.out, "activations (one micro-batch)"));
}

// Issue 61: a sparse layer keeps its k routed copies' activations (2 C + 4 I each), the router's
// logits and fp32 softmax, the fp32 combine; a dense layer its MLP's 4 F.
TEST_CASE("estimate-memory counts a mixture of experts' activations by its routed copies, not the dense width") {
  auto estimate = [](const std::string& only) {
    return estimated_activations(
        "qwen3moe-" + std::to_string(only.size()) + ".json",
        R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 257,
      "hidden_size": 64, "intermediate_size": 1720, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
      "moe_intermediate_size": 24, "mlp_only_layers": )" + only + "}");
  };
  const double sparse = estimate("[]"), one_dense = estimate("[1]");
  // Layer 1 dense instead of sparse: 4 F in the compute dtype (fp32 in the quickstart) in place of the
  // routed copies' k (2 C + 4 I) and the router's E, and of the fp32 E + k C + C, per token (B 8 x T 128).
  const double tokens = 8.0 * 128, per_token = 4.0 * (4 * 1720) - 4.0 * (2 * (2 * 64 + 4 * 24) + 8) -
                                                4.0 * (8 + 2 * 64 + 64);
  CHECK(one_dense - sparse == doctest::Approx(tokens * per_token).epsilon(0.01));
}

// Issue 63: Trainer's and TRL's gradient_checkpointing was accepted and changed nothing (the same
// estimate, the same peak); it is activation checkpointing under another name.
TEST_CASE("gradient_checkpointing lowers the estimate exactly as fsdp_activation_checkpointing does") {
  auto total = [](const std::vector<std::string>& sets) {
    std::vector<std::string> args = {"estimate-memory", "--config", kQuickstart, "--num_processes", "2"};
    for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
    const Result r = fsdptrain_in_source(args);
    INFO(r.out, r.err);
    REQUIRE(r.code == 0);
    return parse_size(after(r.out, "total on the device (as configured)"));
  };
  const double plain = total({}), gc = total({"model.gradient_checkpointing=true"}),
               ac = total({"fsdp_config.fsdp_activation_checkpointing=true"});
  CHECK(gc < plain);
  CHECK(gc == ac);
}

TEST_CASE("estimate-memory counts capped and sunk scores where engine.kernels: reference keeps them whole") {
  // Gemma 2's attn_logit_softcapping and gpt-oss's sinks: the blocks keep no score for backward, packed
  // records or not; the reference provider's eager sums keep every layer's (B, H, T, T) scores, the
  // cap's as tanh's output and the fp32 softmax (8 bytes a score in fp32), the sinks' as the fp32
  // softmax (4).
  auto estimate = [](const std::string& model_type, const std::string& extra, const std::string& kernels,
                     const std::string& packing = "auto") {
    return estimated_activations(model_type + "-" + std::to_string(extra.size()) + "-" + kernels + ".json",
                                 R"({"model_type": ")" + model_type +
                                     R"(", "vocab_size": 257, "hidden_size": 64, "intermediate_size": 172,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16)" +
                                     extra + "}",
                                 {"engine.kernels=" + kernels, "data.packing=" + packing});
  };
  const double scores = 2.0 * 8 * 4 * 128 * 128;  // layers x B x H x T x T (the quickstart: B 8, T 128)
  const std::string cap = R"(, "attn_logit_softcapping": 50.0)", none = R"(, "attn_logit_softcapping": null)";
  CHECK(estimate("gemma2", cap, "reference") - estimate("gemma2", none, "reference") ==
        doctest::Approx(8 * scores).epsilon(0.01));
  CHECK(estimate("gemma2", cap, "auto", "masked") == estimate("gemma2", none, "auto", "masked"));
  // gpt-oss without its sinks is not a form config.json can say: against the same model's blocks.
  const std::string oss = R"(, "num_local_experts": 4, "num_experts_per_tok": 2)";
  CHECK(estimate("gpt_oss", oss, "reference") - estimate("gpt_oss", oss, "auto") ==
        doctest::Approx(4 * scores).epsilon(0.01));
}

TEST_CASE("estimate-memory with float8 all-gather: the decoder layers' weights gathered in one byte an element") {
  auto estimate = [](const std::string& gather) {
    const Result r = fsdptrain_in_source({"estimate-memory", "--config", kQuickstart, "--num_processes", "4", "--set",
                                          "use_cpu=false", "--set", "mixed_precision=bf16", "--set",
                                          "engine.float8=tensorwise", "--set", "engine.float8_all_gather=" + gather});
    INFO(r.out, r.err);
    REQUIRE(r.code == 0);
    return r.out;
  };
  const std::string float8 = estimate("true"), bf16 = estimate("false");
  INFO(float8, bf16);
  CHECK(bf16.find("in float8") == std::string::npos);
  // The quickstart model's 2 layers: q, k, v, o, gate, up and down each.
  CHECK(float8.find("forward's all-gathers ") != std::string::npos);
  CHECK(float8.find(" (14 weights in float8) over 4 ranks") != std::string::npos);
  const double gathers = parse_size(after(float8, "forward's all-gathers")),
               plain = parse_size(after(bf16, "forward's all-gathers"));
  CHECK(gathers < plain);
  CHECK(gathers > plain / 2);  // the embeddings and norms stay bf16
  CHECK(parse_size(after(float8, "gathered units and reduction buffers (peak)")) <
        parse_size(after(bf16, "gathered units and reduction buffers (peak)")));
}

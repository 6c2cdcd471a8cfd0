// The fsdptrain binary as a user runs it: exit codes, messages, files written (or not).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "support/child_process.h"
#include "util/files.h"

namespace fs = std::filesystem;

namespace {

using fsdp::testing::Result;

// Runs fsdptrain with `args`, feeding `input` on stdin, in `env` (on top of a clean HOME).
Result run(const std::vector<std::string>& args, const std::string& input = "",
           const std::map<std::string, std::string>& env = {}) {
  return fsdp::testing::ChildProcess(FSDP_BINARY, args, env,
                                     {"FSDPTRAIN_CONFIG_FILE", "HF_HOME", "XDG_CACHE_HOME", "RANK"}, input)
      .wait();
}

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/fsdptrain_cli_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name, const std::string& text) const {
    std::string p = (path / name).string();
    fsdp::write_file_atomic(p, text);
    return p;
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

const std::string kConfigs = std::string(FSDP_SOURCE_DIR) + "/configs";

}  // namespace

TEST_CASE("--version names LibTorch, CUDA and NCCL; --help lists the commands and generated flags") {
  Result v = run({"--version"});
  CHECK(v.code == 0);
  CHECK(v.out.find("fsdptrain 0.1.0 (LibTorch 2.11.0, ") == 0);
  Result h = run({"--help"});
  CHECK(h.code == 0);
  for (const char* cmd : {"env", "config", "to-fsdp2"}) CHECK_MESSAGE(h.out.find(cmd) != std::string::npos, cmd);
  Result sh = run({"config", "show", "--help"});
  CHECK(sh.out.find("--fsdp_offload_params") != std::string::npos);
  CHECK(sh.out.find("Keep sharded parameters, gradients and optimizer state in host memory") != std::string::npos);
  CHECK(sh.out.find("key: fsdp_config.fsdp_offload_params") != std::string::npos);
  Result none = run({});
  CHECK(none.code == 2);
}

TEST_CASE("config validate: every error on its own line, exit code 2; a good file exits 0") {
  TempDir t;
  std::string bad = t.file("bad.yaml",
                           "distributed_type: FSDP\nnum_processes: 3\nnum_machines: 2\nmain_process_ip: h\n"
                           "fsdp_config:\n  fsdp_version: 2\n  fsdp_ofload_params: true\n");
  Result r = run({"config", "validate", bad});
  CHECK(r.code == 2);
  CHECK(r.err.find("error: " + bad + ":7:3: fsdp_config.fsdp_ofload_params: unknown key") != std::string::npos);
  CHECK(r.err.find("error: " + bad + ":2:1: num_processes: 3 processes cannot be split evenly") != std::string::npos);
  CHECK(r.err.find("2 errors in the config; nothing was started") != std::string::npos);
  Result ok = run({"config", "validate", kConfigs + "/fsdp2/hybrid.yaml"});
  CHECK(ok.code == 0);
  CHECK(
      ok.out.find("valid; runs as FSDP2, reshard_after_forward=true, HSDP: 2 replicas x 8 shards on 16 processes") !=
      std::string::npos);
  CHECK(run({"config", "validate", t / "missing.yaml"}).err.find("missing.yaml not found") != std::string::npos);
}

TEST_CASE("config show: flag > --set > file > default, with origins, as a table, YAML or JSON") {
  TempDir t;
  std::string cfg = t.file("c.yaml", "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n");
  Result r = run({"config", "show", "--config", cfg, "--set", "num_processes=8", "--num-processes", "4", "--set",
                  "fsdp_config.fsdp_offload_params=true", "--env"});
  REQUIRE(r.code == 0);
  CHECK(r.out.find("num_processes") != std::string::npos);
  const size_t row = r.out.find("\nnum_processes ");
  REQUIRE(row != std::string::npos);
  const std::string line = r.out.substr(row + 1, r.out.find('\n', row + 1) - row - 1);
  CHECK(line.find(" 4 ") != std::string::npos);
  CHECK(line.find("--num_processes") != std::string::npos);
  // The table leaves out what does not apply: FSDP1's keys in an FSDP2 run.
  CHECK(r.out.find("fsdp_sync_module_states") == std::string::npos);
  CHECK(r.out.find("keys of FSDP1 left out") != std::string::npos);
  CHECK(r.out.find("train.output_dir") != std::string::npos);
  CHECK(r.out.find("--set fsdp_config.fsdp_offload_params=true") != std::string::npos);
  CHECK(r.out.find(cfg + ":4:3") != std::string::npos);
  CHECK(r.out.find("FSDP_OFFLOAD_PARAMS=true") != std::string::npos);
  Result y = run({"config", "show", "--config", cfg, "--format", "yaml"});
  std::string round = t.file("round.yaml", y.out);
  CHECK(run({"config", "validate", round}).code == 0);
  Result j = run({"config", "show", "--config", cfg, "--format", "json"});
  CHECK(j.out.find("\"fsdp_config.fsdp_version\": {\n      \"value\": \"2\"") != std::string::npos);
}

TEST_CASE("the default config: $FSDPTRAIN_CONFIG_FILE, then fsdptrain's, then Accelerate's default path") {
  TempDir t;
  std::map<std::string, std::string> env = {{"HOME", t.path.string()}};
  fs::create_directories(t.path / ".cache/huggingface/accelerate");
  t.file(".cache/huggingface/accelerate/default_config.yaml", "distributed_type: MULTI_GPU\nnum_processes: 3\n");
  CHECK(run({"config", "show"}, "", env)
            .out.find("# config: " + t / ".cache/huggingface/accelerate/default_config.yaml") == 0);
  Result d = run({"config", "default"}, "", env);
  CHECK(d.code == 0);
  CHECK(run({"config", "show"}, "", env).out.find("# config: " + t / ".cache/fsdptrain/default_config.yaml") == 0);
  Result again = run({"config", "default"}, "", env);
  CHECK(again.code == 2);
  CHECK(again.err.find("already exists and was left as it is") != std::string::npos);
  env["FSDPTRAIN_CONFIG_FILE"] = t.file("mine.yaml", "distributed_type: NO\n");
  CHECK(run({"config", "show"}, "", env).out.find("# config: " + t / "mine.yaml") == 0);
  Result e = run({"env"}, "", env);
  CHECK(e.code == 0);
  CHECK(e.out.find("LibTorch version: 2.11.0") != std::string::npos);
  CHECK(e.out.find("Config file: " + t / "mine.yaml" + " ($FSDPTRAIN_CONFIG_FILE)") != std::string::npos);
}

TEST_CASE("to-fsdp2: Accelerate's argument checks, exit 3 and nothing written on a lossy conversion") {
  TempDir t;
  const std::string in = t.file("in.yaml", fsdp::read_file(kConfigs + "/fsdp1/no_shard.yaml"));
  CHECK(run({"to-fsdp2", "--config_file", t / "nope.yaml", "--overwrite"}).err.find("nope.yaml not found") !=
        std::string::npos);
  Result no_out = run({"to-fsdp2", "--config_file", in});
  CHECK(no_out.code == 2);
  CHECK(no_out.err.find("pass --output_file NEW.yaml, or --overwrite") != std::string::npos);
  t.file("exists.yaml", "x: 1\n");
  CHECK(run({"to-fsdp2", "--config_file", in, "--output_file", t / "exists.yaml"}).err.find("already exists") !=
        std::string::npos);
  Result lossy = run({"to-fsdp2", "--config_file", in, "--output_file", t / "out.yaml"});
  CHECK(lossy.code == 3);
  CHECK(lossy.err.find("lossy: NO_SHARD has no FSDP2 equivalent") != std::string::npos);
  CHECK_FALSE(fs::exists(t / "out.yaml"));
  Result forced = run({"to-fsdp2", "--config_file", in, "--output_file", t / "out.yaml", "--force"});
  CHECK(forced.code == 0);
  CHECK(fsdp::read_file(t / "out.yaml") == fsdp::read_file(kConfigs + "/fsdp2/no_shard.yaml"));
}

TEST_CASE("to-fsdp2 --dry-run prints a diff and writes nothing; --overwrite rewrites in place") {
  TempDir t;
  const std::string original = fsdp::read_file(kConfigs + "/fsdp1/shard_grad_op.yaml");
  const std::string in = t.file("in.yaml", original);
  Result dry = run({"to-fsdp2", "--config_file", in, "--dry-run"});
  CHECK(dry.code == 0);
  CHECK(dry.out.find("-  fsdp_reshard_after_forward: SHARD_GRAD_OP\n+  fsdp_reshard_after_forward: false\n") !=
        std::string::npos);
  CHECK(fsdp::read_file(in) == original);
  CHECK(run({"to-fsdp2", "--config_file", in, "--overwrite"}).code == 0);
  CHECK(fsdp::read_file(in) == fsdp::read_file(kConfigs + "/fsdp2/shard_grad_op.yaml"));
}

TEST_CASE("config update: a clear error without a file; legacy spellings modernised with a backup") {
  TempDir t;
  Result none = run({"config", "update"}, "", {{"HOME", t.path.string()}});
  CHECK(none.code == 2);
  CHECK(none.err.find("no config file given and none found") != std::string::npos);
  const std::string legacy =
      "distributed_type: FSDP\nnum_processes: 2\nfp16: true\nfsdp_config:\n  sharding_strategy: 2\n";
  const std::string path = t.file("old.yaml", legacy);
  Result r = run({"config", "update", "--config_file", path, "--to-fsdp2"});
  CHECK(r.code == 0);
  CHECK(fsdp::read_file(path + ".bak") == legacy);
  const std::string updated = fsdp::read_file(path);
  CHECK(updated.find("mixed_precision: fp16") != std::string::npos);
  CHECK(updated.find("fsdp_reshard_after_forward: false") != std::string::npos);
  CHECK(updated.find("fsdp_version: 2") != std::string::npos);
  CHECK(run({"config", "validate", path}).code == 0);
}

// Issue 63: Accelerate refuses a file with keys it does not know; the wizard says so when it writes
// fsdptrain's own sections, and what to do.
TEST_CASE("the wizard says when its file holds sections accelerate launch refuses") {
  TempDir t;
  const std::string data = t.file("train.txt", "some text to train on\n");
  const std::string answers =
      t.file("answers.yaml", "machine_type: multi-CPU\nnum_machines: 1\ndebug: no\nuse_fsdp: yes\n"
                             "fsdp_config.fsdp_version: 2\nnum_processes: 2\nmodel.pretrained: " FSDP_SOURCE_DIR
                             "/configs/models/tiny\ndata.path: " + data + "\n");
  Result r = run({"config", "--config_file", t / "w.yaml", "--answers", answers}, "");
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(r.out.find("note: the file holds fsdptrain's own sections (") != std::string::npos);
  CHECK(r.out.find("which `accelerate launch` refuses as unknown keys: run it with `fsdptrain launch`") !=
        std::string::npos);
  Result plain = run({"config", "--config_file", t / "p.yaml", "--answers",
                      t.file("plain.yaml", "machine_type: multi-CPU\nnum_machines: 1\ndebug: no\nuse_fsdp: yes\n"
                                           "fsdp_config.fsdp_version: 2\nnum_processes: 2\n")},
                     "");
  CHECK_MESSAGE(plain.code == 0, plain.err);
  CHECK(plain.out.find("note: the file holds") == std::string::npos);  // Accelerate's keys alone: nothing to say
}

TEST_CASE("the wizard through a pipe and an answers file, with no terminal") {
  TempDir t;
  const std::string answers = t.file("answers.yaml",
                                     "machine_type: multi-CPU\nnum_machines: 1\ndebug: no\nuse_fsdp: yes\n"
                                     "fsdp_config.fsdp_version: 2\nnum_processes: 2\n");
  // The remaining questions come from stdin: reshard, offload, wrap policy, layer classes, state dict,
  // RAM-efficient loading, activation checkpointing, HSDP, context parallel, mixed precision.
  Result r = run({"config", "--config_file", t / "w.yaml", "--answers", answers, "--fsdp_offload_params", "true"},
                 "no\n\n\n\n\nyes\n\n\nbf16\n");
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(r.out.find("fsdptrain configuration saved at " + t / "w.yaml") != std::string::npos);
  CHECK(r.out.find("offload") == std::string::npos);  // answered by the flag, not asked
  Result show = run({"config", "show", "--config", t / "w.yaml"});
  CHECK(show.out.find("fsdp_config.fsdp_offload_params") != std::string::npos);
  CHECK(show.out.find("runs as: FSDP2, reshard_after_forward=false, sharded over 2 ranks") != std::string::npos);
  const std::string yaml = fsdp::read_file(t / "w.yaml");
  CHECK(yaml.find("fsdp_activation_checkpointing: true") != std::string::npos);
  CHECK(yaml.find("mixed_precision: bf16") != std::string::npos);
}

TEST_CASE("the wizard through a pseudo-terminal, re-asking on a bad answer") {
  TempDir t;
  int master = -1;
  pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  REQUIRE(pid >= 0);
  if (pid == 0) {
    unsetenv("FSDPTRAIN_CONFIG_FILE");
    std::string out = t / "pty.yaml";
    execl(FSDP_BINARY, FSDP_BINARY, "config", "--config_file", out.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string screen;
  auto wait_for = [&](const std::string& text) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    char buf[1024];
    while (screen.find(text) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{master, POLLIN, 0};
      if (poll(&p, 1, 200) > 0) {
        ssize_t n = read(master, buf, sizeof(buf));
        if (n > 0)
          screen.append(buf, n);
        else
          break;
      }
    }
    return screen.find(text) != std::string::npos;
  };
  auto say = [&](const std::string& line) { (void)!write(master, (line + "\n").data(), line.size() + 1); };
  REQUIRE(wait_for("Which type of machine are you using?"));
  say("No distributed training");
  REQUIRE(wait_for("Do you wish to use mixed precision?"));
  say("fp64");
  REQUIRE(wait_for("Please enter a number from 1 to 3 or one of: no, fp16, bf16."));
  say("bf16");
  REQUIRE(wait_for("Which model should the built-in trainer fine-tune"));
  say("");  // none: a config for one's own program
  REQUIRE(wait_for("fsdptrain configuration saved at"));
  int status = 0;
  waitpid(pid, &status, 0);
  close(master);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const std::string yaml = fsdp::read_file(t / "pty.yaml");
  CHECK(yaml.find("distributed_type: 'NO'") != std::string::npos);
  CHECK(yaml.find("mixed_precision: bf16") != std::string::npos);
}

TEST_CASE("regression: a misspelled command or launch flag is refused with the closest one, and nothing starts") {
  Result cmd = run({"lanuch", "--config", "x.yaml"});
  CHECK(cmd.code == 2);
  CHECK(cmd.err.find("unknown command \"lanuch\"; did you mean launch?") != std::string::npos);
  Result sub = run({"config", "valdate", "x.yaml"});
  CHECK(sub.code == 2);
  CHECK(sub.err.find("fsdptrain config: unknown command \"valdate\"; did you mean validate?") != std::string::npos);
  // Before the program, a flag launch does not have must not become the workers' command.
  Result flag = run({"launch", "--cpu", "--distributed_type", "MULTI_CPU", "--num_procs", "2", "--", "/bin/echo",
                     "STARTED"});
  CHECK(flag.code == 2);
  CHECK(flag.err.find("unknown option --num_procs; did you mean --num_processes?") != std::string::npos);
  CHECK(flag.out.find("STARTED") == std::string::npos);
}

TEST_CASE("an FSDP1 file's summary says FSDP1, and what the built-in trainer runs instead") {
  Result r = run({"config", "validate", std::string(FSDP_SOURCE_DIR) + "/configs/fsdp1/shard_grad_op.yaml"});
  CHECK(r.code == 0);
  CHECK(r.out.find("runs as FSDP1 SHARD_GRAD_OP (programs get FSDP_VERSION=1; the built-in trainer runs it as FSDP2, "
                   "reshard_after_forward=false") != std::string::npos);
}

TEST_CASE("input paths a config names are read beside the config when the working directory lacks them") {
  TempDir t;
  t.file("cfg/model.json", fsdp::read_file(std::string(FSDP_SOURCE_DIR) + "/configs/models/tiny/config.json"));
  t.file("cfg/data/a.txt", "hello world\n");
  const std::string base = "distributed_type: NO\nmodel:\n  config: model.json\ndata:\n  path: data/*.txt\n";
  const std::string good = t.file("cfg/run.yaml", base);
  Result ok = run({"config", "validate", good});
  INFO(ok.err);
  CHECK(ok.code == 0);
  Result show = run({"config", "show", "--config", good});
  CHECK(show.out.find(t / "cfg/model.json") != std::string::npos);
  CHECK(show.out.find("(relative to " + t / "cfg" + "/)") != std::string::npos);
  // Nowhere: the error names both places it looked.
  const std::string bad = t.file("cfg/bad.yaml", "distributed_type: NO\nmodel:\n  config: nothere.json\n");
  Result missing = run({"config", "validate", bad});
  CHECK(missing.code == 2);
  CHECK(missing.err.find("model.config: no file at \"nothere.json\" (from the working directory) or \"" +
                         t / "cfg/nothere.json" + "\" (beside the config file)") != std::string::npos);
}

TEST_CASE("files fsdptrain writes validate without warnings; show --format yaml leaves the trainer's sections out") {
  TempDir t;
  const std::string written = t / "default.yaml";
  REQUIRE(run({"config", "default", "--config_file", written}).code == 0);
  Result v = run({"config", "validate", written});
  CHECK(v.code == 0);
  CHECK(v.err.find("warning") == std::string::npos);
  const std::string answers = t.file("answers.yaml", "fsdp_config.fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n");
  REQUIRE(run({"config", "--config_file", t / "wizard.yaml", "--answers", answers}).code == 0);
  Result w = run({"config", "validate", t / "wizard.yaml"});
  CHECK(w.code == 0);
  CHECK(w.err.find("warning") == std::string::npos);
  Result y = run({"config", "show", "--config", kConfigs + "/quickstart.yaml", "--format", "yaml"});
  CHECK(y.code == 0);
  CHECK(y.out.find("\nmodel:") == std::string::npos);
  CHECK(y.out.find("the built-in trainer's sections (model, data, ...) are left out") != std::string::npos);
}

TEST_CASE("help and flags: the program's name in usage lines, config's subcommands first, --config everywhere") {
  Result launch = run({"launch", "--help"});
  CHECK(launch.out.find("Usage: fsdptrain launch [OPTIONS] [PROGRAM | SCRIPT.py] [ARGS]...") != std::string::npos);
  Result config = run({"config", "--help"});
  REQUIRE(config.out.find("Subcommands:") != std::string::npos);
  CHECK(config.out.find("Subcommands:") < config.out.find("Options:"));
  TempDir t;
  const std::string v1 = t.file("v1.yaml", fsdp::read_file(kConfigs + "/fsdp1/full_shard.yaml"));
  Result by_flag = run({"config", "validate", "--config", v1});
  CHECK(by_flag.code == 0);
  Result convert = run({"to-fsdp2", "--config", v1, "--output_file", t / "v2.yaml"});
  CHECK(convert.code == 0);
  CHECK(run({"config", "validate", "--config_file", t / "v2.yaml"}).code == 0);
}

TEST_CASE("validate lists errors in the order of the file's lines; counts read as words") {
  TempDir t;
  const std::string bad = t.file("bad.yaml",
                                 "distributed_type: FSDP\nnum_processes: 6\nnum_machines: 4\nfsdp_config:\n"
                                 "  fsdp_version: 2\n  fsdp_ofload_params: true\n  fsdp_reshard_after_forward: maybe\n");
  Result r = run({"config", "validate", bad});
  const size_t line2 = r.err.find("bad.yaml:2:1"), line6 = r.err.find("bad.yaml:6:3"), line7 = r.err.find("bad.yaml:7:3");
  REQUIRE(line2 != std::string::npos);
  REQUIRE(line6 != std::string::npos);
  REQUIRE(line7 != std::string::npos);
  CHECK(line2 < line6);
  CHECK(line6 < line7);
  Result one = run({"config", "validate", kConfigs + "/fsdp2/full_shard.yaml", "--num_processes", "1"});
  CHECK(one.out.find("on 1 process\n") != std::string::npos);
}

// Runs of the built-in trainer through the real CLI, for the trainer and checkpoint tests:
// `fsdptrain ARGS` from the source tree (relative paths in configs resolve there), the losses a
// run wrote to its metrics file, and scratch paths unique to the test process. A training launch
// gets a run folder of its own (train.output_dir) unless the test names one, so runs of one config
// never meet in configs/runs.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/child_process.h"

namespace fsdp::testing {

inline Result run_in_source(const std::string& binary, const std::vector<std::string>& args) {
  std::vector<std::string> all{"-c", "cd " + std::string(FSDP_SOURCE_DIR) + " && exec \"$0\" \"$@\"", binary};
  all.insert(all.end(), args.begin(), args.end());
  return ChildProcess("/bin/sh", all, {}, {"FSDPTRAIN_CONFIG_FILE", "RANK", "WORLD_SIZE"})
      .wait(std::chrono::seconds(240));
}

// A scratch path of this test process's own. Everything under its prefix (run folders, configs,
// checkpoints) is removed when the process ends: left behind, a few hundred test runs held 1.1 GB
// of /tmp.
inline std::string temp_path(const std::string& name) {
  static const struct Scratch {
    pid_t owner = ::getpid();
    ~Scratch() {
      if (::getpid() == owner)  // not in a forked child that exits
        (void)std::system(("rm -rf /tmp/fsdp_test_" + std::to_string(owner) + "_*").c_str());
    }
  } scratch;
  return "/tmp/fsdp_test_" + std::to_string(scratch.owner) + "_" + name;
}

inline Result fsdptrain_in_source(std::vector<std::string> args) {
  static int runs = 0;
  const bool trains = !args.empty() && args[0] == "launch" &&
                      std::find(args.begin(), args.end(), "--") == args.end() &&
                      std::none_of(args.begin(), args.end(), [](const std::string& a) {
                        return a.rfind("train.output_dir=", 0) == 0 || a.rfind("--check", 0) == 0;
                      });
  if (trains) args.insert(args.end(), {"--set", "train.output_dir=" + temp_path("run_" + std::to_string(++runs))});
  return run_in_source(FSDP_BINARY, args);
}

// step -> loss, from a logging.metrics_file.
inline std::map<int64_t, double> losses_by_step(const std::string& metrics_file) {
  std::map<int64_t, double> out;
  std::ifstream in(metrics_file);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

inline std::vector<double> losses(const std::string& metrics_file) {
  std::vector<double> out;
  for (const auto& [step, loss] : losses_by_step(metrics_file)) out.push_back(loss);
  return out;
}

// Runs a shell command; the test stops when it fails.
inline void sh(const std::string& command) {
  REQUIRE_MESSAGE(std::system(command.c_str()) == 0, command);
}

inline bool exists(const std::string& path) {
  return std::ifstream(path).good();
}

// Makes `dir` a fresh copy of what `make(folder)` writes into a folder, made once per test process:
// doctest runs a TEST_CASE's body again for each of its SUBCASEs, and each subcase damages its own
// copy of the same trained checkpoints instead of training them again.
// (`dir` is a temp_path: the folder made once lies beside it and goes with the process's scratch.)
template <typename Make>
void copy_of_made_once(const std::string& dir, Make make) {
  static std::map<std::string, std::string> made;  // dir -> the folder made once
  auto it = made.find(dir);
  if (it == made.end()) {
    const std::string folder = dir + "-made-once";
    sh("rm -rf " + folder);
    make(folder);
    it = made.emplace(dir, folder).first;
  }
  sh("rm -rf " + dir + " && cp -a " + it->second + " " + dir);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace fsdp::testing

// Runs a program as a user would: arguments, extra environment, stdin, and its stdout, stderr and
// exit code captured. Shared by the CLI and launcher tests; header-only (tests/ is on the include
// path of every test).
#pragma once

#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace fsdp::testing {

struct Result {
  int code = -1;  // the exit code, or 128 + signal
  std::string out, err;
};

class ChildProcess {
 public:
  // Starts `binary args...` with `unset` removed from and `env` added to this process's
  // environment, `input` written to its stdin.
  ChildProcess(const std::string& binary, const std::vector<std::string>& args,
               const std::map<std::string, std::string>& env = {}, const std::vector<std::string>& unset = {},
               const std::string& input = "") {
    int in_pipe[2], out_pipe[2], err_pipe[2];
    REQUIRE(pipe(in_pipe) == 0);
    REQUIRE(pipe(out_pipe) == 0);
    REQUIRE(pipe(err_pipe) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(in_pipe[0], 0);
      dup2(out_pipe[1], 1);
      dup2(err_pipe[1], 2);
      for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
      for (const auto& v : unset) unsetenv(v.c_str());
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<std::string> copy = args;
      std::string bin = binary;
      std::vector<char*> argv{bin.data()};
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    close(in_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[1]);
    if (!input.empty()) (void)!write(in_pipe[1], input.data(), input.size());
    close(in_pipe[1]);
    fds_[0] = out_pipe[0];
    fds_[1] = err_pipe[0];
  }
  ~ChildProcess() {
    if (!done_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  void signal(int sig) { kill(pid_, sig); }

  // Collects output until the process exits; fails the test if that takes over `limit`.
  Result wait(std::chrono::seconds limit = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    pollfd fds[2] = {{fds_[0], POLLIN, 0}, {fds_[1], POLLIN, 0}};
    int open_fds = 2;
    char buf[4096];
    while (open_fds > 0 && std::chrono::steady_clock::now() < deadline) {
      if (poll(fds, 2, 100) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
        ssize_t n = read(fds[i].fd, buf, sizeof(buf));
        if (n <= 0) {
          close(fds[i].fd);
          fds[i].fd = -1;
          --open_fds;
        } else {
          (i == 0 ? result_.out : result_.err).append(buf, n);
        }
      }
    }
    REQUIRE_MESSAGE(open_fds == 0, "the process did not finish within ", limit.count(), " s\n", result_.err);
    int status = 0;
    waitpid(pid_, &status, 0);
    done_ = true;
    result_.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return result_;
  }

 private:
  pid_t pid_ = -1;
  int fds_[2] = {-1, -1};
  bool done_ = false;
  Result result_;
};

}  // namespace fsdp::testing

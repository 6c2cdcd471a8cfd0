// WorkerGroup: the local worker processes of one launch attempt, started, watched and stopped.
//
// Each worker runs in its own process group (so a terminal's Ctrl-C reaches only the launcher,
// which forwards it) with PR_SET_PDEATHSIG=SIGKILL (so no worker outlives a launcher that is
// killed outright). Each line a worker writes is relayed with a "[rank N] " prefix to the
// launcher's stdout or stderr, and optionally copied to <log_dir>/rank<N>.log.
//
// Owned by the launcher's main thread; not thread-safe. The destructor kills and reaps anything
// still running, so an exception cannot leave workers behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "launch/worker_plan.h"

namespace fsdp::launch {

struct WorkerStatus {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = true;
  bool exited = false;  // exit(code); else killed by `signal`
  int code = 0;
  int signal = 0;
  bool stopped_by_launcher = false;  // the launcher sent the signal that ended it
  std::chrono::steady_clock::time_point ended;
  int64_t ended_unix_ns = 0;  // the same moment on the clock error files use
  std::string error_file;     // where it records why it failed (dist/error_file.h); "" when none

  // Exit 0, or ExitCode::kStopped: the built-in trainer stopped on a signal with its work saved.
  bool succeeded() const;
  bool failed() const { return !running && !succeeded() && !stopped_by_launcher; }
  // "exit 0", "exit 3", "SIGKILL", "SIGTERM (stopped by the launcher)", "stopped, its work saved (exit 75)"
  std::string describe() const;
  // The launcher's exit code for this worker's failure: its exit code, or 128 + signal.
  int exit_code() const { return exited ? code : 128 + signal; }
};

class WorkerGroup {
 public:
  // Starts every worker. Throws fsdp::Error if a process cannot be created. With `error_dir`, each
  // worker records its failure in <error_dir>/rank<N>.json (TORCHELASTIC_ERROR_FILE).
  WorkerGroup(const std::vector<WorkerSpec>& specs, const std::string& log_dir, int attempt,
              const std::string& error_dir = "");
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Relays output and reaps exited workers; returns after at most `timeout`, or sooner when
  // `wake_fd` (the launcher's signal pipe) becomes readable.
  void poll(std::chrono::milliseconds timeout, int wake_fd = -1);

  bool all_exited() const;
  bool all_succeeded() const;                 // each WorkerStatus::succeeded
  bool any_stopped() const;                   // some worker exited with ExitCode::kStopped
  const WorkerStatus* first_failure() const;  // the earliest to exit with a failure, or nullptr
  // The root cause, once the workers have exited: the worker that recorded the earliest error
  // (even one the launcher stopped while it was tearing down), else first_failure(); its message
  // ("" when it recorded none).
  struct RootCause {
    const WorkerStatus* worker = nullptr;
    std::string message;
  };
  RootCause root_cause() const;
  // Once the workers have exited: a line per other error they recorded ("ranks 1, 3 failed the same
  // way", "rank 2: <its first line>"), given the root cause's message.
  std::vector<std::string> other_errors(const std::string& root_message) const;
  const std::vector<WorkerStatus>& status() const { return status_; }

  // Sends `sig` to every running worker's process group.
  void signal_all(int sig);
  // SIGTERM (or `sig`) to the running workers, up to `grace` for them to exit, then SIGKILL;
  // returns when every worker has been reaped. Output keeps flowing meanwhile.
  void stop(std::chrono::milliseconds grace, int sig = 15 /* SIGTERM */);

  // A table of every worker's pid and how it ended, marking the root cause.
  std::string exit_table() const;

 private:
  struct Stream;
  void reap();
  void drain(Stream& s, bool final);
  bool progress_shown_ = false;  // a progress line is drawn on the terminal now
  std::vector<WorkerStatus> status_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<int> log_fds_;  // per worker, -1 when no log_dir
};

}  // namespace fsdp::launch

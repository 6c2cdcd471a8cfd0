// `fsdptrain launch`: start this machine's workers, supervise them, and coordinate with the
// launchers of the other machines (rendezvous.h). Data flow step 2 of DESIGN.md.
#pragma once

#include <chrono>
#include <ostream>
#include <string>
#include <vector>

#include "config/loader.h"

namespace fsdp::launch {

struct LaunchOptions {
  // What each worker runs: a program and its arguments (after `--`), or a .py script.
  std::vector<std::string> command;
  std::string log_dir;  // also write each rank's output to <log_dir>/rank<N>.log
  bool dry_run = false;
  std::chrono::milliseconds grace{std::chrono::seconds(5)};  // SIGTERM -> SIGKILL
  int visible_gpus = 0;                                      // this machine's GPUs (0: none, or unknown)
  bool oversubscribe = false;                                // a CPU run: start more than 4 local workers per core
  // The workers (the built-in trainer) save and stop on SIGINT, SIGTERM and SIGUSR1: the launcher
  // passes its first such signal on and waits (SIGHUP as SIGTERM); a second kills them at once.
  // Otherwise SIGINT, SIGTERM and SIGHUP stop them after `grace`, and SIGUSR1 is passed on.
  bool saves_on_signal = false;
  std::string resume_command;  // printed when the workers stopped with ExitCode::kStopped
};

// Throws InputError, before anything starts, when this machine is asked for more workers than it
// can run: more than its GPUs for a GPU run (always: NCCL cannot put two ranks on one GPU), or more
// than 4 per core (a CPU run, or no GPU seen; options.oversubscribe allows it).
void check_capacity(int local_workers, int num_machines, bool use_cpu, const LaunchOptions& options, int cores);

// Runs the whole launch and returns the process exit code: 0 when every worker of every machine
// exited 0; ExitCode::kStopped when they stopped early on a signal with their work saved; else the
// first failing rank's exit code (128 + signal when it was killed); 128 + signal when the launcher
// itself was interrupted (twice, with saves_on_signal). A run asked to stop is never restarted. Throws fsdp::Error for
// problems before any worker starts (rendezvous, ports, check_capacity). With dry_run, prints each local rank's
// environment and command to `out` and starts nothing.
int run_launch(const config::ResolvedConfig& rc, const LaunchOptions& options, std::ostream& out);

}  // namespace fsdp::launch

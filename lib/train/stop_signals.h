// StopSignals: the signals that ask a training run to stop without losing it. SIGINT (Ctrl-C,
// forwarded by the launcher), SIGTERM (what SLURM, Kubernetes and `kill` send before they kill)
// and SIGUSR1 (SLURM's --signal=USR1@SECONDS, before a time limit) are noted, not obeyed, while a
// StopSignals lives: the trainer finishes its step, saves a checkpoint, says where, and exits with
// ExitCode::kStopped. At any other time they end the process as they always do.
//
// No training thread is ever interrupted by them: take_over_process, called before a worker starts
// any thread, blocks them in every thread it will start and gives them to one thread of its own
// (sigwait). A handler would interrupt whichever thread the kernel picks, and a collective's
// socket read that returns EINTR is not retried by every library.
//
// The same signal often arrives twice in a moment (SLURM signals every process of a job step, and
// the launcher forwards what it received), so one within kRepeatWindow of the first is the same
// request. A later one ends the process at once, as the signal would have.
#pragma once

#include <chrono>

namespace fsdp::train {

class StopSignals {
 public:
  static constexpr std::chrono::seconds kRepeatWindow{2};

  // Once per process, before it starts any other thread (later calls do nothing).
  static void take_over_process();

  StopSignals();   // notes the signals from now on, forgetting any earlier request
  ~StopSignals();  // they end the process again
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal noted since construction, or 0 (util/signal_name.h names it).
  static int received();
};

}  // namespace fsdp::train

// StopSignals: the signals that ask a process to stop without losing its work. SIGINT (Ctrl-C,
// forwarded by the launcher), SIGTERM (what SLURM, Kubernetes and `kill` send before they kill)
// and SIGUSR1 (SLURM's --signal=USR1@SECONDS, before a time limit) are noted, not obeyed, while a
// StopSignals lives, and received() says which came first; the work polls it at a safe point. The
// trainer finishes its step, saves a checkpoint, says where, and exits with ExitCode::kStopped; the
// launcher's tokenizing stops between batches and exits with 128 + the signal (130 for Ctrl-C). At
// any other time they end the process as they always do.
//
// No training thread is ever interrupted by them: take_over_process, called before a worker starts
// any thread, blocks them in every thread it will start and gives them to one thread of its own
// (sigwait). A handler would interrupt whichever thread the kernel picks, and a collective's
// socket read that returns EINTR is not retried by every library. A process that did not take them
// over (the launcher, which installs its own handlers once its workers run) gets a handler for the
// StopSignals' lifetime instead, and its previous ones back after; both keep this one contract.
//
// The same signal often arrives twice in a moment (SLURM signals every process of a job step, and
// the launcher forwards what it received), so one within kRepeatWindow of the first is the same
// request. A later one ends the process at once, as the signal would have.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstddef>

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

 private:
  static constexpr size_t kSignals = 3;  // SIGINT, SIGTERM, SIGUSR1
  bool handled_;                         // this one installed the handler (the process did not take them over)
  struct sigaction previous_[kSignals] {};
};

}  // namespace fsdp::train

// The launchers' rendezvous: machine 0's launcher serves the Store that every launcher and every
// worker of the run meets at; each launcher announces itself, waits for all machines, and later
// reports how each attempt ended, so that a failure on one machine stops the workers on all.
//
// Keys (under "/fsdptrain/"): machine/<m> (announcement), attempt/<k>/failed (first failure:
// "<exit code>|<description>"), attempt/<k>/done/<m> (machine m's workers all exited 0).
// Workers use "/worker/attempt_<k>/" (as torchrun's agent store does).
//
// Owned by the launcher's main thread. Not collective in the dist sense, but every launcher of a
// run must construct one with the same num_machines.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "dist/store.h"
#include "launch/worker_plan.h"

namespace fsdp::launch {

class Rendezvous {
 public:
  // Machine 0 serves on topology.master_port (on one machine, a busy port falls back to a free
  // one with a warning, as accelerate does; on several it is an error naming the port). Every
  // launcher then connects and announces itself. Throws fsdp::Error on failure.
  Rendezvous(const Topology& topology, std::chrono::milliseconds timeout);

  // The port the store really listens on (differs from the requested one after a fallback or 0).
  int port() const { return port_; }

  // Waits until every machine has announced itself; throws naming the machine ranks that never
  // arrived when `timeout` passes first.
  void wait_for_machines();

  // Records this machine's failure in `attempt` unless another machine recorded one first.
  void report_failure(int attempt, int exit_code, const std::string& description);
  // The first failure recorded for `attempt` by any machine: (exit code, description). A lost
  // connection to machine 0 counts as a failure.
  std::optional<std::pair<int, std::string>> failure(int attempt);

  void report_done(int attempt);
  // Machine 0 keeps the store alive until every machine is done (or one failed); false when
  // `timeout` passes first.
  bool wait_until_all_done(int attempt, std::chrono::milliseconds timeout);

 private:
  Topology topology_;
  std::chrono::milliseconds timeout_;
  std::optional<dist::Store> server_;  // machine 0 only
  std::optional<dist::Store> client_;
  int port_ = 0;
};

}  // namespace fsdp::launch

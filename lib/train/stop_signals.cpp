#include "train/stop_signals.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace fsdp::train {

namespace {

std::atomic<bool> g_noting{false};  // a StopSignals lives
std::atomic<int> g_first{0};
std::chrono::steady_clock::time_point g_first_at;  // written and read by the signal thread only

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) sigaddset(&set, sig);
  return set;
}

// What the signal does when nobody handles it (all three end the process).
[[noreturn]] void die_of(int sig) {
  ::signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  ::raise(sig);
  std::_Exit(128 + sig);  // not reached
}

void take_signals() {
  const sigset_t set = stop_set();
  for (;;) {
    int sig = 0;
    if (::sigwait(&set, &sig) != 0) continue;
    if (!g_noting) die_of(sig);
    const auto now = std::chrono::steady_clock::now();
    int none = 0;
    if (g_first.compare_exchange_strong(none, sig)) {
      g_first_at = now;
    } else if (now - g_first_at >= StopSignals::kRepeatWindow) {
      die_of(sig);  // asked again: stop now
    }
  }
}

}  // namespace

void StopSignals::take_over_process() {
  static std::once_flag once;
  std::call_once(once, [] {
    const sigset_t set = stop_set();
    ::pthread_sigmask(SIG_BLOCK, &set, nullptr);  // inherited by every thread started from here on
    std::thread(take_signals).detach();
  });
}

StopSignals::StopSignals() {
  g_first = 0;
  g_noting = true;
}

StopSignals::~StopSignals() {
  g_noting = false;
}

int StopSignals::received() {
  return g_first.load();
}

}  // namespace fsdp::train

#include "train/stop_signals.h"

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <thread>

namespace fsdp::train {

namespace {

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGUSR1};
static_assert(std::atomic<int64_t>::is_always_lock_free, "the handler reads it: it must be lock-free");

std::atomic<bool> g_noting{false};      // a StopSignals lives
std::atomic<bool> g_taken_over{false};  // take_over_process ran: the signal thread receives them
std::atomic<int> g_first{0};
std::atomic<int64_t> g_first_at_ns{0};  // the steady clock's

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kStopSignals) sigaddset(&set, sig);
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

// The header's contract for one delivery, whichever receives it: the signal thread or, in a process
// that did not take them over, the handler (async-signal-safe).
void note(int sig) {
  if (!g_noting) die_of(sig);
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  int none = 0;
  if (g_first.compare_exchange_strong(none, sig)) {
    g_first_at_ns = now;
  } else if (now - g_first_at_ns >= std::chrono::nanoseconds(StopSignals::kRepeatWindow).count()) {
    die_of(sig);  // asked again: stop now
  }
}

void take_signals() {
  const sigset_t set = stop_set();
  for (;;) {
    int sig = 0;
    if (::sigwait(&set, &sig) == 0) note(sig);
  }
}

}  // namespace

void StopSignals::take_over_process() {
  static std::once_flag once;
  std::call_once(once, [] {
    const sigset_t set = stop_set();
    ::pthread_sigmask(SIG_BLOCK, &set, nullptr);  // inherited by every thread started from here on
    g_taken_over = true;
    std::thread(take_signals).detach();
  });
}

StopSignals::StopSignals() : handled_(!g_taken_over) {
  static_assert(std::size(kStopSignals) == kSignals, "stop_signals.h: kSignals counts these");
  g_first = 0;
  g_first_at_ns = 0;
  g_noting = true;
  if (!handled_) return;
  struct sigaction sa {};
  sa.sa_handler = note;
  sa.sa_mask = stop_set();   // one handler at a time: a second signal waits until the first is noted
  sa.sa_flags = SA_RESTART;  // a system call the signal interrupts resumes instead of failing with EINTR
  for (size_t i = 0; i < kSignals; ++i) ::sigaction(kStopSignals[i], &sa, &previous_[i]);
}

StopSignals::~StopSignals() {
  if (handled_)
    for (size_t i = 0; i < kSignals; ++i) ::sigaction(kStopSignals[i], &previous_[i], nullptr);
  g_noting = false;
}

int StopSignals::received() {
  return g_first.load();
}

}  // namespace fsdp::train

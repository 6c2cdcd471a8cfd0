#include "launch/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "config/config.h"
#include "launch/cpu_affinity.h"
#include "launch/rendezvous.h"
#include "launch/worker_group.h"
#include "launch/worker_plan.h"
#include "util/error.h"
#include "util/files.h"
#include "util/log.h"
#include "util/signal_name.h"
#include "util/strings.h"

namespace fsdp::launch {

namespace {

// SIGINT/SIGTERM/SIGHUP/SIGUSR1 to the launcher arrive here and are handled in the main loop: each
// delivery as a record of the signal, its sender and when it came (async-signal-safe calls only).
int g_signal_pipe[2] = {-1, -1};

struct Delivery {
  int32_t sig;
  int32_t sender;  // si_pid: the process that sent it; 0 from the kernel (a terminal's Ctrl-C)
  int32_t from_terminal;
  int64_t at_ns;  // CLOCK_MONOTONIC
};

void on_signal(int sig, siginfo_t* info, void*) {
  const int saved = errno;
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const Delivery d{sig, info != nullptr ? info->si_pid : 0, info != nullptr && info->si_code == SI_KERNEL,
                   static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec};
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &d, sizeof d);  // atomic: under PIPE_BUF
  errno = saved;
}

constexpr int kCaught[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

class SignalCatcher {
 public:
  SignalCatcher() {
    FSDP_CHECK(::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "[launch] pipe: ", std::strerror(errno));
    struct sigaction sa {};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    for (int sig : kCaught) ::sigaction(sig, &sa, &old_[sig]);
  }
  ~SignalCatcher() {
    for (int sig : kCaught) ::sigaction(sig, &old_[sig], nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
  }
  int fd() const { return g_signal_pipe[0]; }
  // The deliveries since the previous call, in order.
  std::vector<Delivery> take() {
    std::vector<Delivery> out;
    Delivery d{};
    while (::read(g_signal_pipe[0], &d, sizeof d) == static_cast<ssize_t>(sizeof d)) out.push_back(d);
    return out;
  }

 private:
  struct sigaction old_[65]{};
};

// The stop the workers were asked for, and the delivery that asked.
struct StopRequest {
  int sig = 0;
  Delivery by{};
};

// One logical signal often arrives twice: `timeout` signals the launcher and then its whole process
// group, supervisors and `kill -- -PGID` reach every process of a group. A delivery of the stop's
// own signal from the same sender within kRepeatWindow of the first is that one request again. A
// terminal's Ctrl-C (from the kernel) is always the user's own: pressed again, it stops at once.
constexpr int64_t kRepeatWindowNs = 1000000000;

bool repeats(const StopRequest& stop, const Delivery& d) {
  return stop.sig == d.sig && !d.from_terminal && !stop.by.from_terminal && d.sender == stop.by.sender &&
         d.at_ns - stop.by.at_ns < kRepeatWindowNs;
}

void print_dry_run(const std::vector<WorkerSpec>& specs, const Topology& t, const config::Config& c,
                   std::ostream& out) {
  const bool use_cpu = c.launch.use_cpu;
  out << "# machine " << t.machine_rank << " of " << t.num_machines << ": " << t.local_world_size
      << " worker(s), world size " << t.world_size << "; rendezvous " << t.master_addr << ":" << t.master_port << "\n";
  out << "# runs as: " << config::effective_fsdp_layout(c).describe() << "\n";  // the mesh: which ranks form each group
  if (use_cpu)
    out << "# use_cpu: every worker gets ACCELERATE_USE_CPU=true and runs on CPU processes over Gloo (accelerate "
           "launch exports it only from its single-process launcher, so its workers differ; README)\n";
  for (const auto& w : specs) {
    out << "\n# rank " << w.rank << " (local rank " << w.local_rank << ")\n";
    out << "env";
    for (const auto& [k, v] : w.env) out << " \\\n  " << k << "=" << shell_quote(v);
    out << " \\\n ";
    if (!w.cpus.empty()) out << " taskset -c " << format_cpu_list(w.cpus);
    for (const auto& a : w.argv) out << " " << shell_quote(a);
    out << "\n";
  }
}

// A folder under $TMPDIR (or /tmp) for this launch, removed with what is in it at the end.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = str(tmp && *tmp ? tmp : "/tmp", "/", name, "-XXXXXX");
    FSDP_CHECK(::mkdtemp(pattern.data()) != nullptr, "[launch] cannot create a folder in ", parent_folder(pattern),
               ": ", std::strerror(errno), "; set TMPDIR to a writable folder");
    path_ = pattern;
  }
  ~TempDir() { remove_tree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string first_line(const std::string& text) {
  const std::string line = text.substr(0, text.find('\n'));
  return line.size() > 160 ? line.substr(0, 160) + "..." : line;
}

// What ended the watch over one attempt's workers: a signal that ends them now, or another
// machine's failure (neither: they all exited, or one failed here).
struct Watched {
  int received = 0;
  std::optional<std::pair<int, std::string>> remote;
};

// Relays the workers' output until they have all exited, one failed, another machine reported a
// failure, or a signal ends them now. The built-in trainer (options.saves_on_signal) saves and stops
// on its first signal, passed on and noted in `stop`; any program gets SIGUSR1 (SLURM's warning
// before a time limit) and keeps running. Anything else, or a second signal, ends them now.
Watched watch(WorkerGroup& group, SignalCatcher& signals, Rendezvous& rdzv, int attempt,
              std::chrono::milliseconds interval, const LaunchOptions& options, StopRequest& stop) {
  Watched w;
  while (!group.all_exited()) {
    group.poll(interval, signals.fd());
    for (const Delivery& d : signals.take()) {
      const int sig = d.sig;
      if (stop.sig && repeats(stop, d)) continue;  // the same request delivered twice
      if (stop.sig || (!options.saves_on_signal && sig != SIGUSR1)) {
        w.received = sig;
        return w;
      }
      if (options.saves_on_signal) stop = {sig, d};
      group.signal_all(sig == SIGHUP ? SIGTERM : sig);  // the trainer takes a closed terminal as SIGTERM
      if (stop.sig)
        log_warn(str("[launch] received ", signal_name(sig), ": the workers finish their step, save a checkpoint and ",
                     "stop; ", sig == SIGINT ? "press Ctrl-C again" : "signal again",
                     " to stop them at once (losing the steps since the last checkpoint)"));
      else
        log_info("[launch] received SIGUSR1; passed on to the workers");
    }
    if (group.first_failure()) return w;
    if ((w.remote = rdzv.failure(attempt))) return w;
  }
  return w;
}

}  // namespace

void check_capacity(int local, int num_machines, bool use_cpu, const LaunchOptions& o, int cores) {
  const std::string asked = str("num_processes asks for ", plural(local, "worker"), " on this machine");
  // Not even with --oversubscribe: NCCL refuses two ranks on one GPU.
  if (!use_cpu && o.visible_gpus > 0)
    FSDP_CHECK(local <= o.visible_gpus, "[launch] ", asked, ", which has ", plural(o.visible_gpus, "GPU"),
               "; each worker drives a GPU of its own (NCCL cannot share one between ranks). Set num_processes (or "
               "--num_processes) to at most ",
               o.visible_gpus * num_machines, ", or train on the CPU (--cpu)");
  if (o.oversubscribe) return;
  FSDP_CHECK(local <= 4 * cores, "[launch] ", asked, ", which has ", plural(cores, "core"),
             "; more than 4 workers per core would only thrash, and their memory ends in the out-of-memory killer. "
             "Set num_processes (or --num_processes) to at most ",
             4 * cores * num_machines, ", or pass --oversubscribe to start them anyway");
}

int run_launch(const config::ResolvedConfig& rc, const LaunchOptions& options, std::ostream& out) {
  const config::LaunchConfig& l = rc.typed.launch;
  Topology topology = topology_of(l);
  FSDP_ASSERT(!options.command.empty(), "launch without a command");
  check_capacity(topology.local_world_size, topology.num_machines, l.use_cpu, options,
                 static_cast<int>(cpu_facts().allowed.size()));
  if (options.dry_run) {
    print_dry_run(plan_workers(rc, topology, options.command, 0), topology, rc.typed, out);
    return 0;
  }
  const auto ms = [](double seconds) { return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)); };
  // Until workers exist, Ctrl-C simply ends the launcher (SignalCatcher comes after the rendezvous).
  Rendezvous rdzv(topology, ms(l.rdzv_timeout));
  topology.master_port = rdzv.port();
  if (topology.num_machines > 1)
    log_info(str("[launch] machine ", topology.machine_rank, " of ", topology.num_machines,
                 ": waiting for the other machines at ", topology.master_addr, ":", topology.master_port));
  rdzv.wait_for_machines();
  SignalCatcher signals;
  const TempDir errors("fsdptrain-errors");  // the workers' error files (dist/error_file.h)

  const auto interval = std::max(ms(l.monitor_interval), std::chrono::milliseconds(1));
  StopRequest stop;  // the signal the workers were asked to stop on (options.saves_on_signal)
  for (int attempt = 0;; ++attempt) {
    const std::string error_dir = str(errors.path(), "/attempt", attempt);
    make_directories(error_dir);
    WorkerGroup group(plan_workers(rc, topology, options.command, attempt), options.log_dir, attempt, error_dir);
    const auto [received, remote] = watch(group, signals, rdzv, attempt, interval, options, stop);
    const bool stopping = stop.sig != 0;
    if (received) {
      // Forward the signal, then SIGKILL whatever is left after the grace period (at once when asked twice).
      log_warn(str("[launch] received ", signal_name(received), stopping ? " again; killing" : "; stopping",
                   " the workers"));
      if (stopping)
        group.stop(std::chrono::milliseconds(0), SIGKILL);
      else
        group.stop(options.grace, received);
      rdzv.report_failure(attempt, 128 + received,
                          str("machine ", topology.machine_rank, "'s launcher was interrupted"));
      std::cerr << "[launch] workers stopped (attempt " << attempt << "):\n" << group.exit_table();
      return 128 + received;
    }
    if (group.all_succeeded()) {
      // Other machines check for a failure before reporting done: once every machine has, machine 0
      // closes the store, and a later check would mistake that for a failure. Machine 0 checks last.
      const bool main_machine = topology.machine_rank == 0;
      std::optional<std::pair<int, std::string>> failed;
      if (!main_machine) failed = rdzv.failure(attempt);
      if (!failed) rdzv.report_done(attempt);
      if (main_machine && topology.num_machines > 1) {
        if (!rdzv.wait_until_all_done(attempt, ms(l.rdzv_timeout)))
          log_warn("[launch] not every machine reported its end; machine 0 closes the rendezvous anyway");
        failed = rdzv.failure(attempt);
      }
      if (!failed && group.any_stopped()) {
        if (!options.resume_command.empty())
          std::cerr << "[launch] the run stopped early with its work saved; continue it with:\n  "
                    << options.resume_command << "\n";
        return static_cast<int>(ExitCode::kStopped);
      }
      if (!failed) return 0;
      std::cerr << "[launch] this machine's workers succeeded, but " << failed->second << "\n";
      return failed->first;
    }
    // A failure: here (first_failure) or on another machine (remote). Once every worker has
    // stopped, the root cause is the rank that recorded the earliest error.
    const WorkerStatus* first = group.first_failure();
    group.stop(options.grace);
    int code = 1;
    std::string what;
    if (first) {
      const WorkerGroup::RootCause root = group.root_cause();
      const WorkerStatus& f = *root.worker;
      code = f.failed() ? f.exit_code() : first->exit_code();
      const std::string who = str("rank ", f.rank, " (machine ", topology.machine_rank, ", pid ", f.pid, ")");
      what = str(who, " ",
                 root.message.empty() ? "ended with " + f.describe() : str("failed first: ", first_line(root.message)));
      rdzv.report_failure(attempt, code, what);
      // The workers leave their errors to the launcher: the cause in full, once, then what else the ranks said.
      if (!root.message.empty()) {
        std::cerr << "[launch] " << who << " failed first:\n";
        for (const std::string& line : split(root.message, '\n')) std::cerr << "error: " << line << "\n";
        for (const std::string& line : group.other_errors(root.message)) std::cerr << "[launch] " << line << "\n";
        what = "";
      }
    } else {
      code = remote->first;
      what = remote->second;
    }
    std::cerr << "[launch] " << (what.empty() ? std::string("the") : what + "; the")
              << " other workers were stopped (attempt " << attempt << "):\n"
              << group.exit_table();
    if (stopping) return code;  // asked to stop: never restarted
    if (attempt >= l.max_restarts) {
      if (l.max_restarts > 0) std::cerr << "[launch] no restarts left (--max_restarts " << l.max_restarts << ")\n";
      return code;
    }
    log_warn(str("[launch] restarting the workers (restart ", attempt + 1, " of ", l.max_restarts, ")"));
  }
}

}  // namespace fsdp::launch

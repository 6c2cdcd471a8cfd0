#include "launch/worker_group.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <thread>

#include "dist/error_file.h"
#include "launch/cpu_affinity.h"
#include "util/error.h"
#include "util/files.h"
#include "util/log.h"
#include "util/signal_name.h"
#include "util/strings.h"

extern char** environ;

namespace fsdp::launch {

namespace {

void write_all(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed stdout must not stop supervision
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// The child's environment: the launcher's, with the worker's variables set on top.
std::vector<std::string> merged_env(const EnvList& overrides) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [k, v] : overrides) replaced |= k == name;
    if (!replaced) out.push_back(entry);
  }
  for (const auto& [k, v] : overrides) out.push_back(k + "=" + v);
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& items) {
  std::vector<char*> out;
  for (auto& s : items) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

bool WorkerStatus::succeeded() const {
  return !running && exited && (code == 0 || code == static_cast<int>(ExitCode::kStopped));
}

std::string WorkerStatus::describe() const {
  if (running) return "running";
  if (exited && code == static_cast<int>(ExitCode::kStopped)) return str("stopped, its work saved (exit ", code, ")");
  std::string s = exited ? str("exit ", code) : signal_name(signal);
  // Only a signal is the launcher's doing: a worker that exited with a code of its own ended by itself.
  if (stopped_by_launcher && !exited) s += " (stopped by the launcher)";
  return s;
}

// One output pipe of one worker, with the partial line not yet relayed.
struct WorkerGroup::Stream {
  int fd = -1;
  int to_fd = 1;  // the launcher's stdout or stderr
  size_t worker = 0;
  std::string prefix;
  std::string pending;
};

WorkerGroup::WorkerGroup(const std::vector<WorkerSpec>& specs, const std::string& log_dir, int attempt,
                         const std::string& error_dir) {
  if (!log_dir.empty()) {
    try {
      make_directories(log_dir);
    } catch (const Error& e) {
      throw InputError(str("[launch] --log_dir: ", e.what()));
    }
  }
  const pid_t launcher = ::getpid();
  for (size_t i = 0; i < specs.size(); ++i) {
    const WorkerSpec& spec = specs[i];
    FSDP_ASSERT(!spec.argv.empty(), "worker ", spec.rank, " has no command");
    int out_pipe[2], err_pipe[2];
    FSDP_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0,
               "[launch] cannot create pipes: ", std::strerror(errno));
    int log_fd = -1;
    if (!log_dir.empty()) {
      const std::string path = str(log_dir, "/rank", spec.rank, ".log");
      log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      FSDP_CHECK(log_fd >= 0, "[launch] cannot open ", path, ": ", std::strerror(errno), "; check --log_dir");
      write_all(log_fd, str("==== attempt ", attempt, " ====\n"));
    }
    // Everything the child needs is built before fork: after it, only exec-safe calls.
    EnvList spec_env = spec.env;
    const std::string error_file = error_dir.empty() ? "" : str(error_dir, "/rank", spec.rank, ".json");
    if (!error_file.empty()) spec_env.emplace_back(dist::kErrorFileVariable, error_file);
    std::vector<std::string> env = merged_env(spec_env);
    std::vector<std::string> argv = spec.argv;
    std::vector<char*> c_env = c_strings(env), c_argv = c_strings(argv);
    cpu_set_t cpus;  // enable_cpu_affinity: the child pins itself before exec
    CPU_ZERO(&cpus);
    for (int c : spec.cpus) CPU_SET(c, &cpus);
    const std::string pin_warning =
        str("[launch] warning: cannot pin rank ", spec.rank, " to CPUs ", format_cpu_list(spec.cpus), "\n");
    // Signals stay blocked across fork until the child has dropped the launcher's handlers: a
    // SIGTERM that reaches the child earlier must kill it, not run the launcher's handler there.
    sigset_t all, saved;
    sigfillset(&all);
    ::sigprocmask(SIG_SETMASK, &all, &saved);
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) ::signal(sig, SIG_DFL);
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(1);  // the launcher died before prctl took effect
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::dup2(out_pipe[1], 1);
      ::dup2(err_pipe[1], 2);
      if (!spec.cpus.empty() && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) write_all(2, pin_warning);
      ::execvpe(c_argv[0], c_argv.data(), c_env.data());
      const std::string msg = str("[launch] cannot run ", c_argv[0], ": ", std::strerror(errno), "\n");
      write_all(2, msg);
      ::_exit(127);
    }
    const int fork_errno = errno;
    ::sigprocmask(SIG_SETMASK, &saved, nullptr);
    FSDP_CHECK(pid >= 0, "[launch] cannot start worker ", spec.rank, ": fork failed: ", std::strerror(fork_errno));
    ::setpgid(pid, pid);  // also in the parent, so signal_all never races the child's setpgid
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    WorkerStatus st;
    st.rank = spec.rank;
    st.local_rank = spec.local_rank;
    st.pid = pid;
    st.error_file = error_file;
    status_.push_back(st);
    log_fds_.push_back(log_fd);
    for (auto [fd, to] : {std::pair<int, int>{out_pipe[0], 1}, {err_pipe[0], 2}}) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      auto s = std::make_unique<Stream>();
      s->fd = fd;
      s->to_fd = to;
      s->worker = i;
      s->prefix = str("[rank ", spec.rank, "] ");
      streams_.push_back(std::move(s));
    }
  }
}

WorkerGroup::~WorkerGroup() {
  for (auto& st : status_) ::kill(-st.pid, SIGKILL);  // the worker and anything it left in its group
  for (auto& st : status_)
    if (st.running) ::waitpid(st.pid, nullptr, 0);
  for (auto& s : streams_) {
    if (s->fd >= 0) {
      drain(*s, true);
      ::close(s->fd);
    }
  }
  for (int fd : log_fds_)
    if (fd >= 0) ::close(fd);
}

void WorkerGroup::drain(Stream& s, bool final) {
  char buf[65536];
  while (true) {
    ssize_t n = ::read(s.fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0 || final) {  // EOF: the worker closed it (exited)
        ::close(s.fd);
        s.fd = -1;
      }
      break;
    }
    s.pending.append(buf, static_cast<size_t>(n));
  }
  std::string out, logged;
  size_t start = 0, nl;
  const bool tty = ::isatty(s.to_fd);
  while ((nl = s.pending.find('\n', start)) != std::string::npos) {
    const std::string line = s.pending.substr(start, nl - start + 1);
    start = nl + 1;
    if (line.rfind(kProgressLinePrefix, 0) == 0) {
      // Drawn in place on a terminal; never in pipes or log files.
      if (tty)
        out += "\r\033[K" + s.prefix +
               line.substr(sizeof(kProgressLinePrefix) - 1, line.size() - sizeof(kProgressLinePrefix));
      progress_shown_ = tty;
      continue;
    }
    if (progress_shown_) out += "\r\033[K";
    progress_shown_ = false;
    out += s.prefix + line;
    logged += s.prefix + line;
  }
  s.pending.erase(0, start);
  if (s.fd < 0 && !s.pending.empty()) {  // a last line without a newline
    out += s.prefix + s.pending + "\n";
    logged += s.prefix + s.pending + "\n";
    s.pending.clear();
  }
  if (out.empty()) return;
  write_all(s.to_fd, out);
  set_progress_line_live(progress_shown_);
  if (log_fds_[s.worker] >= 0 && !logged.empty()) write_all(log_fds_[s.worker], logged);
}

void WorkerGroup::reap() {
  for (auto& st : status_) {
    if (!st.running) continue;
    int wstatus = 0;
    pid_t r = ::waitpid(st.pid, &wstatus, WNOHANG);
    if (r != st.pid) continue;
    st.running = false;
    st.ended = std::chrono::steady_clock::now();
    st.ended_unix_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    if (WIFEXITED(wstatus)) {
      st.exited = true;
      st.code = WEXITSTATUS(wstatus);
    } else if (WIFSIGNALED(wstatus)) {
      st.signal = WTERMSIG(wstatus);
    }
  }
}

void WorkerGroup::poll(std::chrono::milliseconds timeout, int wake_fd) {
  std::vector<pollfd> fds;
  std::vector<Stream*> owners;
  for (auto& s : streams_)
    if (s->fd >= 0) {
      fds.push_back({s->fd, POLLIN, 0});
      owners.push_back(s.get());
    }
  if (wake_fd >= 0) fds.push_back({wake_fd, POLLIN, 0});
  if (fds.empty()) {
    std::this_thread::sleep_for(timeout);
  } else {
    int n = ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
    if (n > 0)
      for (size_t i = 0; i < owners.size(); ++i)
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) drain(*owners[i], false);
  }
  reap();
}

bool WorkerGroup::all_exited() const {
  for (const auto& st : status_)
    if (st.running) return false;
  return true;
}

bool WorkerGroup::all_succeeded() const {
  for (const auto& st : status_)
    if (!st.succeeded()) return false;
  return true;
}

bool WorkerGroup::any_stopped() const {
  for (const auto& st : status_)
    if (!st.running && st.exited && st.code == static_cast<int>(ExitCode::kStopped)) return true;
  return false;
}

const WorkerStatus* WorkerGroup::first_failure() const {
  const WorkerStatus* first = nullptr;
  for (const auto& st : status_)
    if (st.failed() && (!first || st.ended < first->ended)) first = &st;
  return first;
}

void WorkerGroup::signal_all(int sig) {
  for (auto& st : status_)
    if (st.running) ::kill(-st.pid, sig);
}

void WorkerGroup::stop(std::chrono::milliseconds grace, int sig) {
  for (auto& st : status_)
    if (st.running) {
      st.stopped_by_launcher = true;
      ::kill(-st.pid, sig);
    }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (!all_exited() && std::chrono::steady_clock::now() < deadline) poll(std::chrono::milliseconds(20));
  for (auto& st : status_)
    if (st.running) ::kill(-st.pid, SIGKILL);
  while (!all_exited()) poll(std::chrono::milliseconds(20));
  for (auto& s : streams_)
    if (s->fd >= 0) drain(*s, true);
}

WorkerGroup::RootCause WorkerGroup::root_cause() const {
  RootCause root{first_failure(), ""};
  int64_t earliest = 0;
  for (const auto& st : status_) {
    if (st.error_file.empty() || (!st.failed() && !st.stopped_by_launcher)) continue;
    const auto e = dist::read_worker_error(st.error_file);
    if (e && (root.message.empty() || e->unix_ns < earliest)) {
      root = {&st, e->message};
      earliest = e->unix_ns;
    }
  }
  // A rank killed by a signal the launcher did not send (the out-of-memory killer, a crash, a kill
  // -9) records nothing, and its peers record "a peer is gone" only after losing it; the launcher
  // may see those records before it sees the death. So the killed rank is the root cause unless
  // an error was recorded clearly (a second) before the launcher saw it die.
  const WorkerStatus* killed = nullptr;
  for (const auto& st : status_)
    if (st.failed() && !st.exited && (!killed || st.ended < killed->ended)) killed = &st;
  constexpr int64_t kSlackNs = 1000000000;
  if (killed && (root.message.empty() || earliest > killed->ended_unix_ns - kSlackNs)) root = {killed, ""};
  return root;
}

std::vector<std::string> WorkerGroup::other_errors(const std::string& root_message) const {
  std::vector<std::pair<std::string, std::vector<std::string>>> by_message;  // in rank order of first sight
  for (const auto& st : status_) {
    if (st.error_file.empty()) continue;
    const auto e = dist::read_worker_error(st.error_file);
    if (!e) continue;
    auto it = std::find_if(by_message.begin(), by_message.end(), [&](const auto& m) { return m.first == e->message; });
    if (it == by_message.end()) it = by_message.insert(by_message.end(), {e->message, {}});
    it->second.push_back(std::to_string(st.rank));
  }
  std::vector<std::string> lines;
  for (const auto& [message, ranks] : by_message) {
    const std::string who = str(ranks.size() > 1 ? "ranks " : "rank ", join(ranks, ", "));
    if (message != root_message)
      lines.push_back(str(who, ": ", message.substr(0, message.find('\n'))));
    else if (ranks.size() > 1)
      lines.insert(lines.begin(), str(who, " failed the same way"));
  }
  return lines;
}

std::string WorkerGroup::exit_table() const {
  const WorkerStatus* first = root_cause().worker;
  std::ostringstream out;
  out << "  rank  local  pid       how it ended\n";
  for (const auto& st : status_) {
    out << "  " << std::left << std::setw(6) << st.rank << std::setw(7) << st.local_rank << std::setw(10) << st.pid
        << st.describe() << (&st == first ? "   <- first failure" : "") << "\n";
  }
  return out.str();
}

}  // namespace fsdp::launch

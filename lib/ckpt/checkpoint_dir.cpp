#include "ckpt/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "ckpt/format.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

// The nearest part of `dir` that exists ("a/b/c" -> "a" when only a exists); "" when none does.
std::string nearest_existing(std::string dir) {
  struct stat st;
  while (!dir.empty() && ::stat(dir.c_str(), &st) != 0) {
    const std::string up = parent_folder(dir);
    if (up == dir) return "";
    dir = up;
  }
  return dir;
}

// Throws unless `dir` is, or could be created as, a folder this process can write.
void check_writable(const std::string& dir) {
  const std::string existing = nearest_existing(dir);
  FSDP_CHECK(!existing.empty(), "[ckpt] checkpoint.dir ", quoted(dir), ": no part of the path exists");
  FSDP_CHECK(is_directory(existing), "[ckpt] checkpoint.dir ", quoted(dir), ": ", quoted(existing),
             " is a file, so no checkpoint can be saved there; give a folder path (it is created when missing)");
  FSDP_CHECK(::access(existing.c_str(), W_OK | X_OK) == 0, "[ckpt] checkpoint.dir ", quoted(dir), ": ",
             quoted(existing), " is not writable (", std::strerror(errno),
             "); give a folder this user can write, or fix its permissions");
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string in_use_message(const std::string& dir, const std::string& holder) {
  return str("[ckpt] checkpoint.dir ", quoted(dir), " is in use by another run (", holder,
             "); two runs saving into one folder would delete each other's saves. Wait for that run to end, stop "
             "it, or give this run another checkpoint.dir");
}

}  // namespace

uint64_t checkpoint_bytes(int64_t num_parameters) {
  const uint64_t tensors = static_cast<uint64_t>(num_parameters) * 12;
  return tensors + tensors / 100 + (uint64_t{64} << 10);
}

uint64_t checkpoint_size(const std::string& path) {
  uint64_t total = 0;
  try {
    const nlohmann::json m = read_json_file(path_in(path, kManifest));
    for (const auto& [name, entry] : m.at("files").items()) total += entry.at("bytes").get<uint64_t>();
  } catch (const std::exception&) {
    return 0;  // unreadable: counts as nothing to free
  }
  return total;
}

std::vector<std::string> removable_before_save(const std::string& dir, int64_t keep, FileSystem& fs, bool keep_best) {
  if (keep < 2) return {};
  std::vector<std::string> all = complete_checkpoints(dir, fs);
  if (keep_best) {
    const std::string best = best_checkpoint(dir, fs);
    all.erase(std::remove(all.begin(), all.end(), best), all.end());
  }
  const size_t remove = all.size() + 1 > static_cast<size_t>(keep) ? all.size() + 1 - keep : 0;
  all.resize(remove);
  return all;
}

std::string best_checkpoint(const std::string& dir, FileSystem& fs) {
  std::string best;
  double lowest = 0;
  for (const std::string& path : complete_checkpoints(dir, fs)) {
    const std::optional<nlohmann::json> state = try_read_json_file(path_in(path, kState));
    if (!state || !state->is_object() || !state->contains("eval_loss") || !(*state)["eval_loss"].is_number()) continue;
    const double loss = (*state)["eval_loss"].get<double>();
    if (best.empty() || loss < lowest) {  // the earliest of equals
      best = path;
      lowest = loss;
    }
  }
  return best;
}

std::vector<std::string> damaged_checkpoints(const std::string& dir, FileSystem& fs) {
  std::vector<std::string> out;
  for (const std::string& e : fs.list(dir))
    if (step_of(e) && !fs.exists(path_in(path_in(dir, e), kManifest))) out.push_back(path_in(dir, e));
  return out;
}

void check_checkpoint_dir(const std::string& dir, uint64_t needed, int64_t keep, FileSystem& fs) {
  check_writable(dir);
  const std::vector<std::string> damaged = damaged_checkpoints(dir, fs);
  FSDP_CHECK(damaged.empty(), "[ckpt] ", damaged.empty() ? "" : damaged.back(),
             " has no manifest.json: the checkpoint is damaged (a save becomes step-N only after its manifest is "
             "written, so the file was removed or lost since). fsdptrain neither resumes past it nor overwrites it; "
             "move the folder away (or delete it) to resume from the one before, or use another checkpoint.dir");
  const uint64_t free = fs.available_bytes(dir);
  if (free >= needed) return;
  uint64_t reclaimable = 0;
  for (const std::string& old : removable_before_save(dir, keep, fs)) reclaimable += checkpoint_size(old);
  FSDP_CHECK(free + reclaimable >= needed, "[ckpt] checkpoint.dir ", quoted(dir), ": a checkpoint of this model needs ",
             format_bytes(static_cast<long long>(needed)), " but the disk has ",
             format_bytes(static_cast<long long>(free)), " free",
             reclaimable > 0 ? str(" (", format_bytes(static_cast<long long>(reclaimable)),
                                   " more once checkpoint.keep removes old ones)")
                             : std::string(),
             ", so the first save would fail after training. Free space, use another checkpoint.dir, or set "
             "checkpoint.keep (now ",
             keep, ") to 2 or more so a save removes the oldest checkpoint first");
}

std::optional<std::string> lock_holder(const std::string& dir) {
  const int fd = ::open(path_in(dir, kLockFile).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> holder;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    char buf[512] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    holder = trim(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0));
    if (holder->empty()) holder = "a process that has not written its name yet";
  }
  ::close(fd);  // releases the shared lock, if taken
  return holder;
}

void check_unlocked(const std::string& dir) {
  if (const auto holder = lock_holder(dir)) throw InputError(in_use_message(dir, *holder));
}

DirLock::DirLock(const std::string& dir) {
  check_writable(dir);
  make_directories(dir);
  const std::string path = path_in(dir, kLockFile);
  // Never through a link: a planted .fsdptrain.lock -> somefile would have it truncated and written.
  try {
    fd_ = open_no_follow(path, "[ckpt] checkpoint.dir's lock file");
  } catch (const InputError&) {
    throw;
  } catch (const Error& e) {
    throw InputError(str(e.what(), "; give a checkpoint.dir this user can write"));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const auto holder = lock_holder(dir);
    ::close(fd_);
    fd_ = -1;
    FSDP_CHECK(err != EWOULDBLOCK, in_use_message(dir, holder.value_or("holder unknown")));
    throw InputError(str("[ckpt] checkpoint.dir ", quoted(dir), ": cannot lock ", path, " (", std::strerror(err),
                         "); the file system may not support locks"));
  }
  const std::string me = str("host ", host_name(), ", pid ", ::getpid(), ", since ", now_utc(), "\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
    throw InputError(str("[ckpt] checkpoint.dir ", quoted(dir), ": cannot write ", path, " (", std::strerror(errno),
                         "); is the disk full?"));
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the lock
}

}  // namespace fsdp::ckpt

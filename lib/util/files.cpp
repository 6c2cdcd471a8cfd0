#include "util/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "util/error.h"
#include "util/strings.h"

namespace fsdp {

std::string file_problem(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return "not found";
    if (errno == ELOOP) return "a loop of symbolic links (Too many levels of symbolic links)";
    return std::strerror(errno);
  }
  if (S_ISDIR(st.st_mode)) return "a folder, not a file";
  if (S_ISFIFO(st.st_mode)) return "not a regular file (a FIFO, which would block until something writes to it)";
  if (!S_ISREG(st.st_mode)) return "not a regular file (a device or socket)";
  if (::access(path.c_str(), R_OK) != 0) return str("not readable (", std::strerror(errno), ")");
  return "";
}

std::string read_file(const std::string& path) {
  const std::string problem = file_problem(path);
  FSDP_CHECK(problem.empty(), path, ": cannot read: ", problem);
  std::ifstream in(path, std::ios::binary);
  FSDP_CHECK(in.good(), path, ": cannot read: ", std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void make_directories(const std::string& path) {
  for (size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
    const std::string prefix = path.substr(0, end);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
      throw Error(str("cannot create folder ", prefix, ": ", std::strerror(errno)));
    if (end == std::string::npos) break;
  }
}

namespace {

void fsync_folder(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;
  ::fsync(dfd);
  ::close(dfd);
}

}  // namespace

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
  const std::string dir = parent_folder(path_);
  try {
    make_directories(dir);
  } catch (const Error& e) {
    throw Error(str(path_, ": ", e.what()));
  }
  tmp_ = dir + "/." + base_name(path_) + ".tmp." + std::to_string(::getpid());
  ::unlink(tmp_.c_str());  // an earlier crash's, or a planted link: O_EXCL below refuses both anyway
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(str(path_, ": cannot create ", tmp_, ": ", std::strerror(errno)));
}

OutputFile::~OutputFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void OutputFile::write(std::string_view bytes) {
  FSDP_ASSERT(fd_ >= 0, "OutputFile::write after commit");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(str(path_, ": write failed: ", std::strerror(errno), "; ", path_, " was not changed"));
    done += static_cast<size_t>(n);
  }
}

void OutputFile::commit() {
  FSDP_ASSERT(fd_ >= 0, "OutputFile::commit twice");
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    throw Error(str(path_, ": write failed: ", std::strerror(err), "; ", path_, " was not changed"));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    throw Error(str(path_, ": rename from ", tmp_, " failed: ", std::strerror(err)));
  }
  fsync_folder(parent_folder(path_));
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  OutputFile out(path);
  out.write(contents);
  out.commit();
}

std::string confined_path(const std::string& dir, const std::string& name, const std::string& where) {
  bool escapes = name.empty() || name.front() == '/';
  for (const std::string& part : split(name, '/')) escapes = escapes || part == "..";
  const std::string path = dir + "/" + name;
  FSDP_CHECK(!escapes, where, " names ", quoted(name), ", which is outside ", dir,
             "; files a metadata file names must lie in its own folder. Refusing to read it: the folder is "
             "damaged or was made to read files elsewhere");
  return path;
}

int open_no_follow(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ELOOP)
    throw InputError(str(what, " ", quoted(path),
                         " is a symbolic link; fsdptrain never writes through a link "
                         "(it could point at any file). Remove the link"));
  if (fd < 0) throw Error(str(what, " ", quoted(path), ": cannot open: ", std::strerror(errno)));
  return fd;
}

std::string absolute_path(const std::string& path) {
  if (char* real = ::realpath(path.c_str(), nullptr)) {
    std::string out(real);
    std::free(real);
    return out;
  }
  if (!path.empty() && path.front() == '/') return path;
  char cwd[4096];
  return ::getcwd(cwd, sizeof(cwd)) ? std::string(cwd) + "/" + path : path;
}

std::string folder_glob(const std::string& folder) {
  std::string best = ".bin";
  size_t most = 0;
  for (const char* ext : {".bin", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".txt"}) {
    const size_t n = glob_paths(folder + "/*" + ext).size();
    if (n > most) {
      most = n;
      best = ext;
    }
  }
  return folder + "/*" + best;
}

std::string lexically_normal(const std::string& path) {
  std::vector<std::string> parts;
  for (const std::string& p : split(path, '/')) {
    if (p.empty() || p == ".") continue;
    if (p == ".." && !parts.empty() && parts.back() != "..")
      parts.pop_back();
    else if (!(p == ".." && !path.empty() && path[0] == '/' && parts.empty()))
      parts.push_back(p);
  }
  const std::string joined = join(parts, "/");
  if (!path.empty() && path[0] == '/') return "/" + joined;
  return joined.empty() ? "." : joined;
}

std::string home_dir() {
  if (const char* h = std::getenv("HOME"); h && *h) return h;
  if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir) return pw->pw_dir;
  return ".";
}

std::string host_name() {
  char buf[256] = {0};
  return ::gethostname(buf, sizeof(buf) - 1) == 0 && buf[0] ? std::string(buf) : "localhost";
}

int64_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

void remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    ::unlink(path.c_str());
    return;
  }
  if (DIR* d = ::opendir(path.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") remove_tree(path + "/" + name);
    }
    ::closedir(d);
  }
  ::rmdir(path.c_str());
}

std::string parent_folder(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::vector<std::string> glob_paths(const std::string& pattern) {
  glob_t g{};
  std::vector<std::string> out;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  std::sort(out.begin(), out.end());
  return out;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace fsdp

#include "ckpt/direct_read.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "ckpt/file_system.h"
#include "util/crc32c.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

// The fraction of a file's pages in the page cache (0 where that cannot be told).
double cached_fraction(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st {};
  const bool ok = ::fstat(fd, &st) == 0 && st.st_size > 0;
  void* map = ok ? ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (map == MAP_FAILED) return 0;
  const auto size = static_cast<size_t>(st.st_size);
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((size + page - 1) / page);
  size_t n = 0;
  if (::mincore(map, size, resident.data()) == 0)
    for (unsigned char r : resident) n += r & 1;
  ::munmap(map, size);
  return static_cast<double>(n) / static_cast<double>(resident.size());
}

// One request: bytes [offset, offset + length) of a file (on block boundaries), and the ranges it
// holds part of.
struct Request {
  size_t file = 0;
  uint64_t offset = 0, length = 0;
  std::vector<size_t> reads;
};

// A piece of a range as one request held it: its first byte (in the file), length and CRC-32C.
struct Part {
  size_t read = 0;
  uint64_t at = 0, length = 0;
  uint32_t crc = 0;
};

struct OpenFile {
  std::string path;
  int fd = -1;
  std::atomic<bool> refused{false};  // O_DIRECT reads fail with EINVAL there
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

// The requests for one file's ranges (`order`: their indices, by offset): neighbouring ranges merge
// into sweeps, each cut into requests of `bytes`.
void plan_file(size_t file, const std::vector<RangeRead>& reads, const std::vector<size_t>& order,
               const DirectReadOptions& o, std::vector<Request>& out) {
  size_t i = 0;
  while (i < order.size()) {
    const uint64_t start = reads[order[i]].offset / kDirectAlignment * kDirectAlignment;
    uint64_t end = reads[order[i]].offset + reads[order[i]].length;
    size_t j = i + 1;
    while (j < order.size() && reads[order[j]].offset <= end + o.merge_gap) {
      end = std::max(end, reads[order[j]].offset + reads[order[j]].length);
      ++j;
    }
    const size_t first = out.size();
    for (uint64_t at = start; at < end; at += o.request_bytes)
      out.push_back({file, at, std::min(o.request_bytes, round_up_to_block(end) - at), {}});
    for (size_t k = i; k < j; ++k) {
      const RangeRead& r = reads[order[k]];
      if (r.length == 0) continue;
      const uint64_t lo = (r.offset - start) / o.request_bytes,
                     hi = (r.offset + r.length - 1 - start) / o.request_bytes;
      for (uint64_t q = lo; q <= hi; ++q) out[first + q].reads.push_back(order[k]);
    }
    i = j;
  }
}

// Reads one request into `buffer` and copies out the parts of its ranges; false when the file
// refused O_DIRECT. The last request of a file may end past it: its bytes end at the file's end.
bool serve(const Request& q, OpenFile& f, char* buffer, std::vector<RangeRead>& reads, std::vector<Part>& parts) {
  uint64_t got = 0;
  while (got < q.length) {
    const ssize_t r = ::pread(f.fd, buffer + got, q.length - got, static_cast<off_t>(q.offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EINVAL && got == 0) return false;
    if (r < 0)
      throw Error(str("[ckpt] cannot read ", quoted(f.path), ": a direct (O_DIRECT) read failed: ",
                      std::strerror(errno), "; set checkpoint.direct_io: false to read through the page cache"));
    if (r == 0) break;  // the file's end
    got += static_cast<uint64_t>(r);
    if (got % kDirectAlignment != 0) break;  // a direct read ends short only at the file's end
  }
  for (size_t i : q.reads) {
    RangeRead& r = reads[i];
    const uint64_t lo = std::max(r.offset, q.offset), hi = std::min(r.offset + r.length, q.offset + got);
    FSDP_CHECK(hi > lo, "[ckpt] ", quoted(f.path), " ends at byte ", q.offset + got, ", before byte ",
               r.offset + r.length, " its header says it holds");
    std::memcpy(static_cast<char*>(r.dest) + (lo - r.offset), buffer + (lo - q.offset), hi - lo);
    parts.push_back({i, lo, hi - lo, crc32c(buffer + (lo - q.offset), hi - lo)});
  }
  return true;
}

}  // namespace

void read_ranges_direct(std::vector<RangeRead>& reads, const DirectReadOptions& o) {
  FSDP_ASSERT(o.request_bytes > 0 && o.request_bytes % kDirectAlignment == 0 && o.threads > 0,
              "read_ranges_direct: bad options");
  std::map<std::string, std::vector<size_t>> by_file;
  for (size_t i = 0; i < reads.size(); ++i) reads[i].done = false, by_file[reads[i].path].push_back(i);
  std::vector<std::unique_ptr<OpenFile>> files;
  std::vector<Request> requests;
  for (auto& [path, order] : by_file) {
    if (cached_fraction(path) >= o.cached_at_least) continue;
    auto f = std::make_unique<OpenFile>();
    f->path = path;
    f->fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (f->fd < 0) continue;  // tmpfs and others refuse O_DIRECT at open
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return reads[a].offset < reads[b].offset; });
    plan_file(files.size(), reads, order, o, requests);
    files.push_back(std::move(f));
  }
  if (requests.empty()) return;

  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::vector<Part> parts;
  std::exception_ptr error;
  auto work = [&]() {
    std::unique_ptr<char, decltype(&std::free)> buffer(
        static_cast<char*>(std::aligned_alloc(kDirectAlignment, o.request_bytes)), &std::free);
    std::vector<Part> mine;
    try {
      for (size_t k = next++; k < requests.size(); k = next++) {
        OpenFile& f = *files[requests[k].file];
        if (!f.refused && !serve(requests[k], f, buffer.get(), reads, mine)) f.refused = true;
      }
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
      next = requests.size();  // the others stop too
    }
    const std::lock_guard<std::mutex> lock(mutex);
    parts.insert(parts.end(), mine.begin(), mine.end());
  };
  std::vector<std::thread> threads;
  const size_t n = std::min<size_t>(static_cast<size_t>(o.threads), requests.size());
  for (size_t t = 1; t < n; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);

  // Each range's checksum from its parts in order (a range the file refused stays not done).
  std::sort(parts.begin(), parts.end(),
            [](const Part& a, const Part& b) { return a.read != b.read ? a.read < b.read : a.at < b.at; });
  std::map<std::string, bool> refused;
  for (const auto& f : files) refused[f->path] = f->refused;
  for (size_t p = 0; p < parts.size();) {
    RangeRead& r = reads[parts[p].read];
    uint32_t crc = 0;
    uint64_t covered = 0;
    for (; p < parts.size() && &reads[parts[p].read] == &r; ++p) {
      crc = covered == 0 ? parts[p].crc : crc32c_join(crc, parts[p].crc, parts[p].length);
      covered += parts[p].length;
    }
    if (refused.at(r.path)) continue;
    FSDP_ASSERT(covered == r.length, "read_ranges_direct: ", r.path, " range at ", r.offset, " read ", covered, " of ",
                r.length, " bytes");
    r.crc = crc;
    r.done = true;
  }
}

}  // namespace fsdp::ckpt

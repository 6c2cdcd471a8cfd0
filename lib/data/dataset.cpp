#include "data/dataset.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <numeric>

#include "tokenize/corpus.h"
#include "tokenize/documents.h"
#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::data {

namespace {

constexpr int32_t kMagicUint16 = 20240520, kMagicUint32 = 20240801;
constexpr int64_t kHeaderBytes = 256 * 4;

void pread_all(int fd, uint8_t* out, size_t n, int64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + static_cast<int64_t>(done)));
    FSDP_CHECK(r > 0, "[data] cannot read ", path, ": ", r < 0 ? std::strerror(errno) : "the file got shorter");
    done += static_cast<size_t>(r);
  }
}

// Text files and JSONL as bytes: each document EOT then its bytes; a pair's prompt bytes are not
// targets (the EOT is: it ends the document before).
class ByteDocuments {
 public:
  void add_file(const std::string& path, const std::string& field) {
    tokenize::DocumentReader reader(path, field, "[data]", "data.field");
    for (auto docs = reader.next(size_t{1} << 22); !docs.empty(); docs = reader.next(size_t{1} << 22))
      for (const tokenize::Document& d : docs) add(d, path);
  }
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  int64_t longest_prompt = 0;
  std::string longest_prompt_at;

 private:
  void add(const tokenize::Document& d, const std::string& path) {
    tokens.push_back(kByteEndOfText);
    for (unsigned char ch : d.text) tokens.push_back(ch);
    mask.resize(tokens.size(), 1);
    if (!d.pair) return;
    std::fill(mask.end() - static_cast<int64_t>(d.text.size()), mask.end(), 0);
    if (static_cast<int64_t>(d.text.size()) + 1 > longest_prompt) {
      longest_prompt = static_cast<int64_t>(d.text.size()) + 1;
      longest_prompt_at = str(path, ":", d.line);
    }
    for (unsigned char ch : d.completion) tokens.push_back(ch);
    mask.resize(tokens.size(), 1);
  }
};

}  // namespace

// One file of the stream: an llm.c shard read in place, or tokens in memory.
struct TokenStream::Source {
  std::string path;
  int fd = -1;
  int width = 4;  // bytes per token in the shard
  int64_t count = 0, max = -1;
  std::vector<int32_t> memory;  // when fd < 0
  int mask_fd = -1;             // shard_N.mask, when there is one
  std::vector<uint8_t> memory_mask;
  ~Source() {
    if (fd >= 0) ::close(fd);
    if (mask_fd >= 0) ::close(mask_fd);
  }
  bool has_mask() const { return mask_fd >= 0 || !memory_mask.empty(); }
  void read_mask(int64_t begin, int64_t n, uint8_t* out) const {
    if (!has_mask()) {
      std::fill(out, out + n, 1);
    } else if (mask_fd < 0) {
      std::copy(memory_mask.begin() + begin, memory_mask.begin() + begin + n, out);
    } else {
      pread_all(mask_fd, out, static_cast<size_t>(n), begin, path);
    }
  }
  // Tokens [begin, begin + n) of this source into out.
  void read(int64_t begin, int64_t n, int64_t* out) const {
    if (fd < 0) {
      std::copy(memory.begin() + begin, memory.begin() + begin + n, out);
      return;
    }
    thread_local std::vector<uint8_t> buf;
    buf.resize(static_cast<size_t>(n * width));
    pread_all(fd, buf.data(), buf.size(), kHeaderBytes + begin * width, path);
    for (int64_t i = 0; i < n; ++i) {
      if (width == 2) {
        uint16_t t;
        std::memcpy(&t, buf.data() + 2 * i, 2);
        out[i] = t;
      } else {
        uint32_t t;
        std::memcpy(&t, buf.data() + 4 * i, 4);
        out[i] = t;
      }
    }
  }
};

namespace {

// shard_N.mask beside shard_N.bin, when there is one: a byte per token.
void open_mask(TokenStream::Source& src) {
  const std::string mask = src.path.substr(0, src.path.size() - 4) + ".mask";
  if (!file_exists(mask)) return;
  src.mask_fd = ::open(mask.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(src.mask_fd >= 0, "[data] cannot read ", quoted(mask), ": ", std::strerror(errno));
  FSDP_CHECK(file_size(mask) == src.count, "[data] ", mask, " has ", file_size(mask), " bytes but ", src.path, " has ",
             src.count, " tokens: the mask is from another tokenization; tokenize the data again (fsdptrain "
             "tokenize) or delete the .mask files to train on every token");
}

// Opens an llm.c shard: checks its header and size, then scans it once, a few MB at a time.
std::shared_ptr<TokenStream::Source> open_llmc(const std::string& path) {
  auto src = std::make_shared<TokenStream::Source>();
  src->path = path;
  src->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(src->fd >= 0, "[data] cannot read ", quoted(path), ": ", std::strerror(errno));
  struct stat st;
  FSDP_CHECK(::fstat(src->fd, &st) == 0, "[data] cannot read ", quoted(path), ": ", std::strerror(errno));
  const int64_t bytes = st.st_size;
  FSDP_CHECK(bytes >= kHeaderBytes, "[data] ", path, ": ", bytes,
             " bytes is shorter than an llm.c header (1024); is it a token shard?");
  int32_t header[3];
  FSDP_CHECK(::pread(src->fd, header, sizeof(header), 0) == sizeof(header), "[data] cannot read ", quoted(path));
  FSDP_CHECK(header[0] == kMagicUint16 || header[0] == kMagicUint32, "[data] ", path, ": magic ", header[0],
             " is not an llm.c token shard's (20240520 for uint16 tokens, 20240801 for uint32)");
  src->width = header[0] == kMagicUint16 ? 2 : 4;
  src->count = header[2];
  FSDP_CHECK(src->count >= 0 && bytes == kHeaderBytes + src->count * src->width, "[data] ", path, ": the header says ",
             src->count, " tokens of ", src->width, " bytes, but the file has ", bytes - kHeaderBytes,
             " bytes after the header; the file is truncated or not a shard");
  std::vector<int64_t> chunk;
  for (int64_t at = 0; at < src->count; at += 1 << 20) {
    const int64_t n = std::min<int64_t>(1 << 20, src->count - at);
    chunk.resize(static_cast<size_t>(n));
    src->read(at, n, chunk.data());
    for (int64_t i = 0; i < n; ++i) {
      // Unsigned on disk: an id above int32's range once turned negative and passed the vocab check.
      FSDP_CHECK(chunk[i] <= INT32_MAX, "[data] ", path, ": token ", at + i, " (byte ", kHeaderBytes + 4 * (at + i),
                 ") is id ", chunk[i], ", beyond any vocabulary (ids are below 2^31); the shard is corrupt or was not "
                 "written as llm.c uint32 tokens");
      src->max = std::max(src->max, chunk[i]);
    }
  }
  open_mask(*src);
  return src;
}

std::shared_ptr<TokenStream::Source> in_memory_source(std::vector<int32_t> tokens, const std::string& name,
                                                      std::vector<uint8_t> mask) {
  auto src = std::make_shared<TokenStream::Source>();
  src->path = name;
  src->count = static_cast<int64_t>(tokens.size());
  FSDP_ASSERT(mask.empty() || mask.size() == tokens.size(), "a mask of ", mask.size(), " for ", tokens.size());
  for (int32_t t : tokens) src->max = std::max<int64_t>(src->max, t);
  src->memory = std::move(tokens);
  if (std::find(mask.begin(), mask.end(), 0) != mask.end()) src->memory_mask = std::move(mask);
  return src;
}

}  // namespace

TokenStream TokenStream::in_memory(std::vector<int32_t> tokens, const std::string& name, std::vector<uint8_t> mask) {
  TokenStream s;
  s.add(in_memory_source(std::move(tokens), name, std::move(mask)), name);
  return s;
}

void TokenStream::note_prompt(int64_t tokens, const std::string& where) {
  if (tokens <= longest_prompt_) return;
  longest_prompt_ = tokens;
  longest_prompt_at_ = where;
}

bool TokenStream::has_mask() const {
  return std::any_of(sources_.begin(), sources_.end(), [](const auto& s) { return s->has_mask(); });
}

void TokenStream::read_mask(int64_t begin, int64_t n, uint8_t* out) const {
  FSDP_ASSERT(begin >= 0 && begin + n <= size_, "TokenStream::read_mask out of range");
  size_t k = std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1;
  for (; n > 0; ++k) {
    const int64_t local = begin - starts_[k], take = std::min(n, sources_[k]->count - local);
    sources_[k]->read_mask(local, take, out);
    out += take;
    begin += take;
    n -= take;
  }
}

void TokenStream::check_prompts_fit(int64_t seq_len) const {
  check_prompt_fits(longest_prompt_, longest_prompt_at_, seq_len);
}

void check_prompt_fits(int64_t tokens, const std::string& where, int64_t seq_len) {
  FSDP_CHECK(tokens < seq_len, "[data] ", where, ": the prompt is ", tokens, " tokens, and a sequence of "
             "train.sequence_length ", seq_len, " tokens must hold a whole prompt and a target after it; raise "
             "train.sequence_length above ", tokens, ", or shorten or drop that record");
}

void TokenStream::add(std::shared_ptr<const Source> source, const std::string& file) {
  starts_.push_back(size_);
  size_ += source->count;
  sources_.push_back(std::move(source));
  files_.push_back(file);
}

void TokenStream::read(int64_t begin, int64_t n, int64_t* out) const {
  FSDP_ASSERT(begin >= 0 && begin + n <= size_, "TokenStream::read out of range");
  size_t k = std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1;
  while (n > 0) {
    const int64_t local = begin - starts_[k], take = std::min(n, sources_[k]->count - local);
    sources_[k]->read(local, take, out);
    out += take;
    begin += take;
    n -= take;
    ++k;
  }
}

std::vector<int32_t> TokenStream::read_all() const {
  std::vector<int64_t> wide(static_cast<size_t>(size_));
  read(0, size_, wide.data());
  return std::vector<int32_t>(wide.begin(), wide.end());
}

std::vector<int64_t> TokenStream::file_ends() const {
  std::vector<int64_t> out;
  for (size_t k = 0; k < sources_.size(); ++k) out.push_back(starts_[k] + sources_[k]->count);
  return out;
}

int64_t TokenStream::max_token() const {
  int64_t m = -1;
  for (const auto& s : sources_) m = std::max(m, s->max);
  return m;
}

void TokenStream::check_below(int64_t vocab_size, const std::string& fix) const {
  for (const auto& s : sources_) {
    if (s->max < vocab_size) continue;
    std::vector<int64_t> chunk;
    for (int64_t at = 0; at < s->count; at += 1 << 20) {
      const int64_t n = std::min<int64_t>(1 << 20, s->count - at);
      chunk.resize(static_cast<size_t>(n));
      s->read(at, n, chunk.data());
      for (int64_t i = 0; i < n; ++i)
        FSDP_CHECK(chunk[i] < vocab_size, "[data] ", s->path, ": token ", at + i, " is id ", chunk[i],
                   " but the model's vocab_size is ", vocab_size, "; ", fix);
    }
  }
}

TokenStream read_tokens(const std::string& path_or_glob, const std::string& field) {
  FSDP_CHECK(!path_or_glob.empty(),
             "[data] data.path is not set; give a text file, a .jsonl file, llm.c .bin shards, or a glob");
  const std::vector<std::string> files = glob_paths(path_or_glob);
  FSDP_CHECK(!files.empty(), "[data] data.path ", quoted(path_or_glob),
             " matches no file; check the path (relative paths are from the directory fsdptrain runs in)");
  TokenStream s;
  std::vector<std::string> shard_folders;
  for (const std::string& f : files) {
    FSDP_CHECK(!is_directory(f), "[data] data.path ", quoted(f), " is a folder; give a file, or a glob such as ",
               f, "/*.bin to read the files in it");
    std::shared_ptr<TokenStream::Source> src;
    if (ends_with(f, ".bin")) {
      src = open_llmc(f);
      if (src->has_mask() && (shard_folders.empty() || shard_folders.back() != parent_folder(f)))
        shard_folders.push_back(parent_folder(f));
    } else {
      ByteDocuments docs;
      docs.add_file(f, field);
      FSDP_CHECK(docs.tokens.size() > 1, "[data] ", f, " is empty");
      s.note_prompt(docs.longest_prompt, docs.longest_prompt_at);
      src = in_memory_source(std::move(docs.tokens), f, std::move(docs.mask));
    }
    FSDP_CHECK(src->count > 0, "[data] ", f, " is empty");
    s.add(std::move(src), f);
  }
  for (const std::string& folder : shard_folders) {  // the prompts' lengths, as tokenize recorded them
    const tokenize::CorpusSummary made = tokenize::read_corpus_summary(folder);
    s.note_prompt(made.longest_prompt.tokens, str(made.longest_prompt.file, ":", made.longest_prompt.line));
  }
  return s;
}

void write_llmc_shard(const std::string& path, const std::vector<int32_t>& tokens) {
  const bool narrow = std::all_of(tokens.begin(), tokens.end(), [](int32_t t) { return t >= 0 && t < 65536; });
  int32_t header[256] = {};
  header[0] = narrow ? kMagicUint16 : kMagicUint32;
  header[1] = narrow ? 1 : 7;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  for (int32_t t : tokens) {
    if (narrow) {
      const uint16_t v = static_cast<uint16_t>(t);
      out.write(reinterpret_cast<const char*>(&v), 2);
    } else {
      const uint32_t v = static_cast<uint32_t>(t);
      out.write(reinterpret_cast<const char*>(&v), 4);
    }
  }
  FSDP_CHECK(out.good(), "[data] cannot write ", quoted(path));
}

Split split_sequences(int64_t num_tokens, int64_t seq_len, double eval_fraction, const std::string& what) {
  const int64_t sequences = num_tokens > 0 ? (num_tokens - 1) / seq_len : 0;
  FSDP_CHECK(sequences >= 1, "[data] ", what, " has ", num_tokens, " tokens, shorter than one sequence of ",
             seq_len + 1, "; give more data or lower train.sequence_length");
  Split s;
  s.eval_sequences = eval_fraction > 0 ? std::max<int64_t>(1, static_cast<int64_t>(sequences * eval_fraction)) : 0;
  s.train_sequences = sequences - s.eval_sequences;
  FSDP_CHECK(s.train_sequences >= 1, "[data] ", what, ": nothing left to train on after holding out ", s.eval_sequences,
             " sequences for evaluation; lower data.eval_fraction");
  return s;
}

DistributedLoader::DistributedLoader(const TokenStream& stream, int64_t first_sequence, int64_t num_sequences,
                                     int64_t seq_len, int64_t batch, int rank, int world_size, uint64_t seed)
    : stream_(stream),
      first_(first_sequence),
      count_(num_sequences),
      seq_len_(seq_len),
      batch_(batch),
      rank_(rank),
      world_(world_size),
      seed_(seed) {
  FSDP_CHECK(count_ < (int64_t{1} << 32), "[data] ", count_, " sequences of ", seq_len_ + 1,
             " tokens are more than the loader's permutation holds (2^32); raise train.sequence_length or split the "
             "data into several runs");
  FSDP_CHECK(count_ >= batch_ * world_, "[data] ", count_, " sequences of ", seq_len_ + 1,
             " tokens cannot fill one step of ", world_, " ranks x micro batch ", batch_,
             "; give more data, or lower train.micro_batch_size or train.sequence_length");
  shuffle();
}

void DistributedLoader::shuffle() {
  order_.resize(count_);
  std::iota(order_.begin(), order_.end(), 0);
  // Fisher-Yates driven by SplitMix64, spelled out (not std::shuffle, whose draws differ between
  // standard libraries) so other tools can reproduce the order: scripts/reference/ does.
  uint64_t state = seed_ * 1000003ULL + static_cast<uint64_t>(epoch_);
  auto next = [&state]() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  for (int64_t i = count_ - 1; i > 0; --i)
    std::swap(order_[i], order_[static_cast<int64_t>(next() % static_cast<uint64_t>(i + 1))]);
}

void DistributedLoader::set_position(const Position& p) {
  epoch_ = p.epoch;
  offset_ = p.offset;
  shuffle();
}

int64_t DistributedLoader::Batch::counted_targets() const {
  return std::count_if(targets.begin(), targets.end(), [](int64_t y) { return y != kIgnoreTarget; });
}

DistributedLoader::Batch DistributedLoader::next() {
  const int64_t step = batch_ * world_;
  if (offset_ + step > count_) {  // the tail that cannot fill a step is skipped this epoch
    ++epoch_;
    offset_ = 0;
    shuffle();
  }
  Batch b;
  b.inputs.reserve(batch_ * seq_len_);
  b.targets.reserve(batch_ * seq_len_);
  const bool masked = stream_.has_mask();
  for (int64_t i = 0; i < batch_; ++i) {
    const int64_t seq = first_ + order_[offset_ + rank_ * batch_ + i];
    window_.resize(static_cast<size_t>(seq_len_ + 1));
    stream_.read(seq * seq_len_, seq_len_ + 1, window_.data());
    b.inputs.insert(b.inputs.end(), window_.begin(), window_.end() - 1);
    if (masked) {  // a prompt's token is an input, never a target
      mask_.resize(window_.size());
      stream_.read_mask(seq * seq_len_, seq_len_ + 1, mask_.data());
      for (size_t j = 1; j < window_.size(); ++j)
        if (!mask_[j]) window_[j] = kIgnoreTarget;
    }
    b.targets.insert(b.targets.end(), window_.begin() + 1, window_.end());
  }
  offset_ += step;
  return b;
}

}  // namespace fsdp::data

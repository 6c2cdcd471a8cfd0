#include "data/dataset.h"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::data {

namespace {

constexpr int32_t kMagicUint16 = 20240520, kMagicUint32 = 20240801;
constexpr int64_t kHeaderBytes = 256 * 4;

std::vector<std::string> expand(const std::string& pattern) {
  return glob_paths(pattern);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FSDP_CHECK(in.good(), "[data] cannot read ", quoted(path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void append_document(std::vector<int32_t>& out, const std::string& text) {
  out.push_back(kByteEndOfText);
  for (unsigned char ch : text) out.push_back(ch);
}

void read_llmc(const std::string& path, std::vector<int32_t>& out) {
  const std::string bytes = read_all(path);
  FSDP_CHECK(static_cast<int64_t>(bytes.size()) >= kHeaderBytes, "[data] ", path, ": ", bytes.size(),
             " bytes is shorter than an llm.c header (1024); is it a token shard?");
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  FSDP_CHECK(header[0] == kMagicUint16 || header[0] == kMagicUint32, "[data] ", path, ": magic ", header[0],
             " is not an llm.c token shard's (20240520 for uint16 tokens, 20240801 for uint32)");
  const int64_t width = header[0] == kMagicUint16 ? 2 : 4, count = header[2];
  FSDP_CHECK(count >= 0 && static_cast<int64_t>(bytes.size()) == kHeaderBytes + count * width, "[data] ", path,
             ": the header says ", count, " tokens of ", width, " bytes, but the file has ",
             static_cast<int64_t>(bytes.size()) - kHeaderBytes,
             " bytes after the header; the file is truncated or not a shard");
  const char* p = bytes.data() + kHeaderBytes;
  out.reserve(out.size() + count);
  for (int64_t i = 0; i < count; ++i) {
    if (width == 2) {
      uint16_t t;
      std::memcpy(&t, p + 2 * i, 2);
      out.push_back(t);
    } else {
      uint32_t t;
      std::memcpy(&t, p + 4 * i, 4);
      // Unsigned on disk: an id above int32's range would turn negative and pass the vocab check.
      FSDP_CHECK(t <= static_cast<uint32_t>(INT32_MAX), "[data] ", path, ": token ", i, " (byte ",
                 kHeaderBytes + 4 * i, ") is id ", t, ", beyond any vocabulary (ids are below 2^31); the shard is "
                 "corrupt or was not written as llm.c uint32 tokens");
      out.push_back(static_cast<int32_t>(t));
    }
  }
}

void read_jsonl(const std::string& path, std::vector<int32_t>& out) {
  std::ifstream in(path);
  FSDP_CHECK(in.good(), "[data] cannot read ", quoted(path));
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (trim(line).empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      throw InputError(str("[data] ", path, ":", n, ": not valid JSON: ", e.what()));
    }
    auto it = j.find("text");
    FSDP_CHECK(j.is_object() && it != j.end() && it->is_string(), "[data] ", path, ":", n,
               ": expected an object with a string \"text\" field");
    append_document(out, it->get<std::string>());
  }
}

}  // namespace

int64_t TokenStream::max_token() const {
  return tokens.empty() ? -1 : *std::max_element(tokens.begin(), tokens.end());
}

void TokenStream::check_below(int64_t vocab_size, const std::string& fix) const {
  const auto bad = std::find_if(tokens.begin(), tokens.end(), [&](int32_t t) { return t >= vocab_size; });
  if (bad == tokens.end()) return;
  const int64_t index = bad - tokens.begin();
  const size_t file = std::upper_bound(file_ends.begin(), file_ends.end(), index) - file_ends.begin();
  const int64_t first = file == 0 ? 0 : file_ends[file - 1];
  throw InputError(str("[data] ", files.at(file), ": token ", index - first, " is id ", *bad,
                       " but the model's vocab_size is ", vocab_size, "; ", fix));
}

TokenStream read_tokens(const std::string& path_or_glob) {
  FSDP_CHECK(!path_or_glob.empty(),
             "[data] data.path is not set; give a text file, a .jsonl file, llm.c .bin shards, or a glob");
  TokenStream s;
  s.files = expand(path_or_glob);
  FSDP_CHECK(!s.files.empty(), "[data] data.path ", quoted(path_or_glob),
             " matches no file; check the path (relative paths are from the directory fsdptrain runs in)");
  for (const std::string& f : s.files) {
    FSDP_CHECK(!is_directory(f), "[data] data.path ", quoted(f), " is a folder; give a file, or a glob such as ",
               f, "/*.bin to read the files in it");
    const size_t before = s.tokens.size();
    if (ends_with(f, ".bin"))
      read_llmc(f, s.tokens);
    else if (ends_with(f, ".jsonl"))
      read_jsonl(f, s.tokens);
    else
      append_document(s.tokens, read_all(f));
    FSDP_CHECK(s.tokens.size() > before + (ends_with(f, ".bin") ? 0 : 1), "[data] ", f, " is empty");
    s.file_ends.push_back(static_cast<int64_t>(s.tokens.size()));
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
  for (int64_t i = 0; i < batch_; ++i) {
    const int64_t seq = first_ + order_[offset_ + rank_ * batch_ + i];
    const int32_t* t = stream_.tokens.data() + seq * seq_len_;
    b.inputs.insert(b.inputs.end(), t, t + seq_len_);
    b.targets.insert(b.targets.end(), t + 1, t + seq_len_ + 1);
  }
  offset_ += step;
  return b;
}

}  // namespace fsdp::data

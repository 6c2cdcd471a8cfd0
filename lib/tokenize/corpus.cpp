#include "tokenize/corpus.h"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::tokenize {

namespace {

using json = nlohmann::json;

constexpr int32_t kMagicUint16 = 20240520, kMagicUint32 = 20240801;

int cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
}

// llm.c shards under one folder: shard_000000.bin, ... (256 int32 header, then the tokens).
class ShardWriter {
 public:
  ShardWriter(std::string dir, int64_t shard_tokens, int token_bytes)
      : dir_(std::move(dir)), limit_(shard_tokens), width_(token_bytes) {}
  ~ShardWriter() {
    if (file_) std::fclose(file_);
  }
  void add(const std::vector<int32_t>& ids) {
    for (size_t i = 0; i < ids.size();) {
      if (!file_ || count_ == limit_) open_next();
      const size_t n = std::min<size_t>(ids.size() - i, static_cast<size_t>(limit_ - count_));
      if (width_ == 2) {
        std::vector<uint16_t> narrow(ids.begin() + i, ids.begin() + i + n);
        write(narrow.data(), n * 2);
      } else {
        write(ids.data() + i, n * 4);
      }
      count_ += static_cast<int64_t>(n);
      i += n;
    }
  }
  int64_t finish() {  // the number of shards
    close_current();
    return shards_;
  }

 private:
  void write(const void* p, size_t n) {
    FSDP_CHECK(std::fwrite(p, 1, n, file_) == n, "[tokenize] cannot write ", path_, ": ", std::strerror(errno));
  }
  void open_next() {
    close_current();
    char name[32];
    std::snprintf(name, sizeof(name), "/shard_%06lld.bin", static_cast<long long>(shards_++));
    path_ = dir_ + name;
    file_ = std::fopen(path_.c_str(), "wb");
    FSDP_CHECK(file_ != nullptr, "[tokenize] cannot create ", path_, ": ", std::strerror(errno));
    int32_t header[256] = {};
    write(header, sizeof(header));
    count_ = 0;
  }
  void close_current() {
    if (!file_) return;
    int32_t header[3] = {width_ == 2 ? kMagicUint16 : kMagicUint32, width_ == 2 ? 1 : 7,
                         static_cast<int32_t>(count_)};
    const bool ok = std::fseek(file_, 0, SEEK_SET) == 0 && std::fwrite(header, 1, sizeof(header), file_) == sizeof(header) &&
                    std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
    std::fclose(file_);
    file_ = nullptr;
    FSDP_CHECK(ok, "[tokenize] cannot write ", path_, ": ", std::strerror(errno));
  }
  std::string dir_, path_;
  int64_t limit_, count_ = 0, shards_ = 0;
  int width_;
  std::FILE* file_ = nullptr;
};

// The documents of one input file, a batch at a time.
class DocumentReader {
 public:
  DocumentReader(const std::string& path, const std::string& field) : path_(path), field_(field) {
    for (const char* ext : {".gz", ".zst", ".bz2", ".xz"})
      FSDP_CHECK(!ends_with(path, ext), "[tokenize] ", path, " is compressed; decompress it first (zcat or zstdcat ",
                 path, " > ", path.substr(0, path.size() - std::strlen(ext)), ")");
    jsonl_ = ends_with(path, ".jsonl");
    in_.open(path, std::ios::binary);
    FSDP_CHECK(in_.good(), "[tokenize] cannot read ", quoted(path), ": ", file_problem(path));
  }
  // Up to `max_bytes` of documents (at least one); empty at the end. `read` grows by the bytes read.
  std::vector<std::string> next(size_t max_bytes, int64_t& read) {
    std::vector<std::string> docs;
    if (!jsonl_) {
      if (done_) return docs;
      done_ = true;
      docs.emplace_back(std::istreambuf_iterator<char>(in_), std::istreambuf_iterator<char>());
      read += static_cast<int64_t>(docs.back().size());
      return docs;
    }
    size_t bytes = 0;
    std::string line;
    while (bytes < max_bytes && std::getline(in_, line)) {
      ++line_;
      read += static_cast<int64_t>(line.size()) + 1;
      if (trim(line).empty()) continue;
      json j;
      try {
        j = json::parse(line);
      } catch (const std::exception& e) {
        throw InputError(str("[tokenize] ", path_, ":", line_, ": not valid JSON: ", e.what()));
      }
      const auto it = j.is_object() ? j.find(field_) : j.end();
      FSDP_CHECK(it != j.end() && it->is_string(), "[tokenize] ", path_, ":", line_, ": no string field ",
                 quoted(field_), " (give the field that holds the text with --field)");
      docs.push_back(it->get<std::string>());
      bytes += docs.back().size();
    }
    return docs;
  }

 private:
  std::string path_, field_;
  std::ifstream in_;
  bool jsonl_ = false, done_ = false;
  int64_t line_ = 0;
};

// Each document's ids and EOS, encoded on `jobs` threads, in order.
std::vector<std::vector<int32_t>> encode_batch(const Tokenizer& tok, int32_t eos, const std::vector<std::string>& docs,
                                               int jobs) {
  std::vector<std::vector<int32_t>> out(docs.size());
  auto work = [&](size_t first, size_t step) {
    for (size_t i = first; i < docs.size(); i += step) {
      out[i] = tok.encode(docs[i]);
      out[i].push_back(eos);
    }
  };
  const size_t n = std::min<size_t>(static_cast<size_t>(jobs), docs.size());
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n; ++t) threads.emplace_back(work, t, n);
  work(0, std::max<size_t>(n, 1));
  for (auto& t : threads) t.join();
  return out;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    const std::vector<std::string> found = glob_paths(in);
    FSDP_CHECK(!found.empty(), "[tokenize] --input ", quoted(in), " matches no file");
    for (const std::string& f : found) {
      FSDP_CHECK(!is_directory(f), "[tokenize] --input ", quoted(f), " is a folder; give files or a glob such as ", f,
                 "/*.jsonl");
      files.push_back(f);
    }
  }
  return files;
}

}  // namespace

CorpusSummary tokenize_corpus(const Tokenizer& tokenizer, int32_t eos, const CorpusOptions& o,
                              const CorpusProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  FSDP_CHECK(o.shard_tokens >= 1 && o.shard_tokens <= INT32_MAX, "[tokenize] --shard_size ", o.shard_tokens,
             " tokens: it must be between 1 and 2147483647 (llm.c's header counts in int32)");
  const std::vector<std::string> files = expand_inputs(o.inputs);
  FSDP_CHECK(!file_exists(o.output), "[tokenize] --output ", quoted(o.output),
             " already exists; give a new folder (nothing was written)");
  const std::string partial = o.output + ".partial";
  remove_tree(partial);  // a cut-off earlier run's
  make_directories(partial);
  CorpusSummary s;
  s.token_bytes = tokenizer.vocab_size() <= 65536 ? 2 : 4;
  int64_t total = 0, read = 0;
  for (const std::string& f : files) total += std::max<int64_t>(0, file_size(f));
  try {
    ShardWriter writer(partial, o.shard_tokens, s.token_bytes);
    const int jobs = o.jobs > 0 ? o.jobs : cores();
    for (const std::string& f : files) {
      DocumentReader reader(f, o.field);
      for (auto docs = reader.next(size_t{4} << 20, read); !docs.empty(); docs = reader.next(size_t{4} << 20, read)) {
        for (const std::vector<int32_t>& ids : encode_batch(tokenizer, eos, docs, jobs)) {
          writer.add(ids);
          s.tokens += static_cast<int64_t>(ids.size());
        }
        s.documents += static_cast<int64_t>(docs.size());
        if (progress) progress(read, total, s.documents, s.tokens);
      }
    }
    FSDP_CHECK(s.documents > 0, "[tokenize] the inputs hold no document");
    s.shards = writer.finish();
  } catch (...) {
    remove_tree(partial);
    throw;
  }
  FSDP_CHECK(::rename(partial.c_str(), o.output.c_str()) == 0, "[tokenize] cannot rename ", partial, " to ", o.output,
             ": ", std::strerror(errno));
  s.bytes = read;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

int32_t eos_id(const std::string& path, const Tokenizer& tokenizer, const std::string& override_token) {
  auto id_of = [&](const std::string& token, const std::string& from) {
    const auto id = tokenizer.token_to_id(token);
    FSDP_CHECK(id.has_value(), "[tokenize] the EOS token ", quoted(token), " (", from, ") is not in the vocabulary");
    return *id;
  };
  if (!override_token.empty()) return id_of(override_token, "--eos");
  const std::string dir = is_directory(path) ? path : parent_folder(path);
  const std::string config = dir + "/tokenizer_config.json";
  if (file_exists(config)) {
    const json j = json::parse(read_file(config), nullptr, false);
    if (j.is_object() && j.contains("eos_token")) {
      const json& e = j["eos_token"];
      if (e.is_string()) return id_of(e.get<std::string>(), config);
      if (e.is_object() && e.contains("content")) return id_of(e["content"].get<std::string>(), config);
    }
  }
  const std::string model = dir + "/config.json";
  if (file_exists(model)) {
    const json j = json::parse(read_file(model), nullptr, false);
    if (j.is_object() && j.contains("eos_token_id")) {
      const json& e = j["eos_token_id"];
      if (e.is_number_integer()) return e.get<int32_t>();
      if (e.is_array() && !e.empty() && e[0].is_number_integer()) return e[0].get<int32_t>();
    }
  }
  throw InputError(str("[tokenize] no EOS token: neither ", config, " (eos_token) nor ", model,
                       " (eos_token_id) names one; pass --eos TOKEN"));
}

}  // namespace fsdp::tokenize

#include "tokenize/corpus.h"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tokenize/documents.h"
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

// llm.c shards under one folder: shard_000000.bin, ... (256 int32 header, then the tokens), and
// with masks, shard_000000.mask beside each (a byte per token: 1 counted as a target, 0 not).
class ShardWriter {
 public:
  ShardWriter(std::string dir, int64_t shard_tokens, int token_bytes, bool masks)
      : dir_(std::move(dir)), limit_(shard_tokens), width_(token_bytes), masks_(masks) {}
  ~ShardWriter() {
    if (file_) std::fclose(file_);
    if (mask_) std::fclose(mask_);
  }
  // A document's ids; the first `uncounted` are not targets (a prompt's).
  void add(const std::vector<int32_t>& ids, size_t uncounted) {
    for (size_t i = 0; i < ids.size();) {
      if (!file_ || count_ == limit_) open_next();
      const size_t n = std::min<size_t>(ids.size() - i, static_cast<size_t>(limit_ - count_));
      if (width_ == 2) {
        std::vector<uint16_t> narrow(ids.begin() + i, ids.begin() + i + n);
        write(file_, path_, narrow.data(), n * 2);
      } else {
        write(file_, path_, ids.data() + i, n * 4);
      }
      if (masks_) {
        std::vector<uint8_t> mask(n);
        for (size_t k = 0; k < n; ++k) mask[k] = i + k >= uncounted ? 1 : 0;
        write(mask_, mask_path_, mask.data(), n);
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
  static void write(std::FILE* f, const std::string& path, const void* p, size_t n) {
    FSDP_CHECK(std::fwrite(p, 1, n, f) == n, "[tokenize] cannot write ", path, ": ", std::strerror(errno));
  }
  static std::FILE* create(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    FSDP_CHECK(f != nullptr, "[tokenize] cannot create ", path, ": ", std::strerror(errno));
    return f;
  }
  static void close(std::FILE*& f, const std::string& path) {
    const bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
    std::fclose(f);
    f = nullptr;
    FSDP_CHECK(ok, "[tokenize] cannot write ", path, ": ", std::strerror(errno));
  }
  void open_next() {
    close_current();
    char name[32];
    std::snprintf(name, sizeof(name), "/shard_%06lld", static_cast<long long>(shards_++));
    path_ = dir_ + name + ".bin";
    file_ = create(path_);
    int32_t header[256] = {};
    write(file_, path_, header, sizeof(header));
    if (masks_) mask_ = create(mask_path_ = dir_ + name + ".mask");
    count_ = 0;
  }
  void close_current() {
    if (mask_) close(mask_, mask_path_);
    if (!file_) return;
    int32_t header[3] = {width_ == 2 ? kMagicUint16 : kMagicUint32, width_ == 2 ? 1 : 7,
                         static_cast<int32_t>(count_)};
    FSDP_CHECK(std::fseek(file_, 0, SEEK_SET) == 0, "[tokenize] cannot write ", path_, ": ", std::strerror(errno));
    write(file_, path_, header, sizeof(header));
    close(file_, path_);
  }
  std::string dir_, path_, mask_path_;
  int64_t limit_, count_ = 0, shards_ = 0;
  int width_;
  bool masks_;
  std::FILE* file_ = nullptr;
  std::FILE* mask_ = nullptr;
};

// A document's ids and EOS, and how many of them (a prompt's) are not targets.
struct Encoded {
  std::vector<int32_t> ids;
  size_t prompt = 0;
};

// Each document's ids and EOS, encoded on `jobs` threads, in order.
std::vector<Encoded> encode_batch(const Tokenizer& tok, int32_t eos, const std::vector<Document>& docs, int jobs) {
  std::vector<Encoded> out(docs.size());
  auto work = [&](size_t first, size_t step) {
    for (size_t i = first; i < docs.size(); i += step) {
      out[i].ids = tok.encode(docs[i].text);
      if (docs[i].pair) {
        out[i].prompt = out[i].ids.size();
        const std::vector<int32_t> completion = tok.encode(docs[i].completion, /*add_special_tokens=*/false);
        out[i].ids.insert(out[i].ids.end(), completion.begin(), completion.end());
      }
      out[i].ids.push_back(eos);
    }
  };
  const size_t n = std::min<size_t>(static_cast<size_t>(jobs), docs.size());
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n; ++t) threads.emplace_back(work, t, n);
  work(0, std::max<size_t>(n, 1));
  for (auto& t : threads) t.join();
  return out;
}

std::vector<std::string> expand_inputs(const CorpusOptions& o) {
  std::vector<std::string> files;
  for (const std::string& in : o.inputs) {
    const std::vector<std::string> found = glob_paths(in);
    FSDP_CHECK(!found.empty(), o.who, " ", quoted(in), " matches no file");
    for (const std::string& f : found) {
      FSDP_CHECK(!is_directory(f), o.who, " ", quoted(f), " is a folder; give files or a glob such as ", f, "/*.jsonl");
      files.push_back(f);
    }
  }
  return files;
}

void write_summary(const std::string& folder, const CorpusOptions& o, int32_t eos, const CorpusSummary& s) {
  const json doc = {
      {"tokenizer", o.tokenizer_path},
      {"eos", eos},
      {"inputs", o.inputs},
      {"documents", s.documents},
      {"prompt_completion_pairs", s.pairs},
      {"tokens", s.tokens},
      {"counted_tokens", s.counted_tokens},
      {"shards", s.shards},
      {"token_bytes", s.token_bytes},
      {"longest_prompt",
       {{"tokens", s.longest_prompt.tokens}, {"file", s.longest_prompt.file}, {"line", s.longest_prompt.line}}}};
  write_file_atomic(folder + "/tokenize.json", doc.dump(2) + "\n");
}

// Reads every file into `writer`, adding to `s`.
void tokenize_files(const Tokenizer& tokenizer, int32_t eos, const CorpusOptions& o,
                    const std::vector<std::string>& files, ShardWriter& writer, CorpusSummary& s,
                    const CorpusProgress& progress) {
  const int jobs = o.jobs > 0 ? o.jobs : cores();
  int64_t total = 0, before = 0;
  for (const std::string& f : files) total += std::max<int64_t>(0, file_size(f));
  for (const std::string& f : files) {
    DocumentReader reader(f, o.field, o.who, o.field_hint);
    for (auto docs = reader.next(size_t{4} << 20); !docs.empty(); docs = reader.next(size_t{4} << 20)) {
      const std::vector<Encoded> encoded = encode_batch(tokenizer, eos, docs, jobs);
      for (size_t i = 0; i < docs.size(); ++i) {
        writer.add(encoded[i].ids, encoded[i].prompt);
        s.tokens += static_cast<int64_t>(encoded[i].ids.size());
        s.counted_tokens += static_cast<int64_t>(encoded[i].ids.size() - encoded[i].prompt);
        s.pairs += docs[i].pair ? 1 : 0;
        if (static_cast<int64_t>(encoded[i].prompt) > s.longest_prompt.tokens)
          s.longest_prompt = {static_cast<int64_t>(encoded[i].prompt), f, docs[i].line};
      }
      s.documents += static_cast<int64_t>(docs.size());
      if (progress) progress(before + reader.bytes_read(), total, s.documents, s.tokens);
    }
    before += reader.bytes_read();
  }
  s.bytes = before;
}

}  // namespace

CorpusSummary tokenize_corpus(const Tokenizer& tokenizer, int32_t eos, const CorpusOptions& o,
                              const CorpusProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  FSDP_CHECK(o.shard_tokens >= 1 && o.shard_tokens <= INT32_MAX, o.who, " --shard_size ", o.shard_tokens,
             " tokens: it must be between 1 and 2147483647 (llm.c's header counts in int32)");
  const std::vector<std::string> files = expand_inputs(o);
  FSDP_CHECK(!file_exists(o.output), o.who, " ", quoted(o.output),
             " already exists; give a new folder (nothing was written)");
  bool masks = false;  // any file of prompt/completion pairs (its first record says)
  for (const std::string& f : files) masks = masks || DocumentReader(f, o.field, o.who, o.field_hint).holds_pairs();
  const std::string partial = o.output + ".partial";
  remove_tree(partial);  // a cut-off earlier run's
  make_directories(partial);
  CorpusSummary s;
  s.token_bytes = tokenizer.vocab_size() <= 65536 ? 2 : 4;
  try {
    ShardWriter writer(partial, o.shard_tokens, s.token_bytes, masks);
    tokenize_files(tokenizer, eos, o, files, writer, s, progress);
    FSDP_CHECK(s.documents > 0, o.who, " the inputs hold no document");
    s.shards = writer.finish();
    write_summary(partial, o, eos, s);
  } catch (...) {
    remove_tree(partial);
    throw;
  }
  FSDP_CHECK(::rename(partial.c_str(), o.output.c_str()) == 0, o.who, " cannot rename ", partial, " to ", o.output,
             ": ", std::strerror(errno));
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

CorpusSummary read_corpus_summary(const std::string& folder) {
  CorpusSummary s;
  const std::string path = folder + "/tokenize.json";
  if (!file_exists(path)) return s;
  const json j = json::parse(read_file(path), nullptr, false);
  if (!j.is_object()) return s;
  s.documents = j.value("documents", int64_t{0});
  s.pairs = j.value("prompt_completion_pairs", int64_t{0});
  s.tokens = j.value("tokens", int64_t{0});
  s.counted_tokens = j.value("counted_tokens", int64_t{0});
  s.shards = j.value("shards", int64_t{0});
  s.token_bytes = j.value("token_bytes", 2);
  if (j.contains("longest_prompt") && j["longest_prompt"].is_object()) {
    const json& p = j["longest_prompt"];
    s.longest_prompt = {p.value("tokens", int64_t{0}), p.value("file", std::string()), p.value("line", int64_t{0})};
  }
  return s;
}

std::vector<int32_t> eos_token_ids(const std::string& json_file) {
  if (!file_exists(json_file)) return {};
  const json j = json::parse(read_file(json_file), nullptr, false);
  if (!j.is_object() || !j.contains("eos_token_id")) return {};
  const json& e = j["eos_token_id"];
  std::vector<int32_t> ids;
  for (const json& id : e.is_array() ? e : json::array({e}))
    if (id.is_number_integer()) ids.push_back(id.get<int32_t>());
  return ids;
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
  if (const std::vector<int32_t> ids = eos_token_ids(model); !ids.empty()) return ids.front();
  throw InputError(str("[tokenize] no EOS token: neither ", config, " (eos_token) nor ", model,
                       " (eos_token_id) names one; pass --eos TOKEN"));
}

}  // namespace fsdp::tokenize

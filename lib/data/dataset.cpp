#include "data/dataset.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <numeric>

#include "data/corpus.h"
#include "data/documents.h"
#include "data/token_shard.h"
#include "util/error.h"
#include "util/files.h"
#include "util/splitmix.h"
#include "util/strings.h"

namespace fsdp::data {

namespace {

// Text files and JSONL as bytes: each document EOT then its bytes; a pair's prompt bytes are not
// targets (the EOT is: it ends the document before), and its EOT starts a record.
class ByteDocuments {
 public:
  void add_file(const std::string& path, const std::string& field) {
    DocumentReader reader(path, field, "[data]", "data.field");
    for (auto docs = reader.next(size_t{1} << 22); !docs.empty(); docs = reader.next(size_t{1} << 22))
      for (const Document& d : docs) add(d, path);
  }
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  int64_t longest_prompt = 0;
  std::string longest_prompt_at;

 private:
  void add(const Document& d, const std::string& path) {
    FSDP_CHECK(!d.chat, "[data] ", path, ":", d.line,
               ": a conversation needs the model's tokenizer and chat template, "
               "and this byte-level model has none; give data.tokenizer (a folder with tokenizer.json and a chat "
               "template), or text or prompt/completion records");
    const size_t start = tokens.size();
    tokens.push_back(kByteEndOfText);
    for (unsigned char ch : d.text) tokens.push_back(ch);
    mask.resize(tokens.size(), kMaskTarget);
    mask[start] |= kMaskRecordStart;
    if (!d.pair) return;
    std::fill(mask.end() - static_cast<int64_t>(d.text.size()), mask.end(), 0);
    if (static_cast<int64_t>(d.text.size()) + 1 > longest_prompt) {
      longest_prompt = static_cast<int64_t>(d.text.size()) + 1;
      longest_prompt_at = str(path, ":", d.line);
    }
    for (unsigned char ch : d.completion) tokens.push_back(ch);
    mask.resize(tokens.size(), kMaskTarget);
  }
};

}  // namespace

// One file of the stream: an llm.c shard read in place, or tokens in memory.
struct TokenStream::Source {
  std::string path;
  std::unique_ptr<ShardReader> shard;  // null: tokens in memory
  int64_t count = 0, max = -1;
  std::vector<int32_t> memory;
  std::vector<uint8_t> memory_mask;
  bool records = false;  // its mask marks where records start
  bool has_mask() const { return shard ? shard->has_mask() : !memory_mask.empty(); }
  void read_mask(int64_t begin, int64_t n, uint8_t* out) const {
    if (shard) return shard->read_mask(begin, n, out);
    if (memory_mask.empty()) return std::fill(out, out + n, 1);
    std::copy(memory_mask.begin() + begin, memory_mask.begin() + begin + n, out);
  }
  // Tokens [begin, begin + n) of this source into out.
  void read(int64_t begin, int64_t n, int64_t* out) const {
    if (shard) return shard->read(begin, n, out);
    std::copy(memory.begin() + begin, memory.begin() + begin + n, out);
  }
  // Calls fn(first, ids, n) over every token, a few MB at a time (a shard is never read whole).
  template <typename Fn>
  void scan(Fn fn) const {
    std::vector<int64_t> chunk;
    for (int64_t at = 0; at < count; at += 1 << 20) {
      const int64_t n = std::min<int64_t>(1 << 20, count - at);
      chunk.resize(static_cast<size_t>(n));
      read(at, n, chunk.data());
      fn(at, chunk.data(), n);
    }
  }
};

namespace {

// Opens an llm.c shard (its header and mask checked by ShardReader) and scans it once.
std::shared_ptr<TokenStream::Source> open_llmc(const std::string& path) {
  auto src = std::make_shared<TokenStream::Source>();
  src->path = path;
  src->shard = std::make_unique<ShardReader>(path);
  src->count = src->shard->count();
  src->scan([&](int64_t at, const int64_t* ids, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      // Unsigned on disk: an id above int32's range once turned negative and passed the vocab check.
      FSDP_CHECK(ids[i] <= INT32_MAX, "[data] ", path, ": token ", at + i, " (byte ",
                 kShardHeaderBytes + src->shard->width() * (at + i), ") is id ", ids[i],
                 ", beyond any vocabulary (ids are below 2^31); the shard is corrupt or was not written as llm.c "
                 "uint32 tokens");
      src->max = std::max(src->max, ids[i]);
    }
  });
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
  // Kept when some token is not a target (prompts); it marks records when it has any start bit.
  if (std::find(mask.begin(), mask.end(), 0) != mask.end()) {
    src->records = std::any_of(mask.begin(), mask.end(), [](uint8_t m) { return (m & kMaskRecordStart) != 0; });
    src->memory_mask = std::move(mask);
  }
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

bool TokenStream::has_records() const {
  return !sources_.empty() && std::all_of(sources_.begin(), sources_.end(), [](const auto& s) { return s->records; });
}

std::vector<int64_t> TokenStream::record_starts() const {
  std::vector<int64_t> starts;
  std::vector<uint8_t> chunk;
  for (int64_t at = 0; at < size_; at += 1 << 20) {
    const int64_t n = std::min<int64_t>(1 << 20, size_ - at);
    chunk.resize(static_cast<size_t>(n));
    read_mask(at, n, chunk.data());
    for (int64_t i = 0; i < n; ++i)
      if (chunk[i] & kMaskRecordStart) starts.push_back(at + i);
  }
  return starts;
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
  FSDP_CHECK(tokens < seq_len, "[data] ", where, ": the prompt is ", tokens,
             " tokens, and a sequence of "
             "train.sequence_length ",
             seq_len,
             " tokens must hold a whole prompt and a target after it; raise "
             "train.sequence_length above ",
             tokens, ", or shorten or drop that record");
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
    s->scan([&](int64_t at, const int64_t* ids, int64_t n) {
      for (int64_t i = 0; i < n; ++i)
        FSDP_CHECK(ids[i] < vocab_size, "[data] ", s->path, ": token ", at + i, " is id ", ids[i],
                   " but the model's vocab_size is ", vocab_size, "; ", fix);
    });
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
  std::map<std::string, CorpusSummary> made;  // by folder: what tokenize.json records
  for (const std::string& f : files) {
    FSDP_CHECK(!is_directory(f), "[data] data.path ", quoted(f), " is a folder; give a file, or a glob such as ",
               folder_glob(f), " to read the files in it");
    std::shared_ptr<TokenStream::Source> src;
    if (ends_with(f, ".bin")) {
      const std::string folder = parent_folder(f);
      if (!made.count(folder)) made[folder] = read_corpus_summary(folder);
      verify_shard(f, made[folder].checksums);
      src = open_llmc(f);
      src->records = src->has_mask() && made[folder].mask_format >= kMaskFormat;
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
    const LongestPrompt& p = made.at(folder).longest_prompt;
    s.note_prompt(p.tokens, str(p.file, ":", p.line));
  }
  return s;
}

Split split_sequences(int64_t sequences, double eval_fraction, const std::string& what) {
  Split s;
  s.eval_sequences = eval_fraction > 0 ? std::max<int64_t>(1, static_cast<int64_t>(sequences * eval_fraction)) : 0;
  s.train_sequences = sequences - s.eval_sequences;
  FSDP_CHECK(s.train_sequences >= 1, "[data] ", what, ": nothing left to train on after holding out ", s.eval_sequences,
             " of ", plural(sequences, "sequence"), " for evaluation; lower data.eval_fraction");
  return s;
}

SequenceReader::SequenceReader(const TokenStream& stream, int64_t seq_len, Packing packing, const std::string& what)
    : stream_(stream), seq_len_(seq_len), packing_(packing) {
  FSDP_CHECK(packing == Packing::kPlain || stream.has_records(),
             "[data] data.packing: ", packing == Packing::kPad ? "pad" : "masked", " needs records, and ", what,
             " marks none: it holds text (or shards from an fsdptrain tokenize before mask format 2). Use plain, or "
             "give prompt/completion or chat JSONL (tokenized again)");
  if (packing != Packing::kPad) {
    count_ = stream.size() > 0 ? (stream.size() - 1) / seq_len : 0;
    FSDP_CHECK(count_ >= 1, "[data] ", what, " has ", stream.size(), " tokens, shorter than one sequence of ",
               seq_len + 1, "; give more data or lower train.sequence_length");
    return;
  }
  records_ = stream.record_starts();
  count_ = static_cast<int64_t>(records_.size());
  for (int64_t k = 0; k < count_; ++k) {
    const int64_t end = k + 1 < count_ ? records_[k + 1] : stream.size();
    truncated_ += end - records_[k] > seq_len + 1 ? 1 : 0;
  }
}

void SequenceReader::append(int64_t k, Batch& out) const {
  if (packing_ == Packing::kPad)
    append_record(k, out);
  else
    append_window(k, out);
}

void SequenceReader::append_window(int64_t k, Batch& out) const {
  const int64_t T = seq_len_;
  thread_local std::vector<int64_t> window;
  thread_local std::vector<uint8_t> mask;
  window.resize(static_cast<size_t>(T + 1));
  stream_.read(k * T, T + 1, window.data());
  out.inputs.insert(out.inputs.end(), window.begin(), window.end() - 1);
  if (stream_.has_mask() || packing_ == Packing::kMasked) {  // a prompt's token is an input, never a target
    mask.resize(window.size());
    stream_.read_mask(k * T, T + 1, mask.data());
    const bool boundaries = packing_ == Packing::kMasked;
    for (size_t j = 1; j < window.size(); ++j)
      if (!(mask[j] & kMaskTarget) || (boundaries && (mask[j] & kMaskRecordStart))) window[j] = kIgnoreTarget;
    if (boundaries) {  // each token's record (within the row) and its position in it
      int64_t segment = 0, start = 0;
      for (int64_t i = 0; i < T; ++i) {
        if (i > 0 && (mask[static_cast<size_t>(i)] & kMaskRecordStart)) {
          ++segment;
          start = i;
        }
        out.segments.push_back(segment);
        out.positions.push_back(i - start);
      }
    }
  }
  out.targets.insert(out.targets.end(), window.begin() + 1, window.end());
}

void SequenceReader::append_record(int64_t k, Batch& out) const {
  const int64_t T = seq_len_, begin = records_[static_cast<size_t>(k)];
  const int64_t end = k + 1 < count_ ? records_[static_cast<size_t>(k) + 1] : stream_.size();
  const int64_t n = std::min(end - begin, T + 1);  // tokens of the record in the row
  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::vector<uint8_t> mask(static_cast<size_t>(n));
  stream_.read(begin, n, ids.data());
  stream_.read_mask(begin, n, mask.data());
  for (int64_t i = 0; i < T; ++i) {
    out.inputs.push_back(i < n ? ids[static_cast<size_t>(i)] : 0);  // padding: any id; its targets count for nothing
    const bool target = i + 1 < n && (mask[static_cast<size_t>(i) + 1] & kMaskTarget);
    out.targets.push_back(target ? ids[static_cast<size_t>(i) + 1] : kIgnoreTarget);
  }
}

DistributedLoader::DistributedLoader(const SequenceReader& reader, int64_t first_sequence, int64_t num_sequences,
                                     int64_t batch, int rank, int world_size, uint64_t seed)
    : reader_(reader),
      first_(first_sequence),
      count_(num_sequences),
      batch_(batch),
      rank_(rank),
      world_(world_size),
      seed_(seed) {
  FSDP_CHECK(count_ < (int64_t{1} << 32), "[data] ", count_,
             " sequences are more than the loader's permutation holds (2^32); raise train.sequence_length or split "
             "the data into several runs");
  FSDP_CHECK(count_ >= batch_ * world_, "[data] ", plural(count_, "sequence"), " cannot fill one step of ",
             plural(world_, "rank"), " x micro batch ", batch_,
             "; give more data, or lower train.micro_batch_size or train.sequence_length");
  shuffle();
}

void DistributedLoader::shuffle() {
  order_.resize(count_);
  std::iota(order_.begin(), order_.end(), 0);
  // Fisher-Yates driven by SplitMix64, spelled out (not std::shuffle, whose draws differ between
  // standard libraries) so other tools can reproduce the order: scripts/reference/ does.
  uint64_t state = seed_ * 1000003ULL + static_cast<uint64_t>(epoch_);
  auto next = [&state]() { return splitmix64_mix(state += kSplitMixStep); };
  for (int64_t i = count_ - 1; i > 0; --i)
    std::swap(order_[i], order_[static_cast<int64_t>(next() % static_cast<uint64_t>(i + 1))]);
}

void DistributedLoader::set_position(const Position& p) {
  epoch_ = p.epoch;
  offset_ = p.offset;
  shuffle();
}

int64_t Batch::counted_targets() const {
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
  for (int64_t i = 0; i < batch_; ++i) reader_.append(first_ + order_[offset_ + rank_ * batch_ + i], b);
  offset_ += step;
  return b;
}

}  // namespace fsdp::data

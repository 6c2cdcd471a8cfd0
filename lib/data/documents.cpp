#include "data/documents.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "data/table_records.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/strings.h"

namespace fsdp::data {

namespace {

using json = nlohmann::json;

std::string strip_compression(const std::string& path) {
  for (const char* ext : {".gz", ".zst"})
    if (ends_with(path, ext)) return path.substr(0, path.size() - std::strlen(ext));
  return path;
}

}  // namespace

bool holds_records(const std::string& path) {
  return ends_with(strip_compression(path), ".jsonl") || ends_with(strip_compression(path), ".json") ||
         TableRecords::is_table(path);
}

namespace {

constexpr const char* kFormats =
    "fsdptrain reads text files (any UTF-8 text: .txt, .md, source code), JSON Lines (.jsonl), JSON (.json: an "
    "array of records, or JSON Lines), each optionally compressed as .gz or .zst; Parquet (.parquet) and Arrow "
    "(.arrow, as datasets' save_to_disk writes) tables; and llm.c token shards (.bin)";

// The columns a record of each kind is read from (a table's others are not decoded).
const std::vector<std::string> kRecordColumns = {"prompt",        "completion", "messages",
                                                 "conversations", "tools",      "chat_template_kwargs"};

}  // namespace

// The bytes of a file: as they are, or decompressed (gzip, zstd) as they are read.
struct DocumentReader::Stream {
  virtual ~Stream() = default;
  virtual size_t read(char* out, size_t n) = 0;  // 0 at the end
  int64_t consumed = 0;                          // bytes of the file read so far
};

namespace {

class PlainStream final : public DocumentReader::Stream {
 public:
  PlainStream(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PlainStream() override { ::close(fd_); }
  size_t read(char* out, size_t n) override {
    ssize_t r;
    do r = ::read(fd_, out, n);
    while (r < 0 && errno == EINTR);
    FSDP_CHECK(r >= 0, "cannot read ", path_, ": ", std::strerror(errno));
    consumed += r;
    return static_cast<size_t>(r);
  }

 private:
  int fd_;
  std::string path_;
};

class GzipStream final : public DocumentReader::Stream {
 public:
  GzipStream(int fd, std::string path) : path_(std::move(path)) {
    file_ = gzdopen(fd, "rb");
    FSDP_CHECK(file_ != nullptr, "cannot read ", path_, ": out of memory");
    gzbuffer(file_, 1 << 17);
  }
  ~GzipStream() override { gzclose(file_); }
  size_t read(char* out, size_t n) override {
    const int r = gzread(file_, out, static_cast<unsigned>(n));
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    FSDP_CHECK(r >= 0 && (code == Z_OK || code == Z_BUF_ERROR), path_, " is not a readable gzip file (", message,
               "); check it with gzip -t ", path_);
    FSDP_CHECK(!(r == 0 && code == Z_BUF_ERROR), path_, " ends in the middle of its gzip data: it is truncated");
    consumed = gzoffset(file_);
    return static_cast<size_t>(r);
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

class ZstdStream final : public DocumentReader::Stream {
 public:
  ZstdStream(int fd, std::string path) : plain_(fd, path), path_(std::move(path)), in_(ZSTD_DStreamInSize()) {
    ctx_ = ZSTD_createDCtx();
    FSDP_CHECK(ctx_ != nullptr, "cannot read ", path_, ": out of memory");
  }
  ~ZstdStream() override { ZSTD_freeDCtx(ctx_); }
  size_t read(char* out, size_t n) override {
    ZSTD_outBuffer o{out, n, 0};
    while (o.pos == 0) {
      if (input_.pos == input_.size) {
        input_ = {in_.data(), plain_.read(in_.data(), in_.size()), 0};
        consumed = plain_.consumed;
        if (input_.size == 0) {
          FSDP_CHECK(last_ == 0, path_, " ends in the middle of its zstd data: it is truncated");
          return 0;
        }
      }
      last_ = ZSTD_decompressStream(ctx_, &o, &input_);
      FSDP_CHECK(!ZSTD_isError(last_), path_, " is not a readable zstd file (", ZSTD_getErrorName(last_),
                 "); check it with zstd -t ", path_);
    }
    return o.pos;
  }

 private:
  PlainStream plain_;
  std::string path_;
  std::vector<char> in_;
  ZSTD_inBuffer input_{nullptr, 0, 0};
  ZSTD_DCtx* ctx_ = nullptr;
  size_t last_ = 0;
};

}  // namespace

DocumentReader::DocumentReader(const std::string& path, const std::string& field, const std::string& who,
                               const std::string& field_hint)
    : path_(path), field_(field), who_(who), hint_(field_hint), jsonl_(holds_records(path)) {
  for (const char* ext : {".bz2", ".xz", ".lz4"})
    FSDP_CHECK(!ends_with(path, ext), who, " ", path,
               " is compressed with a format fsdptrain does not read; "
               "recompress it with gzip or zstd, or decompress it");
  // Not a FIFO (it would block until written) nor a device (/dev/zero never ends): files only.
  const std::string problem = file_problem(path);
  FSDP_CHECK(problem.empty(), who, " cannot read ", quoted(path), ": ", problem);
  for (const char* ext : {".parquet.gz", ".parquet.zst", ".arrow.gz", ".arrow.zst"})
    FSDP_CHECK(!ends_with(path, ext), who, " ", path,
               " is a compressed table; Parquet and Arrow files compress their own columns, so "
               "decompress it and give the .parquet or .arrow file");
  if (TableRecords::is_table(path)) {
    open_table();
    return;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(fd >= 0, who, " cannot read ", quoted(path), ": ", std::strerror(errno));
  if (ends_with(path, ".gz"))
    stream_ = std::make_unique<GzipStream>(fd, path);
  else if (ends_with(path, ".zst"))
    stream_ = std::make_unique<ZstdStream>(fd, path);
  else
    stream_ = std::make_unique<PlainStream>(fd, path);
  const std::string plain = strip_compression(path);
  for (const char* ext : {".feather", ".csv", ".tsv", ".xlsx", ".pkl", ".pickle", ".pt", ".pth", ".npy", ".npz",
                          ".safetensors", ".zip", ".tar", ".h5", ".hdf5"})
    FSDP_CHECK(!ends_with(plain, ext), who, " ", path, " is a ", ext + 1, " file, which would be read as plain text; ",
               kFormats, ". Convert it first (datasets: load_dataset(...).to_parquet(\"data.parquet\"))");
  // The first 64 KiB (decompressed) tell a JSON array from JSON Lines, and text from a binary file.
  buffer_.resize(size_t{1} << 16);
  buffer_.resize(fill(buffer_.data(), buffer_.size()));
  eof_ = buffer_.empty();
  if (jsonl_ && ends_with(plain, ".json")) {
    const size_t first = buffer_.find_first_not_of(" \t\r\n\xef\xbb\xbf");
    array_ = first != std::string::npos && buffer_[first] == '[';
  }
  if (!jsonl_) check_text();
}

void DocumentReader::check_text() const {
  const bool parquet = buffer_.compare(0, 4, "PAR1") == 0;
  FSDP_CHECK(!parquet && buffer_.find('\0') == std::string::npos, who_, " ", path_, " is not text (",
             parquet ? "a Parquet file, by its first bytes" : "it holds NUL bytes: a binary file",
             ") and would be "
             "trained on as bytes; ",
             kFormats);
}

// A Parquet or Arrow table: its rows become the one-line JSON a JSONL file would hold, and a row's
// number stands for the line. Its columns must hold one kind of record.
void DocumentReader::open_table() {
  std::vector<std::string> wanted = kRecordColumns;
  wanted.push_back(field_);
  table_ = std::make_unique<TableRecords>(path_, who_, wanted);
  const std::vector<std::string>& have = table_->columns();
  auto has = [&](const std::string& c) { return std::find(have.begin(), have.end(), c) != have.end(); };
  if (has(field_) || (has("prompt") && has("completion")) || has("messages") || has("conversations")) return;
  std::string near;
  for (const std::string& c : have)
    if (auto m = closest_match(c, {field_, "prompt", "completion", "messages", "conversations"}); m && near.empty())
      near = str("; did you mean \"", *m, "\" for \"", c, "\"?");
  throw InputError(str(who_, " ", path_, " has the column", have.size() == 1 ? " " : "s ",
                       have.empty() ? std::string("(none)") : join(have, ", "), " and no records fsdptrain reads: ",
                       "documents need a string column ", quoted(field_), " (name another with ", hint_,
                       "), prompt/completion pairs \"prompt\" and \"completion\", conversations a \"messages\" "
                       "column (or ShareGPT's \"conversations\")",
                       near));
}

// The whole array at once (a .json array cannot be streamed line by line); each record becomes
// the one-line JSON a JSONL file would hold, and its number in the array stands for the line.
void DocumentReader::read_array() {
  std::string chunk(size_t{1} << 20, '\0');
  for (size_t n; (n = fill(chunk.data(), chunk.size())) > 0;) buffer_.append(chunk, 0, n);
  const nlohmann::json all = parse_json(buffer_, str(who_, " ", path_));  // starts with [: an array
  for (const nlohmann::json& record : all) records_.push_back(record.dump());
  buffer_.clear();
  buffer_.shrink_to_fit();
  at_ = 0;
  eof_ = true;
}

DocumentReader::~DocumentReader() = default;

size_t DocumentReader::fill(char* out, size_t n) {
  try {
    const size_t got = stream_->read(out, n);
    bytes_ = stream_->consumed;
    return got;
  } catch (const InputError& e) {
    throw InputError(str(who_, " ", e.what()));
  }
}

bool DocumentReader::next_line(std::string& line) {
  for (;;) {
    const size_t newline = buffer_.find('\n', at_);
    if (newline != std::string::npos || eof_) {
      if (at_ >= buffer_.size() && eof_) return false;
      const size_t end = newline == std::string::npos ? buffer_.size() : newline;
      line.assign(buffer_, at_, end - at_);
      at_ = end + 1;
      return true;
    }
    buffer_.erase(0, at_);
    at_ = 0;
    FSDP_CHECK(buffer_.size() < kMaxLineBytes, who_, " ", path_, ":", line_ + 1, ": a line of over ",
               format_bytes(kMaxLineBytes),
               " without a newline; a JSONL record is one line. The file is not JSONL "
               "(or is damaged)");
    const size_t old = buffer_.size();
    buffer_.resize(old + (size_t{1} << 20));
    buffer_.resize(old + fill(buffer_.data() + old, size_t{1} << 20));
    eof_ = buffer_.size() == old;
  }
}

// A record that is no kind, but looks like a conversation: its "messages" is not a list, or (in a
// file of conversations) it has no list under either name, perhaps a near miss.
void DocumentReader::check_conversation_keys(const json& j) const {
  for (const char* key : {"messages", "conversations"})
    FSDP_CHECK(!j.contains(key), who_, " ", path_, ":", line_, ": a conversation record's ", quoted(key), " is ",
               j[key].type_name(), ", not a list of messages ({\"role\": ..., \"content\": ...})");
  std::vector<std::string> keys;
  for (const auto& item : j.items()) keys.push_back(item.key());
  std::string near;
  for (const std::string& k : keys)
    if (auto m = closest_match(k, {"messages", "conversations"}); m && near.empty())
      near = str("; did you mean \"", *m, "\" for \"", k, "\"?");
  FSDP_CHECK(kind_ != 3 && near.empty(), who_, " ", path_, ":", line_,
             ": a conversation record needs a \"messages\" list (or ShareGPT's \"conversations\"); this one has ",
             keys.empty() ? std::string("no keys") : "keys " + join(keys, ", "),
             kind_ == 3 ? " (the file's first record is a conversation)" : "", near);
}

Document DocumentReader::parse(const std::string& line) const {
  const json j = parse_json(line, str(who_, " ", path_, ":", line_));
  Document d;
  d.line = line_;
  auto string_field = [&](const char* name) {
    const auto it = j.is_object() ? j.find(name) : j.end();
    return it != j.end() && it->is_string() ? &*it : nullptr;
  };
  auto list_field = [&](const char* name) { return j.is_object() && j.contains(name) && j[name].is_array(); };
  const json *prompt = string_field("prompt"), *completion = string_field("completion");
  const json* text = string_field(field_.c_str());
  const bool chat = list_field("messages") || list_field("conversations") || list_field("prompt");
  const int kind = chat ? 3 : prompt && completion && (kind_ == 2 || !text) ? 2 : text ? 1 : 0;
  if (kind == 0 && j.is_object()) check_conversation_keys(j);
  FSDP_CHECK(kind != 0 || kind_ != 0 || prompt || completion, who_, " ", path_, ":", line_, ": no string field ",
             quoted(field_),
             " nor \"prompt\" and \"completion\" nor a \"messages\" or \"conversations\" list; name "
             "the field that holds the text with ",
             hint_, ", or give prompt/completion or conversation records");
  FSDP_CHECK(kind != 0 || kind_ != 1, who_, " ", path_, ":", line_, ": no string field ", quoted(field_),
             ", as every record has to (the file's first record has it)");
  FSDP_CHECK(kind != 0, who_, " ", path_, ":", line_,
             ": a prompt/completion record needs both \"prompt\" and \"completion\" as strings (or both as lists of "
             "messages)");
  static const char* const kKinds[] = {"", "a document in a string field", "a prompt/completion pair",
                                       "a conversation"};
  FSDP_CHECK(kind == kind_ || kind_ == 0, who_, " ", path_, ":", line_, ": ", kKinds[kind],
             ", but the file's first record is ", kKinds[kind_], " and every record has to be one");
  d.pair = kind == 2;
  d.chat = kind == 3;
  if (d.chat) {
    d.text = line;  // read as a conversation where it is rendered (data/chat_records.h)
    return d;
  }
  d.text = (d.pair ? *prompt : *text).get<std::string>();
  if (d.pair) d.completion = completion->get<std::string>();
  return d;
}

std::vector<Document> DocumentReader::next(size_t max_bytes) {
  std::vector<Document> docs = std::move(peeked_);
  peeked_.clear();
  if (!jsonl_) {
    if (done_) return docs;
    done_ = true;
    Document d;
    d.text = std::move(buffer_);  // the first 64 KiB, read when the file was opened
    buffer_.clear();
    std::string chunk(size_t{1} << 20, '\0');
    for (size_t n; (n = fill(chunk.data(), chunk.size())) > 0;) d.text.append(chunk, 0, n);
    docs.push_back(std::move(d));
    return docs;
  }
  if (array_ && !done_) {
    done_ = true;
    read_array();
  }
  size_t bytes = 0;
  std::string line;
  auto next_record = [&](std::string& out) {
    if (table_) {
      const bool got = table_->next(out);
      bytes_ = table_->bytes_read();
      return got;
    }
    if (!array_) return next_line(out);
    if (next_record_ >= records_.size()) return false;
    out = std::move(records_[next_record_++]);
    return true;
  };
  while (bytes < max_bytes && next_record(line)) {
    ++line_;
    if (trim(line).empty()) continue;
    Document d = parse(line);
    if (kind_ == 0) kind_ = d.chat ? 3 : d.pair ? 2 : 1;
    bytes += d.text.size() + d.completion.size();
    docs.push_back(std::move(d));
  }
  return docs;
}

bool DocumentReader::holds_pairs() {
  if (jsonl_ && kind_ == 0 && peeked_.empty()) peeked_ = next(1);
  return kind_ == 2;
}

bool DocumentReader::holds_conversations() {
  if (jsonl_ && kind_ == 0 && peeked_.empty()) peeked_ = next(1);
  return kind_ == 3;
}

}  // namespace fsdp::data

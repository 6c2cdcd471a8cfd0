// The documents of one input file, as `fsdptrain tokenize` and the trainer read them:
//   *.jsonl   one JSON object per line: a document in its `field` ("text" unless told), a
//             prompt/completion pair (TRL's prompt-completion format: string "prompt" and
//             "completion"), or a conversation (TRL's conversational formats, chat/conversation.h:
//             "messages", "conversations", or "prompt" and "completion" as message lists). A file's
//             first record sets which; every other line must match.
//   *.json    the same records as a JSON array (read whole), or JSON Lines under that name (what
//             datasets' to_json writes), told apart by the first character;
//   *.parquet, *.arrow  a table (data/table_records.h: Parquet, or the Arrow files datasets'
//             save_to_disk writes) whose rows are the same records, read a row group at a time;
//   other     a text file: the whole file is one document. A file that is not text (a NUL byte or
//             Parquet's magic in its first 64 KiB) or another table format (.csv, .feather, ...) is refused
//             by name with the formats fsdptrain reads, never trained on as text.
// Any of them may be compressed: *.gz (zlib) or *.zst (zstd), streamed, never whole in memory
// (a text file's one document is, necessarily).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace fsdp::data {

class TableRecords;  // data/table_records.h

struct Document {
  std::string text;        // the document, or the prompt of a pair
  std::string completion;  // a pair's completion
  bool pair = false;       // a prompt/completion record
  bool chat = false;       // a conversation: `text` is the record's JSON line, as it is
  int64_t line = 0;        // its JSONL line (1-based); 0 for a text file
};

class DocumentReader {
 public:
  // A JSONL line longer than this is refused (a file that is not JSONL, or endless, is not read whole).
  static constexpr size_t kMaxLineBytes = size_t{1} << 30;

  // Throws InputError naming the file when it cannot be read. `who` starts error messages
  // ("[tokenize]", "[data]"); `field_hint` says how to name another field (a flag or a key).
  DocumentReader(const std::string& path, const std::string& field, const std::string& who,
                 const std::string& field_hint);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // Up to about `max_bytes` of documents (at least one); empty at the end. Throws InputError naming
  // the file and line for a line that is not JSON, or not a record of the file's kind.
  std::vector<Document> next(size_t max_bytes);
  // Whether the file holds prompt/completion pairs (reads its first record; no effect on next()).
  bool holds_pairs();
  bool holds_conversations();                    // the same for conversations
  int64_t bytes_read() const { return bytes_; }  // of the file on disk (compressed, if it is)
  const std::string& path() const { return path_; }

  struct Stream;  // plain, gzip or zstd bytes

 private:
  size_t fill(char* out, size_t n);  // the stream's next bytes; errors name the caller
  bool next_line(std::string& line);
  Document parse(const std::string& line) const;
  void check_conversation_keys(const nlohmann::json& record) const;
  std::string path_, field_, who_, hint_;
  std::unique_ptr<Stream> stream_;
  std::string buffer_;
  size_t at_ = 0;
  bool jsonl_ = false, done_ = false, eof_ = false;
  bool array_ = false;                   // a .json file holding one array of records
  std::unique_ptr<TableRecords> table_;  // a Parquet or Arrow file's rows
  void open_table();
  std::vector<std::string> records_;  // its records, each as one JSON line, once read
  size_t next_record_ = 0;
  void read_array();
  void check_text() const;
  int kind_ = 0;  // 0: not seen yet, 1: `field` documents, 2: pairs
  std::vector<Document> peeked_;
  int64_t line_ = 0, bytes_ = 0;
};

// Whether `path` names a file of JSON records (.jsonl, or .json: an array or JSON Lines), compressed or not.
bool holds_records(const std::string& path);

}  // namespace fsdp::data

// The rows of a Parquet file, or of an Arrow IPC file (what datasets' save_to_disk and
// Dataset.to_parquet write), as the one-line JSON objects a JSONL file of the same records holds:
// strings, numbers and booleans as they are, lists as arrays, structs (a message) as objects, a
// missing value as null. A Parquet file is decoded 1,024 rows at a time, its pages read as needed,
// and an Arrow file a record batch at a time, so host memory holds one batch however large the file
// (or its row groups); only the columns asked for are decoded.
// This is the one translation unit that includes Arrow's headers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::data {

class TableRecords {
 public:
  // Whether `path` names a Parquet (.parquet) or Arrow (.arrow) file.
  static bool is_table(const std::string& path);

  // Opens the file and reads its schema; of `wanted`, the columns the file has are read (all of
  // them when `wanted` is empty). Throws InputError naming the file, with Arrow's reason, when it is
  // not a readable Parquet or Arrow file. `who` starts error messages ("[data]").
  TableRecords(const std::string& path, const std::string& who, const std::vector<std::string>& wanted);
  ~TableRecords();
  TableRecords(const TableRecords&) = delete;
  TableRecords& operator=(const TableRecords&) = delete;

  const std::vector<std::string>& columns() const;  // every top-level column of the file, in order
  // The next row as one line of JSON; false after the last. Throws InputError naming the file and
  // the row after which a part cannot be decoded (a damaged file), and the row of a value that is
  // not text where text is needed (bytes that are not UTF-8).
  bool next(std::string& record);
  int64_t bytes_read() const;  // of the file, about: in proportion to the rows decoded so far
  int64_t row_count() const;   // the file's rows (-1 for an Arrow stream, which does not say)

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::data

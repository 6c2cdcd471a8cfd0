// TensorBoard event files, written without TensorFlow or protobuf: the TFRecord framing (length,
// masked CRC-32C of the length, the record, masked CRC-32C of the record) around hand-encoded
// `Event` messages holding the few fields TensorBoard reads: wall_time, step, file_version,
// summary values (simple_value scalars, and text as the text plugin's string tensor) and
// session_log (START, which tells readers to drop the steps a resumed run writes again).
//
// One writer per run, on rank 0. Not thread-safe. Every record is flushed as written, so a run
// that dies keeps what it logged.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace fsdp::train {

class TensorBoardWriter {
 public:
  // Creates `dir` and a new events.out.tfevents.<seconds>.<host>.<pid>.fsdptrain file in it.
  // Throws InputError naming the folder when it cannot be created or written.
  explicit TensorBoardWriter(const std::string& dir);

  void add_scalar(const std::string& tag, int64_t step, double value);
  // Markdown text (the text plugin renders it).
  void add_text(const std::string& tag, int64_t step, const std::string& text);
  // A run that continues from a checkpoint at step `step - 1`: readers discard what earlier files
  // logged at `step` and later, so the resumed curve replaces it instead of doubling it.
  void start_session(int64_t step);

  const std::string& path() const { return path_; }

 private:
  void write_event(int64_t step, const std::string& fields);
  std::string path_;
  std::ofstream out_;
};

// The protobuf and TFRecord pieces, exposed for tests.
namespace tensorboard_wire {
std::string varint(uint64_t v);
std::string field_varint(int field, uint64_t v);
std::string field_bytes(int field, const std::string& bytes);  // length-delimited (strings, messages)
std::string field_double(int field, double v);
std::string field_float(int field, float v);
uint32_t masked_crc32c(const std::string& data);
std::string record(const std::string& data);  // one TFRecord
}  // namespace tensorboard_wire

}  // namespace fsdp::train

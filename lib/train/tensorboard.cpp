#include "train/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstring>

#include "ckpt/file_system.h"
#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::train {

namespace tensorboard_wire {

std::string varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
  return out;
}

std::string field_varint(int field, uint64_t v) {
  return varint(static_cast<uint64_t>(field) << 3 | 0) + varint(v);
}

std::string field_bytes(int field, const std::string& bytes) {
  return varint(static_cast<uint64_t>(field) << 3 | 2) + varint(bytes.size()) + bytes;
}

std::string field_double(int field, double v) {
  char raw[8];
  std::memcpy(raw, &v, 8);  // little-endian, as protobuf's fixed64
  return varint(static_cast<uint64_t>(field) << 3 | 1) + std::string(raw, 8);
}

std::string field_float(int field, float v) {
  char raw[4];
  std::memcpy(raw, &v, 4);
  return varint(static_cast<uint64_t>(field) << 3 | 5) + std::string(raw, 4);
}

uint32_t masked_crc32c(const std::string& data) {
  const uint32_t crc = ckpt::crc32c(data.data(), data.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string record(const std::string& data) {
  const uint64_t length = data.size();
  std::string header(reinterpret_cast<const char*>(&length), 8);
  const uint32_t header_crc = masked_crc32c(header), data_crc = masked_crc32c(data);
  return header + std::string(reinterpret_cast<const char*>(&header_crc), 4) + data +
         std::string(reinterpret_cast<const char*>(&data_crc), 4);
}

}  // namespace tensorboard_wire

namespace {

using namespace tensorboard_wire;

// Event fields (tensorflow/core/util/event.proto) and Summary.Value fields (summary.proto).
constexpr int kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5, kEventSessionLog = 7;
constexpr int kSummaryValue = 1;
constexpr int kValueTag = 1, kValueSimpleValue = 2, kValueTensor = 8, kValueMetadata = 9;
constexpr int kMetadataPluginData = 1, kPluginName = 1;
constexpr int kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8;
constexpr int kDtString = 7;
constexpr int kSessionLogStatus = 1, kSessionStart = 1;

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  make_directories(dir);
  path_ = str(dir, "/events.out.tfevents.", static_cast<int64_t>(wall_time()), ".", host_name(), ".", ::getpid(),
              ".fsdptrain");
  out_.open(path_, std::ios::binary | std::ios::app);
  FSDP_CHECK(out_.good(), "[train] logging.tensorboard_dir: cannot write ", quoted(path_));
  write_event(0, field_bytes(kEventFileVersion, "brain.Event:2"));
}

void TensorBoardWriter::write_event(int64_t step, const std::string& fields) {
  const std::string event =
      field_double(kEventWallTime, wall_time()) + field_varint(kEventStep, static_cast<uint64_t>(step)) + fields;
  out_ << record(event) << std::flush;
  FSDP_CHECK(out_.good(), "[train] cannot write TensorBoard events to ", quoted(path_));
}

void TensorBoardWriter::add_scalar(const std::string& tag, int64_t step, double value) {
  const std::string v = field_bytes(kValueTag, tag) + field_float(kValueSimpleValue, static_cast<float>(value));
  write_event(step, field_bytes(kEventSummary, field_bytes(kSummaryValue, v)));
}

void TensorBoardWriter::add_text(const std::string& tag, int64_t step, const std::string& text) {
  const std::string metadata = field_bytes(kMetadataPluginData, field_bytes(kPluginName, "text"));
  const std::string tensor =
      field_varint(kTensorDtype, kDtString) + field_bytes(kTensorShape, "") + field_bytes(kTensorStringVal, text);
  const std::string v =
      field_bytes(kValueTag, tag) + field_bytes(kValueMetadata, metadata) + field_bytes(kValueTensor, tensor);
  write_event(step, field_bytes(kEventSummary, field_bytes(kSummaryValue, v)));
}

void TensorBoardWriter::start_session(int64_t step) {
  write_event(step, field_bytes(kEventSessionLog, field_varint(kSessionLogStatus, kSessionStart)));
}

}  // namespace fsdp::train

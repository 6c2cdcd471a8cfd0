// The error file: how a worker tells its launcher why it failed, and when. torchrun's contract
// (TORCHELASTIC_ERROR_FILE, the JSON that torch.distributed.elastic's @record writes), so Python
// programs decorated with @record report through it too.
//
// When one rank fails, others fail after it only because it went away ("connection closed by
// peer"), and the order in which processes exit says little: a rank tearing down its process
// groups can exit after the peers it disconnected. The earliest error a rank recorded is the root
// cause, and that is what the launcher reports.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace fsdp::dist {

inline constexpr const char* kErrorFileVariable = "TORCHELASTIC_ERROR_FILE";

// Writes `message` and the time now to this worker's error file, unless the launcher gave none or
// an error was recorded already (the first one is the cause). Never throws. Returns whether the
// file holds an error now: then the launcher shows it, once for all ranks, and the worker need not.
bool record_worker_error(const std::string& message);

struct RecordedError {
  std::string message;
  int64_t unix_ns = 0;  // when it was recorded
};

// The error recorded in `path`; nullopt when there is none or it cannot be read.
std::optional<RecordedError> read_worker_error(const std::string& path);

}  // namespace fsdp::dist

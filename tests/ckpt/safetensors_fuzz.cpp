// libFuzzer target for the safetensors reader: any bytes either parse into a header whose tensors
// tile the data exactly, or are refused with fsdp::InputError; nothing else (no crash, no other
// exception, no read past the input). Build with clang and -DFSDP_BUILD_FUZZERS=ON, then run
// ./build/tests/safetensors_fuzz -max_total_time=60 [CORPUS_DIR].
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "ckpt/safetensors.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const fsdp::ckpt::Header h = fsdp::ckpt::parse_safetensors(data, size, "fuzz");
    uint64_t end = 0;
    for (const auto& t : h.tensors) {
      if (t.begin != end) std::abort();
      end = t.end;
    }
    if (h.data_start + end != size) std::abort();
  } catch (const fsdp::InputError&) {
  }
  return 0;
}

// Checkpoint stage: the host memory a save copies this rank's part into, and the copy.
//
// One buffer, allocated by reserve() before step 1 (or else by the first save) and reused by every
// save (a save joins the previous save's writer first), pinned when the model is on a GPU so the
// copies run at the link's speed and queue behind the step instead of waiting for it. plan() says
// where each tensor goes; the writer thread starts; copy() then copies on the training thread in
// the buffer's order, and the writer writes each piece once ready() says it is there, so a save
// takes about the longer of the copies and the writes, not their sum (the first save's copies, into
// memory not yet backed, cost as much as the writes on a virtual machine). Training goes on after
// copy(); on a GPU the copies queue on the step's stream and the next optimizer step runs after
// them, so they read this step's values, and ready() waits for their event. Pinning the buffer
// costs 6.2 s for the 14.8 GB of a 1.24B model on an H200: reserve() pays it on the training thread
// before step 1, since pinning on a thread beside the steps only moved that cost into step 1 (7.8 s
// instead of 0.8 s, measured there; the driver serializes it with the step's launches).
//
// Thread safety: the training thread calls plan(), copy(), back_all() and the stage_* functions;
// the writer thread calls ready() and copied_at(), which may run during copy(). Not collective.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_plan.h"
#include "util/clock.h"

namespace fsdp::ckpt {

class Staging {
 public:
  // Plans copying each source to `offsets[i]` bytes into the buffer (a multiple of 4), after
  // `prefix`'s bytes at its start; `bytes` in all. The buffer ends on a kDirectAlignment boundary
  // past them, so a file whose image it holds can be written with WritableFile::append_image.
  // Returns where each source will be; copy() fills them.
  std::vector<at::Tensor> plan(const std::string& prefix, const std::vector<at::Tensor>& sources,
                               const std::vector<uint64_t>& offsets, uint64_t bytes, const c10::Device& device);
  // Makes the copies plan() planned (none when it was not called since the last copy()), in the
  // buffer's order, telling ready() about each 32 MiB as it lands (on a GPU: queues them all, and
  // ready() waits for them). After a failure ready() throws, so a writer waiting for bytes that
  // never come ends.
  void copy();
  // Forgets the plan and has the whole buffer backed with memory now (pinned memory already is), so
  // the first save copies at the speed of the later ones. Returns its bytes.
  uint64_t back_all();
  // Seconds from `t0` until copy() had made every copy (the writer thread: after ready() of them all).
  double copied_at(Clock::time_point t0);
  // The writer thread: waits until the buffer's first `upto` bytes hold this save's values; returns
  // the buffer's start.
  const char* ready(uint64_t upto);

 private:
  struct Copy {
    uint64_t offset;
    at::Tensor src, dst;
  };
  void publish(uint64_t upto);

  at::Tensor buffer_;    // fp32, host
  bool pinned_ = false;  // on a GPU: pinned memory, copies queued on the step's stream
  c10::Device device_{at::kCPU};
  uint64_t backed_ = 0;  // the bytes from the buffer's start populate() has backed
  std::string prefix_;
  std::vector<Copy> copies_;  // by offset
  bool planned_ = false;      // copy() has copies_ to make
  std::mutex mutex_;          // the rest, shared with the writer thread
  std::condition_variable ready_;
  uint64_t staged_ = 0, end_ = 0;
  Clock::time_point done_;
  bool failed_ = false;
  std::optional<c10::Event> copied_;
};

// Plans the staging of a SHARDED save's shard file: its header at the buffer's start, then each of
// its rows at its file offset; each rows' data becomes its place in the buffer.
void stage_shard_image(ShardImage& image, Staging& staging, const c10::Device& device);
// Plans the staging of a FULL save's slices at their offsets; each slice becomes its place in the
// buffer. Returns the slices.
std::vector<HostSlice> stage_full_slices(FullSlices plan, Staging& staging, const c10::Device& device);

}  // namespace fsdp::ckpt

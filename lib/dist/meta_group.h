// A process group that moves no bytes: rank `rank` of `size` ranks that exist only in name, for the
// meta device, where a step runs with shapes and dtypes alone (c10d's FakeProcessGroup, which
// fully_shard's memory estimates use, is the same idea). Every collective checks its tensors as a
// real group's do, counts the bytes a rank of a real group of that size would send (process_group.h's
// table), and completes at once without touching its outputs. So a step at W = 8, or over a
// data x tensor x context mesh, can be run on one CPU and its collectives held against the formulas.
//
// Tensors on any device (meta, for a step; the CPU is accepted too, its outputs left as they were).
// Not a transport: nothing here is correct to train with.
#pragma once

#include "dist/process_group.h"

namespace fsdp::dist {

ProcessGroup make_meta_group(int rank, int size);

}  // namespace fsdp::dist

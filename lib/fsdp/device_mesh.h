// DeviceMesh: the ranks a model is sharded over. FSDP shards over `shard`; HSDP also replicates
// over `replicate` (the ranks that hold the same shard). A value type over shared process groups.
#pragma once

#include <optional>

#include "dist/process_group.h"

namespace fsdp {

struct DeviceMesh {
  dist::ProcessGroup shard;
  std::optional<dist::ProcessGroup> replicate;
};

// Splits `world` into replicate x shard (shard groups are consecutive ranks, one per machine
// usually). replicate = 1 gives plain FSDP over the world. Collective over `world`.
DeviceMesh make_mesh(const dist::ProcessGroup& world, int replicate_size, int shard_size);

}  // namespace fsdp

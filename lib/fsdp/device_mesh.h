// DeviceMesh: the ranks a model is sharded over. FSDP shards over `shard`; HSDP also replicates
// over `replicate` (the ranks that hold the same shard). A value type over shared process groups.
#pragma once

#include <optional>
#include <utility>

#include "dist/process_group.h"

namespace fsdp {

struct DeviceMesh {
  explicit DeviceMesh(dist::ProcessGroup shard_group, std::optional<dist::ProcessGroup> replicate_group = std::nullopt,
                      std::optional<dist::ProcessGroup> post_forward_group = std::nullopt)
      : shard(std::move(shard_group)),
        replicate(std::move(replicate_group)),
        post_forward(std::move(post_forward_group)) {}

  dist::ProcessGroup shard;
  std::optional<dist::ProcessGroup> replicate;
  // Partial resharding (FSDP2's reshard_after_forward=N): N consecutive ranks of the shard group
  // (one machine's GPUs, typically) over which a unit stays sharded between its forward and its
  // backward, so backward's all-gather runs inside them. None: resharded over the whole shard group.
  std::optional<dist::ProcessGroup> post_forward;
};

// Splits `world` into replicate x shard (shard groups are consecutive ranks, one per machine
// usually). replicate = 1 gives plain FSDP over the world. post_forward_size N (0: none) adds the
// partial-resharding groups: N consecutive ranks of each shard group; N must divide shard_size.
// Collective over `world`.
DeviceMesh make_mesh(const dist::ProcessGroup& world, int replicate_size, int shard_size, int post_forward_size = 0);

}  // namespace fsdp

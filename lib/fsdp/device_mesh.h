// DeviceMesh: the ranks a model is sharded over. FSDP shards over `shard`; HSDP also replicates
// over `replicate` (the ranks that hold the same shard). A value type over shared process groups.
#pragma once

#include <memory>
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
  // Tensor parallel: the ranks that split each layer's weights between them (and read the same
  // batch). The shard and replicate groups then join the ranks of one tp index across those groups.
  std::optional<dist::ProcessGroup> tp;
  // Context or Ulysses sequence parallel: the ranks that split each sequence between them (and read
  // the same batch). They are members of the shard group too: FSDP shards over dp_shard x cp, as
  // TorchTitan's and Accelerate's dp_shard_cp.
  std::optional<dist::ProcessGroup> cp;
  // Expert parallel: ep consecutive members of the shard group that split each mixture-of-experts
  // layer's experts between them (rank i of it holds the i-th E/ep); a token reaches its experts'
  // rank and comes back through all-to-all over it. Its counters are its own.
  std::optional<dist::ProcessGroup> ep;
  // With ep: the mesh the experts' units shard over (FsdpOptions::expert_classes). Its shard group
  // is the members of this shard group at this rank's place in its ep group (the shard group / ep),
  // its replicate, tp and ep groups this one's, and expert_blocks is set. Under tp the experts are
  // whole on every tp rank (each routes its own sequence block): their gradients are summed over it.
  std::shared_ptr<DeviceMesh> experts;
  // An experts' mesh: every parameter of its units is this ep rank's block of the whole along dim 0
  // (the stacked experts), and their gradients hold every ep rank's tokens, so each is divided by
  // ep after the shard group's average: the update then equals ep 1's.
  bool expert_blocks = false;
};

// Splits `world` into replicate x shard x cp x tp, tp innermost (TorchTitan's order):
// rank = ((replica * shard_size + shard index) * cp_size + cp index) * tp_size + tp index, so a tp
// group is consecutive ranks (one machine's GPUs), a cp group is ranks tp_size apart, and FSDP's
// shard group is the shard_size x cp_size ranks of one replica and tp index. replicate = 1, tp = 1
// and cp = 1 give plain FSDP over the world. post_forward_size N (0: none) adds the
// partial-resharding groups: N consecutive members of each shard group; N must divide
// shard_size x cp_size. ep_size > 1 adds the expert-parallel groups (ep, experts): ep_size must divide
// shard_size x cp_size. Collective over `world`.
DeviceMesh make_mesh(const dist::ProcessGroup& world, int replicate_size, int shard_size, int post_forward_size = 0,
                     int tp_size = 1, int cp_size = 1, int ep_size = 1);

}  // namespace fsdp

// Expert parallel for a mixture of experts, as TorchTitan and DeepSpeed-MoE lay it out: the E experts
// of every sparse layer are split over the P ranks of the ep group (fsdp::DeviceMesh::ep), rank i
// holding experts [i E/P, (i+1) E/P). Each rank routes its own tokens; the rows for each expert travel
// to the rank that holds it in one all-to-all (unequal splits), run there grouped by expert, and come
// back in a second. The counts per expert cross first as a tensor; the host reads them once a layer,
// since the rows' all-to-all takes its split sizes there. Backward runs the two exchanges reversed.
//
// Collective over the ep group: every rank runs the same sparse layers in the same order, forward
// and backward. Not thread-safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>

#include "dist/process_group.h"

namespace fsdp::model {

struct ExpertParallel {
  explicit ExpertParallel(dist::ProcessGroup g) : group(std::move(g)), rank_(group->rank()), size_(group->size()) {}
  // Shapes alone (estimate-memory builds rank 0's experts of a model it never runs): no group.
  static ExpertParallel shapes_only(int size) { return ExpertParallel(size); }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::optional<dist::ProcessGroup> group;  // P ranks

 private:
  explicit ExpertParallel(int size) : size_(size) {}
  int rank_ = 0, size_ = 1;
};

// The local experts' product: rows grouped by local expert, offsets (L) int32 the groups' ends,
// expert (rows) int64 each row's local expert -> (rows, C).
using LocalExperts =
    std::function<at::Tensor(const at::Tensor& rows, const at::Tensor& offsets, const at::Tensor& expert)>;

// rows (N, C): this rank's routed rows grouped by expert (of all E), counts (E) int64 the rows per
// expert, on rows' device. Sends each expert's rows to its rank, runs `local` there on what every
// rank sent (grouped by local expert, each group's rows in source rank order), and returns each row's
// output (N, C) in rows' order. Differentiable in rows (and through `local` in the experts' weights).
at::Tensor run_expert_parallel(const at::Tensor& rows, const at::Tensor& counts, const ExpertParallel& ep,
                               const LocalExperts& local);

// The bytes this rank sends in one sparse layer's forward: the row counts' exchange (E int64, each
// rank its (P-1)/P) and the rows to and from other ranks' experts (sent + received rows x C x the
// element size: what goes out comes back). rows_sent: the rows routed to experts on other ranks.
int64_t expert_parallel_forward_bytes(int64_t num_experts, int ep_size, int64_t rows_sent, int64_t rows_received,
                                      int64_t hidden, int64_t element_size);

}  // namespace fsdp::model

// ShardLayout: where one parameter's rows live when it is split over a group (dim-0 sharding).
//
// Like torch.chunk(param, W, dim=0): every rank owns chunk_rows = ceil(dim0 / W) rows of storage,
// rank r holds rows [r * chunk_rows, (r + 1) * chunk_rows) of the parameter, and the rows past
// dim0 are padding that stays zero. So the last ranks may hold a partial chunk or only padding
// (dim0 = 5, W = 4: 2, 2, 1 + 1 pad, 0 + 2 pad). Gathering the padded chunks rank-major puts the
// real rows first, in order: the full parameter is the first numel() elements of the gathered
// buffer. Plain arithmetic; no LibTorch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace fsdp {

struct ShardLayout {
  std::vector<int64_t> shape;  // the full parameter's shape (at least 1-D)
  int world_size = 1;          // the shard group's size W
  int rank = 0;                // this rank in the shard group

  int64_t dim0() const { return shape.empty() ? 1 : shape[0]; }
  int64_t row_numel() const {  // elements in one row: the product of shape[1:]
    int64_t n = 1;
    for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
    return n;
  }
  int64_t numel() const { return dim0() * row_numel(); }
  int64_t chunk_rows() const { return (dim0() + world_size - 1) / world_size; }
  int64_t shard_numel() const { return chunk_rows() * row_numel(); }   // padded, same on every rank
  int64_t padded_numel() const { return shard_numel() * world_size; }  // the gathered buffer
  int64_t first_row() const { return std::min<int64_t>(dim0(), rank * chunk_rows()); }
  int64_t valid_rows() const { return std::min<int64_t>(chunk_rows(), dim0() - first_row()); }
  // Padding elements this rank holds (zeros that exist only so every rank's shard is the same size).
  int64_t padding_numel() const { return (chunk_rows() - valid_rows()) * row_numel(); }
};

// TpSlice: where a tensor-parallel rank's part of a parameter sits in the whole parameter. The
// parameter is cut into `parts` equal blocks along `dim` and this rank holds block `index`
// (Megatron's column-parallel weights: dim 0; row-parallel: dim 1); dim -1: every rank of the
// tensor-parallel group holds the whole parameter (norms, row-parallel biases). When the whole size
// along dim does not divide (a vocabulary of 257 rows over 2 ranks), `whole` is that size and the
// blocks are ceil(whole / parts) long, the last ones padded past it with rows that stay zero.
struct TpSlice {
  int dim = -1;
  int index = 0;
  int parts = 1;
  int64_t whole = 0;  // the whole size along dim; 0: parts x the block's

  bool split() const { return dim >= 0 && parts > 1; }
  // The whole parameter's shape, from this rank's part's.
  std::vector<int64_t> full_shape(std::vector<int64_t> local) const {
    if (split()) {
      int64_t& n = local[static_cast<size_t>(dim)];
      n = whole > 0 ? whole : n * parts;
    }
    return local;
  }
  // Where this rank's block starts along dim, for a block of `local_size` there.
  int64_t start(int64_t local_size) const { return split() ? index * local_size : 0; }
  // How many of the block's `local_size` entries along dim are the parameter's (the rest pad it).
  int64_t valid(int64_t local_size) const {
    if (!split() || whole == 0) return local_size;
    return std::clamp<int64_t>(whole - start(local_size), 0, local_size);
  }
};

}  // namespace fsdp

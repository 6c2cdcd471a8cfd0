#include "model/parallel/context_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "model/kernels/ops.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

dist::ProcessGroup group_of(const ContextParallel& cp) {
  FSDP_ASSERT(cp.group.has_value(), "a sequence-split collective on a model built for its shapes alone");
  return *cp.group;
}

const ContextParallel& saved_cp(AutogradContext* ctx) {
  return *reinterpret_cast<const ContextParallel*>(static_cast<intptr_t>(ctx->saved_data["cp"].toInt()));
}

// --- one block of attention: a query chunk against a key chunk -------------------------------------

using kernels::BlockAttention;

// k (B, K, L, D) -> (B, H, L, D): query head j reads kv head j / (H / K).
at::Tensor expand_heads(const at::Tensor& k, int64_t heads) {
  return k.size(1) == heads ? k : k.repeat_interleave(heads / k.size(1), 1);
}
// The gradient of expand_heads: (B, H, L, D) summed back to (B, K, L, D).
at::Tensor fold_heads(const at::Tensor& g, int64_t kv_heads) {
  if (g.size(1) == kv_heads) return g;
  const int64_t b = g.size(0), h = g.size(1), l = g.size(2), d = g.size(3);
  return g.view({b, kv_heads, h / kv_heads, l, d}).sum(2);
}

// The layer's scores as the blocks apply them: the scale resolved.
struct Rule {
  double scale = 1, softcap = 0;
  int64_t window = 0;
  at::Tensor segments;  // (B, T) int64 on one device: each token's record in its packed row; else undefined
  std::vector<int64_t> first_key;  // with segments: position i's record's first token, least over rows; or empty
};

// Where a block stands: query row i and key column j of it are offset + i - j positions apart, and a
// query sees a key at a distance d >= 0 (and d < window, where there is one).
struct Block {
  enum class Kind {
    kNone,    // no query sees a key of it
    kWhole,   // every query sees every key
    kCausal,  // the chunk against itself, no window cutting it: flash attention's causal mask
    kCut,     // a window (or a window and the causal mask) cuts it: masked, tile by tile
  };
  Kind kind = Kind::kNone;
  int64_t offset = 0;
  int64_t rows = 0;  // its first `rows` queries see a key of it (those after see none)
  // The first key of the chunk the keys given hold (a window's exchange moves only the keys from there
  // on, model/parallel/context_parallel.h): key column j is row j - held_from of them.
  int64_t held_from = 0;
};

// Block of query chunk a against key chunk b, chunks of c tokens.
Block block_of(int64_t a, int64_t b, int64_t c, int64_t window) {
  if (b > a) return {};
  const int64_t offset = (a - b) * c;
  if (window > 0 && offset - (c - 1) >= window) return {};  // its nearest pair is out of the window
  if (window == 0 || offset + c - 1 < window) return {a == b ? Block::Kind::kCausal : Block::Kind::kWhole, offset, c};
  return {Block::Kind::kCut, offset, std::min(c, window + c - 1 - offset)};
}

// The first key of the block any query of it sees: 0 unless a window cuts it.
int64_t first_key_seen(const Block& b, int64_t window) {
  return b.kind == Block::Kind::kCut ? std::max<int64_t>(0, b.offset - window + 1) : 0;
}

// Query rows [r0, r1) of a block against key columns [k0, k1): every key those rows see.
struct Tile {
  int64_t r0, r1, k0, k1;
};

// A block's tiles: rows a window (at least 256) at a time, so that each tile's scores are a band's
// worth under a window, and a bounded share of the block's without one. Packed records (one device's
// whole block) start a tile's keys at its first row's record: no row of it sees a key before that.
std::vector<Tile> tiles_of(const Block& b, int64_t c, const Rule& rule) {
  const int64_t window = rule.window, step = std::max<int64_t>(window, 256);
  FSDP_ASSERT(rule.first_key.empty() || (b.offset == 0 && static_cast<int64_t>(rule.first_key.size()) == c),
              "blockwise attention: record starts for a block of another shape");
  std::vector<Tile> out;
  for (int64_t r0 = 0; r0 < b.rows; r0 += step) {
    const int64_t r1 = std::min(b.rows, r0 + step);
    int64_t k0 = window > 0 ? std::max<int64_t>(0, b.offset + r0 - window + 1) : 0;
    if (!rule.first_key.empty()) k0 = std::max(k0, rule.first_key[static_cast<size_t>(r0)]);
    out.push_back({r0, r1, k0, std::min(c, b.offset + r1)});
  }
  return out;
}

// a (..., n, k) times b (..., k, m), the same batch dimensions, in float32: as flash attention keeps
// its scores, a bf16/fp16 product with a float32 result on a GPU (CUDA's bmm with an out_dtype; on
// meta, which has no kernel for it, a product in the operands' dtype stands in for its shape and
// cost), else the operands in float32 (the CPU, where bf16 is no speed target).
at::Tensor float_product(const at::Tensor& a, const at::Tensor& b) {
  const bool reduced = a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf;
  if (!reduced || a.is_meta()) return at::matmul(a, b).to(at::kFloat);  // float32 and float64 as they are
  if (!a.is_cuda()) return at::matmul(a.to(at::kFloat), b.to(at::kFloat));
  std::vector<int64_t> sizes(a.sizes().begin(), a.sizes().end());
  sizes.back() = b.size(-1);
  const at::Tensor out =
      at::bmm(a.reshape({-1, a.size(-2), a.size(-1)}), b.reshape({-1, b.size(-2), b.size(-1)}), at::kFloat);
  return out.view(sizes);
}

// A tile's keys [k0, k1) of the keys k holds (from key held_from on), (B, K, n, D) -> (B, H, m, D).
at::Tensor tile_keys(const at::Tensor& k, const Tile& t, int64_t held_from, int64_t heads) {
  FSDP_ASSERT(t.k0 >= held_from, "blockwise attention: a tile reads key ", t.k0, " of keys held from ", held_from);
  return expand_heads(k.narrow(2, t.k0 - held_from, t.k1 - t.k0), heads);
}

// A tile's scores in float32, capped where the rule caps them, the keys its queries do not see at -inf
// (kt: the tile's keys, kv heads expanded); the cap's tanh for backward (undefined without one). The
// tiles' products take their operands in q's dtype and give float32 (float_product), everything
// between them in float32, as flash attention computes.
std::pair<at::Tensor, at::Tensor> tile_scores(const at::Tensor& q, const at::Tensor& kt, const Block& b, const Tile& t,
                                              const Rule& rule) {
  const at::Tensor qt = q.narrow(2, t.r0, t.r1 - t.r0);
  at::Tensor s = float_product(qt, kt.transpose(-1, -2)) * rule.scale, th;
  if (rule.softcap > 0) {
    th = at::tanh(s / rule.softcap);
    s = th * rule.softcap;
  }
  if (b.kind != Block::Kind::kWhole) {
    const auto opts = q.options().dtype(at::kLong);
    const at::Tensor d = (at::arange(t.r0, t.r1, opts).unsqueeze(1) + b.offset) - at::arange(t.k0, t.k1, opts);
    at::Tensor unseen = rule.window > 0 ? (d < 0) | (d >= rule.window) : d < 0;  // (n, m)
    if (rule.segments.defined()) {  // and another record's keys: (B, 1, n, m)
      const at::Tensor rows = rule.segments.narrow(1, t.r0, t.r1 - t.r0),
                       keys = rule.segments.narrow(1, t.k0, t.k1 - t.k0);
      unseen = unseen | (rows.unsqueeze(2) != keys.unsqueeze(1)).unsqueeze(1);
    }
    s = s.masked_fill(unseen, -INFINITY);
  }
  return {s, th};
}

struct Partial {
  at::Tensor out;    // (B, H, n, D), the block's softmax over its keys alone for queries row0 .. row0 + n - 1
  at::Tensor lse;    // (B, H, n) float32, the log of its denominator
  int64_t row0 = 0;  // the first query row it holds
};

// Flash attention takes a block whose mask is none or causal, with plain scores.
bool flash_takes(const Block& b, const Rule& rule) {
  return rule.softcap == 0 && (b.kind == Block::Kind::kWhole || b.kind == Block::Kind::kCausal);
}

std::vector<Partial> block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Block& b,
                                   const Rule& rule) {
  const bool causal = b.kind == Block::Kind::kCausal;
  FSDP_ASSERT(b.held_from == 0 || !flash_takes(b, rule), "blockwise attention: a whole block given part of its keys");
  const BlockAttention kernel = kernels::ops_for(q).block_attention(q);  // engine.kernels (model/kernels/ops.h)
  if (flash_takes(b, rule) && kernel == BlockAttention::kCpuFlash) {     // takes grouped heads itself
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, {}, rule.scale);
    return {{out, lse.to(at::kFloat)}};
  }
  const int64_t h = q.size(1);
  if (flash_takes(b, rule) && kernel == BlockAttention::kCudaFlash) {
    auto r = at::_scaled_dot_product_flash_attention(q, expand_heads(k, h), expand_heads(v, h), 0.0, causal, false,
                                                     rule.scale);
    return {{std::get<0>(r), std::get<1>(r).to(at::kFloat)}};
  }
  std::vector<Partial> out;
  for (const Tile& t : tiles_of(b, q.size(2), rule)) {  // every row of a tile sees a key: lse is finite
    const at::Tensor s = tile_scores(q, tile_keys(k, t, b.held_from, h), b, t, rule).first, lse = s.logsumexp(-1);
    const at::Tensor p = at::exp(s - lse.unsqueeze(-1)).to(v.scalar_type());
    out.push_back({float_product(p, tile_keys(v, t, b.held_from, h)), lse, t.r0});
  }
  return out;
}

// What backward reads of queries' rows, over every key (and sink) they see, not one block's: dout, the
// output, its log-sum-exp and D = rowsum(dout * out) (a block's probabilities are exp(score - the
// whole row's lse)).
struct Rows {
  at::Tensor dout, out, lse, d;  // (B, H, L, D), (B, H, L, D), (B, H, L) float32, (B, H, L) float32
};

// The block's shares of dq (B, H, L, D), dk and dv (B, K, L, D), all float32, added in place.
void block_backward(const Rows& rows, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Block& b,
                    const Rule& rule, const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv) {
  const int64_t h = q.size(1), kv = k.size(1);
  const bool causal = b.kind == Block::Kind::kCausal;
  FSDP_ASSERT(b.held_from == 0 || !flash_takes(b, rule), "blockwise attention: a whole block given part of its keys");
  const BlockAttention kernel = kernels::ops_for(q).block_attention(q);  // engine.kernels (model/kernels/ops.h)
  if (flash_takes(b, rule) && kernel == BlockAttention::kCpuFlash) {
    auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(rows.dout, q, k, v, rows.out, rows.lse,
                                                                                 0.0, causal, {}, rule.scale);
    dq.add_(gq);
    dk.add_(gk);
    dv.add_(gv);
    return;
  }
  if (flash_takes(b, rule) && kernel == BlockAttention::kCudaFlash) {
    // The kernel reads the log-sum-exp as a dense (B, H, Lq) array, whatever its strides say: a chunk's
    // rows narrowed out of the whole row's (B, H, 2Lq) would be read from the wrong places.
    const int64_t l = q.size(2);
    const at::Tensor none = at::zeros({2}, q.options().dtype(at::kLong));  // no dropout: no generator state
    auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_backward(
        rows.dout, q, expand_heads(k, h), expand_heads(v, h), rows.out, rows.lse.contiguous(), at::Tensor(),
        at::Tensor(), l, k.size(2), 0.0, causal, none, none, rule.scale);
    dq.add_(gq);
    dk.add_(fold_heads(gk, kv));
    dv.add_(fold_heads(gv, kv));
    return;
  }
  const at::ScalarType dtype = q.scalar_type();  // the products' operands (tile_scores)
  for (const Tile& t : tiles_of(b, q.size(2), rule)) {
    const int64_t n = t.r1 - t.r0, m = t.k1 - t.k0;
    const at::Tensor kt = tile_keys(k, t, b.held_from, h), vt = tile_keys(v, t, b.held_from, h);
    auto [s, th] = tile_scores(q, kt, b, t, rule);
    const at::Tensor g = rows.dout.narrow(2, t.r0, n);
    const at::Tensor p = at::exp(s - rows.lse.narrow(2, t.r0, n).unsqueeze(-1));
    at::Tensor ds = p * (float_product(g, vt.transpose(-1, -2)) - rows.d.narrow(2, t.r0, n).unsqueeze(-1));
    if (th.defined()) ds = ds * (1 - th * th);  // d(cap tanh(s / cap)) / ds
    ds = ds.to(dtype);
    dq.narrow(2, t.r0, n).add_(float_product(ds, kt), rule.scale);
    const int64_t k0 = t.k0 - b.held_from;  // dk and dv: of the keys held
    dk.narrow(2, k0, m).add_(fold_heads(float_product(ds.transpose(-1, -2), q.narrow(2, t.r0, n)), kv), rule.scale);
    dv.narrow(2, k0, m).add_(fold_heads(float_product(p.to(dtype).transpose(-1, -2), g), kv));
  }
}

// The running merge of one query chunk's partial attentions (the log-sum-exp rule). Rows no partial has
// reached yet hold out 0 and lse -inf; a partial's rows each see a key, so their lse is finite.
struct Merged {
  at::Tensor out, lse;  // (B, H, c, D), (B, H, c) float32
  void add(const Partial& p, int64_t c) {
    const at::Tensor o = p.out.to(at::kFloat);
    const int64_t n = o.size(2);
    if (!out.defined() && n == c) {
      out = o;
      lse = p.lse;
      return;
    }
    if (!out.defined()) {
      out = at::zeros({o.size(0), o.size(1), c, o.size(3)}, o.options());
      lse = at::full({o.size(0), o.size(1), c}, -INFINITY, o.options());
    }
    const at::Tensor out_rows = out.narrow(2, p.row0, n), lse_rows = lse.narrow(2, p.row0, n);
    const at::Tensor total = at::logaddexp(lse_rows, p.lse);
    out_rows.copy_(out_rows * at::exp(lse_rows - total).unsqueeze(-1) + o * at::exp(p.lse - total).unsqueeze(-1));
    lse_rows.copy_(total);
  }
};

// --- the layout: which chunks a rank holds, and which blocks its queries need ---------------------

std::vector<int64_t> prepend(int64_t n, at::IntArrayRef sizes) {
  std::vector<int64_t> out{n};
  out.insert(out.end(), sizes.begin(), sizes.end());
  return out;
}

// The two chunks (of 2P) rank r holds, in its order.
std::array<int64_t, 2> chunks_of(int64_t r, int64_t p) {
  return {r, 2 * p - 1 - r};
}

// (B, N, L, D) -> its two chunks along L.
std::array<at::Tensor, 2> halves(const at::Tensor& x) {
  const int64_t c = x.size(2) / 2;
  return {x.narrow(2, 0, c), x.narrow(2, c, c)};
}

// Keys and values packed into one buffer for a collective: (2, B, K, L, D).
at::Tensor pack(const at::Tensor& k, const at::Tensor& v) {
  return at::stack({k, v}).contiguous();
}

// This rank's two query chunks against key chunk `chunk` (of 2P) and its values (kv: (2, B, K, n, D),
// the chunk's keys from key `held_from` on, n = c - held_from): each query chunk takes the block it sees,
// if any.
void attend_chunk(const std::array<at::Tensor, 2>& q, const at::Tensor& kv, int64_t chunk, const ContextParallel& cp,
                  const Rule& rule, std::array<Merged, 2>& merged, int64_t held_from = 0) {
  const auto mine = chunks_of(cp.rank(), cp.size());
  const int64_t c = q[0].size(2);
  for (int i = 0; i < 2; ++i)
    if (Block b = block_of(mine[i], chunk, c, rule.window); b.kind != Block::Kind::kNone) {
      b.held_from = held_from;
      for (const Partial& p : block_forward(q[i], kv[0], kv[1], b, rule)) merged[i].add(p, c);
    }
}

// The backward of attend_chunk: dq accumulates into dq (float32, two chunks), dk and dv into dkv
// (float32, kv's shape).
void attend_chunk_backward(const std::array<Rows, 2>& rows, const std::array<at::Tensor, 2>& q, const at::Tensor& kv,
                           const at::Tensor& dkv, int64_t chunk, const ContextParallel& cp, const Rule& rule,
                           std::array<at::Tensor, 2>& dq, int64_t held_from = 0) {
  const auto mine = chunks_of(cp.rank(), cp.size());
  for (int i = 0; i < 2; ++i)
    if (Block b = block_of(mine[i], chunk, q[i].size(2), rule.window); b.kind != Block::Kind::kNone) {
      b.held_from = held_from;
      block_backward(rows[i], q[i], kv[0], kv[1], b, rule, dq[i], dkv[0], dkv[1]);
    }
}

// Half `half` (0, 1) of packed keys and values (2, B, K, 2c, D): (2, B, K, c, D).
at::Tensor half_of(const at::Tensor& kv, int64_t half) {
  const int64_t c = kv.size(3) / 2;
  return kv.narrow(3, half * c, c);
}

// This rank's queries against the keys and values of rank `owner` (kv: (2, B, K, L, D)).
void attend_owner(const std::array<at::Tensor, 2>& q, const at::Tensor& kv, int64_t owner, const ContextParallel& cp,
                  const Rule& rule, std::array<Merged, 2>& merged) {
  const auto theirs = chunks_of(owner, cp.size());
  for (int j = 0; j < 2; ++j) attend_chunk(q, half_of(kv, j), theirs[j], cp, rule, merged);
}

// The backward of attend_owner: dk and dv into dkv (float32, (2, B, K, L, D)).
void attend_owner_backward(const std::array<Rows, 2>& rows, const std::array<at::Tensor, 2>& q, const at::Tensor& kv,
                           const at::Tensor& dkv, int64_t owner, const ContextParallel& cp, const Rule& rule,
                           std::array<at::Tensor, 2>& dq) {
  const auto theirs = chunks_of(owner, cp.size());
  for (int j = 0; j < 2; ++j) attend_chunk_backward(rows, q, half_of(kv, j), half_of(dkv, j), theirs[j], cp, rule, dq);
}

// --- a window's exchange: only the keys some query sees move -------------------------------------

// How many of the last keys of rank `from`'s half `half` a query of rank `to`'s chunks sees (0: none; c:
// all), chunks of c tokens: a window reaching into a chunk sees its tail.
int64_t keys_seen(int64_t to, int64_t from, int half, int64_t p, int64_t c, int64_t window) {
  const int64_t theirs = chunks_of(from, p)[half];
  int64_t most = 0;
  for (const int64_t a : chunks_of(to, p))
    if (const Block b = block_of(a, theirs, c, window); b.kind != Block::Kind::kNone)
      most = std::max(most, c - first_key_seen(b, window));
  return most;
}

// What one rank sends and receives: the tails of its own halves another rank's queries see, and the tails
// of other ranks' halves its own see, each listed rank-major and in half order, as the all-to-all lays
// them out.
struct Exchange {
  struct Move {
    int64_t rank;  // whom it goes to (sends) or comes from (receives)
    int half;      // of the sender's two chunks
    int64_t keys;  // the half's last `keys` keys (and values), those the receiver's queries see
  };
  std::vector<int64_t> send_keys, receive_keys;  // keys, by rank
  std::vector<Move> sends, receives;
  int64_t keys_sent() const { return std::accumulate(send_keys.begin(), send_keys.end(), int64_t{0}); }
  int64_t keys_received() const { return std::accumulate(receive_keys.begin(), receive_keys.end(), int64_t{0}); }
};

Exchange exchange_of(int64_t rank, int64_t p, int64_t c, int64_t window) {
  Exchange e{std::vector<int64_t>(static_cast<size_t>(p), 0), std::vector<int64_t>(static_cast<size_t>(p), 0), {}, {}};
  for (int64_t other = 0; other < p; ++other) {
    if (other == rank) continue;
    for (int half = 0; half < 2; ++half) {
      if (const int64_t n = keys_seen(other, rank, half, p, c, window); n > 0) {
        e.send_keys[static_cast<size_t>(other)] += n;
        e.sends.push_back({other, half, n});
      }
      if (const int64_t n = keys_seen(rank, other, half, p, c, window); n > 0) {
        e.receive_keys[static_cast<size_t>(other)] += n;
        e.receives.push_back({other, half, n});
      }
    }
  }
  return e;
}

// The most chunks a rank of the group receives (some of) under the window (2(P-1): every other rank's).
int64_t busiest_receiver(int64_t p, int64_t c, int64_t window) {
  int64_t most = 0;
  for (int64_t r = 0; r < p; ++r)
    most = std::max<int64_t>(most, static_cast<int64_t>(exchange_of(r, p, c, window).receives.size()));
  return most;
}

bool exchanges(SequenceSplit how, int64_t p, int64_t c, int64_t window) {
  if (how == SequenceSplit::kUlysses || p == 1 || window <= 0) return false;
  const int64_t most = busiest_receiver(p, c, window);
  return most < 2 * (p - 1) && (how == SequenceSplit::kAllGather || most <= 2);
}

// The exchange's buffers are flat: each move's tail of packed keys and values (2, B, K, keys, D) laid
// out whole, one after another in the moves' order (so the all-to-all's rows are elements). `per_key`:
// the elements of one key's K and V, 2 B K D.

// Move m's tail in a flat buffer of `moves`, (2, B, K, keys, D); `like`: packed keys and values.
at::Tensor tail_in(const at::Tensor& flat, const std::vector<Exchange::Move>& moves, size_t m, const at::Tensor& like) {
  int64_t at = 0;
  for (size_t i = 0; i < m; ++i) at += moves[i].keys;
  const int64_t per_key = like.numel() / like.size(3);
  return flat.narrow(0, at * per_key, moves[m].keys * per_key)
      .view({like.size(0), like.size(1), like.size(2), moves[m].keys, like.size(4)});
}

// Rows (elements) of a flat buffer by rank, from keys by rank.
std::vector<int64_t> rows_of(const std::vector<int64_t>& keys, int64_t per_key) {
  std::vector<int64_t> rows;
  for (const int64_t n : keys) rows.push_back(n * per_key);
  return rows;
}

// Sends the tails of this rank's halves (packed keys and values (2, B, K, 2c, D)) that other ranks'
// queries see, and returns (once waited for) those of other ranks' halves its own see, flat.
std::pair<at::Tensor, dist::Work> start_exchange(dist::ProcessGroup& group, const Exchange& e, const at::Tensor& kv) {
  const int64_t c = kv.size(3) / 2, per_key = kv.numel() / kv.size(3);
  std::vector<at::Tensor> tails;
  for (const Exchange::Move& m : e.sends)
    tails.push_back(half_of(kv, m.half).narrow(3, c - m.keys, m.keys).reshape(-1));
  const at::Tensor out = tails.empty() ? at::empty({0}, kv.options()) : at::cat(tails);
  at::Tensor in = at::empty({e.keys_received() * per_key}, kv.options());
  dist::Work w = group.all_to_all(in, out, rows_of(e.receive_keys, per_key), rows_of(e.send_keys, per_key),
                                  "context-parallel window exchange of K/V");
  return {in, std::move(w)};
}

// Sinks (H) folded into the merged attention: one more term exp(sink) in each row's denominator.
void add_sinks(at::Tensor& out, at::Tensor& lse, const at::Tensor& sinks) {
  const at::Tensor total = at::logaddexp(lse, sinks.to(at::kFloat).view({1, -1, 1}));
  out = out * at::exp(lse - total).unsqueeze(-1);
  lse = total;
}

// The sinks' gradient from each row's lse (sinks included) and D: a sink's probability exp(sink - lse)
// takes -p D, its value being none.
at::Tensor sinks_gradient(const at::Tensor& sinks, const at::Tensor& lse, const at::Tensor& d) {
  const at::Tensor p = at::exp(sinks.to(at::kFloat).view({1, -1, 1}) - lse);
  return (-(p * d).sum(at::IntArrayRef{0, 2})).to(sinks.scalar_type());
}

// --- context parallel's two strategies, and one device's whole sequence --------------------------------

// This rank's two chunks' merged attention (B, H, L, D) and log-sum-exp (B, H, L), float32, and for the
// all-gather the gathered K/V (P, 2, B, K, L, D) that backward reads again, or under a window's exchange
// the tails received (flat; the ring keeps none).
struct Forward {
  at::Tensor out, lse, gathered;
};

// Whether this layer's window exchanges its chunks (exchanges_window), from a rank's c-token chunks.
bool exchanged(const ContextParallel& cp, int64_t c, const Rule& rule) {
  return exchanges(cp.how, cp.size(), c, rule.window);
}

Forward forward_over_group(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextParallel& cp,
                           const Rule& rule) {
  dist::ProcessGroup group = group_of(cp);
  const int64_t p = cp.size(), r = cp.rank();
  const auto qs = halves(q);
  std::array<Merged, 2> merged;
  at::Tensor kv = pack(k, v), gathered;
  if (exchanged(cp, qs[0].size(2), rule)) {  // the rank's own chunks while the others' arrive
    const Exchange e = exchange_of(r, p, qs[0].size(2), rule.window);
    auto [received, arriving] = start_exchange(group, e, kv);
    attend_owner(qs, kv, r, cp, rule, merged);
    arriving.wait();
    const int64_t c = qs[0].size(2);
    for (size_t m = 0; m < e.receives.size(); ++m) {
      const Exchange::Move& from = e.receives[m];
      attend_chunk(qs, tail_in(received, e.receives, m, kv), chunks_of(from.rank, p)[from.half], cp, rule, merged,
                   c - from.keys);
    }
    if (cp.how == SequenceSplit::kAllGather) gathered = received;  // the ring exchanges them again in backward
  } else if (cp.how == SequenceSplit::kAllGather) {
    gathered = at::empty({p * kv.numel()}, kv.options());
    group.all_gather(gathered, kv.reshape({-1}), "context-parallel gather of K/V").wait();
    gathered = gathered.view(prepend(p, kv.sizes()));
    for (int64_t owner = 0; owner < p; ++owner) attend_owner(qs, gathered[owner], owner, cp, rule, merged);
  } else {
    for (int64_t step = 0; step < p; ++step) {  // holding the K/V of rank r - step
      at::Tensor next;
      dist::Work arriving;
      if (step + 1 < p) {
        next = at::empty_like(kv);
        arriving = group.shift(next, kv, 1, "context-parallel ring of K/V");
      }
      attend_owner(qs, kv, (r - step + p) % p, cp, rule, merged);
      arriving.wait();
      if (next.defined()) kv = next;
    }
  }
  return {at::cat({merged[0].out, merged[1].out}, 2), at::cat({merged[0].lse, merged[1].lse}, 2), gathered};
}

// One device: the whole sequence one chunk, against itself; packed records cut it as a window does
// (every row still sees itself).
Block whole_block(int64_t t, const Rule& rule) {
  Block b = block_of(0, 0, t, rule.window);
  if (rule.segments.defined()) b.kind = Block::Kind::kCut;
  return b;
}

Forward forward_whole(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Rule& rule) {
  const int64_t t = q.size(2);
  Merged merged;
  for (const Partial& p : block_forward(q, k, v, whole_block(t, rule), rule)) merged.add(p, t);
  return {merged.out, merged.lse, at::Tensor()};
}

// A window's exchange backward: dq into dq; returns this rank's dK and dV (2, B, K, L, D), float32: its
// own blocks' shares and those of the ranks that received its chunks, sent home by the reverse exchange.
// `received`: the chunks forward received (allgather), or undefined (the ring: exchanged again).
at::Tensor backward_exchanged(const std::array<Rows, 2>& rows, const std::array<at::Tensor, 2>& qs,
                              const at::Tensor& kv, at::Tensor received, const ContextParallel& cp, const Rule& rule,
                              std::array<at::Tensor, 2>& dq) {
  dist::ProcessGroup group = group_of(cp);
  const int64_t p = cp.size(), r = cp.rank();
  const Exchange e = exchange_of(r, p, qs[0].size(2), rule.window);
  dist::Work arriving;
  if (!received.defined()) std::tie(received, arriving) = start_exchange(group, e, kv);
  const at::Tensor dkv = at::zeros(kv.sizes(), kv.options().dtype(at::kFloat));
  attend_owner_backward(rows, qs, kv, dkv, r, cp, rule, dq);
  arriving.wait();
  const at::Tensor shares = at::zeros(received.sizes(), received.options().dtype(at::kFloat));
  const int64_t c = qs[0].size(2), per_key = kv.numel() / kv.size(3);
  for (size_t m = 0; m < e.receives.size(); ++m) {
    const Exchange::Move& from = e.receives[m];
    attend_chunk_backward(rows, qs, tail_in(received, e.receives, m, kv), tail_in(shares, e.receives, m, dkv),
                          chunks_of(from.rank, p)[from.half], cp, rule, dq, c - from.keys);
  }
  const at::Tensor home = at::empty({e.keys_sent() * per_key}, shares.options());
  group
      .all_to_all(home, shares, rows_of(e.send_keys, per_key), rows_of(e.receive_keys, per_key),
                  "context-parallel window exchange of K/V gradients")
      .wait();
  for (size_t m = 0; m < e.sends.size(); ++m)
    half_of(dkv, e.sends[m].half).narrow(3, c - e.sends[m].keys, e.sends[m].keys).add_(tail_in(home, e.sends, m, dkv));
  return dkv;
}

// The gradients of q (B, H, L, D) and of this rank's K and V (2, B, K, L, D), float32, from the rows'
// quantities (the whole output, log-sum-exp, D and dout).
std::pair<at::Tensor, at::Tensor> backward_over_group(const Rows& all, const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v, const at::Tensor& gathered,
                                                      const ContextParallel& cp, const Rule& rule) {
  dist::ProcessGroup group = group_of(cp);
  const int64_t p = cp.size(), r = cp.rank(), c = q.size(2) / 2;
  auto rows_of = [&](int64_t i) {
    return Rows{all.dout.narrow(2, i * c, c), all.out.narrow(2, i * c, c), all.lse.narrow(2, i * c, c),
                all.d.narrow(2, i * c, c)};
  };
  const std::array<Rows, 2> rows = {rows_of(0), rows_of(1)};
  const auto qs = halves(q);
  const at::Tensor dq_all = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
  std::array<at::Tensor, 2> dq = halves(dq_all);
  if (exchanged(cp, c, rule)) return {dq_all, backward_exchanged(rows, qs, pack(k, v), gathered, cp, rule, dq)};
  if (cp.how == SequenceSplit::kAllGather) {
    const at::Tensor dkv = at::zeros(gathered.sizes(), gathered.options().dtype(at::kFloat));
    for (int64_t owner = 0; owner < p; ++owner)
      attend_owner_backward(rows, qs, gathered[owner], dkv[owner], owner, cp, rule, dq);
    at::Tensor mine = at::empty({dkv.numel() / p}, dkv.options());
    group.reduce_scatter(mine, dkv.reshape({-1}), dist::ReduceOp::kSum, "context-parallel K/V gradients").wait();
    return {dq_all, mine.view(dkv.sizes().slice(1))};
  }
  // The gradients of the K/V a rank uses travel on with them, each rank adding its share; after P
  // steps they are home. A step's share is computed while the previous step's sum is in flight.
  at::Tensor kv = pack(k, v), in_flight;
  dist::Work kv_arriving, sum_arriving;
  for (int64_t step = 0; step < p; ++step) {
    at::Tensor next;
    if (step + 1 < p) {
      next = at::empty_like(kv);
      kv_arriving = group.shift(next, kv, 1, "context-parallel ring of K/V");
    }
    const at::Tensor share = at::zeros(kv.sizes(), kv.options().dtype(at::kFloat));
    attend_owner_backward(rows, qs, kv, share, (r - step + p) % p, cp, rule, dq);
    sum_arriving.wait();  // the other ranks' shares for the same K/V, so far
    if (in_flight.defined()) share.add_(in_flight);
    in_flight = at::empty_like(share);
    sum_arriving = group.shift(in_flight, share, 1, "context-parallel ring of K/V gradients");
    kv_arriving.wait();
    if (next.defined()) kv = next;
  }
  sum_arriving.wait();
  return {dq_all, in_flight};
}

std::pair<at::Tensor, at::Tensor> backward_whole(const Rows& all, const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const Rule& rule) {
  const at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
  const at::Tensor dkv = at::zeros(prepend(2, k.sizes()), k.options().dtype(at::kFloat));
  block_backward(all, q, k, v, whole_block(q.size(2), rule), rule, dq, dkv[0], dkv[1]);
  return {dq, dkv};
}

// --- the autograd function ---------------------------------------------------------------------------

// Over a cp group (cp given) or on one device (cp null).
struct BlockwiseAttention : torch::autograd::Function<BlockwiseAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& maybe_sinks, const std::optional<at::Tensor>& segments,
                            const ContextParallel* cp, double scale, double softcap, int64_t window,
                            const std::vector<int64_t>* first_keys) {
    const at::Tensor sinks = maybe_sinks.value_or(at::Tensor());  // an undefined tensor is no autograd input
    const Rule rule{scale, softcap, window, segments.value_or(at::Tensor()), *first_keys};
    Forward f = cp ? forward_over_group(q, k, v, *cp, rule) : forward_whole(q, k, v, rule);
    if (sinks.defined()) add_sinks(f.out, f.lse, sinks);
    const at::Tensor out = f.out.to(q.scalar_type());
    ctx->save_for_backward({q, k, v, out, f.lse, f.gathered, sinks, rule.segments});
    ctx->saved_data["cp"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(cp));
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["window"] = window;
    ctx->saved_data["first_keys"] = *first_keys;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* cp = reinterpret_cast<const ContextParallel*>(static_cast<intptr_t>(ctx->saved_data["cp"].toInt()));
    const auto saved = ctx->get_saved_variables();
    const Rule rule{ctx->saved_data["scale"].toDouble(), ctx->saved_data["softcap"].toDouble(),
                    ctx->saved_data["window"].toInt(), saved[7], ctx->saved_data["first_keys"].toIntVector()};
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const at::Tensor &gathered = saved[5], &sinks = saved[6];
    const at::Tensor dout = grads[0].to(q.scalar_type()).contiguous();
    const at::Tensor d = (dout.to(at::kFloat) * out.to(at::kFloat)).sum(-1);  // (B, H, L)
    const Rows rows{dout, out, lse, d};
    auto [dq, dkv] = cp ? backward_over_group(rows, q, k, v, gathered, *cp, rule) : backward_whole(rows, q, k, v, rule);
    return {dq.to(q.scalar_type()),
            dkv[0].to(k.scalar_type()),
            dkv[1].to(v.scalar_type()),
            sinks.defined() ? sinks_gradient(sinks, lse, d) : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

std::optional<at::Tensor> sinks_input(const at::Tensor& sinks, const at::Tensor& q) {
  FSDP_ASSERT(!sinks.defined() || sinks.numel() == q.size(1), "blockwise attention: ", sinks.numel(), " sinks for ",
              q.size(1), " query heads");
  return sinks.defined() ? std::optional<at::Tensor>(sinks) : std::nullopt;
}

double scale_of(const ScoreRule& rule, const at::Tensor& q) {
  return rule.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
}

// --- Ulysses ----------------------------------------------------------------------------------------

// (B, L, N, D) tokens-local -> (B, P*L, N/P, D) heads-local.
at::Tensor to_heads(const at::Tensor& x, const ContextParallel& cp) {
  const int64_t p = cp.size(), b = x.size(0), l = x.size(1), n = x.size(2), d = x.size(3);
  FSDP_CHECK(n % p == 0, "[sp] ", n, " heads do not divide over sp_size ", p);
  const at::Tensor in = x.reshape({b, l, p, n / p, d}).permute({2, 0, 1, 3, 4}).contiguous();  // by destination
  const at::Tensor out = at::empty_like(in);
  group_of(cp).all_to_all(out, in, "Ulysses all-to-all to heads").wait();
  return out.permute({1, 0, 2, 3, 4}).reshape({b, p * l, n / p, d});  // (B, P, L, ...): rank q's tokens q-th
}

// (B, T, N/P, D) heads-local -> (B, T/P, N, D) tokens-local.
at::Tensor to_tokens(const at::Tensor& x, const ContextParallel& cp) {
  const int64_t p = cp.size(), b = x.size(0), t = x.size(1), n = x.size(2), d = x.size(3);
  const at::Tensor in = x.reshape({b, p, t / p, n, d}).permute({1, 0, 2, 3, 4}).contiguous();  // by destination
  const at::Tensor out = at::empty_like(in);
  group_of(cp).all_to_all(out, in, "Ulysses all-to-all to tokens").wait();
  return out.permute({1, 2, 0, 3, 4}).reshape({b, t / p, p * n, d});  // rank q's heads q-th
}

// Ulysses' swap as autograd sees it: each direction's gradient is the other direction.
struct UlyssesSwap : torch::autograd::Function<UlyssesSwap> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const ContextParallel* cp, bool heads) {
    ctx->saved_data["cp"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(cp));
    ctx->saved_data["heads"] = heads;
    return heads ? to_heads(x, *cp) : to_tokens(x, *cp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const ContextParallel& cp = saved_cp(ctx);
    return {ctx->saved_data["heads"].toBool() ? to_tokens(grads[0], cp) : to_heads(grads[0], cp), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

const char* sequence_split_name(SequenceSplit how) {
  switch (how) {
    case SequenceSplit::kAllGather:
      return "allgather";
    case SequenceSplit::kRing:
      return "alltoall";
    case SequenceSplit::kUlysses:
      return "ulysses";
  }
  return "?";
}

SequenceSplit sequence_split_named(const std::string& name) {
  if (name == "ulysses") return SequenceSplit::kUlysses;
  return name == "alltoall" ? SequenceSplit::kRing : SequenceSplit::kAllGather;
}

int64_t sequence_multiple(const ContextParallel& cp) {
  return cp.ulysses() ? cp.size() : 2 * cp.size();
}

at::Tensor sequence_positions(int64_t seq_len, const ContextParallel& cp, const c10::Device& device) {
  const int64_t m = sequence_multiple(cp);
  FSDP_CHECK(seq_len % m == 0, "[cp] a sequence of ", seq_len, " tokens cannot be split into ", m,
             cp.ulysses() ? " blocks (one per sp rank)" : " chunks (two per cp rank)",
             "; train.sequence_length must be a multiple of ", m);
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  if (cp.ulysses()) {
    const int64_t l = seq_len / m;
    return at::arange(cp.rank() * l, (cp.rank() + 1) * l, opts);
  }
  const int64_t c = seq_len / m;
  const auto [a, b] = chunks_of(cp.rank(), cp.size());
  return at::cat({at::arange(a * c, (a + 1) * c, opts), at::arange(b * c, (b + 1) * c, opts)});
}

at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextParallel& cp,
                             const ScoreRule& rule, const at::Tensor& sinks) {
  FSDP_ASSERT(!cp.ulysses(), "context_attention under Ulysses");
  FSDP_ASSERT(q.size(2) % 2 == 0, "context_attention: ", q.size(2), " tokens are not two chunks");
  const std::vector<int64_t> unbounded;
  return BlockwiseAttention::apply(q, k, v, sinks_input(sinks, q), std::nullopt, &cp, scale_of(rule, q), rule.softcap,
                                   rule.window, &unbounded);
}

at::Tensor blockwise_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ScoreRule& rule,
                               const at::Tensor& sinks, const at::Tensor& segments,
                               const std::vector<int64_t>& first_keys) {
  FSDP_ASSERT(!segments.defined() || (segments.size(0) == q.size(0) && segments.size(1) == q.size(2)),
              "blockwise attention: segments of ", segments.sizes(), " for ", q.size(0), " rows of ", q.size(2),
              " tokens");
  FSDP_ASSERT(first_keys.empty() || (segments.defined() && static_cast<int64_t>(first_keys.size()) == q.size(2)),
              "blockwise attention: ", first_keys.size(), " record starts for ", q.size(2), " tokens");
  return BlockwiseAttention::apply(q, k, v, sinks_input(sinks, q),
                                   segments.defined() ? std::optional<at::Tensor>(segments) : std::nullopt, nullptr,
                                   scale_of(rule, q), rule.softcap, rule.window, &first_keys);
}

at::Tensor ulysses_to_heads(const at::Tensor& x, const ContextParallel& cp) {
  return UlyssesSwap::apply(x, &cp, true);
}

at::Tensor ulysses_to_tokens(const at::Tensor& x, const ContextParallel& cp) {
  return UlyssesSwap::apply(x, &cp, false);
}

bool exchanges_window(const ContextParallel& cp, int64_t seq_len, int64_t window) {
  return exchanges(cp.how, cp.size(), seq_len / (2 * cp.size()), window);
}

int64_t chunks_received(const ContextParallel& cp, int64_t seq_len, int64_t window) {
  const int64_t p = cp.size(), c = seq_len / (2 * p);
  if (!exchanges_window(cp, seq_len, window)) return 2 * (p - 1);
  return cp.group ? static_cast<int64_t>(exchange_of(cp.rank(), p, c, window).receives.size())
                  : busiest_receiver(p, c, window);
}

int64_t keys_received(const ContextParallel& cp, int64_t seq_len, int64_t window) {
  const int64_t p = cp.size(), c = seq_len / (2 * p);
  if (!exchanges_window(cp, seq_len, window)) return 2 * (p - 1) * c;
  if (cp.group) return exchange_of(cp.rank(), p, c, window).keys_received();
  int64_t most = 0;
  for (int64_t r = 0; r < p; ++r) most = std::max(most, exchange_of(r, p, c, window).keys_received());
  return most;
}

int64_t sequence_split_bytes(const ContextParallel& cp, int64_t batch, int64_t seq_len, int64_t heads, int64_t kv_heads,
                             int64_t head_dim, int64_t elem, int64_t window) {
  const int64_t p = cp.size();
  if (p == 1) return 0;
  const int64_t l = seq_len / p;
  const int64_t kv = 2 * batch * kv_heads * l * head_dim;  // one rank's K and V, elements
  if (exchanges_window(cp, seq_len, window)) {
    // The tails of K/V halves out (twice for the ring), their float32 gradients home
    const int64_t per_key = kv / l, ring = cp.how == SequenceSplit::kRing ? 2 : 1;
    auto bytes_of = [&](int64_t rank) {
      const Exchange e = exchange_of(rank, p, l / 2, window);
      return ring * e.keys_sent() * per_key * elem + e.keys_received() * per_key * 4;
    };
    if (cp.group) return bytes_of(cp.rank());
    int64_t most = 0;
    for (int64_t r = 0; r < p; ++r) most = std::max(most, bytes_of(r));
    return most;
  }
  switch (cp.how) {
    case SequenceSplit::kAllGather:  // gather (elem) forward, reduce-scatter (float32) backward
      return (p - 1) * kv * elem + (p - 1) * kv * 4;
    case SequenceSplit::kRing:  // P-1 steps of K/V each way, P of their float32 gradients
      return 2 * (p - 1) * kv * elem + p * kv * 4;
    case SequenceSplit::kUlysses: {  // q, k, v and the output each way, forward and backward
      const int64_t qo = batch * l * heads * head_dim, kvs = batch * l * kv_heads * head_dim;
      return 2 * (2 * qo + 2 * kvs) * elem * (p - 1) / p;
    }
  }
  return 0;
}

int64_t ulysses_linear_attention_bytes(const ContextParallel& cp, int64_t batch, int64_t seq_len, int64_t key_heads,
                                       int64_t value_heads, int64_t key_head_dim, int64_t value_head_dim,
                                       int64_t elem) {
  const int64_t p = cp.size();
  if (p == 1) return 0;
  const int64_t tokens = batch * seq_len / p;  // a rank's, before the swap
  // An all-to-all of n elements sends all but the rank's own 1/P.
  auto swap = [&](int64_t per_token) { return tokens * per_token / p * (p - 1) * elem; };
  const int64_t one_way = swap(key_heads * 2 * key_head_dim) + swap(value_heads * (value_head_dim + 2)) +
                          swap(value_heads * value_head_dim);
  return 2 * one_way;  // the gradients come back the same way
}

}  // namespace fsdp::model

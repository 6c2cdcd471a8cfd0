// ParamGroup: one FSDP unit (FSDP2's FSDPParamGroup): the parameters of one wrapped module, sharded
// over the shard group, gathered with one flat all-gather and reduced with one flat reduce-scatter.
//
// Ownership. The module's registered parameters stay the tensors its forward reads; fully_shard
// turns each into the *unsharded* leaf (param_dtype or kept fp32, full shape), a view of one storage this group
// owns for all of them, end to end in params() order (padding only to align a kept one): 0 bytes while resharded,
// regrown and refilled in place by unshard(). The storage object is never replaced (autograd's saved
// tensors alias it), and refills go through a second tensor over the same storage, so no
// parameter's version counter is bumped. Parameters registered one after another in the same
// class below (q, k and v; gate and up) are therefore adjacent rows of one block. The group owns the sharded fp32
// master weights of the trainable parameters (one flat buffer), their fp32 gradients and, through
// ShardedAdamW, the optimizer state; frozen parameters (LoRA's base) are kept in param_dtype alone
// (or in fp32 alone when kept so, below), with no fp32 copy, no gradient and no optimizer state.
//
// Flat layout of a unit's shard (S elements, the same on every rank):
//   [ trainable, decayed (dim >= 2) | trainable, not decayed | frozen kept in fp32 | frozen ]
//   param i occupies [offset_i, offset_i + width_i x shard_numel_i), shaped (chunk_rows_i, *shape_i[1:]);
//   the trainable prefix lives in the fp32 flat shard, the kept ones in an fp32 one, the rest in a param_dtype one.
// A frozen parameter FsdpOptions::keep_in_fp32 names, under a 16-bit param_dtype, is held in an fp32
// shard of its own and travels as its fp32 bits, two param_dtype elements a value (width 2): its
// unsharded leaf is an fp32 view of the group's storage. Its values start at an even offset in the
// flat layout and in that storage (an fp32 view needs one), so one element of padding may precede
// the first of them.
// The all-gather output is (W, S) rank-major; the reduce-scatter input is (W, S_trainable).
// Float8 all-gather (fsdp/float8_gather.h; S8 > 0 of the S elements are weights gathered in
// float8): the gather moves bytes, (W, B) with a rank's B = [the other parameters' S - S8 elements
// in param_dtype | the float8 weights' S8 in float8_e4m3fn | zeros to a multiple of 16 bytes], each
// part in the flat layout's order; the float8 weights' unsharded leaves hold no bytes, and their
// gathered bits live in a buffer of their own.
//
// Streams and buffers on CUDA (as FSDP2 orders them, with the process group's own stream instead of
// FSDP2's separate all-gather and reduce-scatter streams):
//   - unshard(): the gather's output (W * S, param_dtype) is allocated and this rank's slot is
//     filled (the cast) on the *current* stream; the all-gather runs on the NCCL group's stream,
//     which first waits for the current stream, so a prefetch issued before a unit computes
//     overlaps that computation. Under offload the slot is filled by the host-to-device copy on
//     the upload stream (fsdp/host_transfer.h), the all-gather issued from there; with one rank,
//     the upload fills the parameters' storage itself. With offload_keep_on_device the upload's
//     result stays on the device until the unit's next update (see on_device_), and a gather
//     before then uploads nothing.
//   - wait_for_unshard(): Work::wait makes the current stream wait for the gather (no host wait);
//     the copy-out into the parameters' storage runs on the current stream after it.
//   - post_backward(): the reduce-scatter's input is built on the current stream (in backward: the
//     autograd engine's device thread, whose current stream is the one forward ran on); the
//     reduce-scatter runs on the group's stream after it.
//   - finish_reduce(): Work::wait orders the current stream after the reduce-scatter; the fp32
//     accumulation into the sharded gradient runs there (under offload, the copy down to the host
//     gradient runs on the download stream).
// A buffer is kept alive by PendingGather/PendingReduce until its Work::wait, and by the process
// group itself (c10d's stash, TORCH_NCCL_AVOID_RECORD_STREAMS) until then too. Once wait() has
// ordered the current stream after the collective, dropping the buffer is safe without
// recordStream: the caching allocator hands its block to later work of the current stream only,
// which runs after the collective. So no buffer outlives its wait, and memory does not grow with
// how far the host runs ahead of the device.
//
// Collective: unshard, post_backward, finish_reduce and gather_full_parameters issue collectives on
// the shard (and replicate) group, the gathers of whole values and sum_whole_gradients_over_tp on the
// tp group; all ranks call them in the same order (the engine guarantees it
// because every rank runs the same model). Not thread-safe: one thread at a time, the training
// thread in forward and, on CUDA, the autograd engine's device thread in backward (the engine's
// hooks; the training thread waits in backward() meanwhile).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "fsdp/device_mesh.h"
#include "fsdp/options.h"
#include "fsdp/shard_layout.h"

namespace fsdp {

struct ShardedParam {
  std::string name;                  // fully qualified, e.g. "blocks.0.fc1.weight"
  std::vector<std::string> aliases;  // other names of a tied parameter
  ShardLayout layout;                // of this rank's registered tensor (its tensor-parallel block, under tp)
  TpSlice tp;                        // where that tensor sits in the whole parameter
  bool trainable = true;
  bool decay = true;     // AdamW weight decay applies (dim >= 2)
  int width = 1;         // param_dtype elements a value takes in the flat layout and the gathers: 2 when kept in fp32
  int64_t offset = 0;    // in the unit's flat shard
  at::Tensor unsharded;  // the module's parameter: (shape), param_dtype (kept: fp32), a view of the unit's storage
  int64_t unsharded_offset = 0;  // where it starts in that storage (elements)
  at::Tensor
      sharded;  // (chunk_rows, *shape[1:]) view of the flat shard: fp32, param_dtype when frozen (unless kept in fp32)
  at::Tensor accumulated;        // (shape) fp32, no-sync accumulation; undefined when unused
  // Gathered in float8 (fsdp/float8_gather.h): `unsharded` then holds no bytes, and
  // unsharded_offset is where the gathered bits start in the group's float8 buffer.
  bool float8 = false;
  int64_t gather_offset = 0;  // under float8 all-gather: where its shard starts in its part of the slot

  // The whole parameter's shape (what checkpoints and exports hold).
  std::vector<int64_t> full_shape() const { return tp.full_shape(layout.shape); }
};

// kPartial: between forward and backward under partial resharding, this rank holds its
// post-forward group's share of the unit (the gathered rows it will contribute in backward).
enum class GroupState { kSharded, kGathering, kUnsharded, kPartial };

// Releases a tensor's bytes but keeps its StorageImpl and shape (0-byte storage). The unsharded
// parameters live this way between uses; a model builder may do it to a layer it just created.
void free_storage(const at::Tensor& t);

// The sum of the squares of every element of `ts` (all on one device), unrounded: a () fp32 tensor on
// a device (one _foreach_norm over the tensors, reduced in a tree, squared and summed, as
// torch.nn.utils.clip_grad_norm_ does); on the host a () float64 one, each tensor's part added in
// turn (so parts taken one tensor at a time and added in the same order give the same bits).
at::Tensor sum_of_squares(const std::vector<at::Tensor>& ts);

// The whole parameter from every tp rank's block of it (`block` this rank's, on the host or the
// device), the padding past TpSlice::whole cut off. Collective over `tp`.
at::Tensor whole_from_blocks(dist::ProcessGroup& tp, const at::Tensor& block, const TpSlice& slice,
                             const std::string& label);

class ParamGroup {
 public:
  using EventLog = std::function<void(const std::string&)>;

  // Shards `params` (the module's registered tensors, full values, identical on every rank of the
  // replicate group) and turns them into unsharded leaves with empty storage. name: the module's
  // path ("" for the root).
  ParamGroup(std::string name, std::vector<std::pair<std::string, at::Tensor>> params,
             std::vector<std::vector<std::string>> aliases, std::shared_ptr<DeviceMesh> mesh,
             const FsdpOptions& options, EventLog log);
  ~ParamGroup();
  ParamGroup(const ParamGroup&) = delete;
  ParamGroup& operator=(const ParamGroup&) = delete;

  const std::string& name() const { return name_; }
  const DeviceMesh& mesh() const { return *mesh_; }  // what it shards over (an experts' mesh for expert units)
  std::string display_name() const { return name_.empty() ? "<root>" : name_; }
  GroupState state() const { return state_; }
  // The parameters (their sharded views included), any deferred update applied first.
  // Whoever gets them may write the shards: the device's copy (on_device_) is dropped.
  const std::vector<ShardedParam>& params() const {
    apply_deferred_update();
    on_device_ = float8_amax_current_ = false;
    return params_;
  }
  bool empty() const { return params_.empty(); }
  bool has_trainable() const { return trainable_numel_ > 0; }

  // Issues the all-gather (asynchronously where the backend allows): over the shard group, or over
  // the post-forward group when kPartial. No-op unless sharded or partial.
  void unshard();
  // Finishes a pending gather: waits, regrows the parameters' storage and copies the gathered
  // rows in. Idempotent; calls unshard() first when nothing is pending.
  void wait_for_unshard();
  // Frees the unsharded storage (0 bytes) and any post-forward share. No-op when sharded.
  void reshard();
  // After a forward that backward will follow: reshard(), or with a post-forward group (mesh), keep
  // this rank's share of the gathered unit for that group ((W/N) x S elements, 1/N of the unit)
  // and free the rest (kPartial), so backward's gather runs over the N ranks only.
  void reshard_after_forward();

  // After this unit's backward: takes the parameters' gradients and, when `sync`, issues the
  // reduce-scatter (average over the shard group) of all of them, accumulated micro-batches
  // included; otherwise adds them into fp32 accumulators. Frozen parameters are never reduced.
  void post_backward(bool sync);
  // Waits for the reduce-scatter issued by post_backward, all-reduces over the replicate group
  // (HSDP) and adds the result into the fp32 sharded gradient. No-op when nothing is pending.
  void finish_reduce();
  bool reduce_pending() const { return pending_reduce_.has_value(); }

  // Flat fp32 views for the optimizer: [0, trainable) and the part of it that decays.
  at::Tensor flat_param() const {  // (S_trainable), any deferred update applied; writable (as params())
    apply_deferred_update();
    on_device_ = float8_amax_current_ = false;
    return flat_shard_;
  }
  at::Tensor flat_grad() const;                                 // (S_trainable), zeros written if pending
  // Offloaded: sum_of_squares of this rank's sharded gradient, taken where the gradient was reduced
  // (on a GPU: before it went down, so the norm needs no pass over host memory) when this step's one
  // reduction is all it holds; undefined otherwise, and once flat_grad() has been read (its reader
  // may change it).
  at::Tensor grad_squares() const { return grad_squares_; }
  int64_t trainable_numel() const { return trainable_numel_; }  // S_trainable
  int64_t decay_numel() const { return decay_numel_; }          // S_decay <= S_trainable
  int64_t shard_numel() const { return shard_numel_; }          // S
  int64_t float8_numel() const { return float8_numel_; }        // S8: gathered in float8 (fsdp/float8_gather.h)
  void zero_grad();

  // Offload (ShardedAdamW): this unit's optimizer update, held until the unit is next needed (its
  // gather, its gradients' reduction, any read of its shards, gradient or params()) instead of
  // applied at the step, so that on a GPU the host computes unit k+1's update while unit k's shards
  // go up and unit k computes. At most one is held: `update` must not read this group through its
  // accessors (it would apply itself), and a second one applies the first before it is held.
  void defer_update(std::function<void()> update);
  // Applies the held update, if any ("update X" in the event log); then nothing is held.
  void apply_deferred_update() const;
  bool update_deferred() const { return static_cast<bool>(deferred_update_); }

  // The full fp32 value of every parameter, or of every trainable parameter's sharded gradient
  // (collective over the shard group).
  std::vector<std::pair<std::string, at::Tensor>> gather_full_parameters() const;
  std::vector<std::pair<std::string, at::Tensor>> gather_full_gradients() const;
  // The full fp32 value of params()[i] alone (collective over the shard group): what exports use,
  // so no rank holds more than one full tensor.
  at::Tensor gather_full_parameter(size_t i) const;
  // Float8 all-gather: whether the float8 weights' scales are those of the current shards (true
  // without float8 weights); this rank's largest magnitudes of them ((k) fp32, the values rounded to
  // param_dtype as the gathered weights hold them); the whole weights' (the max over the shard
  // group), which the next gathers use until the shards change. ShardedModel takes every unit's in
  // one all-reduce at the step's first forward, before any gather.
  bool float8_scales_current() const { return float8_numel_ == 0 || float8_amax_current_; }
  at::Tensor float8_local_amaxes() const;
  void set_float8_amaxes(at::Tensor amax);
  // Tensor parallel: sums over the tp group the sharded gradients of the parameters every tp rank
  // holds whole (each rank's is its part). Collective over the tp group; no-op without one.
  void sum_whole_gradients_over_tp();

  // Persistent bytes this rank holds: sharded params (fp32, frozen ones in param_dtype unless kept in
  // fp32), their gradients (fp32), padding included.
  int64_t param_bytes() const;
  int64_t grad_bytes() const;

 private:
  void log(const char* what) const;
  int64_t lay_out_unsharded();                           // each parameter's unsharded_offset; the storage's elements
  void copy_out(const at::Tensor& gathered);             // (W * S) param_dtype -> every param's unsharded rows
  void copy_shards_into(const at::Tensor& dst) const;    // the flat shards -> (S) param_dtype, cast
  void finish_upload();                                  // the current stream waits for upload_
  bool keeps_on_device() const;                          // offloaded with offload_keep_on_device
  at::Tensor unsharded_of(const ShardedParam& p) const;  // (width x numel) of unsharded_ that p views
  std::vector<std::pair<std::string, at::Tensor>> gather_full(const at::Tensor& flat, bool trainable_only) const;
  at::Tensor initial_value(const ShardedParam& p) const;
  // The whole parameter from every tp rank's block (collective over the tp group); `block` itself
  // when the parameter is not split.
  at::Tensor whole(const ShardedParam& p, const at::Tensor& block) const;
  at::Tensor shard_of(const ShardedParam& p) const;  // (shard_numel) in flat_shard_, kept_shard_ or frozen_shard_
  // (width x shard_numel): what p's shard puts in a gather's slot, in param_dtype once cast (kept in
  // fp32: its bits, unrounded).
  at::Tensor travelling(const ShardedParam& p) const;
  // Float8 all-gather: a rank's slot in bytes (B) and the part of it in param_dtype; the slot filled
  // (the other parameters cast, the float8 weights scaled with the step's scales and cast); the
  // gathered (W, B) bytes into the parameters and float8_gathered_.
  int64_t slot_bytes() const;
  int64_t others_bytes() const;
  void fill_float8_slot(const at::Tensor& slot);
  void copy_out_float8(const at::Tensor& gathered);
  void drop_float8();  // the gathered bits go (resharded)

  std::string name_;
  std::shared_ptr<DeviceMesh> mesh_;
  FsdpOptions options_;
  EventLog log_;
  std::vector<ShardedParam> params_;
  int64_t shard_numel_ = 0, trainable_numel_ = 0, decay_numel_ = 0, float8_numel_ = 0;
  at::Tensor flat_shard_;    // (S_trainable) fp32 master weights on the shard device
  // The frozen parameters kept in fp32: their values (fp32), and where their elements start and how
  // many there are in the flat layout (two per value; kept_begin_ is S_trainable, or one past it).
  at::Tensor kept_shard_;
  int64_t kept_begin_ = 0, kept_words_ = 0;
  at::Tensor frozen_shard_;  // (S - kept_begin_ - kept_words_) param_dtype: the other frozen parameters
  at::Tensor flat_grad_;     // (S_trainable) fp32 on the shard device
  bool grad_zero_ = true;    // flat_grad_ holds zeros (since zero_grad): a reduction is copied in, not added
  // zero_grad's zeros not written yet: the first reduction writes every element, so they are written
  // only when flat_grad_ is read before one (a unit that got no reduction this step).
  mutable bool zeros_pending_ = false;
  at::Tensor unsharded_;     // (sum of width x numel, + alignment) param_dtype on the device: every full value
  at::Tensor post_forward_;  // kPartial: ((W/N) * S) param_dtype (float8: bytes), rows j*W/N.. of the gathered
  // Float8 all-gather: the float8 weights' gathered bits, end to end (bytes; their numel summed),
  // while gathered; each weight's inverse scale from the last cast; the amaxes of the current
  // shards, and whether they are (cleared wherever on_device_ is: the shards may change).
  at::Tensor float8_gathered_;
  int64_t float8_gathered_numel_ = 0;
  std::vector<at::Tensor> float8_inverse_;
  at::Tensor float8_amax_;
  mutable bool float8_amax_current_ = false;
  GroupState state_ = GroupState::kSharded;
  struct PendingGather {
    dist::Work work;
    at::Tensor output;  // (W * S) param_dtype
    at::Tensor input;   // the post-forward share it gathers from, kept alive until the work is done
  };
  std::optional<PendingGather> pending_gather_;
  std::optional<uint64_t> upload_;  // offloaded: the HostTransfer ticket of the shards' upload in flight
  // keeps_on_device(): this rank's shards as last uploaded, in param_dtype on the device ((S), the
  // gather's input; with one rank the parameters' storage itself is kept, allocated, instead), and
  // whether they still equal the host shards: set by an upload; cleared by an update and by every
  // accessor that hands the shards out (params(), flat_param()), since their taker may write them.
  at::Tensor device_shard_;
  mutable bool on_device_ = false;
  mutable std::function<void()> deferred_update_;  // defer_update's, until apply_deferred_update
  mutable at::Tensor grad_squares_;                // grad_squares()
  struct PendingReduce {
    dist::Work work;
    at::Tensor input;   // (W * S_trainable) reduce_dtype; kept alive until the work is done
    at::Tensor output;  // (S_trainable) reduce_dtype
    bool into_grad = false;  // output is flat_grad_ itself: nothing to add when it is done
  };
  std::optional<PendingReduce> pending_reduce_;
};

}  // namespace fsdp

#include "fsdp/param_group.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <cmath>

#include "fsdp/host_transfer.h"
#include "fsdp/set_data.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp {

namespace {

void alloc_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == nbytes) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

// Writes `src` (numel elements, a parameter or its gradient flattened) into a (W, shard_numel)
// region of a rank-major flat buffer: element k lands in row k / shard_numel. What is left (the
// padding past numel) is zeroed, so the buffer can start uninitialised instead of zero-filled whole.
void copy_into_rows(const at::Tensor& region, const at::Tensor& src) {
  const int64_t numel = src.numel(), rows = region.size(0), shard_numel = region.size(1);
  if (shard_numel == 0) return;
  const int64_t full_rows = numel / shard_numel, rest = numel % shard_numel;
  if (full_rows > 0)
    region.narrow(0, 0, full_rows).copy_(src.narrow(0, 0, full_rows * shard_numel).view({full_rows, shard_numel}));
  int64_t first_empty = full_rows;
  if (rest > 0) {
    region[full_rows].narrow(0, 0, rest).copy_(src.narrow(0, full_rows * shard_numel, rest));
    region[full_rows].narrow(0, rest, shard_numel - rest).zero_();
    first_empty = full_rows + 1;
  }
  if (first_empty < rows) region.narrow(0, first_empty, rows - first_empty).zero_();
}

// The inverse: the first dst.numel() elements of a (W, shard_numel) region, read rank-major (the
// padding past them is not copied), into dst.
void copy_from_rows(const at::Tensor& dst, const at::Tensor& region) {
  const int64_t numel = dst.numel(), shard_numel = region.size(1);
  if (shard_numel == 0) return;
  const int64_t full_rows = numel / shard_numel, rest = numel % shard_numel;
  if (full_rows > 0)
    dst.narrow(0, 0, full_rows * shard_numel).view({full_rows, shard_numel}).copy_(region.narrow(0, 0, full_rows));
  if (rest > 0) dst.narrow(0, full_rows * shard_numel, rest).copy_(region[full_rows].narrow(0, 0, rest));
}

}  // namespace

// Unsharded storage is freed and regrown in place: the StorageImpl stays the one autograd's saved
// tensors point at; only its bytes come and go (FSDP2's untyped_storage().resize_()).
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == 0) return;
  s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
}

ParamGroup::ParamGroup(std::string name, std::vector<std::pair<std::string, at::Tensor>> params,
                       std::vector<std::vector<std::string>> aliases, std::shared_ptr<DeviceMesh> mesh,
                       const FsdpOptions& options, EventLog log)
    : name_(std::move(name)), mesh_(std::move(mesh)), options_(options), log_(std::move(log)) {
  c10::NoGradGuard no_grad;
  const int world = mesh_->shard.size(), rank = mesh_->shard.rank();
  const c10::Device shard_device = options_.offload_params ? c10::Device(c10::kCPU) : options_.device;
  const at::ScalarType param_dtype = options_.mixed_precision.param_dtype;

  // Float8 all-gather needs a collective (W > 1), whole weights (no tensor parallel, not an expert
  // unit's blocks) and shards on the device (no offload).
  const bool float8 = options_.float8_gather.enabled() && world > 1 && !options_.offload_params &&
                      !mesh_->expert_blocks && !(mesh_->tp && mesh_->tp->size() > 1);
  auto gathers_float8 = [&](size_t i) {
    const at::Tensor& t = params[i].second;
    return float8 && t.requires_grad() && t.dim() == 2 && options_.float8_gather.gathers(params[i].first);
  };
  // Frozen parameters kept in fp32 travel as their bits: two elements of a 16-bit param_dtype a value.
  const bool narrow_dtype = c10::elementSize(param_dtype) == 2;
  auto kept = [&](size_t i) {
    return narrow_dtype && options_.keep_in_fp32 && !params[i].second.requires_grad() &&
           options_.keep_in_fp32(params[i].first);
  };
  // Trainable decayed first, then trainable undecayed, then frozen (those kept in fp32 first): the
  // optimizer and the reduce-scatter each see one contiguous prefix.
  std::vector<size_t> order(params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto rank_of = [&](size_t i) {
    const at::Tensor& t = params[i].second;
    if (!t.requires_grad()) return kept(i) ? 2 : 3;
    return t.dim() >= 2 ? 0 : 1;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rank_of(a) < rank_of(b); });

  for (size_t i : order) {
    const auto& [pname, tensor] = params[i];
    FSDP_CHECK(at::isFloatingType(tensor.scalar_type()), "[fsdp] parameter ", pname, " has dtype ",
               tensor.scalar_type(), "; only floating-point parameters can be sharded");
    ShardedParam p;
    p.name = pname;
    p.aliases = aliases[i];
    p.layout = ShardLayout{tensor.sizes().vec(), world, rank};
    if (mesh_->expert_blocks) {  // this ep rank's experts: rows [rank x E/ep, (rank + 1) x E/ep) of the whole
      p.tp = TpSlice{0, mesh_->ep->rank(), mesh_->ep->size(), 0};
    } else if (mesh_->tp && options_.tensor_parallel) {
      p.tp = options_.tensor_parallel(pname);
      p.tp.index = mesh_->tp->rank();
      p.tp.parts = mesh_->tp->size();
      FSDP_CHECK(p.tp.dim < tensor.dim(), "[fsdp] parameter ", pname, " of ", tensor.dim(),
                 " dimensions cannot be split for tensor parallel along dimension ", p.tp.dim);
    }
    p.trainable = tensor.requires_grad();
    p.decay = p.trainable && tensor.dim() >= 2;
    p.float8 = gathers_float8(i);
    p.width = kept(i) ? 2 : 1;
    if (p.width == 2 && kept_words_ == 0) {  // the first kept in fp32: at an even offset
      shard_numel_ += shard_numel_ % 2;
      kept_begin_ = shard_numel_;
    }
    p.offset = shard_numel_;
    p.gather_offset = p.float8 ? float8_numel_ : shard_numel_ - float8_numel_;
    shard_numel_ += p.width * p.layout.shard_numel();
    if (p.width == 2) kept_words_ += 2 * p.layout.shard_numel();
    if (p.float8) float8_numel_ += p.layout.shard_numel();
    if (p.trainable) trainable_numel_ += p.layout.shard_numel();
    if (p.decay) decay_numel_ += p.layout.shard_numel();
    p.unsharded = tensor;
    params_.push_back(std::move(p));
  }

  at::TensorOptions shard_opts = at::TensorOptions().dtype(at::kFloat).device(shard_device);
  if (options_.offload_params && options_.device.is_cuda()) shard_opts = shard_opts.pinned_memory(true);
  flat_shard_ = at::zeros({trainable_numel_}, shard_opts);
  flat_grad_ = at::zeros({trainable_numel_}, shard_opts);
  if (kept_words_ == 0) kept_begin_ = trainable_numel_;
  kept_shard_ = at::zeros({kept_words_ / 2}, shard_opts);
  frozen_shard_ = at::zeros({shard_numel_ - kept_begin_ - kept_words_}, shard_opts.dtype(param_dtype));

  // Every registered parameter becomes an unsharded leaf over one storage this group owns (see
  // lay_out_unsharded). `unsharded_` writes that storage without sharing any parameter's version counter.
  unsharded_ = at::empty({lay_out_unsharded()}, at::TensorOptions().dtype(param_dtype).device(options_.device));
  for (ShardedParam& p : params_) {
    const ShardLayout& l = p.layout;
    // This rank's rows of the full value (init_range: made without the rest); the padding rows stay zero.
    const int64_t begin = l.first_row() * l.row_numel(), count = l.valid_rows() * l.row_numel();
    const at::Tensor flat = shard_of(p);
    if (count > 0) {
      const at::Tensor rows =
          options_.init && options_.init_range && !p.tp.split()
              ? options_.init_range(p.name, p.full_shape(), begin, count)
              : (options_.init ? initial_value(p) : p.unsharded.detach()).reshape({-1}).narrow(0, begin, count);
      flat.narrow(0, 0, count).copy_(rows);
    }
    std::vector<int64_t> shard_shape = l.shape;
    if (shard_shape.empty()) shard_shape.push_back(1);
    shard_shape[0] = l.chunk_rows();
    p.sharded = flat.view(shard_shape);
    if (p.float8) {  // a leaf of its own that never holds bytes: the product reads gathered_float8's
      const at::Tensor leaf = at::empty(l.shape, unsharded_.options());
      free_storage(leaf);
      set_data_any_device(p.unsharded, leaf);
    } else {
      const at::Tensor values = p.width == 2 ? unsharded_of(p).view(at::kFloat) : unsharded_of(p);
      set_data_any_device(p.unsharded, values.view(l.shape));
    }
    p.unsharded.mutable_grad() = at::Tensor();
  }
  free_storage(unsharded_);
}

// The parameters laid end to end in params_' order, so parameters registered one after another
// (q, k, v) form one block a forward may use as a single weight
// (model/kernels/stacked_weights.h). A weight gathered in float8 has its place in float8_gathered_
// instead; one kept in fp32 starts at an even offset (with one rank, where every shard is its whole
// parameter, the flat layout's). Returns the storage's elements.
int64_t ParamGroup::lay_out_unsharded() {
  int64_t unsharded_numel = 0;
  for (ShardedParam& p : params_) {
    int64_t& end = p.float8 ? float8_gathered_numel_ : unsharded_numel;
    if (p.width == 2) end += end % 2;
    p.unsharded_offset = end;
    end += p.width * p.layout.numel();
  }
  return unsharded_numel;
}

ParamGroup::~ParamGroup() {
  drop_float8();
}

void ParamGroup::log(const char* what) const {
  if (log_) log_(str(what, " ", display_name()));
}

void ParamGroup::unshard() {
  apply_deferred_update();  // the shards this gather reads: the last step's update
  if (state_ != GroupState::kSharded && state_ != GroupState::kPartial) return;
  RECORD_USER_SCOPE(str("fsdp gather ", display_name()));
  const bool partial = state_ == GroupState::kPartial;
  state_ = GroupState::kGathering;
  if (params_.empty()) return;
  log(partial ? "gather post-forward" : "gather");
  const int world = mesh_->shard.size();
  HostTransfer* transfer = options_.offload_params ? options_.host_transfer.get() : nullptr;
  if (world == 1) {  // a group of one needs no collective: the shards are copied into place
    if (transfer && !on_device_) {  // offloaded: the upload starts now, on its own stream (wait_for_unshard waits)
      c10::NoGradGuard no_grad;
      alloc_storage(unsharded_, static_cast<size_t>(unsharded_.numel()) * unsharded_.element_size());
      upload_ = transfer->upload([this] { copy_shards_into(unsharded_); });
      on_device_ = keeps_on_device();
    }
    return;  // otherwise wait_for_unshard casts them in, or they are there (on_device_)
  }
  c10::NoGradGuard no_grad;
  const bool bytes = float8_numel_ > 0;  // float8 all-gather: a slot of bytes a rank
  const int64_t slot = bytes ? slot_bytes() : shard_numel_;
  at::Tensor out = at::empty(
      {world * slot},
      at::TensorOptions().dtype(bytes ? at::kByte : options_.mixed_precision.param_dtype).device(options_.device));
  if (partial) {  // this rank's share holds W/N ranks' rows; the group's N shares are all W rows, in order
    at::Tensor in = std::move(post_forward_);
    pending_gather_ = PendingGather{
        mesh_->post_forward->all_gather(out, in, "gather " + display_name() + " (post-forward)"), out, in};
    return;
  }
  // In-place gather: this rank's slot of the output is the input (cast, and copied from host memory
  // when offloaded).
  at::Tensor in = out.narrow(0, mesh_->shard.rank() * slot, slot);
  if (!transfer) {
    if (bytes)
      fill_float8_slot(in);
    else
      copy_shards_into(in);
    pending_gather_ = PendingGather{mesh_->shard.all_gather(out, in, "gather " + display_name()), out, at::Tensor()};
    return;
  }
  // Offloaded: the upload and then the all-gather are issued from the upload stream, so the gather
  // waits for the upload and the current stream for neither until wait_for_unshard. Kept on the
  // device: the upload goes to device_shard_, the gather's input, and a gather while it is current
  // uploads nothing.
  const bool keep = keeps_on_device();
  if (keep && !device_shard_.defined()) device_shard_ = at::empty({shard_numel_}, out.options());
  const at::Tensor src = keep ? device_shard_ : in;  // the gather's input, which the upload fills
  const std::string label = "gather " + display_name();
  dist::Work work;
  if (on_device_) {
    work = mesh_->shard.all_gather(out, src, label);
  } else {
    upload_ = transfer->upload([&] {
      copy_shards_into(src);
      work = mesh_->shard.all_gather(out, src, label);
    });
    on_device_ = keep;
  }
  pending_gather_ = PendingGather{std::move(work), out, keep ? src : at::Tensor()};
}

// The flat shards (trainable fp32, frozen param_dtype, kept in fp32 as their bits) into `dst`
// (shard_numel_ elements, param_dtype, on the device), cast on the way: from pinned host memory
// without a host wait when offloaded.
void ParamGroup::copy_shards_into(const at::Tensor& dst) const {
  const bool offloaded = options_.offload_params;
  dst.narrow(0, 0, trainable_numel_).copy_(flat_shard_, /*non_blocking=*/offloaded);
  if (kept_words_ > 0) {
    if (kept_begin_ > trainable_numel_) dst.narrow(0, trainable_numel_, kept_begin_ - trainable_numel_).zero_();
    dst.narrow(0, kept_begin_, kept_words_).copy_(kept_shard_.view(dst.scalar_type()), /*non_blocking=*/offloaded);
  }
  const int64_t frozen = kept_begin_ + kept_words_;
  dst.narrow(0, frozen, shard_numel_ - frozen).copy_(frozen_shard_, /*non_blocking=*/offloaded);
}

void ParamGroup::wait_for_unshard() {
  if (state_ == GroupState::kUnsharded) return;
  RECORD_USER_SCOPE(str("fsdp wait gather ", display_name()));
  if (state_ == GroupState::kSharded || state_ == GroupState::kPartial) unshard();
  c10::NoGradGuard no_grad;
  alloc_storage(unsharded_, static_cast<size_t>(unsharded_.numel()) * unsharded_.element_size());
  if (pending_gather_) {
    pending_gather_->work.wait();
    finish_upload();
    copy_out(pending_gather_->output);
    pending_gather_.reset();
  } else if (upload_) {
    finish_upload();  // one rank, offloaded: the upload filled the storage
  } else if (on_device_) {
    // One rank, offloaded: the storage kept since the shards' last upload holds them.
  } else {
    // One rank: each shard is its whole parameter, unpadded and in the unsharded storage's order
    // (trainable first), so the flat shards are that storage: two casts, where a collective of one
    // would cast into a buffer, copy it to another and copy each parameter out of that.
    FSDP_ASSERT(mesh_->shard.size() == 1 && shard_numel_ == unsharded_.numel(), "[fsdp] ", display_name(),
                ": a gather without a collective on ", mesh_->shard.size(), " ranks");
    copy_shards_into(unsharded_);
  }
  state_ = GroupState::kUnsharded;
}

void ParamGroup::finish_upload() {
  if (!upload_) return;
  options_.host_transfer->wait(*upload_);
  upload_.reset();
}

bool ParamGroup::keeps_on_device() const {
  return options_.offload_params && options_.offload_keep_on_device && options_.host_transfer;
}

void ParamGroup::copy_out(const at::Tensor& gathered) {
  if (float8_numel_ > 0) return copy_out_float8(gathered);
  const int64_t world = mesh_->shard.size();
  const at::Tensor rows = gathered.view({world, shard_numel_});
  for (ShardedParam& p : params_)
    copy_from_rows(unsharded_of(p), rows.narrow(1, p.offset, p.width * p.layout.shard_numel()));
}

int64_t ParamGroup::others_bytes() const {
  return (shard_numel_ - float8_numel_) * c10::elementSize(options_.mixed_precision.param_dtype);
}

int64_t ParamGroup::slot_bytes() const {
  return (others_bytes() + float8_numel_ + 15) / 16 * 16;  // rows of whole 16-byte words
}

void ParamGroup::fill_float8_slot(const at::Tensor& slot) {
  const at::ScalarType dtype = options_.mixed_precision.param_dtype;
  const int64_t others = others_bytes();
  const at::Tensor in_dtype = slot.narrow(0, 0, others).view(dtype);                       // (S - S8)
  const at::Tensor bits = slot.narrow(0, others, float8_numel_).view(at::kFloat8_e4m3fn);  // (S8)
  slot.narrow(0, others + float8_numel_, slot.numel() - others - float8_numel_).zero_();
  // The padding before the values kept in fp32 (float8 weights are trainable: all of them precede it).
  in_dtype.narrow(0, trainable_numel_ - float8_numel_, kept_begin_ - trainable_numel_).zero_();
  // The float8 weights' rows as the gathered weights would hold them, their whole weights' amaxes,
  // then each cast with its own scale; the rest cast as a plain gather's (kept in fp32: their bits).
  std::vector<at::Tensor> rows;
  for (const ShardedParam& p : params_) {
    if (p.float8)
      rows.push_back(shard_of(p).to(dtype).view({p.layout.chunk_rows(), p.layout.row_numel()}));
    else
      in_dtype.narrow(0, p.gather_offset, p.width * p.layout.shard_numel()).copy_(travelling(p));
  }
  // ShardedModel's first forward of the step took them (precompute_float8_scales); backward's gathers
  // and later micro-batches' come after it.
  FSDP_ASSERT(float8_amax_current_, "[fsdp] ", display_name(), ": gathered in float8 before the step's scales");
  float8_inverse_.clear();
  for (const ShardedParam& p : params_) {
    if (!p.float8) continue;
    const at::Tensor& x = rows[float8_inverse_.size()];
    const at::Tensor out = bits.narrow(0, p.gather_offset, x.numel()).view(x.sizes());
    float8_inverse_.push_back(
        options_.float8_gather.cast(out, x, float8_amax_[static_cast<int64_t>(float8_inverse_.size())]));
  }
}

// From the fp32 shards, one launch on a GPU (the padding rows are zeros): rounding to param_dtype
// keeps order and sign, so the largest rounded magnitude is the largest magnitude rounded.
at::Tensor ParamGroup::float8_local_amaxes() const {
  std::vector<at::Tensor> shards;
  for (const ShardedParam& p : params_)
    if (p.float8) shards.push_back(shard_of(p));
  return at::stack(at::_foreach_norm(shards, INFINITY)).to(options_.mixed_precision.param_dtype).to(at::kFloat);
}

void ParamGroup::set_float8_amaxes(at::Tensor amax) {
  float8_amax_ = std::move(amax);
  float8_amax_current_ = true;
}

void ParamGroup::copy_out_float8(const at::Tensor& gathered) {
  const int64_t world = mesh_->shard.size(), others = others_bytes();
  const at::Tensor rows = gathered.view({world, slot_bytes()});
  const at::Tensor in_dtype = rows.narrow(1, 0, others).view(options_.mixed_precision.param_dtype);  // (W, S - S8)
  const at::Tensor bits = rows.narrow(1, others, float8_numel_);                                     // (W, S8)
  float8_gathered_ = at::empty({float8_gathered_numel_}, rows.options());
  size_t k = 0;
  for (ShardedParam& p : params_) {
    const int64_t n = p.layout.shard_numel();
    if (!p.float8) {
      copy_from_rows(unsharded_of(p), in_dtype.narrow(1, p.gather_offset, p.width * n));
      continue;
    }
    const at::Tensor whole = float8_gathered_.narrow(0, p.unsharded_offset, p.layout.numel());
    copy_from_rows(whole, bits.narrow(1, p.gather_offset, n));
    hold_gathered_float8(p.unsharded, {whole.view(at::kFloat8_e4m3fn).view(p.layout.shape), float8_inverse_.at(k++)});
  }
}

void ParamGroup::drop_float8() {
  if (!float8_gathered_.defined()) return;
  for (const ShardedParam& p : params_)
    if (p.float8) drop_gathered_float8(p.unsharded);
  float8_gathered_ = at::Tensor();
}

at::Tensor ParamGroup::unsharded_of(const ShardedParam& p) const {
  FSDP_ASSERT(!p.float8, "[fsdp] ", p.name, " is gathered in float8: it has no unsharded bytes");
  return unsharded_.narrow(0, p.unsharded_offset, p.width * p.layout.numel());
}

void ParamGroup::reshard() {
  post_forward_ = at::Tensor();
  drop_float8();
  if (state_ == GroupState::kSharded || state_ == GroupState::kPartial) {
    state_ = GroupState::kSharded;
    return;
  }
  // One rank, offloaded and kept on the device: the storage is the shards' device copy.
  const bool keep = on_device_ && mesh_->shard.size() == 1;
  if (state_ == GroupState::kGathering) {
    // A prefetch that was not used: the collective is in flight on every rank, so it must finish,
    // and an upload must finish before its memory goes back to the current stream.
    if (pending_gather_) pending_gather_->work.wait();
    pending_gather_.reset();
    finish_upload();
    if (!keep) free_storage(unsharded_);  // one rank, offloaded: the upload's storage
    state_ = GroupState::kSharded;
    return;
  }
  if (!keep) free_storage(unsharded_);
  state_ = GroupState::kSharded;
  if (!params_.empty()) log(keep ? "free (kept on the device)" : "free");
}

void ParamGroup::reshard_after_forward() {
  if (!mesh_->post_forward || state_ != GroupState::kUnsharded || params_.empty()) return reshard();
  RECORD_USER_SCOPE(str("fsdp keep post-forward share ", display_name()));
  c10::NoGradGuard no_grad;
  // Rows [j * W/N, (j + 1) * W/N) of the (W, S) the shard group's gather produced, rebuilt from the
  // full parameters: j is this rank's place in its post-forward group.
  // Under float8 all-gather the share is bytes as the gather's are: the float8 weights' from their
  // gathered bits, the others' in param_dtype.
  const int64_t rows = mesh_->shard.size() / mesh_->post_forward->size(), first = mesh_->post_forward->rank() * rows;
  const bool bytes = float8_numel_ > 0;
  const int64_t slot = bytes ? slot_bytes() : shard_numel_, others = bytes ? others_bytes() : 0;
  post_forward_ = at::empty({rows * slot}, bytes ? unsharded_.options().dtype(at::kByte) : unsharded_.options());
  const at::Tensor block = post_forward_.view({rows, slot});
  const at::Tensor in_dtype = bytes ? block.narrow(1, 0, others).view(unsharded_.scalar_type()) : block;
  for (const ShardedParam& p : params_) {  // in elements of the gather (width of them a value)
    const int64_t n = p.width * p.layout.shard_numel(), numel = p.width * p.layout.numel();
    const int64_t begin = std::min(numel, first * n), count = std::min(numel - begin, rows * n);
    const at::Tensor region =
        p.float8 ? block.narrow(1, others + p.gather_offset, n) : in_dtype.narrow(1, p.gather_offset, n);
    const at::Tensor whole = p.float8 ? float8_gathered_.narrow(0, p.unsharded_offset, numel) : unsharded_of(p);
    copy_into_rows(region, whole.narrow(0, begin, count));
  }
  if (bytes) block.narrow(1, others + float8_numel_, slot - others - float8_numel_).zero_();
  // The padding before the values kept in fp32 (after the trainable ones, float8 weights among them).
  in_dtype.narrow(1, trainable_numel_ - float8_numel_, kept_begin_ - trainable_numel_).zero_();
  drop_float8();
  free_storage(unsharded_);
  state_ = GroupState::kPartial;
  log("free to post-forward share");
}

void ParamGroup::post_backward(bool sync) {
  if (!has_trainable()) return;
  apply_deferred_update();  // it reads the gradient this backward writes
  RECORD_USER_SCOPE(str(sync ? "fsdp reduce " : "fsdp accumulate ", display_name()));
  c10::NoGradGuard no_grad;
  // Gradients leave the unsharded parameters here; the next backward starts from none.
  std::vector<at::Tensor> grads;
  for (ShardedParam& p : params_) {
    if (!p.trainable) continue;
    at::Tensor g = p.unsharded.grad();
    p.unsharded.mutable_grad() = at::Tensor();
    if (g.defined() && p.accumulated.defined()) {
      p.accumulated.add_(g);
      g = at::Tensor();
    }
    if (!sync) {
      if (g.defined()) p.accumulated = g.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
      continue;
    }
    grads.push_back(p.accumulated.defined() ? p.accumulated : g);
    p.accumulated = at::Tensor();
  }
  if (!sync) return;

  log("reduce");
  const int64_t world = mesh_->shard.size();
  const at::TensorOptions opts =
      at::TensorOptions().dtype(options_.mixed_precision.reduce_dtype).device(options_.device);
  // Row r of the input is the concatenation of every gradient's r-th padded chunk; a parameter that
  // got no gradient (unused this step) contributes zeros, so every rank issues the same collective.
  // Only the padding and such parameters are zeroed: the rest is written over.
  // The first reduction since zero_grad in fp32 on the gradient's device is written straight into
  // the flat gradient (reduced into it, or at one rank laid out in it), not into a buffer then added.
  // Offloaded gradients come down through the HostTransfer, whatever the device (the CPU tests take
  // a GPU's path that way).
  const bool transferred = options_.offload_params && options_.host_transfer;
  const bool into_grad =
      grad_zero_ && opts.dtype() == at::kFloat && flat_grad_.device() == options_.device && !transferred;
  if (into_grad) grad_zero_ = zeros_pending_ = false;  // every element is written below or by the collective
  at::Tensor input = into_grad && world == 1 ? flat_grad_ : at::empty({world * trainable_numel_}, opts);
  const at::Tensor rows = input.view({world, trainable_numel_});
  std::vector<at::Tensor> regions, sources;  // one rank: each gradient is its whole region
  size_t k = 0;
  for (const ShardedParam& p : params_) {
    if (!p.trainable) continue;
    const at::Tensor& g = grads[k++];
    const at::Tensor region = rows.narrow(1, p.offset, p.layout.shard_numel());
    if (!g.defined()) {
      region.zero_();
    } else if (world == 1) {
      regions.push_back(region.view({-1}));
      sources.push_back(g.reshape({-1}));
    } else {
      copy_into_rows(region, g.reshape({-1}));
    }
  }
  // One multi-tensor copy (and cast) for the group: on a GPU one vectorized kernel, where a copy_
  // per gradient took ATen's unvectorized casting loop (3.2 ms of the 1B step on an H200).
  if (!regions.empty()) at::_foreach_copy_(regions, sources);
  // The experts' gradients hold the tokens of every rank of the ep group: over the shard group's
  // average (of shard / ep ranks) they are ep times the average over all ranks' tokens.
  if (mesh_->expert_blocks && mesh_->ep->size() > 1) input.div_(mesh_->ep->size());
  if (world == 1) {  // the sum over one rank is its gradient: no collective
    pending_reduce_ = PendingReduce{dist::Work(), input, input, into_grad};
    return;
  }
  at::Tensor output = into_grad ? flat_grad_ : at::empty({trainable_numel_}, opts);
  pending_reduce_ =
      PendingReduce{mesh_->shard.reduce_scatter(output, input, dist::ReduceOp::kAvg, "reduce " + display_name()),
                    input, output, into_grad};
}

void ParamGroup::finish_reduce() {
  apply_deferred_update();
  if (!pending_reduce_) return;
  RECORD_USER_SCOPE(str("fsdp finish reduce ", display_name()));
  c10::NoGradGuard no_grad;
  pending_reduce_->work.wait();
  at::Tensor reduced = pending_reduce_->output;
  const bool into_grad = pending_reduce_->into_grad;
  pending_reduce_.reset();
  if (mesh_->replicate && mesh_->replicate->size() > 1)
    mesh_->replicate->all_reduce(reduced, dist::ReduceOp::kAvg, "replicate " + display_name()).wait();
  if (into_grad) return;  // reduced is flat_grad_
  // Offloaded: the first reduction since zero_grad goes down to the pinned host gradient on the
  // download stream, without a host wait (the engine waits once, after the last unit:
  // ShardedModel::finish_backward); a later one is added on the host, which waits for both.
  HostTransfer* transfer = options_.offload_params ? options_.host_transfer.get() : nullptr;
  if (transfer && grad_zero_ && reduced.scalar_type() == at::kFloat) {
    transfer->download(flat_grad_, reduced);
    grad_squares_ = sum_of_squares({reduced});  // before reduced's memory goes back
  } else if (grad_zero_) {  // the first reduction since zero_grad: its zeros need not exist
    flat_grad_.copy_(reduced);
  } else {
    if (transfer) transfer->synchronize_downloads();
    flat_grad_.add_(reduced.to(flat_grad_.device(), at::kFloat));
    grad_squares_ = at::Tensor();  // of the first reduction alone
  }
  grad_zero_ = zeros_pending_ = false;
}

void ParamGroup::defer_update(std::function<void()> update) {
  apply_deferred_update();
  deferred_update_ = std::move(update);
}

void ParamGroup::apply_deferred_update() const {
  if (!deferred_update_) return;
  const std::function<void()> update = std::move(deferred_update_);
  deferred_update_ = nullptr;
  on_device_ = float8_amax_current_ = false;  // the device's copy (and the amaxes) are of the shards before it
  log("update");
  update();
}

// The zeros are written lazily (flat_grad): the step's first reduction overwrites the whole flat
// gradient, so a step that reduces every unit never writes them (on a GPU a pass over the model's
// fp32 gradients; offloaded, a memset of them in host memory). A deferred update's gradient is left
// as it is: the update reads flat_grad_ itself, and every accessor that would write the zeros
// applies it first.
void ParamGroup::zero_grad() {
  grad_squares_ = at::Tensor();
  zeros_pending_ = true;
  grad_zero_ = true;
  for (ShardedParam& p : params_) p.accumulated = at::Tensor();
}

at::Tensor ParamGroup::shard_of(const ShardedParam& p) const {
  apply_deferred_update();
  const int64_t n = p.layout.shard_numel();
  if (p.trainable) return flat_shard_.narrow(0, p.offset, n);
  if (p.width == 2) return kept_shard_.narrow(0, (p.offset - kept_begin_) / 2, n);
  return frozen_shard_.narrow(0, p.offset - kept_begin_ - kept_words_, n);
}

at::Tensor ParamGroup::travelling(const ShardedParam& p) const {
  return p.width == 2 ? shard_of(p).view(options_.mixed_precision.param_dtype) : shard_of(p);
}

std::vector<std::pair<std::string, at::Tensor>> ParamGroup::gather_full_parameters() const {
  apply_deferred_update();
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> values;  // every parameter's shard in fp32, end to end in params_' order
  for (const ShardedParam& p : params_) values.push_back(shard_of(p).to(at::kFloat).reshape({-1}));
  return gather_full(values.empty() ? flat_shard_ : at::cat(values), /*trainable_only=*/false);
}

std::vector<std::pair<std::string, at::Tensor>> ParamGroup::gather_full_gradients() const {
  return gather_full(flat_grad(), /*trainable_only=*/true);
}

at::Tensor ParamGroup::flat_grad() const {
  apply_deferred_update();       // before the zeros: the update reads the step's gradient
  grad_squares_ = at::Tensor();  // the reader may change the gradient
  if (zeros_pending_) {
    c10::NoGradGuard no_grad;
    flat_grad_.zero_();
    zeros_pending_ = false;
  }
  return flat_grad_;
}

at::Tensor ParamGroup::gather_full_parameter(size_t i) const {
  c10::NoGradGuard no_grad;
  const ShardedParam& p = params_.at(i);
  dist::ProcessGroup shard = mesh_->shard;  // a handle; copies share the group
  const at::Tensor all = shard.all_gather_copies(shard_of(p).to(at::kFloat), "full value of " + p.name);
  return whole(p, all.narrow(0, 0, p.layout.numel()).view(p.layout.shape)).clone();
}

// The whole fp32 value: init's, cut to this rank's tensor-parallel block.
at::Tensor ParamGroup::initial_value(const ShardedParam& p) const {
  const at::Tensor full = options_.init(p.name, p.full_shape()).to(at::kFloat);
  if (!p.tp.split()) return full;
  const int64_t n = p.layout.shape[static_cast<size_t>(p.tp.dim)], valid = p.tp.valid(n);
  at::Tensor block = at::zeros(p.layout.shape, full.options());  // the padding past the whole stays zero
  block.narrow(p.tp.dim, 0, valid).copy_(full.narrow(p.tp.dim, p.tp.start(n), valid));
  return block;
}

at::Tensor ParamGroup::whole(const ShardedParam& p, const at::Tensor& block) const {
  if (!p.tp.split()) return block;
  dist::ProcessGroup blocks = mesh_->expert_blocks ? *mesh_->ep : *mesh_->tp;
  return whole_from_blocks(blocks, block, p.tp, "whole " + p.name);
}

// Host tensors (CPU runs, offloaded gradients) are reduced in rows of 1K elements: LibTorch's fp32
// norm of a long vector loses digits (2e-3 relative at 7M elements: each thread accumulates its
// share in fp32), while rows' norms squared and summed in float64 stay close to the float64 norm:
// a row's norm adds its squares one after another in fp32, so a shorter row loses fewer digits
// (a unit's flat gradient: 7e-7 relative in rows of 16K, 9e-9 in rows of 1K, in the same time). The
// rows of a tensor are one (rows, 1K) norm along dim 1, which ATen splits over the host's cores; a
// list of chunks (this function's first form) ran each chunk's norm on one thread, so the whole
// norm ran on one core (0.16 s for 250M parameters on one core or two; the rows' form 0.05 s on two).
at::Tensor sum_of_squares(const std::vector<at::Tensor>& ts) {
  if (ts.empty() || !ts.front().is_cpu()) return at::stack(at::_foreach_norm(ts, 2)).square().sum();
  const int64_t row = 1 << 10;
  at::Tensor sum = at::zeros({}, at::kDouble);
  for (const at::Tensor& t : ts) {
    const at::Tensor flat = t.reshape({-1});
    const int64_t rows = flat.numel() / row, tail = flat.numel() - rows * row;
    at::Tensor part = at::zeros({}, at::kDouble);
    if (rows > 0) {
      const at::Tensor norms = at::linalg_vector_norm(flat.narrow(0, 0, rows * row).view({rows, row}), 2, {1});
      part += norms.to(at::kDouble).square().sum();
    }
    if (tail > 0) part += at::linalg_vector_norm(flat.narrow(0, rows * row, tail), 2).to(at::kDouble).square();
    sum += part;
  }
  return sum;
}

at::Tensor whole_from_blocks(dist::ProcessGroup& tp, const at::Tensor& block, const TpSlice& slice,
                             const std::string& label) {
  std::vector<int64_t> stacked = block.sizes().vec(), merged = block.sizes().vec();
  stacked.insert(stacked.begin(), tp.size());
  merged[static_cast<size_t>(slice.dim)] *= tp.size();
  // (parts, *block) rank-major, the parts dimension moved next to the one it splits, then merged,
  // and the padding past the whole cut off.
  const at::Tensor all = tp.all_gather_copies(block.contiguous().reshape({-1}), label).view(stacked);
  const std::vector<int64_t> full = slice.full_shape(block.sizes().vec());
  return all.movedim(0, slice.dim).reshape(merged).narrow(slice.dim, 0, full[static_cast<size_t>(slice.dim)]);
}

void ParamGroup::sum_whole_gradients_over_tp() {
  if (!mesh_->tp || mesh_->tp->size() == 1) return;
  apply_deferred_update();
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> slices;
  for (const ShardedParam& p : params_)
    if (p.trainable && (!p.tp.split() || mesh_->expert_blocks))  // experts: split over ep, whole over tp
      slices.push_back(flat_grad().narrow(0, p.offset, p.layout.shard_numel()));
  if (slices.empty()) return;
  // Each tp rank's gradient of a parameter they all hold is its part (its sequence block, its heads).
  const at::Tensor sum = at::cat(slices).to(options_.device);
  dist::ProcessGroup tp = *mesh_->tp;
  tp.all_reduce(sum, dist::ReduceOp::kSum, "tensor-parallel gradients of " + display_name()).wait();
  int64_t at = 0;
  for (const at::Tensor& s : slices) {
    s.copy_(sum.narrow(0, at, s.numel()));
    at += s.numel();
  }
}

std::vector<std::pair<std::string, at::Tensor>> ParamGroup::gather_full(const at::Tensor& flat,
                                                                        bool trainable_only) const {
  c10::NoGradGuard no_grad;
  dist::ProcessGroup shard = mesh_->shard;
  const at::Tensor rows =
      shard.all_gather_copies(flat, "full state of " + display_name()).view({shard.size(), flat.numel()});
  std::vector<std::pair<std::string, at::Tensor>> out;
  int64_t at = 0;  // `flat` holds the parameters' shards end to end (the trainable ones first)
  for (const ShardedParam& p : params_) {
    if (trainable_only && !p.trainable) continue;
    const int64_t k = p.layout.shard_numel();
    at::Tensor full = rows.narrow(1, at, k).reshape({-1}).narrow(0, 0, p.layout.numel()).view(p.layout.shape);
    out.emplace_back(p.name, whole(p, full).clone());
    at += k;
  }
  return out;
}

int64_t ParamGroup::param_bytes() const {
  return trainable_numel_ * 4 + kept_shard_.numel() * 4 + frozen_shard_.numel() * frozen_shard_.element_size();
}

int64_t ParamGroup::grad_bytes() const {
  return trainable_numel_ * 4;
}

}  // namespace fsdp

#include "ckpt/checkpoint_plan.h"

#include <utility>

#include "ckpt/file_system.h"
#include "ckpt/format.h"

namespace fsdp::ckpt {

SaveRanks save_ranks(const ShardedModel& model) {
  const DeviceMesh& mesh = model.mesh();
  SaveRanks ranks;
  ranks.shard_rank = mesh.shard.rank();
  ranks.shard_size = mesh.shard.size();
  ranks.tp_rank = mesh.tp ? mesh.tp->rank() : 0;
  ranks.tp_size = mesh.tp ? mesh.tp->size() : 1;
  ranks.writer = !mesh.replicate || mesh.replicate->rank() == 0;
  return ranks;
}

std::vector<Slot> saved_slots(const ShardedModel& model, bool frozen_from_base) {
  if (!frozen_from_base) return slots_of(model);
  return slots_of(model, [](const ShardedParam& p) { return p.trainable; });
}

ShardImage plan_shard_image(const std::vector<Slot>& slots, const optim::ShardedAdamW& adamw, int tp_rank) {
  ShardImage image;
  std::vector<HostRows>& out = image.rows;
  for (const Slot& s : slots) {
    const ShardedParam& p = *s.param;
    const auto [r0, r1] = stored_rows(p);
    const int64_t n = r1 - r0;  // the rank's rows that hold the parameter (not FSDP's or tp's padding)
    // One tp rank writes what they all hold (the experts too: split over ep, whole over tp).
    if (n == 0 || ((!p.tp.split() || s.expert) && tp_rank != 0)) continue;
    int64_t c0 = 0, c1 = 0;
    if (p.tp.split() && p.tp.dim == 1) {
      c0 = p.tp.start(p.layout.shape[1]);
      c1 = c0 + p.layout.shape[1];
    }
    auto add = [&](const std::string& name, const at::Tensor& rows) {
      out.push_back({name, p.full_shape(), r0, r0 + n, c0, c1, rows.narrow(0, 0, n)});
    };
    add(p.name, p.sharded);
    if (p.trainable) {
      const auto& st = adamw.state()[s.group];
      add(kExpAvg + p.name, state_rows(st.exp_avg, p));
      add(kExpAvgSq + p.name, state_rows(st.exp_avg_sq, p));
    }
  }
  std::vector<TensorBytes> specs;
  for (const HostRows& r : out) {
    std::vector<int64_t> shape = r.shape;
    shape[0] = r.r1 - r.r0;
    if (r.c1 > r.c0) shape[1] = r.c1 - r.c0;
    specs.push_back({r.name, Dtype::kF32, shape, nullptr, static_cast<size_t>(r.data.numel()) * 4});
  }
  image.layout = safetensors_layout(specs, {{"format", "pt"}});
  std::map<std::string, uint64_t> offset_of;
  for (size_t i = 0; i < image.layout.order.size(); ++i) offset_of[image.layout.order[i]] = image.layout.offsets[i];
  for (const HostRows& r : out) image.offsets.push_back(offset_of.at(r.name));
  return image;
}

InPlacePlan plan_in_place(const std::vector<HostSlice>& slices, int64_t max_shard_bytes) {
  std::map<std::string, const HostSlice*> by_name;
  std::vector<TensorSpec> params;
  std::vector<TensorBytes> optim;
  for (const HostSlice& h : slices) {
    by_name[h.name] = &h;
    if (h.name.rfind("optim.", 0) == 0)
      optim.push_back({h.name, Dtype::kF32, h.full_shape(), nullptr, static_cast<size_t>(h.layout->numel()) * 4});
    else
      params.push_back({h.name, h.full_shape()});
  }
  InPlacePlan out;
  out.hf = plan_hf_shards(params, Dtype::kF32, max_shard_bytes);
  auto add_file = [&](const std::string& name, const std::vector<TensorBytes>& specs) {
    InPlaceFile f{name, safetensors_layout(specs), {}};
    for (size_t i = 0; i < f.layout.order.size(); ++i) {
      f.slices.push_back(by_name.at(f.layout.order[i]));
      out.offset[f.layout.order[i]] = f.layout.offsets[i];
    }
    out.files.push_back(std::move(f));
  };
  for (size_t k = 0; k < out.hf.shards.size(); ++k) add_file(out.hf.shards[k].file, out.hf.specs_of(k));
  add_file(kOptimizer, optim);
  return out;
}

FullSlices plan_full_slices(const std::vector<Slot>& slots, const optim::ShardedAdamW& adamw, bool in_place,
                            int64_t max_shard_bytes) {
  FullSlices plan;
  std::vector<HostSlice>& out = plan.slices;
  for (const Slot& s : slots) {
    const ShardedParam& p = *s.param;
    auto add = [&](const std::string& name, const at::Tensor& slice) {
      out.push_back({name, &p.layout, &p.tp, slice.reshape({-1}), 0, s.expert});
    };
    add(p.name, p.sharded);
    if (p.trainable) {
      const auto& st = adamw.state()[s.group];
      add(kExpAvg + p.name, st.exp_avg.narrow(0, p.offset, p.layout.shard_numel()));
      add(kExpAvgSq + p.name, st.exp_avg_sq.narrow(0, p.offset, p.layout.shard_numel()));
    }
  }
  // In place: at most a block of padding each, where a slice's address would otherwise not agree
  // with its rows' file offset (those writes would then go through an aligned copy).
  const InPlacePlan files = in_place ? plan_in_place(out, max_shard_bytes) : InPlacePlan{};
  uint64_t next = 0;
  for (HostSlice& h : out) {
    if (in_place) {  // padding up to the address whose place in a block is that of the rows' file offset
      const uint64_t file_offset =
          files.offset.at(h.name) + static_cast<uint64_t>(h.layout->first_row() * h.layout->row_numel()) * 4;
      next += (file_offset % kDirectAlignment + kDirectAlignment - next % kDirectAlignment) % kDirectAlignment;
    }
    plan.offsets.push_back(next);
    next += static_cast<uint64_t>(h.slice.numel()) * 4;
    h.staged_end = next;
  }
  plan.bytes = next;
  return plan;
}

}  // namespace fsdp::ckpt

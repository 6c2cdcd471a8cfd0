#include "ckpt/checkpoint_write.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>

#include "ckpt/format.h"
#include "ckpt/safetensors_torch.h"
#include "util/crc32c.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::ckpt {

using json = nlohmann::json;

json write_shard(const ShardImage& image, Staging& staging, FileSystem& fs, const SaveRanks& ranks,
                 const std::string& tmp) {
  const std::string file = shard_file_name(ranks.file_index(), ranks.file_count());
  auto out = fs.create(path_in(tmp, file));
  constexpr uint64_t kPiece = uint64_t{64} << 20;  // whole blocks, as append_image's pieces must be
  for (uint64_t at = 0; at < image.layout.size; at += kPiece) {
    const uint64_t n = std::min(kPiece, image.layout.size - at);
    out->append_image(staging.ready(at + n) + at, n);
  }
  out->sync();
  out->close();
  json tensors = json::object();
  for (size_t i = 0; i < image.rows.size(); ++i) {
    const HostRows& r = image.rows[i];
    const uint64_t at = image.offsets[i];
    tensors[r.name] = {{"shape", r.shape}, {"rows", {r.r0, r.r1}}, {"bytes", {at, at + r.data.numel() * 4}}};
    if (r.c1 > r.c0) tensors[r.name]["cols"] = {r.c0, r.c1};
  }
  return json{{"file", file}, {"bytes", out->bytes()}, {"crc32c", crc_hex(out->checksum())}, {"tensors", tensors}};
}

namespace {

// The full value of one parameter's padded shard slice (flat, shard_numel elements on every rank)
// on the CPU. Collective over the shard group.
at::Tensor gather_slice(dist::ProcessGroup shard, const at::Tensor& slice, const ShardLayout& layout,
                        const std::string& name) {
  return shard.all_gather_copies(slice, "save " + name).narrow(0, 0, layout.numel()).view(layout.shape).to(at::kCPU);
}

// Under tensor parallel, the whole tensor from every tp rank's block (collective over `tp`).
at::Tensor whole_of(std::optional<dist::ProcessGroup>& tp, const at::Tensor& block, const TpSlice& slice,
                    const std::string& name) {
  if (!tp || !slice.split()) return block;
  return whole_from_blocks(*tp, block, slice, "save " + name);
}

// This boot of this machine's kernel ("" where there is none to read).
std::string machine_boot_id() {
  try {
    return read_file("/proc/sys/kernel/random/boot_id");
  } catch (const std::exception&) {
    return "";
  }
}

// FULL_STATE_DICT when every shard rank runs on shard rank 0's machine and nothing is split for
// tensor parallel: each rank writes its own rows of every tensor straight into the files, as a
// FULL load reads them, instead of sending them to shard rank 0, which then wrote the whole model
// alone (half of a 125M FULL save's time was that gather on two ranks, and rank 0's inbound bytes
// grow with the ranks). One machine, not merely a shared file system: its page cache makes
// writes of neighbouring bytes by several processes safe, where a network file system's clients
// may each write back whole pages. Collective over host_group: rank 0 leaves a marker named by a
// random number in `tmp` holding its kernel's boot id, and every rank reads it and compares its
// own.
bool every_rank_on_this_machine(const FullWrite& w, const std::string& tmp) {
  if (!w.rows_in_place) return false;
  at::Tensor token = at::zeros({1}, at::kLong);
  if (w.ranks.shard_rank == 0) token.fill_(int64_t{std::random_device{}()} << 20 | (::getpid() & 0xFFFFF));
  w.host_group.broadcast(token, 0, "checkpoint folder check").wait();
  const std::string marker = path_in(tmp, str(".same-machine-", token.item<int64_t>()));
  const std::string boot_id = machine_boot_id();
  if (w.ranks.shard_rank == 0) write_whole_file(w.fs, marker, boot_id);
  w.host_group.barrier("checkpoint folder check").wait();
  bool same = false;
  try {
    same = !boot_id.empty() && read_file(marker) == boot_id;
  } catch (const std::exception&) {  // not there: another machine's folder
  }
  at::Tensor count = at::full({1}, same ? 1 : 0, at::kLong);
  w.host_group.all_reduce(count, dist::ReduceOp::kSum, "checkpoint folder check").wait();
  if (w.ranks.shard_rank == 0) w.fs.remove_all(marker);
  return count.item<int64_t>() == w.ranks.shard_size;
}

// Shard rank 0 creates every file of `files` at its full size with its header; returns each
// header's CRC-32C (nothing on the other ranks).
std::vector<uint32_t> create_in_place_files(const FullWrite& w, const std::vector<InPlaceFile>& files,
                                            const std::string& tmp) {
  std::vector<uint32_t> header_crcs;
  if (w.ranks.shard_rank != 0) return header_crcs;
  for (const InPlaceFile& f : files) {
    auto out = w.fs.create(path_in(tmp, f.name));
    out->append(f.layout.header.data(), f.layout.header.size());
    out->resize(f.layout.size);
    out->sync();
    out->close();
    header_crcs.push_back(out->checksum());
  }
  return header_crcs;
}

// This rank's valid rows of every tensor of `files`, written at their offsets and fsynced; returns
// each piece's CRC-32C, file after file (0 for a piece without rows).
std::vector<int64_t> write_own_rows(const FullWrite& w, const std::vector<InPlaceFile>& files, const std::string& tmp) {
  // Each rank starts at a different file: writes into one file take its inode's lock in turn, so
  // ranks on different files copy at once.
  std::vector<std::vector<int64_t>> file_crcs(files.size());  // this rank's piece of each tensor
  for (size_t j = 0; j < files.size(); ++j) {
    const size_t k = (j + static_cast<size_t>(w.ranks.shard_rank)) % files.size();
    const InPlaceFile& f = files[k];
    auto out = w.fs.open_existing(path_in(tmp, f.name));
    for (size_t i = 0; i < f.slices.size(); ++i) {
      const ShardLayout& l = *f.slices[i]->layout;
      const size_t n = static_cast<size_t>(l.valid_rows() * l.row_numel()) * 4;
      w.staging.ready(f.slices[i]->staged_end);
      const void* rows = f.slices[i]->slice.data_ptr();
      if (n > 0) out->write_at(f.layout.offsets[i] + static_cast<uint64_t>(l.first_row() * l.row_numel()) * 4, rows, n);
      file_crcs[k].push_back(n > 0 ? crc32c(rows, n) : 0);
    }
    out->sync();
    out->close();
  }
  std::vector<int64_t> crcs;  // file after file
  for (const std::vector<int64_t>& c : file_crcs) crcs.insert(crcs.end(), c.begin(), c.end());
  return crcs;
}

// The in-place FULL save: shard rank 0 creates every file at its full size with its header; every
// rank writes its valid rows of each tensor at their offset, fsyncs its writes and sends the
// CRC-32C of each piece to rank 0, which joins them into each file's checksum.
FullWritten write_full_in_place(const FullWrite& w, const std::vector<HostSlice>& slices, const std::string& tmp,
                                const std::string& final_dir) {
  const InPlacePlan in_place = plan_in_place(slices, w.max_shard_bytes);
  const std::vector<InPlaceFile>& files = in_place.files;
  const std::vector<uint32_t> header_crcs = create_in_place_files(w, files, tmp);
  w.host_group.barrier("save " + final_dir + " (files created)").wait();
  const std::vector<int64_t> crcs = write_own_rows(w, files, tmp);
  // Every rank's pieces are on disk once this returns.
  const at::Tensor gathered =
      w.host_group.all_gather_copies(at::tensor(crcs, at::kLong), "save " + final_dir + " (checksums)");
  FullWritten out{/*in_place=*/true, /*commits=*/w.ranks.shard_rank == 0, {}};
  if (!out.commits) return out;
  const int shards = w.ranks.shard_size;
  const at::Tensor by_rank = gathered.view({shards, -1});
  const auto all = by_rank.accessor<int64_t, 2>();
  int64_t piece = 0;
  for (size_t k = 0; k < files.size(); ++k) {
    const InPlaceFile& f = files[k];
    uint32_t crc = header_crcs[k];
    for (const HostSlice* h : f.slices) {
      for (int r = 0; r < shards; ++r) {
        const ShardLayout l{h->layout->shape, shards, r};
        const uint64_t n = static_cast<uint64_t>(l.valid_rows() * l.row_numel()) * 4;
        if (n > 0) crc = crc32c_join(crc, static_cast<uint32_t>(all[r][piece]), n);
      }
      ++piece;
    }
    out.files.push_back({f.name, f.layout.size, crc});
  }
  for (WrittenFile& f : write_hf_side_files(in_place.hf, w.config_json, tmp, w.fs)) out.files.push_back(std::move(f));
  return out;
}

}  // namespace

FullWritten write_full(const FullWrite& w, const std::vector<HostSlice>& slices, const std::string& tmp,
                       const std::string& final_dir) {
  if (every_rank_on_this_machine(w, tmp)) return write_full_in_place(w, slices, tmp, final_dir);
  FullWritten result{/*in_place=*/false, /*commits=*/w.ranks.shard_rank == 0 && w.ranks.tp_rank == 0, {}};
  const bool writer = result.commits;
  auto full = [&](const HostSlice& h) {
    w.staging.ready(h.staged_end);
    if (h.expert)  // this ep rank's experts over the experts' shard group, then every ep rank's
      return whole_of(w.ep_host_group, gather_slice(w.expert_host_group, h.slice, *h.layout, h.name), *h.tp, h.name);
    return whole_of(w.tp_host_group, gather_slice(w.host_group, h.slice, *h.layout, h.name), *h.tp, h.name);
  };
  std::vector<const HostSlice*> params, optim;
  for (const HostSlice& h : slices) (h.name.rfind("optim.", 0) == 0 ? optim : params).push_back(&h);
  std::vector<TensorSpec> specs;
  for (const HostSlice* h : params) specs.push_back({h->name, h->full_shape()});
  result.files = write_hf_folder(
      specs, [&](size_t i) { return full(*params[i]); }, writer, w.config_json, tmp, w.max_shard_bytes, w.fs);
  std::sort(optim.begin(), optim.end(), [](const HostSlice* a, const HostSlice* b) { return a->name < b->name; });
  std::unique_ptr<SafetensorsWriter> out;
  if (writer) {
    std::vector<TensorBytes> tensors;
    for (const HostSlice* h : optim)
      tensors.push_back({h->name, Dtype::kF32, h->full_shape(), nullptr,
                         static_cast<size_t>(c10::multiply_integers(h->full_shape())) * 4});
    // All fp32: the writer's order is the name order, the order of the gathers below (append checks it).
    out = std::make_unique<SafetensorsWriter>(path_in(tmp, kOptimizer), tensors, std::map<std::string, std::string>{},
                                              w.fs);
  }
  for (const HostSlice* h : optim) {
    const at::Tensor t = full(*h);
    if (out) append_tensor(*out, h->name, t.to(at::kCPU).contiguous());
  }
  if (!writer) return result;
  out->finish();
  result.files.push_back({kOptimizer, out->bytes(), out->checksum()});
  return result;
}

}  // namespace fsdp::ckpt

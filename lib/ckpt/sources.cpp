#include "ckpt/sources.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "ckpt/direct_read.h"
#include "ckpt/format.h"
#include "ckpt/hf.h"
#include "ckpt/safetensors_torch.h"
#include "util/crc32c.h"
#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

using json = nlohmann::json;

// A byte range of a file read into the model, and its CRC-32C, taken as it was copied.
struct Segment {
  uint64_t offset = 0, length = 0;
  uint32_t crc = 0;
};

// The CRC-32C of a whole mapped file from the segments read (in any order, by any ranks) and the
// bytes no segment holds (the header, rows nobody read), read here and dropped from the page cache.
// A segment inside bytes already joined (the same rows read by two replicas) counts once; one that
// overlaps them in part is read again from its first byte not yet joined.
uint32_t joined_crc(const SafetensorsFile& f, std::vector<Segment> pieces) {
  std::sort(pieces.begin(), pieces.end(), [](const Segment& a, const Segment& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.length > b.length;
  });
  uint32_t crc = 0;
  uint64_t at = 0;
  auto gap = [&](uint64_t end) {
    crc = crc32c(f.mapped() + at, end - at, crc);
    f.release(f.mapped() + at, end - at);
    at = end;
  };
  for (const Segment& s : pieces) {
    if (s.offset + s.length <= at) continue;
    if (s.offset < at) {
      gap(s.offset + s.length);
      continue;
    }
    gap(s.offset);
    crc = crc32c_join(crc, s.crc, s.length);
    at = s.offset + s.length;
  }
  gap(f.size());
  return crc;
}

// Rows [lo, hi) of stored tensor `t` (whose row `first` is at `begin`) copied into `dest` from the
// mapped file: one copy, or with checksums on the host, 1 MiB blocks, each block's CRC-32C taken
// while it is in cache; the pages dropped once read. Returns the segment read.
Segment copy_mapped(const SafetensorsFile& f, const TensorInfo& t, int64_t first, int64_t lo, int64_t hi,
                    const at::Tensor& dest, bool checksums) {
  const int64_t rb = row_bytes(t);
  const uint8_t* begin = f.data(t) + (lo - first) * rb;
  const size_t bytes = static_cast<size_t>((hi - lo) * rb);
  const int64_t rows_per_copy = checksums && dest.device().is_cpu()
                                    ? std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(rb, 1))
                                    : hi - lo;
  uint32_t crc = 0;
  for (int64_t r = lo; r < hi; r += rows_per_copy) {
    const int64_t k = std::min(rows_per_copy, hi - r);
    dest.narrow(0, r - lo, k).copy_(mapped_rows(f, t, r - first, r - first + k));
    if (checksums) crc = crc32c(f.data(t) + (r - first) * rb, static_cast<size_t>(k * rb), crc);
  }
  f.release(begin, bytes);
  return {static_cast<uint64_t>(begin - f.mapped()), bytes, crc};
}

// Copies noted between Source::start_reads and finish_reads, made at once by read_ranges_direct;
// each file's segments (with their checksums) go to `read` under the file's name.
class DeferredReads {
 public:
  void start() { on_ = true; }
  // Notes rows [lo, hi) of `t` (whose row `first` is at its start) for `dest` when they can be read
  // straight into it; false when they must be copied now.
  bool add(const SafetensorsFile& f, const TensorInfo& t, int64_t first, int64_t lo, int64_t hi, const at::Tensor& dest,
           const std::string& file_name) {
    if (!on_ || t.dtype != Dtype::kF32 || dest.scalar_type() != at::kFloat || !dest.device().is_cpu() ||
        !dest.is_contiguous())
      return false;
    const int64_t rb = row_bytes(t);
    const auto offset = static_cast<uint64_t>(f.data(t) - f.mapped() + (lo - first) * rb);
    const auto length = static_cast<uint64_t>((hi - lo) * rb);
    if (length == 0) return true;
    reads_.push_back({f.path(), offset, length, dest.data_ptr(), 0, false});
    notes_.push_back({&f, &t, first, lo, hi, dest, file_name});
    return true;
  }
  // Makes the noted copies; what read_ranges_direct left is copied from the mapped files.
  void finish(bool checksums, std::map<std::string, std::vector<Segment>>& read) {
    on_ = false;
    read_ranges_direct(reads_);
    for (size_t i = 0; i < reads_.size(); ++i) {
      const Note& n = notes_[i];
      const Segment s = reads_[i].done ? Segment{reads_[i].offset, reads_[i].length, reads_[i].crc}
                                       : copy_mapped(*n.file, *n.tensor, n.first, n.lo, n.hi, n.dest, checksums);
      if (checksums) read[n.file_name].push_back(s);
    }
    reads_.clear();
    notes_.clear();
  }

 private:
  struct Note {
    const SafetensorsFile* file;
    const TensorInfo* tensor;
    int64_t first, lo, hi;
    at::Tensor dest;
    std::string file_name;
  };
  bool on_ = false;
  std::vector<RangeRead> reads_;
  std::vector<Note> notes_;
};

json segments_json(const std::map<std::string, std::vector<Segment>>& read) {
  json out = json::object();
  for (const auto& [file, segments] : read)
    for (const Segment& s : segments) out[file].push_back({s.offset, s.length, s.crc});
  return out;
}

void add_segments(std::map<std::string, std::vector<Segment>>& read, const std::string& text) {
  const json segments = json::parse(text);  // held here: items() of a temporary would dangle
  for (const auto& [file, list] : segments.items())
    for (const auto& s : list)
      read[file].push_back({s.at(0).get<uint64_t>(), s.at(1).get<uint64_t>(), s.at(2).get<uint32_t>()});
}

// SHARDED_STATE_DICT: index.json says which rows of which tensor are in which shard file (and which
// columns, for a tensor-parallel block split along dim 1); files are mapped when first read, so a
// rank opens only those holding its rows.
class ShardedSource final : public Source {
 public:
  explicit ShardedSource(const std::string& dir) : dir_(dir) {
    const std::string where = path_in(dir, kIndex);
    const json j = parse_json_file(where);
    try {
      FSDP_CHECK(j.at("format").get<std::string>() == "fsdptrain-sharded", "[ckpt] ", where,
                 ": not an fsdptrain sharded index");
      for (const auto& f : j.at("files")) {
        confined_path(dir, f.get<std::string>(), "[ckpt] " + where);  // never a file outside the checkpoint
        files_.push_back(f.get<std::string>());
      }
      for (const auto& [name, t] : j.at("tensors").items()) {
        Entry e;
        const auto dtype = dtype_from_name(t.at("dtype").get<std::string>());
        FSDP_CHECK(dtype, "[ckpt] ", where, ": ", name, " has an unknown dtype");
        e.info.dtype = *dtype;
        e.info.shape = t.at("shape").get<std::vector<int64_t>>();
        // Each column range's pieces cover the rows in order, and the column ranges tile dim 1.
        std::map<std::pair<int64_t, int64_t>, int64_t> next;  // (c0, c1) -> the next row
        const int64_t dim0 = e.info.shape.empty() ? 1 : e.info.shape[0];
        const int64_t dim1 = e.info.shape.size() < 2 ? 0 : e.info.shape[1];
        for (const auto& p : t.at("pieces")) {
          Piece piece;
          piece.file = p.at("file").get<size_t>();
          piece.r0 = p.at("rows").at(0).get<int64_t>();
          piece.r1 = p.at("rows").at(1).get<int64_t>();
          if (p.contains("cols")) {
            piece.c0 = p.at("cols").at(0).get<int64_t>();
            piece.c1 = p.at("cols").at(1).get<int64_t>();
            FSDP_CHECK(piece.c0 >= 0 && piece.c1 > piece.c0 && piece.c1 <= dim1, "[ckpt] ", where, ": ", name,
                       "'s columns [", piece.c0, ", ", piece.c1, ") lie outside its shape; the index is corrupt");
          }
          piece.byte0 = p.at("bytes").at(0).get<uint64_t>();
          int64_t& row = next[{piece.c0, piece.c1}];
          FSDP_CHECK(piece.file < files_.size() && piece.r0 == row && piece.r1 > piece.r0, "[ckpt] ", where, ": ", name,
                     "'s pieces do not cover its rows in order; the index is corrupt");
          row = piece.r1;
          e.pieces.push_back(piece);
        }
        // One range of all the columns (0, 0), or ranges that tile [0, dim1) in order.
        const bool all_columns = next.size() == 1 && next.begin()->first == std::pair<int64_t, int64_t>{0, 0};
        int64_t col = 0;
        for (const auto& [cols, rows] : next) {
          FSDP_CHECK(rows == dim0, "[ckpt] ", where, ": ", name, "'s pieces cover ", rows, " of ", dim0,
                     " rows; the index is corrupt");
          FSDP_CHECK(all_columns || (cols.first == col && cols.second > cols.first), "[ckpt] ", where, ": ", name,
                     "'s column ranges do not tile its columns; the index is corrupt");
          col = cols.second;
        }
        FSDP_CHECK(all_columns || col == dim1, "[ckpt] ", where, ": ", name, "'s column ranges end at ", col, " of ",
                   dim1, " columns; the index is corrupt");
        infos_[name] = e.info;
        entries_[name] = std::move(e);
      }
    } catch (const json::exception& e) {
      throw InputError(str("[ckpt] ", where, ": ", e.what(), "; the index is corrupt"));
    }
  }
  void files(const std::string& name, int64_t r0, int64_t r1, std::set<std::string>& out) const override {
    for (const Piece& p : entries_.at(name).pieces)
      if (p.r0 < r1 && r0 < p.r1) out.insert(files_[p.file]);
  }
  at::Tensor rows(const std::string& name, int64_t r0, int64_t r1) override {
    std::vector<int64_t> shape = entries_.at(name).info.shape;
    if (shape.empty()) shape.push_back(1);
    shape[0] = r1 - r0;
    at::Tensor out = at::empty(shape, at::kFloat);
    read_pieces(name, r0, r1, out, /*defer=*/false);  // the caller uses them at once
    return out;
  }
  // Every file's header and this index's entries in it, checked before any read: a damaged header
  // is refused here (as a corrupt file when its bytes are not the saved ones), on every rank alike,
  // never in the middle of filling the model.
  bool checksum_while_reading(const std::string& dir, const std::set<std::string>& files) override {
    for (size_t i = 0; i < files_.size(); ++i) {
      if (!files.count(files_[i])) continue;
      try {
        const SafetensorsFile& f = open(i);
        for (const auto& [name, e] : entries_)
          for (const Piece& p : e.pieces)
            if (p.file == i) piece_info(f, name, p);
      } catch (const InputError&) {
        check_recorded_crc(dir, files_[i], crc32c_of_file(path_in(dir_, files_[i])));
        throw;
      }
    }
    checksums_ = true;
    return true;
  }

  void verify_read(const std::string& dir, const std::set<std::string>& files) override {
    for (size_t i = 0; i < files_.size(); ++i)
      if (files.count(files_[i])) check_recorded_crc(dir, files_[i], joined_crc(open(i), read_[files_[i]]));
  }

  // Straight from the mapped file into `out` (the parameter's or the optimizer state's rows): one
  // copy, converting the dtype on the way (copy_mapped).
  void read_rows_into(const std::string& name, int64_t r0, int64_t r1, const at::Tensor& out) override {
    read_pieces(name, r0, r1, out, /*defer=*/true);
  }
  void start_reads() override { deferred_.start(); }
  void finish_reads() override { deferred_.finish(checksums_, read_); }

 private:
  void read_pieces(const std::string& name, int64_t r0, int64_t r1, const at::Tensor& out, bool defer) {
    const Entry& e = entries_.at(name);
    for (const Piece& p : e.pieces) {
      const int64_t lo = std::max(r0, p.r0), hi = std::min(r1, p.r1);
      if (lo >= hi) continue;
      const SafetensorsFile& f = open(p.file);
      at::Tensor dest = out.narrow(0, lo - r0, hi - lo);
      if (p.c1 > p.c0) dest = dest.narrow(1, p.c0, p.c1 - p.c0);
      const TensorInfo& t = piece_info(f, name, p);
      if (defer && deferred_.add(f, t, p.r0, lo, hi, dest, files_[p.file])) continue;
      const Segment s = copy_mapped(f, t, p.r0, lo, hi, dest, checksums_);
      if (checksums_) read_[files_[p.file]].push_back(s);
    }
  }
  struct Piece {
    size_t file = 0;
    int64_t r0 = 0, r1 = 0;
    int64_t c0 = 0, c1 = 0;  // columns [c0, c1) of a tensor-parallel block; 0, 0: all of them
    uint64_t byte0 = 0;
  };
  struct Entry {
    StoredInfo info;
    std::vector<Piece> pieces;
  };
  const TensorInfo& piece_info(const SafetensorsFile& f, const std::string& name, const Piece& p) const {
    const TensorInfo* t = f.header().find(name);
    const bool block = p.c1 > p.c0;
    FSDP_CHECK(t != nullptr && f.header().data_start + t->begin == p.byte0 &&
                   (t->shape.empty() ? 1 : t->shape[0]) == p.r1 - p.r0 &&
                   (!block || (t->shape.size() >= 2 && t->shape[1] == p.c1 - p.c0)),
               "[ckpt] ", f.path(), " does not hold rows [", p.r0, ", ", p.r1, ") of ", name,
               " where index.json says; the checkpoint is corrupt");
    return *t;
  }
  const SafetensorsFile& open(size_t file) {
    auto& f = open_[file];
    if (!f) f = std::make_unique<SafetensorsFile>(path_in(dir_, files_[file]));
    return *f;
  }
  std::string dir_;
  std::vector<std::string> files_;
  std::map<std::string, Entry> entries_;
  std::map<size_t, std::unique_ptr<SafetensorsFile>> open_;
  // With checksums: the byte ranges read from each file (by name) and their CRC-32C.
  bool checksums_ = false;
  std::map<std::string, std::vector<Segment>> read_;
  DeferredReads deferred_;
};

// FULL_STATE_DICT (and any Hugging Face folder): whole tensors in the model files, and the AdamW
// state in optimizer.safetensors when there is one.
class FullSource final : public Source {
 public:
  explicit FullSource(const std::string& dir) : hf_(dir) {
    for (const auto& [name, where] : hf_.tensors()) add(*where.first, *where.second);
    if (file_exists(path_in(dir, kOptimizer))) {
      optimizer_ = std::make_unique<SafetensorsFile>(path_in(dir, kOptimizer));
      for (const TensorInfo& t : optimizer_->header().tensors) add(*optimizer_, t);
    }
  }
  // The folder's tensors under the model's names (FolderLayout::places): the left-out ones gone,
  // the prefixed ones renamed, a fused tensor read as its parts (rows of the stored tensor), a
  // stacked parameter from the tensors apart that make its rows.
  void apply(const model::FolderLayout& layout) {
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& [name, info] : infos_) shapes[name] = info.shape;
    std::map<std::string, StoredInfo> infos;
    std::map<std::string, Entry> entries;
    // Block FP8: a tensor's entry with its scales' (each part of a stacked one: its own).
    auto with_scales = [&](const std::string& stored) {
      Entry e = entries_.at(stored);
      if (const std::string scales = layout.fp8_scales(stored, shapes); !scales.empty()) {
        e.scales = std::make_shared<Entry>(entries_.at(scales));
        e.fp8_block = layout.fp8_block;
      }
      return e;
    };
    for (const auto& [mine, place] : layout.places(shapes)) {
      if (place.fp8) {
        infos[mine] = {Dtype::kF32, place.shape};  // its values: fp8 times fp32 scales
        entries[mine] = with_scales(place.stored);
        entries[mine].row0 += place.row0;
        entries[mine].computed = true;
        continue;
      }
      if (!place.scales.empty()) {  // MXFP4: its blocks' entry, and its scales'
        Entry e = entries_.at(place.stored);
        e.scales = std::make_shared<Entry>(entries_.at(place.scales));
        e.computed = true;
        infos[mine] = {Dtype::kBF16, place.shape};  // its values: e2m1 times powers of 2, exact in bf16
        entries[mine] = std::move(e);
        continue;
      }
      if (!place.stack.empty()) {
        Entry stacked;
        for (const std::vector<std::string>& row : place.stack) {
          stacked.stack.emplace_back();
          for (const std::string& part : row) {
            stacked.stack.back().push_back(with_scales(part));
            if (stacked.stack.back().back().scales)
              stacked.computed = true;
            else
              refuse_unscaled(part, layout);
          }
        }
        infos[mine] = {stacked.stack[0][0].scales ? Dtype::kF32 : infos_.at(place.stack[0][0]).dtype, place.shape};
        entries[mine] = std::move(stacked);
        continue;
      }
      infos[mine] = {infos_.at(place.stored).dtype, place.shape};
      refuse_unscaled(place.stored, layout);
      const Entry& e = entries_.at(place.stored);
      entries[mine] = {e.file, e.tensor, e.row0 + place.row0, {}, nullptr, {}, false};
    }
    infos_ = std::move(infos);
    entries_ = std::move(entries);
  }
  void files(const std::string& name, int64_t r0, int64_t r1, std::set<std::string>& out) const override {
    const Entry& e = entries_.at(name);
    if (e.scales) out.insert(base_name(e.scales->file->path()));
    if (e.stack.empty()) {
      out.insert(base_name(e.file->path()));
      return;
    }
    for (int64_t r = r0; r < r1; ++r)
      for (const Entry& part : e.stack[static_cast<size_t>(r)]) {
        out.insert(base_name(part.file->path()));
        if (part.scales) out.insert(base_name(part.scales->file->path()));
      }
  }
  at::Tensor rows(const std::string& name, int64_t r0, int64_t r1) override {
    const Entry& e = entries_.at(name);
    if (e.stack.empty()) return read(e, r0, r1, name);
    std::vector<at::Tensor> out;
    for (int64_t r = r0; r < r1; ++r) {
      std::vector<at::Tensor> parts;
      for (const Entry& part : e.stack[static_cast<size_t>(r)])
        parts.push_back(read(part, 0, part.tensor->shape.at(0), name));
      out.push_back(at::cat(parts, 0));
    }
    return at::stack(out, 0);
  }
  void read_rows_into(const std::string& name, int64_t r0, int64_t r1, const at::Tensor& out) override {
    const Entry& e = entries_.at(name);
    if (e.computed) {
      out.copy_(rows(name, r0, r1));
      return;
    }
    if (!e.stack.empty()) {  // each row's parts into its block, one after another
      for (int64_t r = r0; r < r1; ++r) {
        int64_t at_row = 0;
        for (const Entry& part : e.stack[static_cast<size_t>(r)]) {
          const int64_t n = part.tensor->shape.at(0);
          const at::Tensor dest = out[r - r0].narrow(0, at_row, n);
          at_row += n;
          if (deferred_.add(*part.file, *part.tensor, 0, 0, n, dest, base_name(part.file->path()))) continue;
          const Segment s = copy_mapped(*part.file, *part.tensor, 0, 0, n, dest, checksums_);
          if (checksums_) read_[base_name(part.file->path())].push_back(s);
        }
      }
      return;
    }
    r0 += e.row0;
    r1 += e.row0;
    if (deferred_.add(*e.file, *e.tensor, 0, r0, r1, out, base_name(e.file->path()))) return;
    const Segment s = copy_mapped(*e.file, *e.tensor, 0, r0, r1, out, checksums_);
    if (checksums_) read_[base_name(e.file->path())].push_back(s);
  }
  void start_reads() override { deferred_.start(); }
  void finish_reads() override { deferred_.finish(checksums_, read_); }
  bool checksum_while_reading(const std::string&, const std::set<std::string>&) override {
    checksums_ = true;  // every header was read and checked when the folder was opened
    return true;
  }
  std::string read_segments() const override { return segments_json(read_).dump(); }
  void add_read_segments(const std::string& other) override { add_segments(read_, other); }
  void verify_read(const std::string& dir, const std::set<std::string>& files) override {
    for (const std::string& name : files) check_recorded_crc(dir, name, joined_crc(*by_name_.at(name), read_[name]));
  }

 private:
  struct Entry {
    const SafetensorsFile* file = nullptr;
    const TensorInfo* tensor = nullptr;
    int64_t row0 = 0;  // a fused tensor's part: where its rows start in the stored tensor
    std::vector<std::vector<Entry>> stack;  // a stacked parameter: each row's stored tensors (file, tensor)
    std::shared_ptr<Entry> scales;          // an MXFP4 parameter (file, tensor: its blocks): its scales; block FP8: too
    std::vector<int64_t> fp8_block;         // block FP8: its block (empty: MXFP4 when there are scales)
    bool computed = false;                  // read through scales (its own or a stacked part's), never as stored
  };
  // An FP8 tensor without the scales its values are multiplied by is refused: read as it is, it would be wrong.
  void refuse_unscaled(const std::string& stored, const model::FolderLayout& layout) const {
    const Dtype d = infos_.at(stored).dtype;
    const bool fp8 =
        d == Dtype::kF8_E4M3 || d == Dtype::kF8_E5M2 || d == Dtype::kF8_E4M3FNUZ || d == Dtype::kF8_E5M2FNUZ;
    FSDP_CHECK(!fp8, "[ckpt] ", base_name(entries_.at(stored).file->path()), ": ", stored, " is ", dtype_name(d),
               layout.fp8_block.empty()
                   ? ", and config.json has no quantization_config {\"quant_method\": \"fp8\"} saying how to scale it"
                   : str(" without ", stored, "_scale_inv, the scales its values are multiplied by"),
               "; give the folder as it was published, or a bf16 copy of it");
  }
  // Rows [r0, r1) of one stored tensor (of a fused one: its part's), as fp32: dequantized when it has scales.
  static at::Tensor read(const Entry& e, int64_t r0, int64_t r1, const std::string& name) {
    if (e.scales && !e.fp8_block.empty())
      return dequantize_block_fp8(*e.file, *e.tensor, *e.scales->file, *e.scales->tensor, e.row0 + r0, e.row0 + r1,
                                  e.fp8_block);
    if (e.scales)
      return dequantize_mxfp4(mapped_rows(*e.file, *e.tensor, r0, r1),
                              mapped_rows(*e.scales->file, *e.scales->tensor, r0, r1), name);
    return read_rows_fp32(*e.file, *e.tensor, e.row0 + r0, e.row0 + r1);
  }
  bool checksums_ = false;
  std::map<std::string, std::vector<Segment>> read_;  // with checksums: by file name
  DeferredReads deferred_;
  std::map<std::string, const SafetensorsFile*> by_name_;
  void add(const SafetensorsFile& f, const TensorInfo& t) {
    infos_[t.name] = StoredInfo{t.dtype, t.shape};
    entries_[t.name] = {&f, &t, 0, {}, nullptr, {}};
    by_name_.emplace(base_name(f.path()), &f);
  }
  HfCheckpoint hf_;
  std::unique_ptr<SafetensorsFile> optimizer_;
  std::map<std::string, Entry> entries_;
};

}  // namespace

std::unique_ptr<Source> open_source(const std::string& dir) {
  if (file_exists(path_in(dir, kIndex))) return std::make_unique<ShardedSource>(dir);
  return std::make_unique<FullSource>(dir);
}

std::unique_ptr<Source> open_hf_source(const std::string& dir, const model::FolderLayout& layout) {
  auto src = std::make_unique<FullSource>(dir);
  src->apply(layout);
  return src;
}

std::vector<Slot> slots_of(const ShardedModel& model, const std::function<bool(const ShardedParam&)>& keep) {
  std::vector<Slot> out;
  for (size_t g = 0; g < model.groups().size(); ++g)
    for (size_t i = 0; i < model.groups()[g]->params().size(); ++i)
      if (!keep || keep(model.groups()[g]->params()[i]))
        out.push_back({g, i, &model.groups()[g]->params()[i], model.groups()[g]->mesh().expert_blocks});
  return out;
}

at::Tensor state_rows(const at::Tensor& flat, const ShardedParam& p) {
  std::vector<int64_t> shape = p.layout.shape;
  shape[0] = p.layout.chunk_rows();
  return flat.narrow(0, p.offset, p.layout.shard_numel()).view(shape);
}

std::pair<int64_t, int64_t> stored_rows(const ShardedParam& p) {
  if (!p.tp.split() || p.tp.dim != 0) return {p.layout.first_row(), p.layout.first_row() + p.layout.valid_rows()};
  // Split along rows: this tp rank's block starts further down the whole tensor, and rows past the
  // whole (the last blocks' padding) are nobody's.
  const int64_t block = p.layout.dim0(), offset = p.tp.start(block), valid = p.tp.valid(block);
  const int64_t first = std::min(p.layout.first_row(), valid), last = std::min(first + p.layout.valid_rows(), valid);
  return {offset + first, offset + last};
}

at::Tensor tp_block(const at::Tensor& rows, const ShardedParam& p) {
  if (!p.tp.split() || p.tp.dim == 0) return rows;
  const int64_t n = p.layout.shape[static_cast<size_t>(p.tp.dim)];
  return rows.narrow(p.tp.dim, p.tp.start(n), n);
}

std::string stored_name(const Source& src, const ShardedParam& p) {
  if (src.info(p.name)) return p.name;
  for (const std::string& a : p.aliases)
    if (src.info(a)) return a;
  return p.name;
}

void check_matches_model(const Source& src, const std::vector<Slot>& slots, bool optimizer, const std::string& where,
                         const std::string& hint) {
  std::map<std::string, std::vector<int64_t>> stored;
  for (const std::string& name : src.names()) stored[name] = src.info(name)->shape;
  std::vector<ExpectedTensor> expected;
  for (const Slot& s : slots) {
    const ShardedParam& p = *s.param;
    expected.push_back({p.name, p.full_shape(), p.aliases});
    if (optimizer && p.trainable)
      for (const char* prefix : {kExpAvg, kExpAvgSq}) expected.push_back({prefix + p.name, p.full_shape(), {}});
  }
  check_tensors_match(where, stored, expected, hint, optimizer ? "" : "optim.");
}

void fill(const std::vector<Slot>& slots, ShardedModel& model, optim::ShardedAdamW* adamw, Source* src,
          dist::ProcessGroup& world, bool efficient, bool direct_reads) {
  const c10::Device device = model.options().device;
  auto copy_rows = [&](const std::string& name, const ShardedParam& p, const at::Tensor& dest) {
    const auto [r0, r1] = stored_rows(p);
    const int64_t n = r1 - r0;  // the rows past them (FSDP's and tp's padding) stay zero
    if (!efficient || world.size() == 1) {
      if (n == 0) return;
      if (!p.tp.split() || p.tp.dim == 0)
        src->read_rows_into(name, r0, r1, dest.narrow(0, 0, n));
      else
        dest.narrow(0, 0, n).copy_(tp_block(src->rows(name, r0, r1), p));
      return;
    }
    const std::vector<int64_t> shape = p.full_shape();
    at::Tensor full = world.rank() == 0 ? src->rows(name, 0, shape[0]).to(device)
                                        : at::empty(shape, at::TensorOptions().dtype(at::kFloat).device(device));
    world.broadcast(full, 0, "load " + name).wait();
    if (n > 0) dest.narrow(0, 0, n).copy_(tp_block(full.narrow(0, r0, n), p));
  };
  c10::NoGradGuard no_grad;
  const bool own_rows = !efficient || world.size() == 1;  // this rank reads its rows itself
  if (own_rows && direct_reads) src->start_reads();
  for (const Slot& s : slots) {
    const ShardedParam& p = *s.param;
    const std::string name = stored_name(*src, p);
    copy_rows(name, p, p.sharded);
    if (adamw != nullptr && p.trainable) {
      auto& st = adamw->mutable_state()[s.group];
      copy_rows(kExpAvg + name, p, state_rows(st.exp_avg, p));
      copy_rows(kExpAvgSq + name, p, state_rows(st.exp_avg_sq, p));
    }
  }
  if (own_rows && direct_reads) src->finish_reads();
}

void agree(dist::ProcessGroup& world, const c10::Device& device, const std::string& failure, const std::string& what) {
  if (world.size() == 1) {
    if (!failure.empty()) throw InputError(failure);
    return;
  }
  at::Tensor flag = at::full({1}, failure.empty() ? 0 : 1, at::TensorOptions().dtype(at::kInt).device(device));
  world.all_reduce(flag, dist::ReduceOp::kSum, "agree on " + what).wait();  // the number of ranks that refused
  if (!failure.empty()) throw InputError(failure);
  if (flag.item<int>() != 0)
    throw InputError(str("[ckpt] another rank refused ", what, "; that rank's error says which file and why"));
}

}  // namespace fsdp::ckpt

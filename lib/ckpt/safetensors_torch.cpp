#include "ckpt/safetensors_torch.h"

#include <ATen/ATen.h>

#include <cstring>
#include <set>

#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

constexpr std::pair<at::ScalarType, Dtype> kMap[] = {
    {at::kBool, Dtype::kBool},
    {at::kByte, Dtype::kU8},
    {at::kChar, Dtype::kI8},
    {at::kShort, Dtype::kI16},
    {at::kUInt16, Dtype::kU16},
    {at::kInt, Dtype::kI32},
    {at::kUInt32, Dtype::kU32},
    {at::kLong, Dtype::kI64},
    {at::kUInt64, Dtype::kU64},
    {at::kHalf, Dtype::kF16},
    {at::kBFloat16, Dtype::kBF16},
    {at::kFloat, Dtype::kF32},
    {at::kDouble, Dtype::kF64},
    {at::kComplexFloat, Dtype::kC64},
    {at::kFloat8_e5m2, Dtype::kF8_E5M2},
    {at::kFloat8_e4m3fn, Dtype::kF8_E4M3},
    {at::kFloat8_e4m3fnuz, Dtype::kF8_E4M3FNUZ},
    {at::kFloat8_e5m2fnuz, Dtype::kF8_E5M2FNUZ},
};

}  // namespace

void append_tensor(SafetensorsWriter& out, const std::string& name, const at::Tensor& t) {
  FSDP_ASSERT(t.device().is_cpu(), "[ckpt] ", name, " is a ", t.device(),
              " tensor; the safetensors writer takes host memory only (copy it to the host first)");
  FSDP_ASSERT(t.is_contiguous(), "[ckpt] ", name, " is not contiguous; the writer takes its bytes in order");
  out.append(name, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
}

std::optional<Dtype> safetensors_dtype(at::ScalarType t) {
  for (const auto& [s, d] : kMap)
    if (s == t) return d;
  return std::nullopt;
}

at::ScalarType scalar_type_of(Dtype d, const std::string& what) {
  for (const auto& [s, dt] : kMap)
    if (dt == d) return s;
  throw InputError(str("[ckpt] ", what, ": dtype ", dtype_name(d), " has no LibTorch equivalent"));
}

at::Tensor read_tensor(const SafetensorsFile& file, const TensorInfo& info) {
  const at::ScalarType type = scalar_type_of(info.dtype, file.path() + ": " + info.name);
  at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(type));
  if (info.nbytes() > 0) std::memcpy(t.data_ptr(), file.data(info), info.nbytes());
  file.release(file.data(info), info.nbytes());  // the copy is what stays resident, not the mapped pages
  return t;
}

int64_t row_bytes(const TensorInfo& info) {
  const int64_t dim0 = info.shape.empty() ? 1 : info.shape[0];
  return dim0 == 0 ? 0 : static_cast<int64_t>(info.nbytes()) / dim0;
}

at::Tensor mapped_rows(const SafetensorsFile& file, const TensorInfo& info, int64_t r0, int64_t r1) {
  const at::ScalarType type = scalar_type_of(info.dtype, file.path() + ": " + info.name);
  const int64_t dim0 = info.shape.empty() ? 1 : info.shape[0];
  FSDP_ASSERT(0 <= r0 && r0 <= r1 && r1 <= dim0, "mapped_rows: rows [", r0, ", ", r1, ") of ", info.name);
  std::vector<int64_t> shape = info.shape;
  if (shape.empty()) shape.push_back(1);
  shape[0] = r1 - r0;
  if (r1 == r0) return at::empty(shape, at::TensorOptions().dtype(type));
  return at::from_blob(const_cast<uint8_t*>(file.data(info)) + r0 * row_bytes(info), shape,
                       at::TensorOptions().dtype(type));
}

at::Tensor read_rows_fp32(const SafetensorsFile& file, const TensorInfo& info, int64_t r0, int64_t r1) {
  at::Tensor rows = mapped_rows(file, info, r0, r1).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  // Read once: the mapped pages leave this process's memory (a resume of a 14 GiB shard otherwise kept
  // all of it resident, as the first GPU run's resume showed).
  file.release(file.data(info) + r0 * row_bytes(info), static_cast<size_t>((r1 - r0) * row_bytes(info)));
  return rows;
}

at::Tensor dequantize_mxfp4(const at::Tensor& blocks, const at::Tensor& scales, const std::string& what) {
  FSDP_CHECK(blocks.scalar_type() == at::kByte && scales.scalar_type() == at::kByte && blocks.dim() == 4 &&
                 blocks.size(3) == 16 && scales.sizes() == blocks.sizes().slice(0, 3),
             "[ckpt] ", what, ": MXFP4 blocks ", blocks.sizes(), " (", blocks.scalar_type(), ") and scales ",
             scales.sizes(), " (", scales.scalar_type(), ") are not (n, R, G, 16) and (n, R, G) bytes");
  // e2m1: sign, two exponent bits, one mantissa bit.
  static const float kValues[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const at::Tensor table = at::from_blob(const_cast<float*>(kValues), {16}, at::kFloat);
  const at::Tensor bytes = blocks.to(at::kLong);
  auto lookup = [&](const at::Tensor& index) { return table.index_select(0, index.reshape({-1})).view(index.sizes()); };
  const at::Tensor pairs = at::stack({lookup(bytes.bitwise_and(15)), lookup(bytes.bitwise_right_shift(4))}, -1);
  const int64_t n = blocks.size(0), r = blocks.size(1), g = blocks.size(2);
  const at::Tensor scale = at::exp2(scales.to(at::kFloat) - 127.0f).unsqueeze(-1);  // exact powers of 2
  return (pairs.reshape({n, r, g, 32}) * scale).reshape({n, r, g * 32}).transpose(1, 2).contiguous();
}

at::Tensor dequantize_block_fp8(const SafetensorsFile& file, const TensorInfo& values,
                                const SafetensorsFile& scales_file, const TensorInfo& scales, int64_t r0, int64_t r1,
                                const std::vector<int64_t>& block) {
  const std::vector<int64_t>& w = values.shape;
  const size_t n = w.size();
  std::vector<int64_t> grid(w.begin(), w.end());
  if (n >= 2 && block.size() == 2)
    for (size_t d : {n - 2, n - 1}) grid[d] = (w[d] + block[d + 2 - n] - 1) / block[d + 2 - n];
  const bool fp8 = values.dtype == Dtype::kF8_E4M3 || values.dtype == Dtype::kF8_E5M2;
  const bool float_scales = scales.dtype == Dtype::kF32 || scales.dtype == Dtype::kBF16 || scales.dtype == Dtype::kF16;
  FSDP_CHECK(block.size() == 2 && (n == 2 || n == 3) && fp8 && float_scales && scales.shape == grid, "[ckpt] ",
             file.path(), ": ", values.name, " (", dtype_name(values.dtype), " ", shape_text(values.shape), ") and ",
             scales.name, " (", dtype_name(scales.dtype), " ", shape_text(scales.shape),
             ") are not a block FP8 weight and its scales: an F8_E4M3 ",
             "or F8_E5M2 (R, C) or (E, R, C) tensor and a float one with a scale for each block of ", shape_text(block),
             " (quantization_config's weight_block_size), ", shape_text(grid), " here");
  const at::Tensor q = read_rows_fp32(file, values, r0, r1);
  if (r1 <= r0) return q;
  at::Tensor s;
  if (n == 3) {  // rows are experts: each its own grid
    s = read_rows_fp32(scales_file, scales, r0, r1);
  } else {  // the blocks holding rows [r0, r1), cut to them
    const int64_t b0 = r0 / block[0], b1 = (r1 - 1) / block[0] + 1;
    s = read_rows_fp32(scales_file, scales, b0, b1)
            .repeat_interleave(block[0], 0)
            .narrow(0, r0 - b0 * block[0], r1 - r0);
  }
  const int64_t row_dim = static_cast<int64_t>(n) - 2;
  if (n == 3) s = s.repeat_interleave(block[0], row_dim).narrow(row_dim, 0, w[1]);
  s = s.repeat_interleave(block[1], row_dim + 1).narrow(row_dim + 1, 0, w[n - 1]);
  return q * s;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> host;  // keeps the contiguous CPU copies alive while serializing
  std::vector<TensorBytes> entries;
  std::set<const void*> storages;
  for (const auto& [name, t] : tensors) {
    const auto d = safetensors_dtype(t.scalar_type());
    FSDP_CHECK(d, "[ckpt] ", name, ": dtype ", t.scalar_type(), " cannot be stored in safetensors");
    if (t.numel() > 0)
      FSDP_CHECK(storages.insert(t.storage().data()).second, "[ckpt] ", name,
                 " shares storage with another tensor; write a tied weight once");
    host.push_back(t.detach().to(at::kCPU).contiguous());
    entries.push_back(TensorBytes{name, *d, t.sizes().vec(), host.back().data_ptr(),
                                  static_cast<size_t>(host.back().numel()) * host.back().element_size()});
  }
  write_file_atomic(path, serialize_safetensors(entries, metadata));
}

std::vector<std::pair<std::string, at::Tensor>> load_safetensors(const std::string& path) {
  SafetensorsFile f(path);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const TensorInfo& t : f.header().tensors) out.emplace_back(t.name, read_tensor(f, t));
  return out;
}

}  // namespace fsdp::ckpt

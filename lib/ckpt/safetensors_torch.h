// safetensors files to and from LibTorch tensors (the format itself is ckpt/safetensors.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/safetensors.h"

namespace fsdp::ckpt {

std::optional<Dtype> safetensors_dtype(at::ScalarType t);  // none for types safetensors lacks
// Throws InputError naming `what` for a dtype LibTorch cannot hold (F4, F6_*, F8_E8M0, ...).
at::ScalarType scalar_type_of(Dtype d, const std::string& what);

// A copy of one tensor of a mapped file, as a CPU tensor of its dtype and shape.
at::Tensor read_tensor(const SafetensorsFile& file, const TensorInfo& info);

// Rows [r0, r1) of a mapped tensor (dim 0; a scalar is one row) as a tensor over the mapping itself
// (valid while `file` lives; copy out of it), and the bytes one row takes.
at::Tensor mapped_rows(const SafetensorsFile& file, const TensorInfo& info, int64_t r0, int64_t r1);
int64_t row_bytes(const TensorInfo& info);
// Rows [r0, r1) of a mapped tensor (dim 0; a scalar is one row), copied and converted to fp32.
at::Tensor read_rows_fp32(const SafetensorsFile& file, const TensorInfo& info, int64_t r0, int64_t r1);

// MXFP4 blocks (n, R, G, 16) and scales (n, R, G), both uint8 (model/config/description.h's
// FolderLayout::mxfp4), dequantized to fp32 (n, G * 32, R): value 2k of a block's byte its low nibble
// and 2k + 1 its high one, each an e2m1 number times 2^(scale - 127), then the last two dimensions
// transposed, as transformers' convert_moe_packed_tensors gives them. Throws InputError for other
// dtypes or shapes, naming `what`.
at::Tensor dequantize_mxfp4(const at::Tensor& blocks, const at::Tensor& scales, const std::string& what = "MXFP4");

// Rows [r0, r1) of a block FP8 tensor `values` (R, C) or (E, R, C) of `file`, e4m3 or e5m2, times their
// blocks' scales from `scales` of `scales_file`: (ceil(R / block[0]), ceil(C / block[1])) or (E, ...), any
// float dtype; a block at the end may be cut short. In fp32, each value times its scale, as transformers'
// Fp8Dequantize computes them (model/config/description.h's FolderLayout::fp8_block). Throws InputError
// naming both tensors for other dtypes or shapes.
at::Tensor dequantize_block_fp8(const SafetensorsFile& file, const TensorInfo& values,
                                const SafetensorsFile& scales_file, const TensorInfo& scales, int64_t r0, int64_t r1,
                                const std::vector<int64_t>& block);

// Appends a host tensor's bytes to `out` (SafetensorsWriter::append's order and size rules). The
// writer takes host memory only: a tensor on any other device (CUDA, meta) is refused, naming it, so
// a device pointer never reaches write(). Callers copy to the host one tensor at a time.
void append_tensor(SafetensorsWriter& out, const std::string& name, const at::Tensor& t);

// Writes `tensors` (CPU or not; made contiguous) to `path` atomically (temporary name, fsync,
// rename). Names must be distinct and tensors must not share storage (write a tied weight once).
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// Every tensor of a file, in data order.
std::vector<std::pair<std::string, at::Tensor>> load_safetensors(const std::string& path);

}  // namespace fsdp::ckpt

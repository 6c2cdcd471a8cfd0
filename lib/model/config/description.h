// ModelDescription: what the checkpoint layer (lib/ckpt) knows of a model, whatever its family: the
// tensors it saves and loads, how each is split across ranks, and the Hugging Face config.json to
// write beside them. model/ describes each family (model/config/hf_config.h: describe()); ckpt/ reads only
// this, so a new family, an adapter or a tensor-parallel layout changes model/ (and the engine),
// not ckpt/. Plain data; no LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::model {

struct ParamSpec {
  std::string name;                  // the Hugging Face name, "model.layers.3.mlp.up_proj.weight"
  std::vector<int64_t> shape;        // the full tensor's
  std::vector<std::string> aliases;  // other names it may be stored under (a tied head: "lm_head.weight")
};

// One tensor of a Hugging Face folder that holds several parameters' rows end to end (Phi-3's
// self_attn.qkv_proj.weight: q_proj's, k_proj's, v_proj's): read into them, written from them.
struct FusedTensor {
  std::string name;                                    // the stored name
  std::vector<std::pair<std::string, int64_t>> parts;  // each parameter's name and rows, in order
};

// One parameter (E, R, ...) that a Hugging Face folder holds as tensors apart: its row e is the
// tensors of rows[e] end to end (the Hub's Qwen3-MoE: experts.e.gate_proj.weight (I, C) and
// experts.e.up_proj.weight for experts.gate_up_proj's (2I, C)); a row's parts have equal rows. A
// folder may hold the parameter whole instead (transformers v5 can write either); exports write the
// tensors apart, as the Hub has them.
struct StackedTensor {
  std::string name;                             // the parameter's
  std::vector<std::vector<std::string>> rows;   // each row's stored tensors, in order
};

// How a Hugging Face folder holds the model's parameters where it differs from one tensor each under
// the parameter's name: Phi-3's fused projections; experts one by one; a Gemma3ForConditionalGeneration folder's text
// model under its own prefixes, beside a vision tower the model leaves out.
struct FolderLayout {
  std::vector<FusedTensor> fused;
  std::vector<StackedTensor> stacked;
  // (ours, stored): a stored name that starts with `stored` is ours with that start (first match).
  std::vector<std::pair<std::string, std::string>> prefixes;
  std::vector<std::string> left_out;  // stored names starting with one of these are not the model's
  // (ours, stored): a parameter the folder holds under another name, read and exported so (Mixtral's
  // mlp.gate.weight is block_sparse_moe.gate.weight).
  std::vector<std::pair<std::string, std::string>> renamed;
  // Parameters (E, K, R) a folder may hold in MXFP4, as gpt-oss's Hub checkpoints hold its experts:
  // NAME_blocks (E, R, K/32, 16) bytes, each two 4-bit e2m1 values (the low nibble first), and
  // NAME_scales (E, R, K/32) bytes, each block of 32 values times 2^(scale - 127); read dequantized
  // into (E, R, K) and transposed, as transformers dequantizes them. Exports write them whole.
  std::vector<std::string> mxfp4;
  // Block FP8, as DeepSeek-V3's and the Qwen *-FP8 Hub folders hold their projections (quantization_config
  // "fp8"): a stored tensor NAME (R, C) or (E, R, C), e4m3 or e5m2, with NAME_scale_inv beside it
  // (ceil(R / rows), ceil(C / columns)) or (E, ...), read as each value times its block's scale in fp32, as
  // transformers dequantizes them. These are its block's (rows, columns); empty: the folder holds none.
  std::vector<int64_t> fp8_block;
  // The scale tensor a block FP8 tensor's values are multiplied by ("" when the folder is not block FP8 or
  // `stored` has none): one rule for reading a folder (ckpt/sources.cpp) and checking it.
  std::string fp8_scales(const std::string& stored, const std::map<std::string, std::vector<int64_t>>& folder) const {
    if (fp8_block.empty()) return "";
    const std::string scales = stored + "_scale_inv";
    return folder.count(scales) ? scales : "";
  }
  // The model's name for a stored one ("" when left out).
  std::string ours(const std::string& stored) const {
    for (const std::string& p : left_out)
      if (stored.rfind(p, 0) == 0) return "";
    for (const auto& [mine, theirs] : renamed)
      if (stored == theirs) return mine;
    for (const auto& [mine, theirs] : prefixes)
      if (stored.rfind(theirs, 0) == 0) return mine + stored.substr(theirs.size());
    return stored;
  }
  // The name an export gives parameter `mine`.
  std::string stored_name(const std::string& mine) const {
    for (const auto& [ours, theirs] : renamed)
      if (mine == ours) return theirs;
    return mine;
  }
  // Where each tensor the model reads lies in a folder that stores `stored` (name -> shape): the
  // left-out ones gone, prefixed and renamed ones under the model's names (two spellings: the first
  // in name order), a fused tensor of its parts' rows read as its parts, one after another, unless
  // the parts are stored themselves or its rows differ, and a stacked parameter stored apart read
  // from its rows' tensors, unless it is stored whole or a part is missing (the checkpoint check
  // then names what differs). One rule for reading a folder (ckpt/sources.cpp) and checking it
  // (ckpt/hf.cpp).
  struct Place {
    std::string stored;          // the stored tensor's name
    int64_t row0 = 0;            // where this tensor's rows start in it
    std::vector<int64_t> shape;  // this tensor's
    // A stacked parameter read from tensors apart (stored then empty): row e is these stored
    // tensors, end to end.
    std::vector<std::vector<std::string>> stack;
    // An MXFP4 parameter: `stored` names its blocks, this its scales; block FP8 (fp8): its scale_inv tensor (""
    // otherwise).
    std::string scales;
    bool fp8 = false;
  };
  std::map<std::string, Place> places(const std::map<std::string, std::vector<int64_t>>& stored) const {
    std::map<std::string, Place> out;
    for (const auto& [name, shape] : stored)
      if (const std::string mine = ours(name); !mine.empty() && !out.count(mine)) out[mine] = {name, 0, shape, {}, ""};
    std::vector<std::string> scale_tensors;  // block FP8: each tensor read with its scales, which are not the model's
    for (auto& [mine, place] : out)
      if (const std::string scales = fp8_scales(place.stored, stored); !scales.empty()) {
        place.scales = scales;
        place.fp8 = true;
        scale_tensors.push_back(ours(scales));
      }
    for (const std::string& name : scale_tensors) out.erase(name);
    for (const FusedTensor& f : fused) {
      const auto it = out.find(f.name);
      if (it == out.end()) continue;
      int64_t rows = 0;
      bool apart = false;
      for (const auto& [part, n] : f.parts) {
        apart = apart || out.count(part) > 0;
        rows += n;
      }
      const Place whole = it->second;
      if (apart || whole.shape.empty() || whole.shape[0] != rows) continue;
      out.erase(it);
      int64_t row0 = 0;
      for (const auto& [part, n] : f.parts) {
        Place p = whole;
        p.row0 = row0;
        p.shape[0] = n;
        out[part] = p;
        row0 += n;
      }
    }
    for (const std::string& name : mxfp4) {  // stored whole: read as it is
      const auto blocks = out.find(name + "_blocks"), scales = out.find(name + "_scales");
      if (out.count(name) || blocks == out.end() || scales == out.end() || blocks->second.shape.size() != 4) continue;
      const std::vector<int64_t>& b = blocks->second.shape;  // (E, R, K/32, 16)
      Place p;
      p.stored = blocks->second.stored;
      p.scales = scales->second.stored;
      p.shape = {b[0], b[2] * b[3] * 2, b[1]};
      out.erase(blocks);
      out.erase(scales);
      out[name] = p;
    }
    for (const StackedTensor& s : stacked) {  // stored whole: read as it is
      if (out.count(s.name) || s.rows.empty()) continue;
      std::vector<int64_t> row_shape;
      std::vector<std::vector<std::string>> stored_rows;  // the stored tensors' own names
      bool whole = true;
      for (const std::vector<std::string>& row : s.rows) {
        int64_t n = 0;
        std::vector<int64_t> first;
        stored_rows.emplace_back();
        for (const std::string& name : row) {
          const auto it = out.find(name);
          if (it == out.end() || it->second.shape.empty() || it->second.row0 != 0) {
            whole = false;
            break;
          }
          if (first.empty()) first = it->second.shape;
          n += it->second.shape[0];
          stored_rows.back().push_back(it->second.stored);
        }
        if (!whole) break;
        first[0] = n;
        if (row_shape.empty()) row_shape = first;
        whole = whole && first == row_shape;  // rows of one shape, else the check names the parts
      }
      if (!whole) continue;
      Place p;
      p.shape = row_shape;
      p.shape.insert(p.shape.begin(), static_cast<int64_t>(s.rows.size()));
      p.stack = std::move(stored_rows);
      for (const std::vector<std::string>& row : s.rows)
        for (const std::string& name : row) out.erase(name);
      out[s.name] = p;
    }
    return out;
  }
};

// Whether the model computes parameter `name` in fp32 whatever the compute dtype: the engine holds and
// gathers it so (FsdpOptions::keep_in_fp32) and exports store it so, as transformers keeps it
// (_keep_in_fp32_modules_strict) and save_pretrained writes it. The sigmoid routers' stored, never
// trained e_score_correction_bias (DeepSeek-V3, GLM-4.5 and their kin), whose small differences
// between experts choose them.
inline bool kept_in_fp32(const std::string& name) {
  static const std::string suffix = ".e_score_correction_bias";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct ModelDescription {
  std::string architecture;  // "LlamaForCausalLM", for messages
  // The config.json a checkpoint or export writes (fp32 dtype), and that a stored one must equal,
  // after canonical_config, for a checkpoint to be this model's.
  std::string config_json;
  // The canonical text (as config_json) of a config.json file; throws InputError naming the file
  // when it is not a config of a family fsdptrain knows.
  std::function<std::string(const std::string& path)> canonical_config;
  int64_t num_parameters = 0;  // distinct parameters (a tied head counted once)
  // Every parameter, as the model registers them. Each is split over the FSDP shard group along its
  // dim 0 (fsdp/shard_layout.h).
  std::vector<ParamSpec> params;
  // How a Hugging Face folder it is read from holds them (exports: `fused` alone, the rest under
  // the parameters' names); checkpoints hold the parameters as they are.
  FolderLayout layout;
};

}  // namespace fsdp::model

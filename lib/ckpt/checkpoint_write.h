// Checkpoint write: a save's big files, from this rank's staged host copies (ckpt/checkpoint_stage.h)
// into the save's temporary folder (step-N.tmp), each fsynced and closed, with each file's size and
// CRC-32C for the manifest. Nothing here commits: ckpt/checkpoint_commit.h does, with what these
// return.
//
//   SHARDED   write_shard: this rank's shard file, its image written as the copies land.
//   FULL      write_full: every tensor gathered whole over Gloo groups of the writer's own and
//             written by shard rank 0 as a Hugging Face folder plus optimizer.safetensors; or, when
//             every shard rank runs on one machine, each rank's rows written in place.
//
// Runs on the writer thread (or in save() without background writes), reading only the staged
// copies, never the model. write_shard is not collective; write_full is collective over the
// FullWrite's host groups (every writing rank of the shard group, and of the tp group, calls it
// for the same save).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_plan.h"
#include "ckpt/checkpoint_stage.h"
#include "ckpt/file_system.h"
#include "ckpt/hf.h"
#include "dist/process_group.h"

namespace fsdp::ckpt {

// Writes this rank's shard file (shard_file_name of its file_index) into `tmp` from its staged
// image, 64 MiB at a time as the copies land; returns its report for the index and the manifest
// (file, bytes, crc32c, and every tensor's shape, rows, columns and byte range).
nlohmann::json write_shard(const ShardImage& image, Staging& staging, FileSystem& fs, const SaveRanks& ranks,
                           const std::string& tmp);

// What a FULL save's writing works with; the references must outlive write_full.
struct FullWrite {
  FileSystem& fs;
  Staging& staging;                                  // holds the slices' values
  dist::ProcessGroup& host_group;                    // Gloo over the shard group: the gathers
  std::optional<dist::ProcessGroup>& tp_host_group;  // and over the tp group, for tensor-parallel blocks
  // Expert parallel: Gloo over the experts' shard group and over the ep group, for the experts' slices.
  dist::ProcessGroup& expert_host_group;
  std::optional<dist::ProcessGroup>& ep_host_group;
  SaveRanks ranks;
  bool rows_in_place = false;  // may each rank write its own rows? (CheckpointOptions::full_rows_in_place, no tp)
  int64_t max_shard_bytes = 0;
  const std::string& config_json;
};

// What write_full wrote; `files` are those the committing rank (`commits`) lists in the manifest.
struct FullWritten {
  bool in_place = false;  // each rank wrote its own rows
  bool commits = false;   // this rank commits the folder (shard rank 0, tp rank 0)
  std::vector<WrittenFile> files;
};
// Writes the FULL save of `slices` (staged, in the order plan_full_slices gave) into `tmp`: gathers
// every slice in name order and, on shard rank 0, writes the Hugging Face folder and
// optimizer.safetensors; or, when rows_in_place allows and every shard rank runs on this machine,
// has each rank write its rows. `final_dir` names the save in the collectives' descriptions.
FullWritten write_full(const FullWrite& w, const std::vector<HostSlice>& slices, const std::string& tmp,
                       const std::string& final_dir);

}  // namespace fsdp::ckpt

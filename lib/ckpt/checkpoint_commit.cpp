#include "ckpt/checkpoint_commit.h"

#include <algorithm>
#include <utility>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/format.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::ckpt {

using json = nlohmann::json;

namespace {

// Deletes complete checkpoints beyond `keep` (oldest first) and folders of saves that never finished.
void prune(const CommitSite& site, const std::string& just_written) {
  FileSystem& fs = site.fs;
  const CheckpointOptions& options = site.options;
  for (const std::string& e : fs.list(options.dir))
    if (e.size() > 4 && e.compare(e.size() - 4, 4, ".tmp") == 0 && step_of(e.substr(0, e.size() - 4)))
      fs.remove_all(path_in(options.dir, e));
  if (options.keep <= 0) return;
  auto all = complete_checkpoints(options.dir, fs);
  const std::string best = options.keep_best ? best_checkpoint(options.dir, fs) : "";
  // The newest `keep`, and the best besides them when it is older (Trainer's rule: a best that is
  // also among the newest takes no second place).
  for (size_t i = 0; i + static_cast<size_t>(options.keep) < all.size(); ++i)
    if (all[i] != just_written && all[i] != best) {
      fs.remove_all(all[i]);
      site.say(str("[ckpt] removed ", all[i], " (checkpoint.keep: ", options.keep,
                   best.empty() ? "" : str("; the best by held-out loss, ", best, ", stays"), ")\n"));
    }
}

// index.json of a SHARDED save from its shard files' reports: every tensor's pieces, in order of
// (columns, rows), since under tensor parallel the files hold the blocks shard-major.
json sharded_index(const std::vector<json>& shard_reports) {
  json index = {{"format", "fsdptrain-sharded"}, {"version", kFormatVersion}, {"world_size", shard_reports.size()}};
  json files = json::array(), tensors = json::object();
  for (size_t k = 0; k < shard_reports.size(); ++k) {
    const json& r = shard_reports[k];
    files.push_back(r.at("file"));
    for (const auto& [name, t] : r.at("tensors").items()) {
      json& e = tensors[name];
      e["dtype"] = "F32";
      e["shape"] = t.at("shape");
      json piece = {{"file", k}, {"rows", t.at("rows")}, {"bytes", t.at("bytes")}};
      if (t.contains("cols")) piece["cols"] = t.at("cols");
      e["pieces"].push_back(piece);
    }
  }
  for (auto& [name, e] : tensors.items()) {
    auto key = [](const json& p) {
      return std::make_pair(p.contains("cols") ? p.at("cols").at(0).get<int64_t>() : 0,
                            p.at("rows").at(0).get<int64_t>());
    };
    std::vector<json> pieces(e.at("pieces").begin(), e.at("pieces").end());
    std::stable_sort(pieces.begin(), pieces.end(), [&](const json& a, const json& b) { return key(a) < key(b); });
    e["pieces"] = pieces;
  }
  index["files"] = files;
  index["tensors"] = tensors;
  return index;
}

}  // namespace

void make_room(const CommitSite& site, const std::string& final_dir, uint64_t needed) {
  const CheckpointOptions& options = site.options;
  if (site.fs.available_bytes(options.dir) >= needed) return;
  for (const std::string& old : removable_before_save(options.dir, options.keep, site.fs, options.keep_best)) {
    if (site.fs.available_bytes(options.dir) >= needed) return;
    site.fs.remove_all(old);
    site.say(str("[ckpt] removed ", old, " before saving ", final_dir, ": the disk is short and checkpoint.keep is ",
                 options.keep, "\n"));
  }
}

std::vector<json> collect_shard_reports(dist::Store& store, const std::string& name, json mine, int file_count,
                                        std::chrono::milliseconds timeout) {
  std::vector<json> reports{std::move(mine)};
  for (int k = 1; k < file_count; ++k) {
    const std::string key = str(name, "/shard", k);
    // A large shard on a slow disk takes long: wait the collective timeout (dist_timeout), at least
    // 30 minutes, then give up on this checkpoint (the previous one is untouched).
    const auto limit = std::max<std::chrono::milliseconds>(timeout, std::chrono::minutes(30));
    if (!store.wait_for({key}, limit))
      throw Error(str("[ckpt] shard rank ", k, " did not report its file of ", name, " within ",
                      std::chrono::duration_cast<std::chrono::seconds>(limit).count(),
                      " s; that checkpoint was not committed (the previous one is intact). Check that rank's "
                      "output and the file system"));
    reports.push_back(json::parse(store.get(key)));
  }
  return reports;
}

void commit_checkpoint(const CommitSite& site, const std::vector<json>& shard_reports, std::vector<WrittenFile> written,
                       const json& state, const std::string& config_json, const std::string& tmp,
                       const std::string& final_dir) {
  FileSystem& fs = site.fs;
  auto write = [&](const std::string& name, const std::string& text) {
    written.push_back({name, text.size(), write_whole_file(fs, path_in(tmp, name), text)});
  };
  if (!shard_reports.empty()) {
    for (const json& r : shard_reports)
      written.push_back({r.at("file").get<std::string>(), r.at("bytes").get<uint64_t>(),
                         static_cast<uint32_t>(std::stoul(r.at("crc32c").get<std::string>(), nullptr, 16))});
    write(kIndex, sharded_index(shard_reports).dump(1) + "\n");
    write(kConfig, config_json);
  }
  write(kState, state.dump(2) + "\n");
  json manifest = {{"format", "fsdptrain-manifest"}, {"version", kFormatVersion}, {"files", json::object()}};
  for (const WrittenFile& f : written) manifest["files"][f.name] = {{"bytes", f.bytes}, {"crc32c", crc_hex(f.crc32c)}};
  write_whole_file(fs, path_in(tmp, kManifest), manifest.dump(2) + "\n");
  fs.sync_dir(tmp);
  if (fs.exists(final_dir)) fs.remove_all(final_dir);  // an older run's checkpoint of the same step
  fs.rename(tmp, final_dir);
  fs.sync_dir(site.options.dir);
  prune(site, final_dir);
}

}  // namespace fsdp::ckpt

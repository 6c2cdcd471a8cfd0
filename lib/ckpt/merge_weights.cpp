#include "ckpt/merge_weights.h"

#include <algorithm>
#include <vector>

#include "ckpt/format.h"
#include "ckpt/hf.h"
#include "ckpt/sources.h"
#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::ckpt {

std::string merge_weights(const std::string& checkpoint, const std::string& out, int64_t max_shard_bytes,
                          std::ostream& log) {
  FileSystem& fs = local_file_system();
  std::string path = checkpoint;
  if (!file_exists(path_in(path, kManifest))) {
    path = latest_checkpoint(checkpoint, fs);
    FSDP_CHECK(!path.empty(), "[merge-weights] ", quoted(checkpoint),
               " is neither a checkpoint (a folder with manifest.json) nor a folder holding step-N checkpoints");
    log << "[merge-weights] the newest checkpoint in " << checkpoint << " is " << path << "\n";
  }
  FSDP_CHECK(!file_exists(out), "[merge-weights] ", quoted(out), " already exists; give a new output folder");
  verify_checkpoint(path);
  const std::string config_json = read_file(path_in(path, kConfig));  // the checkpoint's own, fp32
  auto src = open_source(path);
  std::vector<std::string> names;
  for (const std::string& n : src->names())
    if (n.rfind("optim.", 0) != 0) names.push_back(n);
  std::sort(names.begin(), names.end());

  std::vector<TensorSpec> specs;
  int64_t total = 0;
  for (const std::string& n : names) {
    specs.push_back({n, src->info(n)->shape});
    int64_t bytes = 4;
    for (int64_t d : specs.back().shape) bytes *= d;
    total += bytes;
  }
  const std::string tmp = out + ".tmp";
  fs.remove_all(tmp);
  fs.make_dirs(tmp);
  try {
    const auto written = write_hf_folder(
        specs, [&](size_t i) { return src->rows(specs[i].name, 0, specs[i].shape.empty() ? 1 : specs[i].shape[0]); },
        /*writer=*/true, config_json, tmp, max_shard_bytes, fs);
    for (const WrittenFile& f : written)
      log << "[merge-weights] wrote " << f.name << " (" << format_bytes(f.bytes) << ")\n";
    fs.sync_dir(tmp);
    fs.rename(tmp, out);
  } catch (...) {
    fs.remove_all(tmp);  // a full disk leaves nothing behind
    throw;
  }
  log << "[merge-weights] " << out << ": a Hugging Face folder of " << names.size() << " tensors ("
      << format_bytes(total) << ") from " << path << "\n";
  return path;
}

}  // namespace fsdp::ckpt

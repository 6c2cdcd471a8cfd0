#include "util/hub_cache.h"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/strings.h"

namespace fsdp::hub {

namespace {

std::string set_env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string();
}

bool is_commit(const std::string& revision) {
  if (revision.size() != 40) return false;
  for (char c : revision)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

bool good_part(const std::string& p) {
  if (p.empty() || p.size() > 96) return false;
  for (char c : p)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
  const char first = p.front(), last = p.back();
  return first != '-' && first != '.' && last != '-' && last != '.' && p.find("--") == std::string::npos &&
         p.find("..") == std::string::npos;
}

// The commit a refs/ file names: its first line when that is 40 hexadecimal digits (huggingface_hub
// writes the hash alone), else "". A file larger than a hash and a newline is not read at all.
std::string commit_in_ref(const std::string& path) {
  if (!file_exists(path) || file_size(path) > 64) return "";
  const std::string commit = trim(read_file(path));
  return is_commit(commit) ? commit : "";
}

}  // namespace

bool is_revision(const std::string& revision) {
  if (is_commit(revision)) return true;
  if (revision.empty() || revision.size() > 200) return false;
  for (const std::string& part : split(revision, '/')) {
    if (part.empty() || part.front() == '.' || part.front() == '-') return false;
    for (char c : part)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
  }
  return true;
}

std::string bad_revision(const std::string& revision) {
  return str(excerpt(revision), " is not a revision: give a branch or tag name (letters, digits, '.', ",
             "'_', '-', parts joined by '/', as main or refs/convert/parquet) or a commit's 40 hexadecimal digits");
}

std::string cache_folder() {
  if (std::string v = set_env("HF_HUB_CACHE"); !v.empty()) return v;
  if (std::string v = set_env("HUGGINGFACE_HUB_CACHE"); !v.empty()) return v;  // its older name
  if (std::string v = set_env("HF_HOME"); !v.empty()) return v + "/hub";
  if (std::string v = set_env("XDG_CACHE_HOME"); !v.empty()) return v + "/huggingface/hub";
  return home_dir() + "/.cache/huggingface/hub";
}

bool is_repo_id(const std::string& name) {
  const std::vector<std::string> parts = split(name, '/');
  if (parts.empty() || parts.size() > 2) return false;
  for (const std::string& p : parts)
    if (!good_part(p)) return false;
  return true;
}

std::string repo_folder(RepoType type, const std::string& id) {
  std::string folder = type == RepoType::kModel ? "models--" : "datasets--";
  for (char c : id) folder += c == '/' ? std::string("--") : std::string(1, c);
  return cache_folder() + "/" + folder;
}

std::string find_snapshot(RepoType type, const std::string& id, const std::string& revision) {
  if (!is_repo_id(id)) return "";
  const std::string repo = repo_folder(type, id), rev = revision.empty() ? "main" : revision;
  if (!is_revision(rev)) return "";
  const std::string commit = is_commit(rev) ? rev : commit_in_ref(repo + "/refs/" + rev);
  if (commit.empty()) return "";
  const std::string snapshot = repo + "/snapshots/" + commit;
  return is_directory(snapshot) ? snapshot : "";
}

std::string not_cached(RepoType type, const std::string& id, const std::string& revision) {
  const bool dataset = type == RepoType::kDataset;
  const std::string rev = revision.empty() ? "main" : revision;
  if (!is_revision(rev)) return str(quoted(id), ": ", bad_revision(rev));
  const std::string repo = repo_folder(type, id);
  const std::string ref = repo + "/refs/" + rev;
  const std::string named = is_commit(rev) ? "" : commit_in_ref(ref);
  std::string where = !is_directory(repo) ? str("no folder ", repo)
                      : is_commit(rev)    ? str("no snapshots/", rev, " in ", repo)
                      : !named.empty() ? str("refs/", rev, " names commit ", named, " but ", repo, "/snapshots/", named,
                                             " is missing: an interrupted download")
                      : file_exists(ref) ? str(ref, " holds no commit hash: a damaged cache")
                                         : str("no refs/", rev, " in ", repo);
  return str(quoted(id), rev == "main" ? "" : " at revision " + rev, " is not in the Hugging Face cache (", where,
             "; the cache is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub). fsdptrain never "
             "downloads: fetch it where there is network with: hf download ",
             id, dataset ? " --repo-type dataset" : "", rev == "main" ? "" : " --revision " + rev,
             " (and point HF_HUB_CACHE or HF_HOME at the same cache here)");
}

std::string model_folder(const std::string& name, const std::string& revision) {
  if (name.empty() || is_directory(name) || !is_repo_id(name)) return name;
  const std::string snapshot = find_snapshot(RepoType::kModel, name, revision);
  return snapshot.empty() ? name : snapshot;
}

namespace {

bool is_data_file(const std::string& name) {
  for (const char* ext : {".parquet", ".arrow", ".jsonl", ".json", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst"})
    if (ends_with(name, ext)) return true;
  return false;
}

// Every data file under `root`, as a path relative to it, sorted; dot-files and dot-folders skipped.
void data_files_under(const std::string& root, const std::string& rel, std::vector<std::string>& out) {
  DIR* d = ::opendir((rel.empty() ? root : root + "/" + rel).c_str());
  if (!d) return;
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') names.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    const std::string r = rel.empty() ? n : rel + "/" + n;
    if (is_directory(root + "/" + r))
      data_files_under(root, r, out);
    else if (is_data_file(n) && n != "dataset_info.json" && n != "dataset_dict.json" && n != "state.json")
      out.push_back(r);
  }
}

// datasets' split keywords: a split is named by any of its words.
const std::vector<std::pair<std::string, std::vector<std::string>>> kSplitWords = {
    {"train", {"train", "training"}},
    {"validation", {"validation", "valid", "dev", "val"}},
    {"test", {"test", "testing", "eval", "evaluation"}}};

std::vector<std::string> words_of(const std::string& path) {
  std::vector<std::string> words;
  std::string w;
  for (char c : path + "/") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      w += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!w.empty()) {
      words.push_back(w);
      w.clear();
    }
  }
  return words;
}

// The split a file's path names ("" for none): a known split's word, or for other splits the word
// itself when it is the name asked for.
std::string split_of(const std::string& path, const std::string& asked) {
  const std::vector<std::string> words = words_of(path);
  for (const auto& [split, names] : kSplitWords)
    for (const std::string& n : names)
      if (std::find(words.begin(), words.end(), n) != words.end()) return split;
  if (std::find(words.begin(), words.end(), asked) != words.end()) return asked;
  return "";
}

std::string top_folder(const std::string& rel) {
  const size_t slash = rel.find('/');
  return slash == std::string::npos ? "" : rel.substr(0, slash);
}

std::string listed(const std::set<std::string>& names) {
  return join(std::vector<std::string>(names.begin(), names.end()), ", ");
}

}  // namespace

DatasetFiles dataset_files(const std::string& id, const std::string& config, const std::string& split,
                           const std::string& revision) {
  DatasetFiles out;
  if (!is_repo_id(id)) {
    out.error = str(quoted(id), " is not a Hub dataset id (ORG/NAME)");
    return out;
  }
  const std::string snapshot = find_snapshot(RepoType::kDataset, id, revision);
  if (snapshot.empty()) {
    out.error = not_cached(RepoType::kDataset, id, revision);
    return out;
  }
  std::vector<std::string> all;
  data_files_under(snapshot, "", all);
  // Configs: the top-level folders holding data, "data" (the Hub's single-config layout) aside.
  std::set<std::string> configs;
  for (const std::string& f : all)
    if (const std::string top = top_folder(f); !top.empty() && top != "data") configs.insert(top);
  std::string chosen = config;
  if (chosen.empty() && configs.size() > 1 && configs.count("default")) chosen = "default";
  if (!config.empty() && !configs.count(config)) {
    out.error =
        str(quoted(id), " has no config ", quoted(config), " in ", snapshot,
            configs.empty() ? " (it has one: leave data.config unset)" : " (its configs: " + listed(configs) + ")");
    return out;
  }
  if (chosen.empty() && configs.size() > 1) {
    out.error = str(quoted(id), " has several configs (", listed(configs), "); choose one with data.config");
    return out;
  }
  std::vector<std::string> candidates;  // relative to the config's folder, when there is one
  for (const std::string& f : all)
    if (chosen.empty() || top_folder(f) == chosen)
      candidates.push_back(chosen.empty() ? f : f.substr(chosen.size() + 1));
  const std::string base = chosen.empty() ? snapshot : snapshot + "/" + chosen;
  std::set<std::string> splits;
  for (const std::string& f : candidates) {
    const std::string s = split_of(f, split);
    if (!s.empty()) splits.insert(s);
    if (s == split) out.files.push_back(base + "/" + f);
  }
  if (out.files.empty() && splits.empty() && split == "train")  // no file names a split: all are train
    for (const std::string& f : candidates) out.files.push_back(base + "/" + f);
  if (out.files.empty() && candidates.empty())
    out.error = str(quoted(id), " holds no data files (.parquet, .arrow, .jsonl, .json) in ", base);
  else if (out.files.empty())
    out.error =
        str(quoted(id), chosen.empty() ? "" : " config " + fsdp::quoted(chosen), " has no split ", quoted(split),
            " (its splits: ", splits.empty() ? std::string("train") : listed(splits), "); set data.split");
  return out;
}

bool is_saved_dataset(const std::string& folder) {
  return file_exists(folder + "/state.json") || file_exists(folder + "/dataset_dict.json");
}

DatasetFiles saved_dataset_files(const std::string& folder, const std::string& split) {
  DatasetFiles out;
  if (file_exists(folder + "/dataset_dict.json")) {
    const nlohmann::json dict = read_json_file(folder + "/dataset_dict.json");
    std::vector<std::string> splits;
    if (dict.contains("splits") && dict["splits"].is_array())
      for (const auto& s : dict["splits"])
        if (s.is_string()) splits.push_back(s.get<std::string>());
    if (std::find(splits.begin(), splits.end(), split) == splits.end()) {
      out.error = str(folder, " (datasets' save_to_disk of a DatasetDict) has no split ", quoted(split),
                      " (its splits: ", join(splits, ", "), "); set data.split");
      return out;
    }
    return saved_dataset_files(folder + "/" + split, split);
  }
  const std::optional<nlohmann::json> state = try_read_json_file(folder + "/state.json");
  if (state && state->contains("_data_files") && (*state)["_data_files"].is_array())
    for (const auto& f : (*state)["_data_files"])
      if (f.is_object() && f.contains("filename") && f["filename"].is_string()) {
        const std::string name = f["filename"].get<std::string>();
        if (name.find('/') == std::string::npos && name.find("..") == std::string::npos)
          out.files.push_back(folder + "/" + name);
      }
  if (out.files.empty())
    out.error = str(folder, "/state.json (datasets' save_to_disk) lists no Arrow files; save the dataset again");
  for (const std::string& f : out.files)
    if (!file_exists(f)) {
      out.error = str(folder, "/state.json lists ", base_name(f), ", which is not there; the folder is incomplete");
      out.files.clear();
      break;
    }
  return out;
}

}  // namespace fsdp::hub

// The Hugging Face cache, read as huggingface_hub reads it offline, never the network: a
// repository ORG/NAME lives in <cache>/models--ORG--NAME (datasets--ORG--NAME for a dataset), a
// revision (a branch or tag) is the commit hash written in its refs/REVISION file, and the files of
// a commit are in snapshots/COMMIT/ (links into blobs/). The cache is $HF_HUB_CACHE, else
// $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub: where
// `hf download` puts what cluster users fetch ahead of time for nodes without network.
#pragma once

#include <string>
#include <vector>

namespace fsdp::hub {

enum class RepoType { kModel, kDataset };

std::string cache_folder();

// Whether `name` is spelled as a Hub repository id: NAME or ORG/NAME, letters, digits, '-', '_'
// and '.', neither part starting or ending with '-' or '.', no "--" or "..".
bool is_repo_id(const std::string& name);

// Whether `revision` is spelled as a Hub revision: a commit (40 hexadecimal digits) or a branch or
// tag name: parts of letters, digits, '.', '_' and '-' joined by '/' (refs/convert/parquet), none
// empty or starting with '.' or '-', 200 bytes at most. A file under refs/ is opened only for such
// a name, so no revision reaches outside the repository's folder.
bool is_revision(const std::string& revision);
// Why `revision` is not one, for the caller to put after the key or flag it came from:
// "\"../x\" is not a revision: give a branch or tag name ...".
std::string bad_revision(const std::string& revision);

// <cache>/models--ORG--NAME (or datasets--...).
std::string repo_folder(RepoType type, const std::string& id);

// The snapshot folder of `id` at `revision` (a branch or tag under refs/, or a commit hash); "" when
// the cache does not hold it.
std::string find_snapshot(RepoType type, const std::string& id, const std::string& revision);

// Why `id` at `revision` was not found, naming the folder looked in, and the command that fetches
// it ("... is not in the Hugging Face cache (looked in ...); fetch it where there is network with:
// hf download ...").
std::string not_cached(RepoType type, const std::string& id, const std::string& revision);

// A model given as a folder or as a Hub id, as transformers' from_pretrained finds it offline: the
// folder when one of that name exists (it wins), else the cached snapshot; else `name` as it is,
// for the caller to say it is missing (with not_cached when is_repo_id(name)).
std::string model_folder(const std::string& name, const std::string& revision = "main");

// The data files of a dataset, in order, or why there are none.
struct DatasetFiles {
  std::vector<std::string> files;
  std::string error;  // "" when files were found
};

// Split `split` of a dataset in the cache (revision: a branch, a tag such as refs/convert/parquet,
// or a commit). Its files are the data files (.parquet, .arrow, .jsonl, .json, compressed JSON) of
// the snapshot: under the folder named `config` when given (the Hub's layout for a dataset of several
// configs, and the refs/convert/parquet branch's CONFIG/SPLIT/ folders), those whose path names the
// split as datasets' default patterns do (train, training; validation, valid, dev, val; test,
// testing, eval, evaluation: a word of the path, such as data/train-00000-of-00003.parquet); a
// dataset whose files name no split at all is all train. The error names what there is instead.
DatasetFiles dataset_files(const std::string& id, const std::string& config, const std::string& split,
                           const std::string& revision);

// Whether `folder` was written by datasets' save_to_disk: a Dataset (state.json beside its Arrow
// files) or a DatasetDict (dataset_dict.json, a folder per split).
bool is_saved_dataset(const std::string& folder);
// Its Arrow files in order (a DatasetDict's split `split`), or why there are none.
DatasetFiles saved_dataset_files(const std::string& folder, const std::string& split);

}  // namespace fsdp::hub

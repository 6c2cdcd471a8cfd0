#include "util/hub_cache.h"

#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include "util/files.h"

using namespace fsdp;

namespace {

// A cache folder of its own, named by HF_HUB_CACHE while the test runs.
struct Cache {
  std::string root;
  Cache() {
    char name[] = "/tmp/fsdptrain-hub-cache-XXXXXX";
    root = ::mkdtemp(name);
    ::setenv("HF_HUB_CACHE", root.c_str(), 1);
  }
  ~Cache() {
    ::unsetenv("HF_HUB_CACHE");
    remove_tree(root);
  }
  std::string put(const std::string& repo, const std::string& commit, const std::string& rel) const {
    const std::string path = root + "/" + repo + "/snapshots/" + commit + "/" + rel;
    make_directories(parent_folder(path));
    write_file_atomic(path, "x");
    return path;
  }
  void ref(const std::string& repo, const std::string& revision, const std::string& commit) const {
    make_directories(parent_folder(root + "/" + repo + "/refs/" + revision));
    write_file_atomic(root + "/" + repo + "/refs/" + revision, commit + "\n");
  }
};

const std::string kCommit(40, 'a');

}  // namespace

TEST_CASE("Hub ids: ORG/NAME spelled as the Hub allows; anything else is a path") {
  CHECK(hub::is_repo_id("Qwen/Qwen2.5-0.5B-Instruct"));
  CHECK(hub::is_repo_id("gpt2"));
  CHECK(hub::is_repo_id("trl-lib/Capybara"));
  for (const char* path :
       {"/models/x", "./model", "runs/a/b", "../x", "a//b", "org/-x", "org/x.", "a--b/c", "a/b c", ""})
    CHECK_MESSAGE(!hub::is_repo_id(path), path);
}

TEST_CASE("the cache folder: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub") {
  ::unsetenv("HF_HUB_CACHE");
  ::unsetenv("HUGGINGFACE_HUB_CACHE");
  ::setenv("HF_HOME", "/data/hf", 1);
  CHECK(hub::cache_folder() == "/data/hf/hub");
  ::setenv("HF_HUB_CACHE", "/scratch/hub", 1);
  CHECK(hub::cache_folder() == "/scratch/hub");
  CHECK(hub::repo_folder(hub::RepoType::kDataset, "trl-lib/Capybara") == "/scratch/hub/datasets--trl-lib--Capybara");
  ::unsetenv("HF_HUB_CACHE");
  ::unsetenv("HF_HOME");
}

TEST_CASE("a model's snapshot through refs/REVISION, or by commit; a missing one names the fetch command") {
  Cache c;
  c.put("models--org--m", kCommit, "config.json");
  c.ref("models--org--m", "main", kCommit);
  const std::string snapshot = c.root + "/models--org--m/snapshots/" + kCommit;
  CHECK(hub::find_snapshot(hub::RepoType::kModel, "org/m", "main") == snapshot);
  CHECK(hub::find_snapshot(hub::RepoType::kModel, "org/m", kCommit) == snapshot);
  CHECK(hub::find_snapshot(hub::RepoType::kModel, "org/m", "v2").empty());
  CHECK(hub::model_folder("org/m") == snapshot);
  CHECK(hub::model_folder("org/absent") == "org/absent");
  const std::string why = hub::not_cached(hub::RepoType::kModel, "org/m", "v2");
  CHECK(why.find("no refs/v2 in " + c.root + "/models--org--m") != std::string::npos);
  CHECK(why.find("hf download org/m --revision v2") != std::string::npos);
  c.ref("models--org--m", "v3", std::string(40, 'f'));  // a ref whose snapshot never came
  CHECK(hub::find_snapshot(hub::RepoType::kModel, "org/m", "v3").empty());
  CHECK(hub::not_cached(hub::RepoType::kModel, "org/m", "v3").find("refs/v3 names commit " + std::string(40, 'f')) !=
        std::string::npos);
}

TEST_CASE("a dataset's files: the data/ layout, config folders, splits by their words") {
  Cache c;
  const std::string repo = "datasets--org--d";
  c.ref(repo, "main", kCommit);
  const std::string a = c.put(repo, kCommit, "chat/train-00000-of-00002.parquet");
  const std::string b = c.put(repo, kCommit, "chat/train-00001-of-00002.parquet");
  const std::string t = c.put(repo, kCommit, "chat/test-00000-of-00001.parquet");
  const std::string p = c.put(repo, kCommit, "pc/data.jsonl");
  c.put(repo, kCommit, "README.md");
  CHECK(hub::dataset_files("org/d", "chat", "train", "main").files == std::vector<std::string>{a, b});
  CHECK(hub::dataset_files("org/d", "chat", "test", "main").files == std::vector<std::string>{t});
  CHECK(hub::dataset_files("org/d", "pc", "train", "main").files == std::vector<std::string>{p});  // names no split
  CHECK(hub::dataset_files("org/d", "", "train", "main").error.find("several configs (chat, pc)") != std::string::npos);
  CHECK(hub::dataset_files("org/d", "chat", "validation", "main").error.find("its splits: test, train") !=
        std::string::npos);
  CHECK(hub::dataset_files("org/d", "x", "train", "main").error.find("its configs: chat, pc") != std::string::npos);
  // refs/convert/parquet: CONFIG/SPLIT/NNNN.parquet, its "default" config taken when none is named.
  const std::string converted(40, 'b');
  c.ref(repo, "refs/convert/parquet", converted);
  const std::string v = c.put(repo, converted, "default/validation/0000.parquet");
  c.put(repo, converted, "other/train/0000.parquet");
  CHECK(hub::dataset_files("org/d", "", "validation", "refs/convert/parquet").files == std::vector<std::string>{v});
}

// File helpers. Writes are whole or not at all: a temporary file beside the target (created new,
// never through a symbolic link), fsynced, then renamed, so a reader never sees half a file, a
// failed write (a full disk) leaves the previous version, and nothing fsdptrain writes lands where a
// planted link points.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp {

// Reads a whole file. Throws InputError naming the path and the OS reason when it cannot, or when
// it is not a regular file (a FIFO that would block, a device such as /dev/zero that never ends).
std::string read_file(const std::string& path);

bool file_exists(const std::string& path);
// Why `path` cannot be read as a file ("not found", "a folder, not a file", "not a regular file
// (a FIFO)", "a loop of symbolic links ...", "not readable (...)"); "" when it can.
std::string file_problem(const std::string& path);

// A file written whole or not at all: the bytes go to a temporary beside `path`; commit() fsyncs it
// and renames it over `path`. Destroyed without commit() (an error), the temporary is removed and
// `path` is untouched. Creates missing parent folders. Throws Error naming `path` and the OS reason
// (a full disk included) from the constructor, write() and commit(). One thread.
class OutputFile {
 public:
  explicit OutputFile(std::string path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  void write(std::string_view bytes);
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

// Writes `contents` to `path` as an OutputFile.
void write_file_atomic(const std::string& path, const std::string& contents);

// The path of `name`, a file a metadata file in `dir` names (a shard of an index, a weight_map
// entry), when the name stays inside `dir`: relative, no ".." step. The rule is on the name the file
// writes, not on where a link in the folder leads: the Hugging Face cache's snapshot folders hold
// links into ../../blobs/, which transformers follows and so do we.
// Throws InputError "WHERE names NAME, which is outside DIR; ..." otherwise.
std::string confined_path(const std::string& dir, const std::string& name, const std::string& where);

// Opens `path` for writing, creating it, without following a symbolic link (O_NOFOLLOW) and
// without truncating. Returns the fd; throws InputError naming the path when it is a link, or Error
// with the OS reason.
int open_no_follow(const std::string& path, const std::string& what);

// mkdir -p: creates `path` and its missing parents. Throws Error naming the folder and the OS
// reason. (Not std::filesystem: libtorch.so exports its own copies of those functions.)
void make_directories(const std::string& path);

// The folder of a file path ("a/b.yaml" -> "a", "b.yaml" -> ".", "/b" -> "/"), and its last part
// ("a/b.yaml" -> "b.yaml").
std::string parent_folder(const std::string& path);
std::string base_name(const std::string& path);

// The paths a file name or glob ("data/*.bin") names, sorted; empty when nothing matches.
std::vector<std::string> glob_paths(const std::string& pattern);
// A glob for the data files in `folder`: folder/*.EXT for the most common of .bin, .jsonl,
// .jsonl.gz, .jsonl.zst and .txt in it (.bin when it holds none), for "is a folder" hints.
std::string folder_glob(const std::string& folder);
bool is_directory(const std::string& path);

// `path` as an absolute path: its real path (links resolved) when it exists, else the working
// directory joined with it.
std::string absolute_path(const std::string& path);
// `path` with "." steps, repeated slashes and "dir/.." pairs removed, as text (no file system
// access): "/a/b/../c/./d" -> "/a/c/d".
std::string lexically_normal(const std::string& path);

// $HOME, or the password database's home folder when HOME is unset.
std::string home_dir();
// This machine's name ("localhost" when it has none).
std::string host_name();

// The size of a file in bytes; -1 when it does not exist.
int64_t file_size(const std::string& path);
// rm -rf: `path` and everything under it, without following links; no error when it is missing, and
// what cannot be removed is left.
void remove_tree(const std::string& path);

}  // namespace fsdp

// File helpers. Writes are atomic: a temporary file beside the target, fsynced, then renamed, so a
// reader never sees half a file and a crash never destroys the previous version.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp {

// Reads a whole file. Throws InputError naming the path and the OS reason when it cannot.
std::string read_file(const std::string& path);

bool file_exists(const std::string& path);
// Why `path` cannot be read as a file ("not found", "a folder, not a file", "a loop of symbolic
// links ...", "not readable (...)"); "" when it can.
std::string file_problem(const std::string& path);

// Writes `contents` to `path` atomically (temporary name, fsync, rename, fsync of the folder).
// Creates missing parent folders. Throws Error naming the path and the OS reason.
void write_file_atomic(const std::string& path, const std::string& contents);

// mkdir -p: creates `path` and its missing parents. Throws Error naming the folder and the OS
// reason. (Not std::filesystem: libtorch.so exports its own copies of those functions.)
void make_directories(const std::string& path);

// The folder of a file path ("a/b.yaml" -> "a", "b.yaml" -> ".", "/b" -> "/"), and its last part
// ("a/b.yaml" -> "b.yaml").
std::string parent_folder(const std::string& path);
std::string base_name(const std::string& path);

// The paths a file name or glob ("data/*.bin") names, sorted; empty when nothing matches.
std::vector<std::string> glob_paths(const std::string& pattern);
bool is_directory(const std::string& path);

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

// Collects config problems so all of them are reported at once, each on one line:
//   configs/x.yaml:14:3: fsdp_config.fsdp_reshard_after_forward: expected true or false, got "maybe"
// followed by " (hint: ...)" when a fix is known.
#pragma once

#include <string>
#include <vector>

namespace fsdp::config {

struct Origin;

struct Diagnostic {
  enum class Severity { kError, kWarning };
  Severity severity = Severity::kError;
  std::string location;  // "file:line:col", "--flag", "--set k=v", or "" (no single place)
  std::string key;       // dotted key, or "" when the problem is not about one key
  std::string message;
  std::string hint;

  std::string format() const;  // without the severity; callers print "error: " or "warning: "
};

class Diagnostics {
 public:
  void error(const std::string& location, const std::string& key, const std::string& message,
             const std::string& hint = "");
  void warning(const std::string& location, const std::string& key, const std::string& message,
               const std::string& hint = "");
  // Location taken from where the value came from (file position, flag, --set, or default).
  void error_at(const Origin& origin, const std::string& key, const std::string& message, const std::string& hint = "");
  void warning_at(const Origin& origin, const std::string& key, const std::string& message,
                  const std::string& hint = "");

  // Problems beyond the first kMaxListed of each severity are counted, not kept: a file of a
  // million unknown keys gets 50 lines and a count, not a million lines.
  static constexpr size_t kMaxListed = 50;
  bool full() const { return errors_ >= kMaxListed; }  // further errors are only counted

  const std::vector<Diagnostic>& all() const { return items_; }  // the listed ones
  size_t error_count() const { return errors_; }
  bool has_errors() const { return error_count() > 0; }
  bool has_error_for(const std::string& key) const;  // an error about this key was reported
  std::vector<std::string> errors() const;    // formatted, then "... and N more errors"
  std::vector<std::string> warnings() const;  // formatted, then "... and N more warnings"
  // Throws InputError whose message lists every error (one per line) when there is any.
  void throw_if_errors() const;

 private:
  std::vector<Diagnostic> items_;
  size_t errors_ = 0, warnings_ = 0;
};

std::string origin_location(const Origin& origin);

}  // namespace fsdp::config

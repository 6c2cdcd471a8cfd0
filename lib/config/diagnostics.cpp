#include "config/diagnostics.h"

#include "config/option.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::config {

std::string Diagnostic::format() const {
  std::string out;
  if (!location.empty()) out += location + ": ";
  if (!key.empty()) out += key + ": ";
  out += message;
  if (!hint.empty()) out += " (hint: " + hint + ")";
  return out;
}

std::string origin_location(const Origin& origin) {
  switch (origin.kind) {
    case OriginKind::kFile:
      return str(origin.mark.file, ":", origin.mark.line, ":", origin.mark.col);
    case OriginKind::kFlag:
    case OriginKind::kSet:
    case OriginKind::kScheduler:
      return origin.detail;
    case OriginKind::kDefault:
      return "(default)";
    case OriginKind::kDerived:
      return "(derived)";
  }
  return "";
}

std::string Origin::describe() const {
  switch (kind) {
    case OriginKind::kDefault:
      return "default";
    case OriginKind::kDerived:
      return "derived: " + detail;
    case OriginKind::kFile:  // detail: how a path in the file was read ("relative to configs/")
      return origin_location(*this) + (detail.empty() ? "" : " (" + detail + ")");
    default:
      return origin_location(*this);
  }
}

void Diagnostics::error(const std::string& location, const std::string& key, const std::string& message,
                        const std::string& hint) {
  items_.push_back({Diagnostic::Severity::kError, location, key, message, hint});
}

void Diagnostics::warning(const std::string& location, const std::string& key, const std::string& message,
                          const std::string& hint) {
  items_.push_back({Diagnostic::Severity::kWarning, location, key, message, hint});
}

void Diagnostics::error_at(const Origin& origin, const std::string& key, const std::string& message,
                           const std::string& hint) {
  error(origin_location(origin), key, message, hint);
}

void Diagnostics::warning_at(const Origin& origin, const std::string& key, const std::string& message,
                             const std::string& hint) {
  warning(origin_location(origin), key, message, hint);
}

size_t Diagnostics::error_count() const {
  size_t n = 0;
  for (const auto& d : items_) n += d.severity == Diagnostic::Severity::kError;
  return n;
}

bool Diagnostics::has_error_for(const std::string& key) const {
  for (const auto& d : items_)
    if (d.severity == Diagnostic::Severity::kError && d.key == key) return true;
  return false;
}

std::vector<std::string> Diagnostics::errors() const {
  std::vector<std::string> out;
  for (const auto& d : items_)
    if (d.severity == Diagnostic::Severity::kError) out.push_back(d.format());
  return out;
}

std::vector<std::string> Diagnostics::warnings() const {
  std::vector<std::string> out;
  for (const auto& d : items_)
    if (d.severity == Diagnostic::Severity::kWarning) out.push_back(d.format());
  return out;
}

void Diagnostics::throw_if_errors() const {
  auto errs = errors();
  if (errs.empty()) return;
  std::string msg = join(errs, "\n");
  if (errs.size() > 1) msg += str("\n", errs.size(), " errors in the config; nothing was started");
  throw InputError(msg);
}

}  // namespace fsdp::config

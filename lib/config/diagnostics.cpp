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
  if (errors_++ < kMaxListed) items_.push_back({Diagnostic::Severity::kError, location, key, message, hint});
}

void Diagnostics::warning(const std::string& location, const std::string& key, const std::string& message,
                          const std::string& hint) {
  if (warnings_++ < kMaxListed) items_.push_back({Diagnostic::Severity::kWarning, location, key, message, hint});
}

void Diagnostics::error_at(const Origin& origin, const std::string& key, const std::string& message,
                           const std::string& hint) {
  error(origin_location(origin), key, message, hint);
}

void Diagnostics::warning_at(const Origin& origin, const std::string& key, const std::string& message,
                             const std::string& hint) {
  warning(origin_location(origin), key, message, hint);
}


bool Diagnostics::has_error_for(const std::string& key) const {
  for (const auto& d : items_)
    if (d.severity == Diagnostic::Severity::kError && d.key == key) return true;
  return false;
}

namespace {

// (line, column) of a "file:line:col" location; problems with no line of their own sort after.
std::pair<long long, long long> position_of(const std::string& location) {
  const size_t c2 = location.rfind(':');
  const size_t c1 = c2 == std::string::npos || c2 == 0 ? std::string::npos : location.rfind(':', c2 - 1);
  if (c1 == std::string::npos) return {1LL << 60, 0};
  const auto line = parse_int(location.substr(c1 + 1, c2 - c1 - 1));
  const auto col = parse_int(location.substr(c2 + 1));
  if (!line || !col) return {1LL << 60, 0};
  return {*line, *col};
}

// The problems of one severity, formatted, in the order of the lines they are about.
std::vector<std::string> sorted_by_line(const std::vector<Diagnostic>& items, Diagnostic::Severity severity) {
  std::vector<const Diagnostic*> picked;
  for (const auto& d : items)
    if (d.severity == severity) picked.push_back(&d);
  std::stable_sort(picked.begin(), picked.end(), [](const Diagnostic* a, const Diagnostic* b) {
    return position_of(a->location) < position_of(b->location);
  });
  std::vector<std::string> out;
  for (const Diagnostic* d : picked) out.push_back(d->format());
  return out;
}

// "... and 3 more errors": what was counted but not listed.
void add_unlisted(std::vector<std::string>& lines, size_t total, const char* what) {
  if (total > lines.size())
    lines.push_back(str("... and ", plural(static_cast<long long>(total - lines.size()), str("more ", what)),
                        " (the first ", lines.size(), " are listed; fix those and run again)"));
}

}  // namespace

std::vector<std::string> Diagnostics::errors() const {
  std::vector<std::string> out = sorted_by_line(items_, Diagnostic::Severity::kError);
  add_unlisted(out, errors_, "error");
  return out;
}

std::vector<std::string> Diagnostics::warnings() const {
  std::vector<std::string> out = sorted_by_line(items_, Diagnostic::Severity::kWarning);
  add_unlisted(out, warnings_, "warning");
  return out;
}

void Diagnostics::throw_if_errors() const {
  auto errs = errors();
  if (errs.empty()) return;
  std::string msg = join(errs, "\n");
  if (errors_ > 1) msg += str("\n", errors_, " errors in the config; nothing was started");
  throw InputError(msg);
}

}  // namespace fsdp::config

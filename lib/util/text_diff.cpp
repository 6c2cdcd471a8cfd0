#include "util/text_diff.h"

#include <algorithm>
#include <vector>

#include "util/error.h"
#include "util/strings.h"

namespace fsdp {

std::string unified_diff(const std::string& before, const std::string& after, const std::string& before_name,
                         const std::string& after_name, int context) {
  if (before == after) return "";
  auto lines = [](const std::string& s) {
    std::vector<std::string> v = split(s, '\n');
    if (!v.empty() && v.back().empty()) v.pop_back();
    return v;
  };
  const std::vector<std::string> a = lines(before), b = lines(after);
  const size_t n = a.size(), m = b.size();
  // Longest common subsequence table (config files are small).
  std::vector<std::vector<int>> lcs(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = n; i-- > 0;)
    for (size_t j = m; j-- > 0;)
      lcs[i][j] = a[i] == b[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
  struct Op {
    char kind;  // ' ', '-', '+'
    size_t ai, bi;
  };
  std::vector<Op> ops;
  size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j])
      ops.push_back({' ', i++, j++});
    else if (i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]))
      ops.push_back({'-', i++, j});
    else
      ops.push_back({'+', i, j++});
  }
  std::string out = "--- " + before_name + "\n+++ " + after_name + "\n";
  size_t k = 0;
  while (k < ops.size()) {
    if (ops[k].kind == ' ') {
      ++k;
      continue;
    }
    // A hunk: from `context` lines before this change to `context` lines after the last change
    // that is within 2*context of the previous one.
    size_t start = k >= static_cast<size_t>(context) ? k - context : 0;
    size_t end = k;
    size_t last_change = k;
    while (end < ops.size()) {
      if (ops[end].kind != ' ') last_change = end;
      if (end - last_change > static_cast<size_t>(2 * context)) break;
      ++end;
    }
    end = std::min(ops.size(), last_change + context + 1);
    size_t a_start = ops[start].ai, b_start = ops[start].bi, a_len = 0, b_len = 0;
    std::string body;
    for (size_t x = start; x < end; ++x) {
      const Op& op = ops[x];
      if (op.kind != '+') ++a_len;
      if (op.kind != '-') ++b_len;
      body += op.kind;
      body += op.kind == '+' ? b[op.bi] : a[op.ai];
      body += "\n";
    }
    out += str("@@ -", a_start + (a_len ? 1 : 0), ",", a_len, " +", b_start + (b_len ? 1 : 0), ",", b_len, " @@\n");
    out += body;
    k = end;
  }
  return out;
}

}  // namespace fsdp

#include "tokenize/eos.h"

#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/strings.h"

namespace fsdp::tokenize {

using json = nlohmann::json;

std::vector<int32_t> eos_token_ids(const std::string& json_file) {
  const std::optional<json> found = try_read_json_file(json_file);
  if (!found || !found->is_object() || !found->contains("eos_token_id")) return {};
  const json& j = *found;
  const json& e = j["eos_token_id"];
  std::vector<int32_t> ids;
  for (const json& id : e.is_array() ? e : json::array({e}))
    if (id.is_number_integer()) ids.push_back(id.get<int32_t>());
  return ids;
}

int32_t eos_id(const std::string& path, const Tokenizer& tokenizer, const std::string& override_token) {
  auto id_of = [&](const std::string& token, const std::string& from) {
    const auto id = tokenizer.token_to_id(token);
    FSDP_CHECK(id.has_value(), "[tokenize] the EOS token ", quoted(token), " (", from, ") is not in the vocabulary");
    return *id;
  };
  if (!override_token.empty()) return id_of(override_token, "--eos");
  const std::string dir = is_directory(path) ? path : parent_folder(path);
  const std::string config = dir + "/tokenizer_config.json";
  if (const std::optional<json> j = try_read_json_file(config)) {
    if (j->is_object() && j->contains("eos_token")) {
      const json& e = (*j)["eos_token"];
      if (e.is_string()) return id_of(e.get<std::string>(), config);
      if (e.is_object() && e.contains("content")) return id_of(e["content"].get<std::string>(), config);
    }
  }
  const std::string model = dir + "/config.json";
  if (const std::vector<int32_t> ids = eos_token_ids(model); !ids.empty()) return ids.front();
  throw InputError(str("[tokenize] no EOS token: neither ", config, " (eos_token) nor ", model,
                       " (eos_token_id) names one; pass --eos TOKEN"));
}

}  // namespace fsdp::tokenize

// Which id ends a document: what a model folder's files say its EOS token is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenize/tokenizer.h"

namespace fsdp::tokenize {

// The eos_token_id of a config.json or generation_config.json (a number or a list); empty when the
// file or the field is missing.
std::vector<int32_t> eos_token_ids(const std::string& json_file);

// The EOS id of the tokenizer at `path` (a model folder or a tokenizer.json): `eos_token` of the
// tokenizer_config.json beside it, else `eos_token_id` of config.json. `override_token` wins when
// given. Throws InputError saying where it looked.
int32_t eos_id(const std::string& path, const Tokenizer& tokenizer, const std::string& override_token = "");

}  // namespace fsdp::tokenize

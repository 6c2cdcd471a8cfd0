// Environment variables: the one place fsdptrain's own switches (FSDPTRAIN_*) and the launcher's
// counts are read and checked. Errors name the variable and its value.
#pragma once

#include <string>

namespace fsdp {

// Whether `name` is set to exactly `value` (FSDPTRAIN_LAUNCHED=1 and such).
bool env_is(const char* name, const char* value);
// The variable's value; `fallback` when it is unset or empty.
std::string env_or(const char* name, const std::string& fallback);
// A count the launcher sets (RANK, LOCAL_RANK, MASTER_PORT, ...): a whole number >= 0; `fallback`
// when unset or empty. Throws InputError "[env] NAME="x" is not a whole number >= 0".
int env_count(const char* name, int fallback);
// debug: true (the launcher exports it as ACCELERATE_DEBUG_MODE) or FSDPTRAIN_DEBUG=1: LibTorch's
// backtraces in errors, and the cross-rank check of every collective.
bool debug_requested();

}  // namespace fsdp

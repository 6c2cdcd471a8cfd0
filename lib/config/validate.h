// Cross-key rules: what no single key can check alone (num_processes vs num_machines, FSDP1 keys
// in an FSDP2 config, NO_WRAP with activation checkpointing, ...). Every rule reports through
// Diagnostics at the position of the key that must change.
#pragma once

#include "config/diagnostics.h"

namespace fsdp::config {

struct ResolvedConfig;

void validate_config(const ResolvedConfig& rc, Diagnostics& diags);

}  // namespace fsdp::config

// A signal's name as messages print it: "SIGTERM", or "signal 70" for one glibc does not name.
#pragma once

#include <string>

namespace fsdp {

std::string signal_name(int sig);

}  // namespace fsdp

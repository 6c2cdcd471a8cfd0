// See README.md: only the names ProcessGroupGloo.hpp needs.
#pragma once

namespace gloo::transport {
class Device;         // held by shared_ptr only
class UnboundBuffer;  // held by unique_ptr only, inside classes whose members LibTorch defines
}  // namespace gloo::transport

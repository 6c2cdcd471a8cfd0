// Store's inside, for the backends that hand a c10d store to LibTorch (Gloo). Includes c10d.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dist/store.h"

namespace fsdp::dist {

struct Store::Impl {
  c10::intrusive_ptr<c10d::Store> root;      // the TCPStore connection
  c10::intrusive_ptr<c10d::Store> prefixed;  // root seen through options.prefix
  int port = 0;
};

}  // namespace fsdp::dist

// The CPU backend: LibTorch's own c10d ProcessGroupGloo over a Store.
#pragma once

#include <chrono>
#include <memory>

#include "dist/backend.h"
#include "dist/store.h"

namespace fsdp::dist {

// Collective: every rank calls it with the same store (prefix included) and size. Connects a full
// mesh over TCP through the store's host interface; throws naming the rank on failure.
std::shared_ptr<Backend> make_gloo_backend(const Store& store, int rank, int size, std::chrono::milliseconds timeout);

}  // namespace fsdp::dist

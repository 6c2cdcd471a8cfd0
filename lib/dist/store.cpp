#include "dist/store.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dist/store_impl.h"
#include "dist/torch_compat.h"
#include "util/error.h"

namespace fsdp::dist {

namespace {

std::string seconds(std::chrono::milliseconds ms) {
  return str(static_cast<double>(ms.count()) / 1000.0, " s");
}

c10::intrusive_ptr<c10d::Store> with_prefix_store(const c10::intrusive_ptr<c10d::Store>& root,
                                                  const std::string& prefix) {
  if (prefix.empty()) return root;
  return c10::make_intrusive<c10d::PrefixStore>(prefix, root);
}

}  // namespace

Store::Store(const StoreOptions& options) : options_(options) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(options.port);
  o.isServer = options.is_server;
  o.waitWorkers = false;
  o.timeout = options.timeout;
  o.useLibUV = false;  // the classic backend reports a taken port as a plain bind error
  auto impl = std::make_shared<Impl>();
  try {
    const QuietLibTorchLogs quiet;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(options.host, o);
    impl->port = tcp->getPort();
    impl->root = tcp;
  } catch (const std::exception& e) {
    std::string cause = brief_message(e);
    if (options.is_server)
      throw Error(str("[store] cannot serve the rendezvous on port ", options.port, ": ", cause,
                      "; is another run using it? Pick another with --main_process_port"));
    throw Error(str("[store] cannot reach the rendezvous at ", options.host, ":", options.port, " within ",
                    seconds(options.timeout), ": ", cause,
                    "; check --main_process_ip/--main_process_port and that machine 0's launcher is running"));
  }
  impl->prefixed = with_prefix_store(impl->root, options.prefix);
  impl_ = std::move(impl);
}

Store::Store(std::shared_ptr<Impl> impl, StoreOptions options) : impl_(std::move(impl)), options_(std::move(options)) {}

Store::~Store() = default;

Store Store::with_prefix(const std::string& more) const {
  StoreOptions o = options_;
  o.prefix += more;
  auto impl = std::make_shared<Impl>(*impl_);
  impl->prefixed = with_prefix_store(impl->root, o.prefix);
  return Store(std::move(impl), o);
}

std::unique_ptr<Store> Store::new_client(const std::string& more) const {
  StoreOptions o = options_;
  o.is_server = false;
  o.port = port();
  o.prefix += more;
  return std::make_unique<Store>(o);
}

void Store::set(const std::string& key, const std::string& value) {
  impl_->prefixed->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string Store::get(const std::string& key) {
  try {
    std::vector<uint8_t> v = impl_->prefixed->get(key);
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    throw Error(str("[store] waiting for key '", options_.prefix, key, "' failed: ", brief_message(e)));
  }
}

int64_t Store::add(const std::string& key, int64_t delta) {
  return impl_->prefixed->add(key, delta);
}

bool Store::check(const std::vector<std::string>& keys) {
  return impl_->prefixed->check(keys);
}

bool Store::wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  try {
    impl_->prefixed->wait(keys, timeout);
    return true;
  } catch (const c10::DistStoreError&) {  // the wait timed out
    return false;
  }
}

int Store::port() const {
  return impl_->port;
}

}  // namespace fsdp::dist

#include "dist/store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>
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

// Waits until a TCP connection to host:port opens, retrying until `timeout`: the whole wait of a
// client, so a launcher honours --rdzv_timeout (LibTorch's client, given the same timeout, took
// about twice as long to give up). False when it never opened.
bool wait_until_reachable(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  do {
    addrinfo* found = nullptr;
    if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) == 0) {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        const bool open = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
        ::close(fd);
        if (open) {
          ::freeaddrinfo(found);
          return true;
        }
      }
      ::freeaddrinfo(found);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

// A socket listening on 127.0.0.1:port only (port 0: a free one), for a server whose clients are all
// on this machine: TCPStore alone would listen on every interface, open to anyone who can reach
// the port. Returns the fd and sets *bound to the port; throws naming the port.
int listen_on_loopback(int port, int* bound) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FSDP_CHECK(fd >= 0, "[store] cannot open a socket: ", std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 1024) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(str("[store] cannot serve the rendezvous on 127.0.0.1:", port, ": ", std::strerror(err),
                    "; is another run using it? Pick another with --main_process_port"));
  }
  *bound = ntohs(addr.sin_port);
  return fd;
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
  const auto unreachable = [&](const std::string& cause) {
    return Error(str("[store] cannot reach the rendezvous at ", options.host, ":", options.port, " within ",
                     seconds(options.timeout), ": ", cause,
                     "; check --main_process_ip/--main_process_port and that machine 0's launcher is running"));
  };
  if (!options.is_server && !wait_until_reachable(options.host, options.port, options.timeout))
    throw unreachable("nothing accepted a connection there");
  if (options.is_server && options.loopback_only) {
    int bound = 0;
    o.masterListenFd = listen_on_loopback(options.port, &bound);
    o.port = static_cast<std::uint16_t>(bound);
  }
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
    throw unreachable(cause);
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

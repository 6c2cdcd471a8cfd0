// Store: the key-value rendezvous every process of a run meets at (LibTorch's c10d::TCPStore).
//
// One process serves (the launcher of machine 0, or rank 0 when a program is started without our
// launcher); every process, the server's own included, talks to it as a client. Keys are strings,
// values bytes. `prefix` namespaces every key, so each restart attempt of a run gets fresh keys.
//
// Thread safety: one Store may be used from one thread at a time; copies share the connection.
// Not collective: set/get/wait/add are point-to-point with the server.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::dist {

struct StoreOptions {
  std::string host = "127.0.0.1";
  int port = 29500;  // 0 with is_server: pick a free port (read it back with port())
  bool is_server = false;
  // A server whose clients are all on this machine listens on 127.0.0.1 only; otherwise on every
  // interface (c10d's TCPStore), which anyone who reaches the port can read and write: the store has
  // no authentication, so a run across machines belongs on a trusted network.
  bool loopback_only = false;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // connect and wait deadline
  std::string prefix;                                            // prepended to every key ("/worker/attempt_0/")
};

class Store {
 public:
  // Serves (is_server) or connects. Throws fsdp::Error naming host:port and the cause when the
  // port is taken (server) or the server cannot be reached within the timeout (client).
  explicit Store(const StoreOptions& options);
  ~Store();
  Store(const Store&) = default;
  Store& operator=(const Store&) = default;

  // The same connection with a longer prefix.
  Store with_prefix(const std::string& more) const;
  // A new connection (a client, also when this one serves) to the same server, with a longer
  // prefix: for another thread, since one connection serves one thread at a time.
  std::unique_ptr<Store> new_client(const std::string& more) const;

  void set(const std::string& key, const std::string& value);
  std::string get(const std::string& key);  // waits up to the timeout for the key
  int64_t add(const std::string& key, int64_t delta);
  bool check(const std::vector<std::string>& keys);  // all present now? never waits
  // Waits until every key exists; false (no throw) when `timeout` passes first.
  bool wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  int port() const;
  const StoreOptions& options() const { return options_; }

  // Defined in store_impl.h, for backends that build on c10d (Gloo): holds the c10d store with
  // this Store's prefix applied.
  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  Store(std::shared_ptr<Impl> impl, StoreOptions options);
  std::shared_ptr<Impl> impl_;
  StoreOptions options_;
};

}  // namespace fsdp::dist

#include "launch/rendezvous.h"

#include <unistd.h>

#include <thread>

#include "util/error.h"
#include "util/files.h"
#include "util/log.h"
#include "util/strings.h"

namespace fsdp::launch {

Rendezvous::Rendezvous(const Topology& topology, std::chrono::milliseconds timeout)
    : topology_(topology), timeout_(timeout) {
  port_ = topology.master_port;
  if (topology.machine_rank == 0) {
    dist::StoreOptions so;
    so.host = "127.0.0.1";  // the server's own connection
    so.port = port_;
    so.is_server = true;
    so.loopback_only = topology.num_machines == 1;  // other machines must reach it only when there are some
    so.timeout = timeout;
    try {
      server_.emplace(so);
    } catch (const Error& e) {
      if (topology.num_machines > 1)
        throw Error(str(e.what(), " (the same port on every machine; 0, any free port, works on one machine only)"));
      if (port_ == 0) throw;
      log_warn(str("[launch] port ", port_,
                   " is in use on this machine; using a free port instead "
                   "(choose one with --main_process_port)"));
      so.port = 0;
      server_.emplace(so);
    }
    port_ = server_->port();
  }
  if (server_) {
    client_.emplace(server_->with_prefix("/fsdptrain/"));
  } else {
    dist::StoreOptions co;
    co.host = topology.master_addr;
    co.port = port_;
    co.timeout = timeout;
    co.prefix = "/fsdptrain/";
    client_.emplace(co);
  }
  // Two launchers claiming one machine rank would start the same ranks twice.
  const int64_t claims = client_->add(str("claim/", topology.machine_rank), 1);
  FSDP_CHECK(claims == 1, "[launch] machine_rank ", topology.machine_rank,
             " is already taken by another launcher of this run; give each machine its own --machine_rank (0..",
             topology.num_machines - 1, ")");
  client_->set(str("machine/", topology.machine_rank), str(host_name(), " pid ", ::getpid(), " world ",
                                                           topology.world_size, " machines ", topology.num_machines));
}

void Rendezvous::wait_for_machines() {
  std::vector<std::string> keys;
  for (int m = 0; m < topology_.num_machines; ++m) keys.push_back(str("machine/", m));
  if (client_->wait_for(keys, timeout_)) {
    // Every launcher must agree on the world it starts.
    const std::string mine = client_->get(str("machine/", topology_.machine_rank));
    const std::string world = mine.substr(mine.find(" world "));
    for (int m = 0; m < topology_.num_machines; ++m) {
      const std::string theirs = client_->get(str("machine/", m));
      FSDP_CHECK(theirs.find(world) != std::string::npos, "[launch] machine ", m, " (", theirs,
                 ") disagrees with this machine about the world (", world.substr(1),
                 "); pass the same --num_processes and --num_machines to every launcher");
    }
    return;
  }
  std::vector<std::string> missing;
  for (int m = 0; m < topology_.num_machines; ++m)
    if (!client_->check({str("machine/", m)})) missing.push_back(std::to_string(m));
  throw Error(str("[launch] rendezvous timed out after ", static_cast<double>(timeout_.count()) / 1000.0,
                  " s: machine rank(s) ", join(missing, ", "), " of ", topology_.num_machines, " never arrived at ",
                  topology_.master_addr, ":", port_,
                  "; start `fsdptrain launch --machine_rank R` on every machine with the same --num_machines, "
                  "--main_process_ip and --main_process_port, or raise --rdzv_timeout"));
}

void Rendezvous::report_failure(int attempt, int exit_code, const std::string& description) {
  try {
    const std::string key = str("attempt/", attempt, "/failed");
    if (client_->add(str("attempt/", attempt, "/failures"), 1) == 1)
      client_->set(key, str(exit_code, "|", description));
  } catch (const std::exception&) {
    // Machine 0 is gone; the others notice on their own.
  }
}

std::optional<std::pair<int, std::string>> Rendezvous::failure(int attempt) {
  const std::string key = str("attempt/", attempt, "/failed");
  try {
    if (!client_->check({key})) return std::nullopt;
    const std::string v = client_->get(key);
    const size_t bar = v.find('|');
    return std::make_pair(static_cast<int>(parse_int(v.substr(0, bar)).value_or(1)), v.substr(bar + 1));
  } catch (const std::exception& e) {
    return std::make_pair(1, str("lost the rendezvous at ", topology_.master_addr, ":", port_,
                                 " (machine 0's launcher exited or is unreachable)"));
  }
}

void Rendezvous::report_done(int attempt) {
  try {
    client_->set(str("attempt/", attempt, "/done/", topology_.machine_rank), "1");
  } catch (const std::exception&) {
  }
}

bool Rendezvous::wait_until_all_done(int attempt, std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int m = 0; m < topology_.num_machines; ++m) keys.push_back(str("attempt/", attempt, "/done/", m));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (client_->check(keys)) return true;
    if (failure(attempt)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace fsdp::launch

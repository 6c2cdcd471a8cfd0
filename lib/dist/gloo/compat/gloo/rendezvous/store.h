// See README.md: only the names ProcessGroupGloo.hpp needs. ProcessGroupGloo::GlooStore derives
// from this interface and overrides these four members; fsdptrain never instantiates it.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo::rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace gloo::rendezvous

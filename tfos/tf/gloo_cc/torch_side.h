// What bridge.cc and reduction.cc (the PyTorch side of tfos's Gloo op) share: PyTorch's type for
// each TfosType code, the registry that hands Python a number for a group, and the reduction
// server's entry points that bridge.cc's Python module exposes.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tfos_gloo.h"

// PyTorch's type for each TfosType code.
inline constexpr at::ScalarType kTorchTypes[kTfosNumTypes] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                                               at::kInt,   at::kLong,   at::kChar, at::kByte};

// Whether every one of types[0..n) is a TfosType code; else err names the first that is not.
inline bool known_types(int n, const int* types, std::string* err) {
  for (int i = 0; i < n; ++i) {
    if (types[i] < 0 || types[i] >= kTfosNumTypes) {
      *err = "unknown dtype code " + std::to_string(types[i]);
      return false;
    }
  }
  return true;
}

// A flat buffer of count elements of TfosType `type` as a tensor (no copy).
inline at::Tensor blob(void* data, int64_t count, int type) {
  return at::from_blob(data, {count}, at::TensorOptions().dtype(kTorchTypes[type]));
}

// Objects Python holds by number (a handle): add gives the next one, find throws for one that is
// not (or no longer) here. Thread-safe; each registry starts its numbers elsewhere so that a
// handle of one kind is never taken for another.
template <class V>
class HandleRegistry {
 public:
  HandleRegistry(int64_t first, std::string what) : next_(first), what_(std::move(what)) {}

  int64_t add(V value) {
    std::lock_guard<std::mutex> lock(mu_);
    items_[next_] = std::move(value);
    return next_++;
  }

  void remove(int64_t handle) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.erase(handle);
  }

  V find(int64_t handle) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = items_.find(handle);
    if (it == items_.end()) throw std::runtime_error("no " + what_ + " " + std::to_string(handle) + " in this process (closed?)");
    return it->second;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<int64_t, V> items_;
  int64_t next_;
  std::string what_;
};

// reduction.cc: the reduction server on a group of workers (its first ranks) and reducers
int64_t rs_register(c10::intrusive_ptr<c10d::Backend> pg, int workers, std::vector<std::string> names);
void rs_unregister(int64_t handle);
std::string rs_serve(int64_t handle, int64_t step_timeout_ms, int lookahead);

// The torch side of tfos's Gloo op: a registry of Gloo process groups made in Python, and the
// all-reduce the TF kernel (op.cc) calls with its buffers, without Python and without the GIL.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

std::mutex groups_mu;
std::unordered_map<int64_t, c10::intrusive_ptr<c10d::Backend>> groups;
int64_t next_handle = 1;

int64_t add_group(c10::intrusive_ptr<c10d::Backend> pg) {
  std::lock_guard<std::mutex> lock(groups_mu);
  groups[next_handle] = std::move(pg);
  return next_handle++;
}

void remove_group(int64_t handle) {
  std::lock_guard<std::mutex> lock(groups_mu);
  groups.erase(handle);
}

// the dtype codes op.cc sends (the order of its type list)
const at::ScalarType kTypes[] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                 at::kInt,   at::kLong,   at::kChar, at::kByte};

void say(char* err, int errlen, const std::string& text) {
  std::snprintf(err, static_cast<size_t>(errlen), "%s", text.c_str());
}

}  // namespace

// Sums (or averages where average[i], dividing by the group's size) n buffers in place over the
// group's ranks. Every collective is issued before the first is waited for. A buffer of bytes >=
// 2 * piece_bytes goes as min(max_pieces, bytes / piece_bytes) collectives on its parts, which
// Gloo's threads run at once (tfos.tf.gloo.split_count, the same rule as the Python path;
// max_pieces is 1 from 3 ranks on: tfos.tf.gloo.max_pieces). A buffer with a copy_from[i] (an
// input TF keeps) is filled from it part by part, each part just before its collective is issued,
// so the copy overlaps the parts already travelling. Returns 0, or 1 with the error's text in err;
// either way no collective is left running on the buffers (the caller frees them).
extern "C" int tfos_gloo_allreduce(int64_t handle, int n, void* const* data, const void* const* copy_from,
                                   const int64_t* counts, const int* types, const bool* average,
                                   int64_t max_pieces, int64_t piece_bytes, char* err, int errlen) {
  constexpr int kNumTypes = static_cast<int>(sizeof(kTypes) / sizeof(kTypes[0]));
  for (int i = 0; i < n; ++i) {
    if (types[i] < 0 || types[i] >= kNumTypes) {
      say(err, errlen, "unknown dtype code " + std::to_string(types[i]));
      return 1;
    }
  }
  c10::intrusive_ptr<c10d::Backend> pg;
  {
    std::lock_guard<std::mutex> lock(groups_mu);
    auto it = groups.find(handle);
    if (it == groups.end()) {
      say(err, errlen, "no Gloo group " + std::to_string(handle) + " in this process (closed?)");
      return 1;
    }
    pg = it->second;
  }
  std::vector<at::Tensor> tensors(static_cast<size_t>(n));
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::string failure;
  try {
    for (int i = 0; i < n; ++i) {
      if (counts[i] == 0) continue;
      at::Tensor t = at::from_blob(data[i], {counts[i]}, at::TensorOptions().dtype(kTypes[types[i]]));
      tensors[i] = t;
      const int64_t item = t.element_size();
      const int64_t bytes = counts[i] * item;
      const int64_t pieces =
          std::max<int64_t>(1, std::min<int64_t>(max_pieces, piece_bytes > 0 ? bytes / piece_bytes : 1));
      const int64_t step = (counts[i] + pieces - 1) / pieces;
      for (int64_t off = 0; off < counts[i]; off += step) {
        const int64_t len = std::min(step, counts[i] - off);
        if (copy_from[i] != nullptr) {
          std::memcpy(static_cast<char*>(data[i]) + off * item, static_cast<const char*>(copy_from[i]) + off * item,
                      static_cast<size_t>(len * item));
        }
        std::vector<at::Tensor> part{t.narrow(0, off, len)};
        works.push_back(pg->allreduce(part));
      }
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  for (auto& w : works) {  // all of them, even after a failure: none may write into freed buffers
    try {
      w->wait();
    } catch (const std::exception& e) {
      if (failure.empty()) failure = e.what();
    }
  }
  if (!failure.empty()) {
    say(err, errlen, failure);
    return 1;
  }
  try {
    const int size = pg->getSize();
    for (int i = 0; i < n; ++i) {  // averaged once every collective is done (they compete for the cores)
      if (!average[i] || size <= 1 || !tensors[i].defined()) continue;
      if (at::isFloatingType(tensors[i].scalar_type())) {
        tensors[i].mul_(1.0 / size);
      } else {
        tensors[i].floor_divide_(size);
      }
    }
  } catch (const std::exception& e) {
    say(err, errlen, e.what());
    return 1;
  }
  return 0;
}

// reduction.cc: the reduction server on a group of workers and reducers
int64_t rs_register(c10::intrusive_ptr<c10d::Backend> pg, int workers, std::vector<std::string> names);
void rs_unregister(int64_t handle);
std::string rs_serve(int64_t handle, int64_t step_timeout_ms, int lookahead);

PYBIND11_MODULE(_tfos_gloo, m) {
  m.def("register", &add_group, "a handle for this Gloo group, for the TfosGlooAllReduce op");
  m.def("unregister", &remove_group);
  m.def("register_reduction", &rs_register,
        "a handle for a group of workers (its first ranks) and reducers, for the op's reduction-server all-reduce");
  m.def("unregister_reduction", &rs_unregister);
  m.def("serve", &rs_serve, py::call_guard<py::gil_scoped_release>(),
        "run this process's reducer until the workers leave (returns why); raises if an all-reduce fails");
}

// The torch side of tfos's Gloo op: a registry of Gloo process groups made in Python, and the
// all-reduce the TF kernel (op.cc) calls with its buffers, without Python and without the GIL.
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "torch_side.h"

namespace {

HandleRegistry<c10::intrusive_ptr<c10d::Backend>> groups(1, "Gloo group");

int64_t add_group(c10::intrusive_ptr<c10d::Backend> pg) { return groups.add(std::move(pg)); }

void remove_group(int64_t handle) { groups.remove(handle); }

// dst[j] = src[j] * scale on this thread (src may be dst): at::mul_ would wake PyTorch's OpenMP
// threads, which spin on the cores the TF process and Gloo need.
template <class T>
void scale_into(void* dst, const void* src, int64_t count, double scale) {
  const T s = static_cast<T>(scale);
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(src);
  for (int64_t j = 0; j < count; ++j) d[j] = x[j] * s;
}

void scale_into(int type, void* dst, const void* src, int64_t count, double scale) {
  if (type == kTfosFloat) {
    scale_into<float>(dst, src, count, scale);
  } else {
    scale_into<double>(dst, src, count, scale);
  }
}

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
// so the copy overlaps the parts already travelling. A float32/float64 buffer to average is scaled
// by 1/size on the way (in that copy, else in place, part by part before its collective): the mean
// costs no pass of its own after the sums, as Horovod's prescale; other types are divided after.
// Returns 0, or 1 with the error's text in err; either way no collective is left running on the
// buffers (the caller frees them).
int tfos_gloo_allreduce(int64_t handle, int n, void* const* data, const void* const* copy_from,
                        const int64_t* counts, const int* types, const bool* average, int64_t max_pieces,
                        int64_t piece_bytes, char* err, int errlen) {
  std::string failure;
  if (!known_types(n, types, &failure)) {
    say(err, errlen, failure);
    return 1;
  }
  c10::intrusive_ptr<c10d::Backend> pg;
  try {
    pg = groups.find(handle);
  } catch (const std::exception& e) {
    say(err, errlen, e.what());
    return 1;
  }
  std::vector<at::Tensor> tensors(static_cast<size_t>(n));
  std::vector<bool> prescaled(static_cast<size_t>(n), false);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  int size = 1;
  try {
    size = pg->getSize();
    const double scale = 1.0 / size;
    for (int i = 0; i < n; ++i) {
      if (counts[i] == 0) continue;
      at::Tensor t = blob(data[i], counts[i], types[i]);
      tensors[i] = t;
      const bool prescale = average[i] && size > 1 && (types[i] == kTfosFloat || types[i] == kTfosDouble);
      prescaled[i] = prescale;
      const int64_t item = t.element_size();
      const int64_t bytes = counts[i] * item;
      const int64_t pieces =
          std::max<int64_t>(1, std::min<int64_t>(max_pieces, piece_bytes > 0 ? bytes / piece_bytes : 1));
      const int64_t step = (counts[i] + pieces - 1) / pieces;
      for (int64_t off = 0; off < counts[i]; off += step) {
        const int64_t len = std::min(step, counts[i] - off);
        char* to = static_cast<char*>(data[i]) + off * item;
        const char* from = copy_from[i] != nullptr ? static_cast<const char*>(copy_from[i]) + off * item : to;
        if (prescale) {
          scale_into(types[i], to, from, len, scale);
        } else if (from != to) {
          std::memcpy(to, from, static_cast<size_t>(len * item));
        }
        std::vector<at::Tensor> parts{t.narrow(0, off, len)};
        works.push_back(pg->allreduce(parts));
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
    for (int i = 0; i < n; ++i) {  // the rest averaged once every collective is done
      if (!average[i] || prescaled[i] || size <= 1 || !tensors[i].defined()) continue;
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

PYBIND11_MODULE(_tfos_gloo, m) {
  m.def("register", &add_group, "a handle for this Gloo group, for the TfosGlooAllReduce op");
  m.def("unregister", &remove_group);
  m.def("register_reduction", &rs_register,
        "a handle for a group of workers (its first ranks) and reducers, for the op's reduction-server all-reduce");
  m.def("unregister_reduction", &rs_unregister);
  m.def("serve", &rs_serve, py::call_guard<py::gil_scoped_release>(),
        "run this process's reducer until the workers leave (returns why); raises if an all-reduce fails");
}

// What the three parts of tfos's Gloo op share, declared once: op.cc (built against TensorFlow's
// headers) calls the two all-reduces that bridge.cc and reduction.cc (built against PyTorch's)
// define, and passes each buffer's type as a TfosType code. Plain C++: no TensorFlow or PyTorch
// header is needed to include it.
#pragma once

#include <cstdint>

// The dtype codes of the op's T list, in its order (op.cc maps TensorFlow's types to them,
// torch_side.h maps them to PyTorch's).
enum TfosType : int {
  kTfosFloat = 0,
  kTfosDouble,
  kTfosHalf,
  kTfosBFloat16,
  kTfosInt32,
  kTfosInt64,
  kTfosInt8,
  kTfosUInt8,
  kTfosNumTypes
};

// Sums (or averages where average[i]) n buffers in place over a Gloo group (bridge.cc). Returns 0,
// or 1 with the error's text in err.
extern "C" int tfos_gloo_allreduce(int64_t handle, int n, void* const* data, const void* const* copy_from,
                                   const int64_t* counts, const int* types, const bool* average,
                                   int64_t max_pieces, int64_t piece_bytes, char* err, int errlen);

// The same through a reduction server's reducers (reduction.cc). Returns 0; 1 with err set; 2 with
// err set when transfers may still touch the buffers (the caller keeps them alive for good).
extern "C" int tfos_rs_allreduce(int64_t handle, int n, void* const* data, const void* const* copy_from,
                                 const int64_t* counts, const int* types, const bool* average, int64_t piece_bytes,
                                 int64_t timeout_ms, char* err, int errlen);

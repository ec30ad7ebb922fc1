// The TF side of tfos's Gloo op: TfosGlooAllReduce sums a list of tensors over a Gloo group
// (bridge.cc), reducing each in its own buffer when TF forwards it (nothing else reads it) and in
// a copy otherwise (made by the bridge part by part, overlapping the parts already travelling).
// With reduction_server set, the group is one of workers and reducers and the sums are made by the
// reducers (reduction.cc).
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

#include "tfos_gloo.h"

namespace {

using tensorflow::DataType;

// Buffers a failed reduction-server call may still have transfers on: kept for the process's life.
std::mutex quarantine_mu;
std::vector<tensorflow::Tensor>* quarantine = new std::vector<tensorflow::Tensor>();

int type_code(DataType t) {
  switch (t) {
    case tensorflow::DT_FLOAT: return kTfosFloat;
    case tensorflow::DT_DOUBLE: return kTfosDouble;
    case tensorflow::DT_HALF: return kTfosHalf;
    case tensorflow::DT_BFLOAT16: return kTfosBFloat16;
    case tensorflow::DT_INT32: return kTfosInt32;
    case tensorflow::DT_INT64: return kTfosInt64;
    case tensorflow::DT_INT8: return kTfosInt8;
    case tensorflow::DT_UINT8: return kTfosUInt8;
    default: return -1;
  }
}

class GlooAllReduceOp : public tensorflow::OpKernel {
 public:
  explicit GlooAllReduceOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("handle", &handle_));
    OP_REQUIRES_OK(c, c->GetAttr("average", &average_));
    OP_REQUIRES_OK(c, c->GetAttr("context", &context_));
    OP_REQUIRES_OK(c, c->GetAttr("max_pieces", &max_pieces_));
    OP_REQUIRES_OK(c, c->GetAttr("piece_bytes", &piece_bytes_));
    OP_REQUIRES_OK(c, c->GetAttr("reduction_server", &reduction_server_));
    OP_REQUIRES_OK(c, c->GetAttr("timeout_ms", &timeout_ms_));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const int n = ctx->num_inputs();
    OP_REQUIRES(ctx, static_cast<int>(average_.size()) == n,
                tensorflow::errors::InvalidArgument("average has ", average_.size(), " entries for ", n, " inputs"));
    std::vector<void*> data(n);
    std::vector<const void*> copy_from(n, nullptr);  // an input TF keeps: the bridge copies it part by part
    std::vector<int64_t> counts(n);
    std::vector<int> types(n);
    std::unique_ptr<bool[]> average(new bool[n]);
    std::vector<tensorflow::Tensor> held;  // inputs and outputs, for the quarantine
    for (int i = 0; i < n; ++i) {
      const tensorflow::Tensor& in = ctx->input(i);
      tensorflow::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({i}, i, in.shape(), &out));
      auto src = in.tensor_data();
      auto dst = out->tensor_data();
      if (dst.data() != src.data() && src.size()) copy_from[i] = src.data();
      data[i] = const_cast<char*>(dst.data());
      counts[i] = in.NumElements();
      types[i] = type_code(in.dtype());
      average[i] = average_[i];
      held.push_back(in);
      held.push_back(*out);
    }
    char err[4096];
    err[0] = '\0';
    const int rc =
        reduction_server_
            ? tfos_rs_allreduce(handle_, n, data.data(), copy_from.data(), counts.data(), types.data(), average.get(),
                                piece_bytes_, timeout_ms_, err, static_cast<int>(sizeof(err)))
            : tfos_gloo_allreduce(handle_, n, data.data(), copy_from.data(), counts.data(), types.data(),
                                  average.get(), max_pieces_, piece_bytes_, err, static_cast<int>(sizeof(err)));
    if (rc == 2) {  // transfers may still write into these buffers: TF must never reuse them
      std::lock_guard<std::mutex> lock(quarantine_mu);
      quarantine->insert(quarantine->end(), held.begin(), held.end());
    }
    OP_REQUIRES(ctx, rc == 0, tensorflow::errors::Internal(context_, ": ", err));
  }

 private:
  tensorflow::int64 handle_ = 0;
  std::vector<bool> average_;
  std::string context_;
  tensorflow::int64 max_pieces_ = 1;
  tensorflow::int64 piece_bytes_ = 0;
  bool reduction_server_ = false;
  tensorflow::int64 timeout_ms_ = 0;
};

}  // namespace

REGISTER_OP("TfosGlooAllReduce")
    .Input("inputs: T")
    .Output("outputs: T")
    .Attr("T: list({float, double, half, bfloat16, int32, int64, int8, uint8})")
    .Attr("handle: int")
    .Attr("average: list(bool)")
    .Attr("context: string = ''")
    .Attr("max_pieces: int = 1")
    .Attr("piece_bytes: int = 0")
    .Attr("reduction_server: bool = false")
    .Attr("timeout_ms: int = 0")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("TfosGlooAllReduce").Device(tensorflow::DEVICE_CPU), GlooAllReduceOp);

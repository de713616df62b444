// The fused element-wise steps as autograd functions; see fused_ops.h.
#include "worker/model/fused_ops.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#if RLHFD_HAVE_CUDA
#include <c10/core/DeviceGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "worker/model/layer_kernels.h"
#endif

namespace rlhfd::model {

#if RLHFD_HAVE_CUDA
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::ElementType ElementTypeOf(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return kernels::ElementType::kFloat32;
    case at::kBFloat16:
      return kernels::ElementType::kBFloat16;
    case at::kHalf:
      return kernels::ElementType::kFloat16;
    default:
      break;
  }
  TORCH_CHECK(false, "fused layer kernels: no kernel for ", type);
  return kernels::ElementType::kFloat32;
}

cudaStream_t StreamOf(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index());
}

// The kernels read every tensor on one CUDA device.
void CheckOnOneGpu(const char* what, std::initializer_list<at::Tensor> tensors) {
  const at::Device device = tensors.begin()->device();
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.is_cuda() && t.device() == device, what, ": every tensor on one CUDA device");
  }
}

class SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_in,
                            const at::Tensor& up_in, at::ScalarType out) {
    const c10::OptionalDeviceGuard device_guard(gate_in.device());
    const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
    at::Tensor result = at::empty(gate.sizes(), gate.options().dtype(out));
    kernels::SwiGluForward(gate.data_ptr(), up.data_ptr(), ElementTypeOf(gate.scalar_type()),
                           result.data_ptr(), ElementTypeOf(out), gate.numel(), StreamOf(gate));
    ctx->save_for_backward({gate, up});
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& gate = saved[0];
    const at::Tensor& up = saved[1];
    const c10::OptionalDeviceGuard device_guard(gate.device());
    const at::Tensor grad = grads[0].contiguous();
    at::Tensor grad_gate = at::empty_like(gate), grad_up = at::empty_like(up);
    kernels::SwiGluBackward(grad.data_ptr(), ElementTypeOf(grad.scalar_type()), gate.data_ptr(),
                            up.data_ptr(), ElementTypeOf(gate.scalar_type()), grad_gate.data_ptr(),
                            grad_up.data_ptr(), gate.numel(), StreamOf(gate));
    return {grad_gate, grad_up, at::Tensor()};
  }
};

// The norm's kernels for the two autograd functions below. Rows of x's last dimension.
int64_t RowsOf(const at::Tensor& x) { return x.size(-1) == 0 ? 0 : x.numel() / x.size(-1); }

struct NormOutputs {
  at::Tensor x, weight;  // the inputs as the kernel read them (contiguous), for the backward
  at::Tensor sum;        // x + delta, where a delta was added
  at::Tensor y, rstd;
};

NormOutputs NormForward(const at::Tensor& x_in, const at::Tensor& delta_in,
                        const at::Tensor& weight_in, double eps, at::ScalarType out) {
  const c10::OptionalDeviceGuard device_guard(x_in.device());
  NormOutputs result;
  result.x = x_in.contiguous();
  result.weight = weight_in.contiguous();
  const at::Tensor& x = result.x;
  result.y = at::empty(x.sizes(), x.options().dtype(out));
  std::vector<int64_t> rstd_shape = x.sizes().vec();
  rstd_shape.back() = 1;  // the shape ATen's fused norm keeps it in
  result.rstd = at::empty(rstd_shape, x.options());
  kernels::RmsNormInputs inputs{.x = x.data_ptr<float>(),
                                .weight = result.weight.data_ptr<float>(),
                                .rows = RowsOf(x),
                                .width = x.size(-1),
                                .eps = static_cast<float>(eps),
                                .y = result.y.data_ptr(),
                                .out_type = ElementTypeOf(out),
                                .rstd = result.rstd.data_ptr<float>()};
  at::Tensor delta;
  if (delta_in.defined()) {
    delta = delta_in.contiguous();
    result.sum = at::empty_like(x);
    inputs.delta = delta.data_ptr();
    inputs.delta_type = ElementTypeOf(delta.scalar_type());
    inputs.sum = result.sum.data_ptr<float>();
  }
  kernels::RmsNormRows(inputs, StreamOf(x));
  return result;
}

struct NormGradients {
  at::Tensor x, x_narrow, weight;
};

// `x` the normalised input (the sum, where the forward added); `through` a gradient reaching it
// by another path (undefined: none); `narrow` the dtype of a second copy of x's gradient.
NormGradients NormBackward(const at::Tensor& grad_in, const at::Tensor& x, const at::Tensor& weight,
                           const at::Tensor& rstd, const at::Tensor& through_in, bool want_x,
                           std::optional<at::ScalarType> narrow, bool want_weight) {
  const c10::OptionalDeviceGuard device_guard(x.device());
  const at::Tensor grad = grad_in.contiguous();  // read in its own dtype
  const int64_t rows = RowsOf(x), width = x.size(-1);
  const at::Tensor through =
      through_in.defined() ? through_in.to(at::kFloat).contiguous() : at::Tensor();
  NormGradients result;
  at::Tensor workspace;
  if (want_x) result.x = at::empty_like(x);
  if (narrow) result.x_narrow = at::empty(x.sizes(), x.options().dtype(*narrow));
  if (want_weight) {
    result.weight = at::empty_like(weight);
    workspace = at::empty({kernels::RmsNormBackwardWorkspace(rows, width)}, x.options());
  }
  const auto pointer = [](const at::Tensor& t) {
    return t.defined() ? t.data_ptr<float>() : nullptr;
  };
  kernels::RmsNormBackward(
      {.grad = grad.data_ptr(),
       .grad_type = ElementTypeOf(grad.scalar_type()),
       .x = x.data_ptr<float>(),
       .weight = weight.data_ptr<float>(),
       .rstd = rstd.data_ptr<float>(),
       .rows = rows,
       .width = width,
       .through = pointer(through),
       .grad_x = pointer(result.x),
       .grad_x_narrow = result.x_narrow.defined() ? result.x_narrow.data_ptr() : nullptr,
       .narrow_type = ElementTypeOf(narrow.value_or(at::kBFloat16)),
       .grad_weight = pointer(result.weight),
       .workspace = pointer(workspace)},
      StreamOf(x));
  return result;
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps, at::ScalarType out) {
    NormOutputs outputs = NormForward(x, at::Tensor(), weight, eps, out);
    ctx->save_for_backward({outputs.x, outputs.weight, outputs.rstd});
    return outputs.y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    NormGradients gradients =
        NormBackward(grads[0], saved[0], saved[1], saved[2], at::Tensor(), ctx->needs_input_grad(0),
                     std::nullopt, ctx->needs_input_grad(1));
    return {gradients.x, gradients.weight, at::Tensor(), at::Tensor()};
  }
};

// (x + delta, rms_norm(x + delta) · weight): the residual add and the next sublayer's norm.
class AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, double eps, at::ScalarType out) {
    NormOutputs outputs = NormForward(x, delta, weight, eps, out);
    ctx->save_for_backward({outputs.sum, outputs.weight, outputs.rstd});
    ctx->saved_data["delta_type"] = delta.scalar_type();
    return {outputs.sum, outputs.y};
  }

  // The sum's gradient (from the residual stream after it) passes through the add to both x and
  // delta, with the norm's; one kernel writes both (delta's in its own dtype).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::ScalarType delta_type = ctx->saved_data["delta_type"].toScalarType();
    NormGradients gradients =
        NormBackward(grads[1], saved[0], saved[1], saved[2], grads[0], ctx->needs_input_grad(0),
                     ctx->needs_input_grad(1) ? std::optional(delta_type) : std::nullopt,
                     ctx->needs_input_grad(2));
    return {gradients.x, gradients.x_narrow, gradients.weight, at::Tensor(), at::Tensor()};
  }
};

kernels::RopeShape RopeShapeOf(const at::Tensor& x, const at::Tensor& table) {
  kernels::RopeShape shape;
  shape.batch = x.size(0);
  shape.tokens = x.size(1);
  shape.heads = x.size(2);
  shape.dim = x.size(3);
  for (int i = 0; i < 3; ++i) shape.x_strides[i] = x.stride(i);
  for (int i = 0; i < 2; ++i) shape.table_strides[i] = table.stride(i);
  return shape;
}

// x with its last dimension contiguous (the kernels index the others by stride).
at::Tensor InnerContiguous(const at::Tensor& x) {
  return x.size(-1) <= 1 || x.stride(-1) == 1 ? x : x.contiguous();
}

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& cos_in,
                            const at::Tensor& sin_in, at::ScalarType out) {
    const c10::OptionalDeviceGuard device_guard(x_in.device());
    const at::Tensor x = InnerContiguous(x_in);
    // cos and sin share one layout for the kernel's strides.
    const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
    at::Tensor y = at::empty(x.sizes(), x.options().dtype(out));
    kernels::Rope(x.data_ptr(), ElementTypeOf(x.scalar_type()), cos.data_ptr<float>(),
                  sin.data_ptr<float>(), RopeShapeOf(x, cos), /*transposed=*/false, y.data_ptr(),
                  ElementTypeOf(out), StreamOf(x));
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["x_type"] = x.scalar_type();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& cos = saved[0];
    const at::Tensor& sin = saved[1];
    const c10::OptionalDeviceGuard device_guard(cos.device());
    const at::Tensor grad = InnerContiguous(grads[0]);
    at::Tensor grad_x =
        at::empty(grad.sizes(), grad.options().dtype(ctx->saved_data["x_type"].toScalarType()));
    kernels::Rope(grad.data_ptr(), ElementTypeOf(grad.scalar_type()), cos.data_ptr<float>(),
                  sin.data_ptr<float>(), RopeShapeOf(grad, cos), /*transposed=*/true,
                  grad_x.data_ptr(), ElementTypeOf(grad_x.scalar_type()), StreamOf(grad));
    return {grad_x, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool FusedOpsApply(const at::Device& device, at::ScalarType compute) {
  return device.is_cuda() && (compute == at::kBFloat16 || compute == at::kHalf);
}

at::Tensor FusedSwiGlu(const at::Tensor& gate, const at::Tensor& up, at::ScalarType out) {
  CheckOnOneGpu("FusedSwiGlu", {gate, up});
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
              "FusedSwiGlu: gate and up differ in shape or dtype");
  return SwiGluFunction::apply(gate, up, out);
}

at::Tensor FusedRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                        at::ScalarType out) {
  CheckOnOneGpu("FusedRmsNorm", {x, weight});
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "FusedRmsNorm: float32 input and weight");
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1),
              "FusedRmsNorm: weight ", weight.sizes(), " does not fit x ", x.sizes());
  return RmsNormFunction::apply(x, weight, eps, out);
}

std::pair<at::Tensor, at::Tensor> FusedAddRmsNorm(const at::Tensor& x, const at::Tensor& delta,
                                                  const at::Tensor& weight, double eps,
                                                  at::ScalarType out) {
  CheckOnOneGpu("FusedAddRmsNorm", {x, delta, weight});
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "FusedAddRmsNorm: float32 x and weight");
  TORCH_CHECK(x.sizes() == delta.sizes() && x.dim() >= 1 && weight.dim() == 1 &&
                  weight.size(0) == x.size(-1),
              "FusedAddRmsNorm: x ", x.sizes(), ", delta ", delta.sizes(), " and weight ",
              weight.sizes(), " do not fit");
  ElementTypeOf(delta.scalar_type());  // refuses a dtype the kernels do not read
  variable_list outputs = AddRmsNormFunction::apply(x, delta, weight, eps, out);
  return {outputs[0], outputs[1]};
}

at::Tensor FusedRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     at::ScalarType out) {
  CheckOnOneGpu("FusedRope", {x, cos, sin});
  TORCH_CHECK(x.dim() == 4 && cos.dim() == 3 && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat && cos.sizes() == sin.sizes() &&
                  !cos.requires_grad() && !sin.requires_grad(),
              "FusedRope: x (B, T, H, D) and constant float32 cos/sin (B, T, D)");
  TORCH_CHECK(cos.size(0) == x.size(0) && cos.size(1) == x.size(1) && cos.size(2) == x.size(3) &&
                  x.size(3) % 2 == 0,
              "FusedRope: cos/sin ", cos.sizes(), " do not fit x ", x.sizes());
  return RopeFunction::apply(x, cos, sin, out);
}

#else  // built without CUDA: nothing applies.

bool FusedOpsApply(const at::Device&, at::ScalarType) { return false; }

at::Tensor FusedSwiGlu(const at::Tensor&, const at::Tensor&, at::ScalarType) {
  TORCH_CHECK(false, "FusedSwiGlu: built without CUDA");
  return {};
}

at::Tensor FusedRmsNorm(const at::Tensor&, const at::Tensor&, double, at::ScalarType) {
  TORCH_CHECK(false, "FusedRmsNorm: built without CUDA");
  return {};
}

std::pair<at::Tensor, at::Tensor> FusedAddRmsNorm(const at::Tensor&, const at::Tensor&,
                                                  const at::Tensor&, double, at::ScalarType) {
  TORCH_CHECK(false, "FusedAddRmsNorm: built without CUDA");
  return {};
}

at::Tensor FusedRope(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::ScalarType) {
  TORCH_CHECK(false, "FusedRope: built without CUDA");
  return {};
}

#endif

}  // namespace rlhfd::model

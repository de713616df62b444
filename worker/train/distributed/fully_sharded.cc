#include "worker/train/distributed/fully_sharded.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "worker/train/distributed/replicated_model.h"
#include "worker/train/finite_check.h"

namespace rlhfd::train {

struct FullyShardedModel::Unit {
  std::vector<at::Tensor> params;  // The module's tensors; emptied between uses.
  std::vector<std::vector<int64_t>> shapes;
  at::TensorOptions param_options;
  int64_t total = 0, shard_size = 0;
  at::Tensor master;  // This rank's shard (padded flat), wide dtype.
  parallel::Communicator* group = nullptr;
  absl::Status* failure = nullptr;  // The model's first failure (see RecordFailure).

  // Keeps the first failure of a collective inside autograd, which must not throw: a peer's
  // failure is a Status for FinishStep / TakeStatus, never an exception through the engine.
  bool Failed(const absl::Status& status) {
    if (status.ok()) return false;
    if (failure->ok()) {
      RLOG(WARNING) << "fully sharded step failed inside autograd: " << status;
      *failure = status;
    }
    return true;
  }

  void Init(std::vector<at::Tensor> tensors, parallel::Communicator& communicator,
            absl::Status* first) {
    group = &communicator;
    failure = first;
    params = std::move(tensors);
    param_options = params.front().options();
    std::vector<at::Tensor> flat;
    for (const at::Tensor& p : params) {
      shapes.push_back(p.sizes().vec());
      flat.push_back(p.detach().reshape({-1}));
      total += p.numel();
    }
    const at::ScalarType wide = param_options.dtype() == at::kDouble ? at::kDouble : at::kFloat;
    shard_size = (total + group->size() - 1) / group->size();
    at::Tensor padded = at::zeros({shard_size * group->size()}, param_options.dtype(wide));
    padded.narrow(0, 0, total).copy_(at::cat(flat));
    master = padded.narrow(0, group->rank() * shard_size, shard_size).clone();
    Release();
  }

  // Materialises the full parameters (in their own dtype) from every rank's shard.
  absl::Status Gather() {
    at::NoGradGuard no_grad;
    at::Tensor full = at::empty({shard_size * group->size()}, param_options);
    RETURN_IF_ERROR(group->AllGather(master.to(param_options.dtype()), full));
    int64_t offset = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : shapes[i]) n *= d;
      params[i].set_data(full.narrow(0, offset, n).view(shapes[i]));
      offset += n;
    }
    return absl::OkStatus();
  }

  // Frees the full parameters and their gradients.
  void Release() {
    at::NoGradGuard no_grad;
    for (at::Tensor& p : params) {
      p.set_data(at::empty({0}, param_options));
      p.mutable_grad() = at::Tensor();
    }
  }

  // Averages the full gradients over the group into master's gradient (accumulating), then
  // frees them.
  absl::Status ScatterGradients() {
    at::NoGradGuard no_grad;
    at::Tensor flat = at::zeros({shard_size * group->size()}, master.options());
    int64_t offset = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t n = params[i].numel();
      if (params[i].grad().defined()) {
        flat.narrow(0, offset, n).copy_(params[i].grad().reshape({-1}));
      }
      offset += n;
    }
    at::Tensor shard = at::empty({shard_size}, master.options());
    RETURN_IF_ERROR(group->ReduceScatter(flat, shard, parallel::ReduceOp::kAvg));
    if (master.grad().defined()) {
      master.mutable_grad().add_(shard);
    } else {
      master.mutable_grad() = shard;
    }
    return absl::OkStatus();
  }
};

namespace {

// A decoder layer whose parameters are gathered around its forward and its recomputation in
// backward (see the header).
class GatheredLayer : public torch::autograd::Function<GatheredLayer> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            FullyShardedModel::Unit* unit, model::DecoderLayerImpl* layer,
                            const model::AttentionContext& context) {
    // Both outlive the step; their addresses ride in the context as integers.
    ctx->saved_data["unit"] = reinterpret_cast<int64_t>(unit);
    ctx->saved_data["layer"] = reinterpret_cast<int64_t>(layer);
    model::SaveAttentionContext(ctx, context);
    ctx->save_for_backward({x});
    // After a failure the step's result is void (FinishStep reports the failure); the layer
    // passes its input through so the graph stays well-formed.
    if (unit->Failed(unit->Gather())) return x.clone();
    at::Tensor out = layer->forward(x, context);
    unit->Release();
    // Under autocast the casts of the gathered parameters stay cached (by tensor) after the
    // release: they would keep a copy of every layer alive.
    at::autocast::clear_cache();
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* unit = reinterpret_cast<FullyShardedModel::Unit*>(ctx->saved_data["unit"].toInt());
    auto* layer = reinterpret_cast<model::DecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
    const model::AttentionContext context = model::RestoredAttentionContext(ctx);
    const at::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    if (unit->Failed(unit->Gather())) {
      return {at::zeros_like(input), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    at::Tensor output;
    {
      const model::ForwardAutocast autocast(ctx, input.device().type());
      at::AutoGradMode grad(true);
      output = layer->forward(input, context);
    }
    torch::autograd::backward({output}, {grad_outputs[0]});
    unit->Failed(unit->ScatterGradients());
    unit->Release();
    return {input.grad(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

FullyShardedModel::FullyShardedModel(model::Transformer model, parallel::Communicator& group,
                                     AdamWOptions options)
    : model_(std::move(model)), group_(group) {
  std::vector<at::Tensor> root, masters;
  std::vector<std::vector<at::Tensor>> per_layer(model_->config().num_layers);
  for (auto& item : model_->named_parameters()) {
    const std::string& name = item.key();
    const std::string prefix = "model.layers.";
    if (name.rfind(prefix, 0) == 0) {
      const int64_t layer = std::stoll(name.substr(prefix.size()));
      per_layer[layer].push_back(item.value());
    } else {
      root.push_back(item.value());
    }
  }
  for (auto& tensors : per_layer) {
    layers_.push_back(std::make_unique<Unit>());
    layers_.back()->Init(std::move(tensors), group, &failure_);
    masters.push_back(layers_.back()->master);
  }
  root_ = std::make_unique<Unit>();
  root_->Init(std::move(root), group, &failure_);
  masters.push_back(root_->master);
  optimizer_ = std::make_unique<AdamW>(masters, options);
  model_->set_layer_runner([this](int64_t index, model::DecoderLayerImpl& layer,
                                  const at::Tensor& x, const model::AttentionContext& context) {
    return GatheredLayer::apply(x, layers_[index].get(), &layer, context);
  });
}

FullyShardedModel::~FullyShardedModel() { model_->set_layer_runner({}); }

absl::Status FullyShardedModel::BeginStep() { return root_->Gather(); }

void FullyShardedModel::EndForwards() { root_->Release(); }

void FullyShardedModel::ZeroGrad() {
  // A step given up before FinishStep (a non-finite loss) leaves the root gathered.
  root_->Release();
  optimizer_->ZeroGrad();
  for (at::Tensor& p : model_->parameters()) {
    if (p.grad().defined()) p.mutable_grad().reset();
  }
}

absl::Status FullyShardedModel::ReduceOverReplicas(std::vector<double>& values, ReplicaReduce op) {
  return ReduceDoubles(group_, root_->master.device(), values, op);
}

TrainedModel::NamedTensors FullyShardedModel::StateTensors() {
  NamedTensors state;
  for (size_t k = 0; k < layers_.size(); ++k) {
    state.emplace_back("unit." + std::to_string(k), layers_[k]->master);
  }
  state.emplace_back("unit.root", root_->master);
  for (auto& [name, tensor] : optimizer_->State()) state.emplace_back("optimizer." + name, tensor);
  return state;
}

absl::Status FullyShardedModel::TakeStatus() { return std::exchange(failure_, absl::OkStatus()); }

absl::StatusOr<double> FullyShardedModel::FinishStep(double lr, double max_norm) {
  if (absl::Status failed = TakeStatus(); !failed.ok()) {
    root_->Release();
    optimizer_->ZeroGrad();
    return failed;
  }
  RETURN_IF_ERROR(root_->ScatterGradients());
  root_->Release();
  std::vector<Unit*> units;
  for (auto& unit : layers_) units.push_back(unit.get());
  units.push_back(root_.get());
  at::Tensor squares = at::zeros({1}, root_->master.options());
  for (Unit* unit : units) {
    if (unit->master.grad().defined()) squares += unit->master.grad().pow(2).sum();
  }
  RETURN_IF_ERROR(group_.AllReduce(squares, parallel::ReduceOp::kSum));
  const double norm = std::sqrt(squares.item<double>());
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {
    for (Unit* unit : units) {
      if (unit->master.grad().defined()) unit->master.mutable_grad().mul_(max_norm / (norm + 1e-6));
    }
  }
  // The norm is the same on every rank: all skip a non-finite step together.
  nonfinite_gradient_.clear();
  if (std::isfinite(norm)) {
    optimizer_->Step(lr);
  } else {
    // The layers from the last: a NaN born in the backward spreads to every layer before it (and
    // to the embeddings, which share the root unit with the head, so the root comes last).
    std::vector<at::Tensor> gradients;
    for (size_t k = layers_.size(); k-- > 0;) gradients.push_back(layers_[k]->master.grad());
    gradients.push_back(root_->master.grad());
    const std::optional<size_t> found = FirstNonFinite(gradients);
    nonfinite_gradient_ = !found ? ""
                          : *found < layers_.size()
                              ? absl::StrCat("model.layers.", layers_.size() - 1 - *found, ".*")
                              : "the embeddings, final norm or head";
  }
  optimizer_->ZeroGrad();
  return norm;
}

absl::StatusOr<std::optional<std::string>> FullyShardedModel::NonFiniteParameter() {
  // The module's parameters are empty between steps: each rank checks its master shards, and
  // the ranks agree on the first unit any of them found (max of units - index).
  std::vector<at::Tensor> masters;
  for (auto& unit : layers_) masters.push_back(unit->master);
  masters.push_back(root_->master);
  const std::optional<size_t> mine = FirstNonFinite(masters);
  std::vector<double> found = {mine ? static_cast<double>(masters.size() - *mine) : 0.0};
  RETURN_IF_ERROR(ReduceOverReplicas(found, ReplicaReduce::kMax));
  if (found[0] == 0) return std::nullopt;
  const size_t unit = masters.size() - static_cast<size_t>(found[0]);
  if (unit < layers_.size()) return absl::StrCat("model.layers.", unit, ".*");
  return std::string("the embeddings, final norm or head (outside model.layers)");
}

FullyShardedModel::PartsByParameter FullyShardedModel::PartsOfParameters() {
  const OwnedPieces pieces = Pieces();
  const int ranks = group_.size();
  PartsByParameter parts;
  for (int rank = 0; rank < ranks; ++rank) {
    for (size_t i = 0; i < pieces.layout[rank].size(); ++i) {
      const PieceSpan& span = pieces.layout[rank][i];
      auto& of = parts.ranges[span.name];
      of.resize(static_cast<size_t>(ranks), {-1, -1});
      of[rank] = {span.offset, span.offset + span.count};
      if (rank == group_.rank()) parts.mine[span.name] = pieces.values[i];
    }
  }
  for (auto& [name, of] : parts.ranges) {
    int64_t reached = 0;
    for (auto& [begin, end] : of) {
      if (begin < 0) begin = end = reached;
      reached = end;
    }
  }
  return parts;
}

TrainedModel::OwnedPieces FullyShardedModel::Pieces() {
  std::map<const void*, std::string> names;  // Module tensor → its name.
  for (const auto& item : model_->named_parameters()) {
    names[item.value().unsafeGetTensorImpl()] = item.key();
  }
  std::vector<Unit*> units;
  for (auto& layer : layers_) units.push_back(layer.get());
  units.push_back(root_.get());
  OwnedPieces pieces;
  pieces.layout.resize(static_cast<size_t>(group_.size()));
  for (int rank = 0; rank < group_.size(); ++rank) {
    for (Unit* unit : units) {
      // A rank's shard is elements [first, first + shard_size) of the unit's parameters
      // flattened and concatenated (then padded).
      const int64_t first = rank * unit->shard_size;
      int64_t offset = 0;
      for (size_t i = 0; i < unit->params.size(); ++i) {
        int64_t numel = 1;
        for (int64_t size : unit->shapes[i]) numel *= size;
        const int64_t begin = std::max(offset, first);
        const int64_t end = std::min(offset + numel, first + unit->shard_size);
        if (begin < end) {
          pieces.layout[rank].push_back({.name = names.at(unit->params[i].unsafeGetTensorImpl()),
                                         .offset = begin - offset,
                                         .count = end - begin});
          if (rank == group_.rank()) {
            pieces.values.push_back(unit->master.narrow(0, begin - first, end - begin)
                                        .to(unit->param_options.dtype().toScalarType()));
          }
        }
        offset += numel;
      }
    }
  }
  return pieces;
}

absl::StatusOr<std::vector<at::Tensor>> FullyShardedModel::FullParameters() {
  std::map<const void*, at::Tensor> gathered;  // Module tensor → its full value.
  for (Unit* unit : [&] {
         std::vector<Unit*> all;
         for (auto& layer : layers_) all.push_back(layer.get());
         all.push_back(root_.get());
         return all;
       }()) {
    RETURN_IF_ERROR(unit->Gather());
    for (at::Tensor& p : unit->params) gathered[p.unsafeGetTensorImpl()] = p.detach().clone();
    unit->Release();
  }
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : model_->parameters())
    out.push_back(gathered.at(p.unsafeGetTensorImpl()));
  return out;
}

}  // namespace rlhfd::train

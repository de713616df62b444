#include "worker/parallel/host_staged_communicator.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace rlhfd::parallel {
namespace {

bool OnHost(const at::Tensor& tensor) { return tensor.is_cpu() && tensor.is_contiguous(); }

// A host tensor holding `tensor`'s values (itself when it already is one).
at::Tensor HostCopy(const at::Tensor& tensor) {
  return OnHost(tensor) ? tensor : tensor.to(at::kCPU).contiguous();
}

// A host tensor to receive into for `tensor` (itself when it already is one).
at::Tensor HostBuffer(const at::Tensor& tensor) {
  return OnHost(tensor) ? tensor : at::empty(tensor.sizes(), tensor.options().device(at::kCPU));
}

void CopyBack(const at::Tensor& host, const at::Tensor& tensor) {
  if (!host.is_same(tensor)) tensor.copy_(host);
}

// Runs `operation`, turning a torch error of a copy (out of memory, a bad device) into a status.
template <typename Operation>
absl::Status Staged(const char* what, Operation&& operation) {
  try {
    return operation();
  } catch (const std::exception& error) {
    return absl::InternalError(absl::StrCat(
        what, ": staging through host memory failed: ", std::string(error.what()).substr(0, 300)));
  }
}

// Runs `operation` on the host side of `result` (a copy of its values, or with `with_values` false
// only room for them) and copies what it wrote back into `result`.
template <typename Operation>
absl::Status StagedInto(const char* what, const at::Tensor& result, bool with_values,
                        Operation&& operation) {
  return Staged(what, [&] {
    const at::Tensor host = with_values ? HostCopy(result) : HostBuffer(result);
    absl::Status status = operation(host);
    if (status.ok()) CopyBack(host, result);
    return status;
  });
}

class HostStagedCommunicator final : public Communicator {
 public:
  explicit HostStagedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  absl::Status AllReduce(const at::Tensor& tensor, ReduceOp op) override {
    return StagedInto("AllReduce", tensor, /*with_values=*/true,
                      [&](const at::Tensor& host) { return inner_->AllReduce(host, op); });
  }

  absl::Status AllGather(const at::Tensor& input, const at::Tensor& output) override {
    return StagedInto("AllGather", output, /*with_values=*/false, [&](const at::Tensor& host) {
      return inner_->AllGather(HostCopy(input), host);
    });
  }

  absl::Status ReduceScatter(const at::Tensor& input, const at::Tensor& output,
                             ReduceOp op) override {
    return StagedInto("ReduceScatter", output, /*with_values=*/false, [&](const at::Tensor& host) {
      return inner_->ReduceScatter(HostCopy(input), host, op);
    });
  }

  absl::Status Broadcast(const at::Tensor& tensor, int root) override {
    return StagedInto("Broadcast", tensor, /*with_values=*/true,
                      [&](const at::Tensor& host) { return inner_->Broadcast(host, root); });
  }

  absl::Status Send(const at::Tensor& tensor, int peer) override {
    return Staged("Send", [&] { return inner_->Send(HostCopy(tensor), peer); });
  }

  absl::Status Recv(const at::Tensor& tensor, int peer) override {
    return StagedInto("Recv", tensor, /*with_values=*/false,
                      [&](const at::Tensor& host) { return inner_->Recv(host, peer); });
  }

  absl::Status SendRecv(const std::vector<PeerTransfer>& transfers) override {
    return Staged("SendRecv", [&] {
      std::vector<PeerTransfer> staged = transfers;
      for (PeerTransfer& transfer : staged) {
        transfer.tensor = transfer.direction == PeerTransfer::Direction::kSend
                              ? HostCopy(transfer.tensor)
                              : HostBuffer(transfer.tensor);
      }
      absl::Status status = inner_->SendRecv(staged);
      if (!status.ok()) return status;
      for (size_t i = 0; i < staged.size(); ++i) {
        if (staged[i].direction == PeerTransfer::Direction::kRecv) {
          CopyBack(staged[i].tensor, transfers[i].tensor);
        }
      }
      return absl::OkStatus();
    });
  }

  absl::Status Barrier() override { return inner_->Barrier(); }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    absl::StatusOr<std::unique_ptr<Communicator>> split = inner_->Split(color, key);
    if (!split.ok() || *split == nullptr) return split;
    return StageThroughHost(*std::move(split));
  }

 private:
  std::unique_ptr<Communicator> inner_;
};

}  // namespace

std::unique_ptr<Communicator> StageThroughHost(std::unique_ptr<Communicator> host_only) {
  return std::make_unique<HostStagedCommunicator>(std::move(host_only));
}

}  // namespace rlhfd::parallel

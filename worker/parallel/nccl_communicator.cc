#include "worker/parallel/nccl_communicator.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace rlhfd::parallel {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<ncclDataType_t> NcclType(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kLong:
      return ncclInt64;
    case at::kInt:
      return ncclInt32;
    case at::kByte:
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL communicator: unsupported dtype ", c10::toString(type)));
  }
}

// Integer averages are sums divided afterwards (FinishAverage), rounding down as the socket
// backend does.
ncclRedOp_t NcclOp(ReduceOp op, const at::Tensor& tensor) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return at::isFloatingType(tensor.scalar_type()) ? ncclAvg : ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

// Between two polls of a wait: most waits end quickly, so the first millisecond yields instead
// of sleeping (a sleep costs >= 50 us of timer slack); longer waits sleep `sleep`.
void PauseBetweenPolls(Clock::duration waited, std::chrono::microseconds sleep) {
  if (waited < std::chrono::milliseconds(1)) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(sleep);
  }
}

// The NCCL state shared by a communicator and its waits.
class NcclComm {
 public:
  NcclComm(ncclComm_t comm, at::Device device, std::chrono::milliseconds timeout,
           std::shared_ptr<const std::atomic<bool>> interrupt)
      : comm_(comm), device_(device), timeout_(timeout), interrupt_(std::move(interrupt)) {}
  ~NcclComm() {
    if (comm_ == nullptr) return;
    if (aborted_) return;  // ncclCommAbort freed it.
    ncclCommDestroy(comm_);
  }
  ncclComm_t get() const { return comm_; }
  const at::Device& device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::shared_ptr<const std::atomic<bool>>& interrupt() const { return interrupt_; }
  bool aborted() const { return aborted_; }
  const std::string& abort_reason() const { return abort_reason_; }

  void Abort(const std::string& reason) {
    if (aborted_ || comm_ == nullptr) return;
    aborted_ = true;
    abort_reason_ = reason;
    ncclCommAbort(comm_);
  }

  // Waits until NCCL's non-blocking call state leaves ncclInProgress (init, split, group end).
  absl::Status WaitReady(const std::string& what) {
    const auto start = Clock::now(), deadline = start + timeout_;
    ncclResult_t state = ncclInProgress;
    while (true) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
      if (state != ncclInProgress) break;
      if (Interrupted()) {
        Abort(what + " interrupted");
        return InterruptedError(what);
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        Abort(what + " timed out");
        return absl::DeadlineExceededError(absl::StrCat(
            what, ": not done within ", timeout_.count(), " ms; a peer died or hangs"));
      }
      PauseBetweenPolls(now - start, std::chrono::microseconds(100));
    }
    if (state != ncclSuccess) {
      const std::string message = absl::StrCat(what, ": ", ncclGetErrorString(state));
      Abort(message);
      return absl::UnavailableError(message);
    }
    return absl::OkStatus();
  }

  // After enqueueing on `stream`: waits for the work, watching NCCL's error state and the clock.
  absl::Status WaitStream(cudaStream_t stream, const std::string& what) {
    RETURN_IF_ERROR(WaitReady(what));  // Non-blocking enqueue may still be in progress.
    cudaEvent_t done = nullptr;
    if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(done, stream) != cudaSuccess) {
      if (done != nullptr) cudaEventDestroy(done);
      return absl::InternalError(absl::StrCat(what, ": cudaEventRecord failed"));
    }
    const auto start = Clock::now(), deadline = start + timeout_;
    absl::Status status;
    while (true) {
      const cudaError_t query = cudaEventQuery(done);
      if (query == cudaSuccess) break;
      if (query != cudaErrorNotReady) {
        status = absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(query)));
        break;
      }
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        status = absl::UnavailableError(
            absl::StrCat(what, ": ", ncclGetErrorString(state), " (a peer failed)"));
        break;
      }
      if (Interrupted()) {
        status = InterruptedError(what);
        break;
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        status = absl::DeadlineExceededError(absl::StrCat(
            what, ": not done within ", timeout_.count(), " ms; a peer died or hangs"));
        break;
      }
      PauseBetweenPolls(now - start, std::chrono::microseconds(50));
    }
    if (!status.ok()) Abort(std::string(status.message()));  // Ends the stuck kernel too.
    cudaEventDestroy(done);
    return status;
  }

 private:
  bool Interrupted() const { return interrupt_ && interrupt_->load(); }

  ncclComm_t comm_;
  at::Device device_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<const std::atomic<bool>> interrupt_;  // may be null
  bool aborted_ = false;
  std::string abort_reason_;
};

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<NcclComm> comm, int rank, int size)
      : comm_(std::move(comm)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduce(const at::Tensor& tensor, ReduceOp op) override {
    return AllReduceOn(tensor, op, /*wait=*/true);
  }
  absl::Status AllReduceQueued(const at::Tensor& tensor, ReduceOp op) override {
    return AllReduceOn(tensor, op, /*wait=*/false);
  }

  absl::Status AllGather(const at::Tensor& input, const at::Tensor& output) override {
    return AllGatherOn(input, output, /*wait=*/true);
  }
  absl::Status AllGatherQueued(const at::Tensor& input, const at::Tensor& output) override {
    return AllGatherOn(input, output, /*wait=*/false);
  }

  bool CapturableInGraphs() const override { return true; }

  absl::Status ReduceScatter(const at::Tensor& input, const at::Tensor& output,
                             ReduceOp op) override {
    RETURN_IF_ERROR(Check(input));
    RETURN_IF_ERROR(Check(output));
    if (input.numel() != output.numel() * size_ || output.scalar_type() != input.scalar_type()) {
      return absl::InvalidArgumentError("ReduceScatter: input must be size x output, same dtype");
    }
    ASSIGN_OR_RETURN(const ncclDataType_t type, NcclType(input.scalar_type()));
    RETURN_IF_ERROR(Run("reduce-scatter", [&](cudaStream_t stream) {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), type,
                               NcclOp(op, input), comm_->get(), stream);
    }));
    FinishAverage(output, op);
    return absl::OkStatus();
  }

  absl::Status Broadcast(const at::Tensor& tensor, int root) override {
    RETURN_IF_ERROR(Check(tensor));
    if (root < 0 || root >= size_) return absl::InvalidArgumentError("Broadcast: bad root");
    ASSIGN_OR_RETURN(const ncclDataType_t type, NcclType(tensor.scalar_type()));
    return Run("broadcast", [&](cudaStream_t stream) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), type, root,
                           comm_->get(), stream);
    });
  }

  absl::Status Send(const at::Tensor& tensor, int peer) override {
    return SendRecv({{PeerTransfer::Direction::kSend, peer, tensor}});
  }

  absl::Status Recv(const at::Tensor& tensor, int peer) override {
    return SendRecv({{PeerTransfer::Direction::kRecv, peer, tensor}});
  }

  absl::Status SendRecv(const std::vector<PeerTransfer>& transfers) override {
    return GroupedSendRecv(transfers, /*wait=*/true, {});
  }

  absl::Status SendRecvQueued(const std::vector<PeerTransfer>& transfers,
                              const std::function<void()>& meanwhile) override {
    return GroupedSendRecv(transfers, /*wait=*/false, meanwhile);
  }

  absl::Status Synchronize() override {
    RETURN_IF_ERROR(CheckAlive());
    c10::cuda::CUDAGuard guard(comm_->device());
    return comm_->WaitStream(c10::cuda::getCurrentCUDAStream(comm_->device().index()),
                             "synchronize");
  }

  absl::Status Barrier() override {
    c10::cuda::CUDAGuard guard(comm_->device());
    at::Tensor token =
        at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(comm_->device()));
    return AllReduce(token, ReduceOp::kSum);
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    RETURN_IF_ERROR(CheckAlive());
    c10::cuda::CUDAGuard guard(comm_->device());
    ncclConfig_t config = NonBlockingConfig();
    ncclComm_t child = nullptr;
    const ncclResult_t result =
        ncclCommSplit(comm_->get(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      return absl::InternalError(absl::StrCat("ncclCommSplit: ", ncclGetErrorString(result)));
    }
    RETURN_IF_ERROR(comm_->WaitReady("ncclCommSplit"));
    if (color < 0 || child == nullptr) return std::unique_ptr<Communicator>();
    auto wrapped =
        std::make_unique<NcclComm>(child, comm_->device(), comm_->timeout(), comm_->interrupt());
    RETURN_IF_ERROR(wrapped->WaitReady("ncclCommSplit (child)"));
    int child_rank = 0, child_size = 0;
    ncclCommUserRank(child, &child_rank);
    ncclCommCount(child, &child_size);
    return std::unique_ptr<Communicator>(
        new NcclCommunicator(std::move(wrapped), child_rank, child_size));
  }

 private:
  absl::Status GroupedSendRecv(const std::vector<PeerTransfer>& transfers, bool wait,
                               const std::function<void()>& meanwhile) {
    std::vector<ncclDataType_t> types;
    for (const PeerTransfer& transfer : transfers) {
      RETURN_IF_ERROR(Check(transfer.tensor));
      if (transfer.peer < 0 || transfer.peer >= size_ || transfer.peer == rank_) {
        return absl::InvalidArgumentError(
            absl::StrCat("peer ", transfer.peer, " is not another rank"));
      }
      ASSIGN_OR_RETURN(const ncclDataType_t type, NcclType(transfer.tensor.scalar_type()));
      types.push_back(type);
    }
    return Run(
        "send/recv",
        [&](cudaStream_t stream) {
          ncclResult_t result = ncclGroupStart();
          for (size_t i = 0; i < transfers.size() && result == ncclSuccess; ++i) {
            const PeerTransfer& t = transfers[i];
            result = t.direction == PeerTransfer::Direction::kSend
                         ? ncclSend(t.tensor.data_ptr(), t.tensor.numel(), types[i], t.peer,
                                    comm_->get(), stream)
                         : ncclRecv(t.tensor.data_ptr(), t.tensor.numel(), types[i], t.peer,
                                    comm_->get(), stream);
          }
          const ncclResult_t end = ncclGroupEnd();
          return result != ncclSuccess ? result : end;
        },
        wait, meanwhile);
  }

  absl::Status CheckAlive() const {
    if (comm_->aborted()) {
      return absl::FailedPreconditionError(
          absl::StrCat("communicator aborted earlier: ", comm_->abort_reason()));
    }
    return absl::OkStatus();
  }

  absl::Status Check(const at::Tensor& tensor) const {
    RETURN_IF_ERROR(CheckAlive());
    if (!tensor.defined() || tensor.device() != comm_->device() || !tensor.is_contiguous()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL communicator: tensors must be contiguous on ", comm_->device().str()));
    }
    return absl::OkStatus();
  }

  absl::Status AllReduceOn(const at::Tensor& tensor, ReduceOp op, bool wait) {
    RETURN_IF_ERROR(Check(tensor));
    ASSIGN_OR_RETURN(const ncclDataType_t type, NcclType(tensor.scalar_type()));
    RETURN_IF_ERROR(Run(
        "all-reduce",
        [&](cudaStream_t stream) {
          return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), type,
                               NcclOp(op, tensor), comm_->get(), stream);
        },
        wait));
    FinishAverage(tensor, op);
    return absl::OkStatus();
  }

  absl::Status AllGatherOn(const at::Tensor& input, const at::Tensor& output, bool wait) {
    RETURN_IF_ERROR(Check(input));
    RETURN_IF_ERROR(Check(output));
    if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type()) {
      return absl::InvalidArgumentError("AllGather: output must be size x input, same dtype");
    }
    ASSIGN_OR_RETURN(const ncclDataType_t type, NcclType(input.scalar_type()));
    return Run(
        "all-gather",
        [&](cudaStream_t stream) {
          return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), type,
                               comm_->get(), stream);
        },
        wait);
  }

  void FinishAverage(const at::Tensor& tensor, ReduceOp op) const {
    if (op != ReduceOp::kAvg || at::isFloatingType(tensor.scalar_type())) return;
    c10::cuda::CUDAGuard guard(comm_->device());
    tensor.copy_(tensor.div(size_, "floor"));
  }

  // Enqueues on the current stream, then waits for the work to finish, or with `wait` false only
  // until NCCL has put it on the stream (a non-blocking communicator may still be launching it
  // when the call returns, and work queued behind it must come after it), running `meanwhile`
  // first.
  template <typename Enqueue>
  absl::Status Run(const std::string& what, Enqueue enqueue, bool wait = true,
                   const std::function<void()>& meanwhile = {}) {
    c10::cuda::CUDAGuard guard(comm_->device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(comm_->device().index());
    const ncclResult_t result = enqueue(stream);
    if (result != ncclSuccess && result != ncclInProgress) {
      const std::string message = absl::StrCat(what, ": ", ncclGetErrorString(result));
      comm_->Abort(message);
      return absl::InternalError(message);
    }
    if (wait) return comm_->WaitStream(stream, what);
    if (meanwhile) meanwhile();
    return comm_->WaitReady(what);
  }

  std::unique_ptr<NcclComm> comm_;
  int rank_, size_;
};

}  // namespace

absl::StatusOr<std::string> NewNcclUniqueId() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(result)));
  }
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(int rank, int size,
                                                                     const std::string& unique_id,
                                                                     const at::Device& device,
                                                                     const NcclOptions& options) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id must be ", sizeof(id.internal),
                                                   " bytes, got ", unique_id.size()));
  }
  if (!device.is_cuda()) return absl::InvalidArgumentError("NCCL communicator needs a CUDA device");
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  c10::cuda::CUDAGuard guard(device);
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    return absl::UnavailableError(
        absl::StrCat("ncclCommInitRankConfig: ", ncclGetErrorString(result)));
  }
  auto wrapped = std::make_unique<NcclComm>(comm, device, options.timeout, options.interrupt);
  RETURN_IF_ERROR(wrapped->WaitReady(absl::StrCat("NCCL init of rank ", rank, " of ", size)));
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(wrapped), rank, size));
}

}  // namespace rlhfd::parallel

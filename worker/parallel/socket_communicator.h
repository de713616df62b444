// The CPU backend of Communicator: a full mesh of TCP connections between the ranks, with every
// collective a set of concurrent sends and receives driven by poll() against one deadline.
// Meant for tests, CPU-only runs and small control data; its all-to-all algorithms send
// O(size²) messages and it is not for scale (NCCL is the production path).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/parallel/communicator.h"

namespace rlhfd::parallel {

// Rank 0's rendezvous socket, bound (on a port the kernel picks) before the other ranks are told
// where it is, so no port has to be guessed free.
class RendezvousListener {
 public:
  // Listens on `host` (IPv4), port 0.
  static absl::StatusOr<RendezvousListener> Bind(const std::string& host);
  RendezvousListener(RendezvousListener&& other) noexcept;
  RendezvousListener& operator=(RendezvousListener&& other) noexcept;
  ~RendezvousListener();

  // host:port for SocketOptions::master.
  const std::string& address() const { return address_; }
  // The socket, now the caller's to close.
  int Release();

 private:
  RendezvousListener(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  int fd_ = -1;
  std::string address_;
};

// Length of SocketOptions::secret.
inline constexpr size_t kSocketSecretBytes = 32;

struct SocketOptions {
  std::string master = "127.0.0.1:29500";    // host:port rank 0 listens on for the rendezvous
  std::chrono::milliseconds timeout{30000};  // for the rendezvous and for every operation
  // kSocketSecretBytes bytes every connection presents first (empty: zeros). A connection that
  // does not is closed and ignored, so only the job's ranks join its mesh.
  std::string secret;
  // Rank 0: listen on this bound socket (taken over) instead of binding `master`.
  RendezvousListener* listener = nullptr;
  // Once set (from any thread), an operation in progress fails (CANCELLED) within
  // kInterruptCheck and the communicator is aborted: the job's attempt has ended.
  std::shared_ptr<const std::atomic<bool>> interrupt;
};

// Blocks until all `size` ranks have joined (or the timeout passes). Tensors must be CPU and
// contiguous.
absl::StatusOr<std::unique_ptr<Communicator>> CreateSocketCommunicator(
    int rank, int size, const SocketOptions& options);

}  // namespace rlhfd::parallel

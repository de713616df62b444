#include "worker/parallel/socket_communicator.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <numeric>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status/status_macros.h"

namespace rlhfd::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    Reset();
    fd_ = std::exchange(other.fd_, -1);
    return *this;
  }
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::StatusOr<sockaddr_in> ParseAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  sockaddr_in out{};
  out.sin_family = AF_INET;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port <= 0 || port > 65535 ||
      inet_pton(AF_INET, address.substr(0, colon).c_str(), &out.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("master address '", address, "' is not IPv4 host:port"));
  }
  out.sin_port = htons(static_cast<uint16_t>(port));
  return out;
}

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Blocking helpers for the rendezvous (sockets are blocking until the mesh is built).
absl::Status WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("rendezvous send");
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t size, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, RemainingMs(deadline));
    if (ready == 0) return absl::DeadlineExceededError("rendezvous: timed out waiting for a peer");
    if (ready < 0 && errno == EINTR) continue;
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0) return absl::UnavailableError("rendezvous: a peer closed its connection");
    if (n < 0) return Errno("rendezvous recv");
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<Fd> Listen(sockaddr_in address) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Errno("socket");
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &address.sin_addr, text, sizeof(text));
    return Errno(absl::StrCat("bind ", text, ":", ntohs(address.sin_port)));
  }
  if (::listen(fd.get(), 128) != 0) return Errno("listen");
  return fd;
}

absl::StatusOr<Fd> Accept(int listener, Clock::time_point deadline) {
  while (true) {
    pollfd pfd{listener, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, RemainingMs(deadline));
    if (ready == 0)
      return absl::DeadlineExceededError("rendezvous: not every rank connected in time");
    if (ready < 0 && errno == EINTR) continue;
    Fd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.get() >= 0) return fd;
    if (errno != EINTR && errno != EAGAIN) return Errno("accept");
  }
}

// Connects, retrying while the listener is not up yet.
absl::StatusOr<Fd> Connect(sockaddr_in address, Clock::time_point deadline) {
  while (true) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) return Errno("socket");
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
      return fd;
    }
    if (Clock::now() >= deadline) return Errno("rendezvous: connect timed out");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Tune(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Every connection starts with the job's secret; a connection without it is not one of ours.
absl::Status SendSecret(int fd, const std::string& secret) {
  return WriteAll(fd, secret.data(), secret.size());
}

// True when the peer presented `secret` in time; false (the caller drops it) otherwise.
bool ReceivedSecret(int fd, const std::string& secret, Clock::time_point deadline) {
  std::string presented(secret.size(), '\0');
  // A stranger gets a second to speak, not the whole rendezvous.
  const auto limit = std::min(deadline, Clock::now() + std::chrono::seconds(1));
  return ReadAll(fd, presented.data(), presented.size(), limit).ok() && presented == secret;
}

// The connections of one world communicator, shared with the communicators split from it.
struct Mesh {
  int world_rank = 0;
  std::vector<Fd> peers;  // By world rank; none for ourselves.
  std::chrono::milliseconds timeout{30000};
  std::shared_ptr<const std::atomic<bool>> interrupt;  // may be null
  bool aborted = false;
  std::string abort_reason;

  bool interrupted() const { return interrupt && interrupt->load(); }

  // Closing every connection makes each peer's pending operation fail at once.
  void Abort(const std::string& reason) {
    if (aborted) return;
    aborted = true;
    abort_reason = reason;
    for (Fd& fd : peers) fd.Reset();
  }
};

// One message: an 8-byte length, then the bytes.
struct Segment {
  uint64_t header = 0;
  char* data = nullptr;
  size_t size = 0;
  size_t done = 0;  // Of sizeof(header) + size.
};

class SocketCommunicator : public Communicator {
 public:
  SocketCommunicator(std::shared_ptr<Mesh> mesh, std::vector<int> members)
      : mesh_(std::move(mesh)), members_(std::move(members)) {
    rank_ = static_cast<int>(std::find(members_.begin(), members_.end(), mesh_->world_rank) -
                             members_.begin());
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }

  absl::Status AllReduce(const at::Tensor& tensor, ReduceOp op) override {
    RETURN_IF_ERROR(CheckTensor(tensor));
    std::vector<at::Tensor> parts(size());
    std::vector<PeerTransfer> transfers;
    for (int r = 0; r < size(); ++r) {
      if (r == rank_) {
        parts[r] = tensor.clone();
        continue;
      }
      parts[r] = at::empty_like(tensor);
      transfers.push_back({PeerTransfer::Direction::kSend, r, tensor});
      transfers.push_back({PeerTransfer::Direction::kRecv, r, parts[r]});
    }
    RETURN_IF_ERROR(SendRecv(transfers));
    tensor.copy_(Reduce(parts, op));
    return absl::OkStatus();
  }

  absl::Status AllGather(const at::Tensor& input, const at::Tensor& output) override {
    RETURN_IF_ERROR(CheckTensor(input));
    RETURN_IF_ERROR(CheckTensor(output));
    if (output.size(0) != input.size(0) * size()) {
      return absl::InvalidArgumentError("AllGather: output must be size x input along dim 0");
    }
    std::vector<PeerTransfer> transfers;
    for (int r = 0; r < size(); ++r) {
      at::Tensor slot = output.narrow(0, r * input.size(0), input.size(0));
      if (r == rank_) {
        slot.copy_(input);
        continue;
      }
      transfers.push_back({PeerTransfer::Direction::kSend, r, input});
      transfers.push_back({PeerTransfer::Direction::kRecv, r, slot});
    }
    return SendRecv(transfers);
  }

  absl::Status ReduceScatter(const at::Tensor& input, const at::Tensor& output,
                             ReduceOp op) override {
    RETURN_IF_ERROR(CheckTensor(input));
    RETURN_IF_ERROR(CheckTensor(output));
    const int64_t n = output.size(0);
    if (input.size(0) != n * size()) {
      return absl::InvalidArgumentError("ReduceScatter: input must be size x output along dim 0");
    }
    std::vector<at::Tensor> parts(size());
    std::vector<PeerTransfer> transfers;
    for (int r = 0; r < size(); ++r) {
      if (r == rank_) {
        parts[r] = input.narrow(0, rank_ * n, n).clone();
        continue;
      }
      parts[r] = at::empty_like(output);
      transfers.push_back({PeerTransfer::Direction::kSend, r, input.narrow(0, r * n, n)});
      transfers.push_back({PeerTransfer::Direction::kRecv, r, parts[r]});
    }
    RETURN_IF_ERROR(SendRecv(transfers));
    output.copy_(Reduce(parts, op));
    return absl::OkStatus();
  }

  absl::Status Broadcast(const at::Tensor& tensor, int root) override {
    RETURN_IF_ERROR(CheckTensor(tensor));
    RETURN_IF_ERROR(CheckPeer(root, /*self_ok=*/true));
    std::vector<PeerTransfer> transfers;
    if (rank_ == root) {
      for (int r = 0; r < size(); ++r) {
        if (r != root) transfers.push_back({PeerTransfer::Direction::kSend, r, tensor});
      }
    } else {
      transfers.push_back({PeerTransfer::Direction::kRecv, root, tensor});
    }
    return SendRecv(transfers);
  }

  absl::Status Send(const at::Tensor& tensor, int peer) override {
    return SendRecv({{PeerTransfer::Direction::kSend, peer, tensor}});
  }

  absl::Status Recv(const at::Tensor& tensor, int peer) override {
    return SendRecv({{PeerTransfer::Direction::kRecv, peer, tensor}});
  }

  absl::Status Barrier() override {
    at::Tensor token = at::zeros({1}, at::kLong);
    return AllReduce(token, ReduceOp::kSum);
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    at::Tensor mine = at::tensor({static_cast<int64_t>(color), static_cast<int64_t>(key)});
    at::Tensor all = at::empty({2 * size()}, at::kLong);
    RETURN_IF_ERROR(AllGather(mine, all));
    if (color < 0) return std::unique_ptr<Communicator>();
    std::vector<std::pair<int64_t, int>> chosen;  // (key, rank)
    for (int r = 0; r < size(); ++r) {
      if (all[2 * r].item<int64_t>() == color)
        chosen.emplace_back(all[2 * r + 1].item<int64_t>(), r);
    }
    std::sort(chosen.begin(), chosen.end());
    std::vector<int> members;
    for (const auto& [unused, r] : chosen) members.push_back(members_[r]);
    return std::unique_ptr<Communicator>(new SocketCommunicator(mesh_, std::move(members)));
  }

  absl::Status SendRecv(const std::vector<PeerTransfer>& transfers) override {
    if (mesh_->aborted) {
      return absl::FailedPreconditionError(
          absl::StrCat("communicator aborted earlier: ", mesh_->abort_reason));
    }
    // Per peer, its sends and receives in the order given.
    std::vector<std::deque<Segment>> sends(size()), recvs(size());
    std::vector<at::Tensor> keep_alive;
    for (const PeerTransfer& transfer : transfers) {
      RETURN_IF_ERROR(CheckPeer(transfer.peer, /*self_ok=*/false));
      RETURN_IF_ERROR(CheckTensor(transfer.tensor));
      Segment segment;
      segment.data = static_cast<char*>(transfer.tensor.data_ptr());
      segment.size = transfer.tensor.nbytes();
      segment.header = segment.size;
      (transfer.direction == PeerTransfer::Direction::kSend ? sends : recvs)[transfer.peer]
          .push_back(segment);
    }
    const auto deadline = Clock::now() + mesh_->timeout;
    const absl::Status status = Progress(sends, recvs, deadline);
    if (!status.ok()) mesh_->Abort(std::string(status.message()));
    return status;
  }

 private:
  absl::Status CheckTensor(const at::Tensor& tensor) const {
    if (!tensor.defined() || !tensor.is_cpu() || !tensor.is_contiguous()) {
      return absl::InvalidArgumentError("socket communicator: tensors must be CPU and contiguous");
    }
    return absl::OkStatus();
  }

  absl::Status CheckPeer(int peer, bool self_ok) const {
    if (peer < 0 || peer >= size() || (!self_ok && peer == rank_)) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer ", peer, " is not another rank of this communicator (size ", size(),
                       ", rank ", rank_, ")"));
    }
    return absl::OkStatus();
  }

  // In rank order on every rank, so every rank computes bit-identical results.
  at::Tensor Reduce(const std::vector<at::Tensor>& parts, ReduceOp op) const {
    at::Tensor result = parts[0].clone();
    for (size_t r = 1; r < parts.size(); ++r) {
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          result.add_(parts[r]);
          break;
        case ReduceOp::kMax:
          result = at::maximum(result, parts[r]);
          break;
        case ReduceOp::kMin:
          result = at::minimum(result, parts[r]);
          break;
      }
    }
    if (op == ReduceOp::kAvg) {
      result = at::isFloatingType(result.scalar_type()) ? result.div_(size())
                                                        : result.div(size(), "floor");
    }
    return result;
  }

  // Moves every segment, whichever peer is ready first, until all are done or the deadline.
  absl::Status Progress(std::vector<std::deque<Segment>>& sends,
                        std::vector<std::deque<Segment>>& recvs, Clock::time_point deadline) {
    while (true) {
      std::vector<pollfd> polls;
      std::vector<int> peers;
      for (int r = 0; r < size(); ++r) {
        short events = 0;
        if (!sends[r].empty()) events |= POLLOUT;
        if (!recvs[r].empty()) events |= POLLIN;
        if (events == 0) continue;
        const int fd = mesh_->peers[members_[r]].get();
        if (fd < 0) return absl::UnavailableError(absl::StrCat("no connection to rank ", r));
        polls.push_back({fd, events, 0});
        peers.push_back(r);
      }
      if (polls.empty()) return absl::OkStatus();
      if (mesh_->interrupted()) return InterruptedError(absl::StrCat("rank ", rank_));
      const int wait_ms = mesh_->interrupt
                              ? std::min<int>(RemainingMs(deadline), kInterruptCheck.count())
                              : RemainingMs(deadline);
      const int ready = ::poll(polls.data(), polls.size(), wait_ms);
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) return Errno("poll");
      if (ready == 0 && Clock::now() < deadline) continue;  // looked at the interrupt
      if (ready == 0) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rank ", rank_, ": no progress from rank(s) ", absl::StrJoin(peers, ", "), " within ",
            mesh_->timeout.count(), " ms; a peer died or hangs"));
      }
      for (size_t i = 0; i < polls.size(); ++i) {
        const int r = peers[i];
        if (polls[i].revents & (POLLIN | POLLERR | POLLHUP)) {
          if (!recvs[r].empty()) RETURN_IF_ERROR(ReadSome(polls[i].fd, r, recvs[r]));
        }
        if (polls[i].revents & (POLLOUT | POLLERR | POLLHUP)) {
          if (!sends[r].empty()) RETURN_IF_ERROR(WriteSome(polls[i].fd, r, sends[r]));
        }
      }
    }
  }

  absl::Status WriteSome(int fd, int peer, std::deque<Segment>& queue) {
    Segment& s = queue.front();
    const size_t header = sizeof(s.header);
    const char* from = s.done < header ? reinterpret_cast<const char*>(&s.header) + s.done
                                       : s.data + (s.done - header);
    const size_t count = s.done < header ? header - s.done : s.size - (s.done - header);
    const ssize_t n = ::send(fd, from, count, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return absl::OkStatus();
    if (n < 0) return Errno(absl::StrCat("send to rank ", peer));
    s.done += static_cast<size_t>(n);
    if (s.done == header + s.size) queue.pop_front();
    return absl::OkStatus();
  }

  absl::Status ReadSome(int fd, int peer, std::deque<Segment>& queue) {
    Segment& s = queue.front();
    const size_t header = sizeof(s.header);
    if (s.done < header) {
      if (s.done == 0) s.header = 0;
      const ssize_t n = ::recv(fd, reinterpret_cast<char*>(&s.header) + s.done, header - s.done, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return absl::OkStatus();
      if (n == 0)
        return absl::UnavailableError(absl::StrCat("rank ", peer, " closed its connection"));
      if (n < 0) return Errno(absl::StrCat("recv from rank ", peer));
      s.done += static_cast<size_t>(n);
      if (s.done == header && s.header != s.size) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", peer, " sent ", s.header,
                                                       " bytes where ", s.size,
                                                       " were expected (mismatched shapes)"));
      }
    } else {
      const ssize_t n = ::recv(fd, s.data + (s.done - header), s.size - (s.done - header), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return absl::OkStatus();
      if (n == 0)
        return absl::UnavailableError(absl::StrCat("rank ", peer, " closed its connection"));
      if (n < 0) return Errno(absl::StrCat("recv from rank ", peer));
      s.done += static_cast<size_t>(n);
    }
    if (s.done == header + s.size) queue.pop_front();
    return absl::OkStatus();
  }

  std::shared_ptr<Mesh> mesh_;
  std::vector<int> members_;  // World ranks, by rank in this communicator.
  int rank_ = 0;
};

// What each rank tells rank 0: where its mesh listener is.
struct Endpoint {
  uint32_t address = 0;  // Network byte order.
  uint16_t port = 0;     // Network byte order.
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateSocketCommunicator(
    int rank, int size, const SocketOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of size ", size));
  }
  ASSIGN_OR_RETURN(const sockaddr_in master, ParseAddress(options.master));
  if (!options.secret.empty() && options.secret.size() != kSocketSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the socket secret must be ", kSocketSecretBytes, " bytes"));
  }
  const std::string secret =
      options.secret.empty() ? std::string(kSocketSecretBytes, '\0') : options.secret;
  const auto deadline = Clock::now() + options.timeout;
  auto mesh = std::make_shared<Mesh>();
  mesh->world_rank = rank;
  mesh->timeout = options.timeout;
  mesh->interrupt = options.interrupt;
  mesh->peers.resize(size);
  std::vector<int> everyone(size);
  std::iota(everyone.begin(), everyone.end(), 0);
  if (size == 1) return std::unique_ptr<Communicator>(new SocketCommunicator(mesh, everyone));

  std::vector<Endpoint> endpoints(size);
  Fd listener;
  if (rank == 0) {
    // Rank 0's links to every other rank are the rendezvous connections themselves.
    if (options.listener != nullptr) {
      listener = Fd(options.listener->Release());
    } else {
      ASSIGN_OR_RETURN(listener, Listen(master));
    }
    for (int joined = 1; joined < size;) {
      ASSIGN_OR_RETURN(Fd fd, Accept(listener.get(), deadline));
      if (!ReceivedSecret(fd.get(), secret, deadline)) continue;  // not one of the job's ranks
      ++joined;
      int32_t peer = -1;
      Endpoint endpoint;
      RETURN_IF_ERROR(ReadAll(fd.get(), &peer, sizeof(peer), deadline));
      RETURN_IF_ERROR(ReadAll(fd.get(), &endpoint, sizeof(endpoint), deadline));
      if (peer <= 0 || peer >= size || mesh->peers[peer].get() >= 0) {
        return absl::InvalidArgumentError(absl::StrCat("rendezvous: a process joined as rank ",
                                                       peer, " (size ", size, ", or twice)"));
      }
      endpoints[peer] = endpoint;
      mesh->peers[peer] = std::move(fd);
    }
    for (int peer = 1; peer < size; ++peer) {
      RETURN_IF_ERROR(
          WriteAll(mesh->peers[peer].get(), endpoints.data(), sizeof(Endpoint) * endpoints.size()));
    }
  } else {
    ASSIGN_OR_RETURN(Fd to_master, Connect(master, deadline));
    RETURN_IF_ERROR(SendSecret(to_master.get(), secret));
    // Our mesh listener: on the address we reach the master from, any free port.
    sockaddr_in local{};
    socklen_t length = sizeof(local);
    ::getsockname(to_master.get(), reinterpret_cast<sockaddr*>(&local), &length);
    local.sin_port = 0;
    ASSIGN_OR_RETURN(listener, Listen(local));
    length = sizeof(local);
    ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&local), &length);
    const int32_t me = rank;
    const Endpoint mine{local.sin_addr.s_addr, local.sin_port};
    RETURN_IF_ERROR(WriteAll(to_master.get(), &me, sizeof(me)));
    RETURN_IF_ERROR(WriteAll(to_master.get(), &mine, sizeof(mine)));
    RETURN_IF_ERROR(ReadAll(to_master.get(), endpoints.data(), sizeof(Endpoint) * size, deadline));
    mesh->peers[0] = std::move(to_master);
    // Rank j connects to every rank 0 < i < j and accepts from every rank above it.
    for (int peer = 1; peer < rank; ++peer) {
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = endpoints[peer].address;
      address.sin_port = endpoints[peer].port;
      ASSIGN_OR_RETURN(Fd fd, Connect(address, deadline));
      RETURN_IF_ERROR(SendSecret(fd.get(), secret));
      RETURN_IF_ERROR(WriteAll(fd.get(), &me, sizeof(me)));
      mesh->peers[peer] = std::move(fd);
    }
    for (int accepted = rank + 1; accepted < size;) {
      ASSIGN_OR_RETURN(Fd fd, Accept(listener.get(), deadline));
      if (!ReceivedSecret(fd.get(), secret, deadline)) continue;
      ++accepted;
      int32_t peer = -1;
      RETURN_IF_ERROR(ReadAll(fd.get(), &peer, sizeof(peer), deadline));
      if (peer <= rank || peer >= size || mesh->peers[peer].get() >= 0) {
        return absl::InvalidArgumentError(absl::StrCat("rendezvous: unexpected rank ", peer));
      }
      mesh->peers[peer] = std::move(fd);
    }
  }
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) Tune(mesh->peers[peer].get());
  }
  auto communicator = std::unique_ptr<Communicator>(new SocketCommunicator(mesh, everyone));
  // Every link works before anyone starts: one barrier.
  RETURN_IF_ERROR(communicator->Barrier());
  return communicator;
}

absl::StatusOr<RendezvousListener> RendezvousListener::Bind(const std::string& host) {
  ASSIGN_OR_RETURN(sockaddr_in address, ParseAddress(absl::StrCat(host, ":1")));
  address.sin_port = 0;
  ASSIGN_OR_RETURN(Fd fd, Listen(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);
  return RendezvousListener(fd.Release(), absl::StrCat(host, ":", port));
}

RendezvousListener::RendezvousListener(RendezvousListener&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), address_(std::move(other.address_)) {}

RendezvousListener& RendezvousListener::operator=(RendezvousListener&& other) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = std::exchange(other.fd_, -1);
  address_ = std::move(other.address_);
  return *this;
}

RendezvousListener::~RendezvousListener() {
  if (fd_ >= 0) ::close(fd_);
}

int RendezvousListener::Release() { return std::exchange(fd_, -1); }

}  // namespace rlhfd::parallel

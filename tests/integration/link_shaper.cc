// A host's link made slow and lossy, for multihost_test where the kernel has no netem: the
// packets that iptables sends to NFQUEUE `--queue` (in the host's network namespace) are held for
// `--delay_ms` each and dropped with probability `--loss` (a seeded generator, so a run is
// repeatable), then released in arrival order. On SIGTERM or SIGINT it lets every held packet go,
// prints {"packets":N,"dropped":D,"held_ms_mean":M} and exits 0.
//   link_shaper --queue=0 --delay_ms=50 --loss=0.01
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <string_view>

namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t stopping = 0;
void Stop(int) { stopping = 1; }

struct Held {
  uint32_t id;
  Clock::time_point arrived;
};

struct Shaper {
  nfq_q_handle* queue = nullptr;
  Clock::duration delay{};
  std::bernoulli_distribution lose{0.0};
  std::mt19937_64 random{20261203};
  std::deque<Held> held;  // arrival order is release order: every packet waits the same time
  uint64_t packets = 0, dropped = 0;
  double held_ms_total = 0;

  void Release(const Held& packet, Clock::time_point now) {
    held_ms_total += std::chrono::duration<double, std::milli>(now - packet.arrived).count();
    nfq_set_verdict(queue, packet.id, NF_ACCEPT, 0, nullptr);
  }
};

int OnPacket(nfq_q_handle* queue, nfgenmsg*, nfq_data* data, void* context) {
  auto& shaper = *static_cast<Shaper*>(context);
  const nfqnl_msg_packet_hdr* header = nfq_get_msg_packet_hdr(data);
  if (header == nullptr) return 0;
  const uint32_t id = ntohl(header->packet_id);
  ++shaper.packets;
  if (shaper.lose(shaper.random)) {
    ++shaper.dropped;
    return nfq_set_verdict(queue, id, NF_DROP, 0, nullptr);
  }
  shaper.held.push_back({id, Clock::now()});
  return 0;
}

bool Flag(std::string_view arg, std::string_view name, double& value) {
  const std::string prefix = "--" + std::string(name) + "=";
  if (!arg.starts_with(prefix)) return false;
  char* end = nullptr;
  const std::string text(arg.substr(prefix.size()));
  value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') {
    std::fprintf(stderr, "link_shaper: %s is not a number\n", std::string(arg).c_str());
    std::exit(2);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  double queue_number = 0, delay_ms = 50, loss = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (!Flag(arg, "queue", queue_number) && !Flag(arg, "delay_ms", delay_ms) &&
        !Flag(arg, "loss", loss)) {
      std::fprintf(stderr, "link_shaper: unknown argument %s (--queue, --delay_ms, --loss)\n",
                   argv[i]);
      return 2;
    }
  }
  if (delay_ms < 0 || loss < 0 || loss > 1) {
    std::fprintf(stderr, "link_shaper: --delay_ms must be >= 0 and --loss within [0, 1]\n");
    return 2;
  }
  Shaper shaper;
  shaper.delay = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(delay_ms));
  shaper.lose = std::bernoulli_distribution(loss);

  nfq_handle* handle = nfq_open();
  if (handle == nullptr) {
    std::fprintf(stderr, "link_shaper: nfq_open: %s (root, and a kernel with NFQUEUE)\n",
                 std::strerror(errno));
    return 1;
  }
  shaper.queue = nfq_create_queue(handle, static_cast<uint16_t>(queue_number), &OnPacket, &shaper);
  if (shaper.queue == nullptr) {
    std::fprintf(stderr, "link_shaper: cannot bind NFQUEUE %g: %s\n", queue_number,
                 std::strerror(errno));
    return 1;
  }
  // Only the verdict matters, not the payload; a queue long enough for a window of TCP segments,
  // and a socket buffer large enough that the kernel does not drop notifications (ENOBUFS).
  nfq_set_mode(shaper.queue, NFQNL_COPY_META, 0);
  nfq_set_queue_maxlen(shaper.queue, 65536);
  nfnl_rcvbufsiz(nfq_nfnlh(handle), 16 << 20);
  const int fd = nfq_fd(handle);

  struct sigaction action {};
  action.sa_handler = Stop;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  std::fprintf(stderr, "link_shaper: queue %g, %g ms per packet, loss %g\n", queue_number,
               delay_ms, loss);

  alignas(16) char buffer[1 << 16];
  while (!stopping) {
    int timeout_ms = 100;
    if (!shaper.held.empty()) {
      const auto wait = shaper.held.front().arrived + shaper.delay - Clock::now();
      timeout_ms = static_cast<int>(std::max<int64_t>(
          0, std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
    }
    pollfd readable{.fd = fd, .events = POLLIN, .revents = 0};
    if (poll(&readable, 1, timeout_ms) > 0) {
      for (;;) {
        const ssize_t size = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
        if (size > 0) {
          nfq_handle_packet(handle, buffer, static_cast<int>(size));
        } else if (size < 0 && errno == ENOBUFS) {
          std::fprintf(stderr, "link_shaper: the kernel dropped queue notifications\n");
        } else {
          break;
        }
      }
    }
    const Clock::time_point now = Clock::now();
    while (!shaper.held.empty() && shaper.held.front().arrived + shaper.delay <= now) {
      shaper.Release(shaper.held.front(), now);
      shaper.held.pop_front();
    }
  }
  const Clock::time_point now = Clock::now();
  for (const Held& packet : shaper.held) shaper.Release(packet, now);
  const uint64_t passed = shaper.packets - shaper.dropped;
  std::printf("{\"packets\":%llu,\"dropped\":%llu,\"held_ms_mean\":%.2f}\n",
              static_cast<unsigned long long>(shaper.packets),
              static_cast<unsigned long long>(shaper.dropped),
              passed == 0 ? 0.0 : shaper.held_ms_total / static_cast<double>(passed));
  std::fflush(stdout);
  nfq_destroy_queue(shaper.queue);
  nfq_close(handle);
  return 0;
}

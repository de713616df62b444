#include "common/util/systemd_notify.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"

namespace rlhfd {
namespace {

void Notify(const std::string& message) {
  // < 0: the socket is set but cannot be written to; 0: not run by systemd. Said once, not at
  // every ping.
  static std::atomic<bool> warned{false};
  if (const int sent = sd_notify(/*unset_environment=*/0, message.c_str());
      sent < 0 && !warned.exchange(true)) {
    RLOG(WARNING) << "systemd notify (" << message.substr(0, message.find('\n'))
                  << ") failed: error " << -sent << " (further failures are not logged)";
  }
}

// A status line is one line.
std::string OneLine(std::string_view text) {
  std::string line(text.substr(0, 200));
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return line;
}

}  // namespace

void NotifyReady(std::string_view status) {
  Notify(absl::StrCat("READY=1\nSTATUS=", OneLine(status)));
}

// sd_notify blocks while systemd has not read earlier messages; a daemon's exit must not wait on
// that, so STOPPING is sent from a thread of its own.
void NotifyInBackground(std::string message) {
  if (std::getenv("NOTIFY_SOCKET") == nullptr) return;
  std::thread([message = std::move(message)] { Notify(message); }).detach();
}

void NotifyStopping() { NotifyInBackground("STOPPING=1\nSTATUS=stopping"); }

absl::Duration WatchdogPingInterval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) <= 0 || usec == 0) {
    return absl::ZeroDuration();
  }
  return absl::Microseconds(static_cast<int64_t>(usec)) / 2;
}

void NotifyWatchdog() { Notify("WATCHDOG=1"); }

WatchdogPinger::WatchdogPinger(std::function<bool()> healthy) {
  const absl::Duration interval = WatchdogPingInterval();
  if (interval <= absl::ZeroDuration()) return;
  thread_ = std::thread([state = state_, interval, healthy = std::move(healthy)] {
    const auto step = absl::ToChronoMilliseconds(std::min(interval, absl::Milliseconds(100)));
    auto next = std::chrono::steady_clock::now();
    while (!state->stopping.load()) {
      if (std::chrono::steady_clock::now() >= next) {
        if (healthy() && !state->stopping.load()) {
          state->sending = true;
          NotifyWatchdog();
          state->sending = false;
        }
        next = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(interval);
      }
      std::this_thread::sleep_for(step);
    }
  });
}

WatchdogPinger::~WatchdogPinger() {
  state_->stopping = true;
  if (!thread_.joinable()) return;
  // A ping systemd does not read blocks in sd_notify; the process is ending: leave it.
  for (int i = 0; i < 20 && state_->sending.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (state_->sending.load()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

}  // namespace rlhfd

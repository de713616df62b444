#include "common/util/systemd_notify.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"

namespace rlhfd {
namespace {

void Notify(const std::string& message) {
  // < 0: the socket is set but cannot be written to; 0: not run by systemd.
  if (const int sent = sd_notify(/*unset_environment=*/0, message.c_str()); sent < 0) {
    RLOG(WARNING) << "systemd notify (" << message.substr(0, message.find('\n'))
                  << ") failed: error " << -sent;
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

void NotifyStatus(std::string_view status) { Notify(absl::StrCat("STATUS=", OneLine(status))); }

void NotifyStopping() { Notify("STOPPING=1\nSTATUS=stopping"); }

absl::Duration WatchdogPingInterval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) <= 0 || usec == 0) {
    return absl::ZeroDuration();
  }
  return absl::Microseconds(static_cast<int64_t>(usec)) / 2;
}

void NotifyWatchdog() { Notify("WATCHDOG=1"); }

WatchdogPinger::WatchdogPinger() {
  const absl::Duration interval = WatchdogPingInterval();
  if (interval <= absl::ZeroDuration()) return;
  thread_ = std::thread([this, interval] {
    const auto step = absl::ToChronoMilliseconds(std::min(interval, absl::Milliseconds(100)));
    auto next = std::chrono::steady_clock::now();
    while (!stopping_.load()) {
      if (std::chrono::steady_clock::now() >= next) {
        NotifyWatchdog();
        next = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(interval);
      }
      std::this_thread::sleep_for(step);
    }
  });
}

WatchdogPinger::~WatchdogPinger() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace rlhfd

// systemd's notify protocol (sd_notify, libsystemd) for daemons run as Type=notify units:
// readiness (with a status line) once serving, stopping, and the watchdog's keep-alive. Outside
// systemd ($NOTIFY_SOCKET unset) every call does nothing.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string_view>
#include <thread>

#include "absl/time/time.h"

namespace rlhfd {

// Once serving; sent at once (systemd reads a unit's first message as it starts it).
void NotifyReady(std::string_view status);
// Sent from a thread of its own: the drain does not wait for systemd.
void NotifyStopping();

// How often to ping the watchdog: half the unit's WatchdogSec ($WATCHDOG_USEC, when meant for
// this process); zero when the unit has no watchdog.
absl::Duration WatchdogPingInterval();
void NotifyWatchdog();

// Pings the watchdog every WatchdogPingInterval() from a thread of its own while `healthy` says
// so (systemd restarts a process that hangs, is stopped, or stays unhealthy). sd_notify blocks
// while systemd has not read earlier messages, so the daemon's own threads never send. Does
// nothing without a watchdog.
class WatchdogPinger {
 public:
  explicit WatchdogPinger(std::function<bool()> healthy = [] { return true; });
  ~WatchdogPinger();
  WatchdogPinger(const WatchdogPinger&) = delete;
  WatchdogPinger& operator=(const WatchdogPinger&) = delete;

 private:
  // Shared with the thread, which is left behind if it is stuck in sd_notify at the end.
  struct State {
    std::atomic<bool> stopping{false};
    std::atomic<bool> sending{false};
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;
};

}  // namespace rlhfd

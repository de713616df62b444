// systemd's notify protocol (sd_notify, libsystemd) for daemons run as Type=notify units:
// readiness once serving, a status line, stopping, and the watchdog's keep-alive. Outside
// systemd ($NOTIFY_SOCKET unset) every call does nothing.
#pragma once

#include <atomic>
#include <string_view>
#include <thread>

#include "absl/time/time.h"

namespace rlhfd {

void NotifyReady(std::string_view status);
void NotifyStatus(std::string_view status);
void NotifyStopping();

// How often to ping the watchdog: half the unit's WatchdogSec ($WATCHDOG_USEC, when meant for
// this process); zero when the unit has no watchdog.
absl::Duration WatchdogPingInterval();
void NotifyWatchdog();

// Pings the watchdog every WatchdogPingInterval() from a thread of its own for as long as it
// lives (systemd restarts a process that hangs or is stopped). Does nothing without a watchdog.
class WatchdogPinger {
 public:
  WatchdogPinger();
  ~WatchdogPinger();
  WatchdogPinger(const WatchdogPinger&) = delete;
  WatchdogPinger& operator=(const WatchdogPinger&) = delete;

 private:
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace rlhfd

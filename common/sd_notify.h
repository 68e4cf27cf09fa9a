// common/sd_notify.h: readiness notification to systemd (Type=notify units, docs/systemd/). Built with libsystemd
// when meson finds it (optional dependency; DHS_HAVE_SYSTEMD); without it, or when not run under systemd
// ($NOTIFY_SOCKET unset), the calls do nothing.
//
// Thread-safety: safe from any thread (sd_notify is).
#pragma once

#include <string_view>

namespace dhs {

// Sends "READY=1" and "STATUS=<status>" to systemd. Returns true when a notification was sent, false when not under
// systemd, built without libsystemd, or the send failed (never an error for the caller: readiness is advisory).
bool NotifyReady(std::string_view status);
// Sends "STOPPING=1". Same return convention.
bool NotifyStopping();
// Whether this build can notify systemd at all.
bool NotifySupported();

}  // namespace dhs

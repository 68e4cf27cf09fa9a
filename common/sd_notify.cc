#include "common/sd_notify.h"

#include <string>

#ifdef DHS_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace dhs {

bool NotifyReady(std::string_view status) {
#ifdef DHS_HAVE_SYSTEMD
  const std::string text = "READY=1\nSTATUS=" + std::string(status);
  return sd_notify(0, text.c_str()) > 0;
#else
  (void)status;
  return false;
#endif
}

bool NotifyStopping() {
#ifdef DHS_HAVE_SYSTEMD
  return sd_notify(0, "STOPPING=1") > 0;
#else
  return false;
#endif
}

bool NotifySupported() {
#ifdef DHS_HAVE_SYSTEMD
  return true;
#else
  return false;
#endif
}

}  // namespace dhs

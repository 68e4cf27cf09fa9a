// workerd/device/link_model_cli.h: the link-model options (link_model.h) on a CLI11 app, shared by workerd and
// dhs-replay so that both spell them alike. Header-only: includers bring CLI11 (the device library does not need it).
//
//   --link-model off|pcie5   [--link-h2d-gb-per-s X] [--link-d2h-gb-per-s X] [--link-latency-us X]
//
// Values are checked by ResolveLinkModel after parsing (errors name the option).
#pragma once

#include "CLI/CLI.hpp"
#include "workerd/device/link_model.h"

namespace dhs {

inline void AddLinkModelOptions(CLI::App& app, LinkModelFlags* flags) {
  app.add_option("--link-model", flags->model,
                 "model of the host-device link on the CPU backend: off | pcie5 (docs/link_model.md)")
      ->capture_default_str();
  app.add_option("--link-h2d-gb-per-s", flags->host_to_device_gb_per_s,
                 "modelled host->device bandwidth, GB/s (pcie5 default 55)");
  app.add_option("--link-d2h-gb-per-s", flags->device_to_host_gb_per_s,
                 "modelled device->host bandwidth, GB/s (pcie5 default 55)");
  app.add_option("--link-latency-us", flags->latency_us, "modelled latency per copy batch, microseconds (pcie5 default 5)");
}

}  // namespace dhs

// workerd/device/async_device_cli.h: the asynchronous mode of the CPU device (cpu_device.h, issue 28) on a CLI11 app,
// shared by workerd and dhs-replay so that both spell it alike. Header-only: includers bring CLI11.
//
//   --async-device SEED   (0: off, the default) the CPU backend completes copies and ends reads device steps after
//                         the calls that started them, with delays drawn from SEED; a read hazard ends the worker
//                         with its description (docs/workerd testing notes: docs/operations.md "Asynchronous device")
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "workerd/device/cpu_device.h"

namespace dhs {

inline void AddAsyncDeviceOption(CLI::App& app, uint64_t* seed) {
  app.add_option("--async-device", *seed,
                 "TEST MODE of the CPU backend: copies and reads end device steps after the calls that started them "
                 "(delays seeded by SEED; 0 = off); a read hazard aborts the worker with its description")
      ->capture_default_str();
}

// The worker's configuration for seed `seed` (disabled when 0): defaults of AsyncDeviceConfig, hazards fatal.
inline AsyncDeviceConfig WorkerAsyncDevice(uint64_t seed) {
  AsyncDeviceConfig c;
  c.enabled = seed != 0;
  c.seed = seed;
  c.fatal_hazards = true;
  // A worker's step issues some hundreds of device steps; a reader must outlive a memd round trip (about one step)
  // for an early ReadersDone or Retire to meet it, as a GPU's queued reads can.
  c.reader_steps_min = 256;
  c.reader_steps_max = 1024;
  // A wait that cannot end fails after 2 s (the worker's loop is blocked meanwhile: memd's silence clock is longer).
  c.stuck_after = absl::Seconds(2);
  return c;
}

// The workerd arguments that select it (empty when off).
inline std::vector<std::string> AsyncDeviceArgs(uint64_t seed) {
  if (seed == 0) return {};
  return {"--async-device", std::to_string(seed)};
}

}  // namespace dhs

// fuzz/cluster_page_value_fuzz.cc: libFuzzer target for the cluster tier's page value decoder (issue 26;
// memd/cluster_page_value.h). The input is a value as read from the store, decoded against a fixed geometry (host
// pages of 64 bytes) and identity. Properties: the decoder never reads outside the input (ASan: the bytes are copied
// into a buffer of exactly their size); a value it accepts is exactly what the encoder writes for its payload (so
// nothing but an encoder's output is ever imported); and the input's first 64 bytes, encoded as a payload, decode back
// to themselves.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "memd/cluster_page_value.h"

namespace {

using dhs::memd::PageGeometry;
using dhs::memd::PageIdentity;

PageGeometry Geometry() {
  PageGeometry g;
  g.page_rows = 2;
  g.payload_sources = 1;
  g.index_producers = 1;
  g.index_key_bytes = 8;
  g.page_bytes = 48;
  g.host_page_bytes = 64;
  const uint64_t rows[] = {24}, keys[] = {8};
  g.layout_digest = dhs::memd::LayoutDigest(rows, keys);
  g.model = 26;
  return g;
}

const PageIdentity kIdentity{dhs::memd::PageValueKind::kPrefix, 0x0123456789abcdefull, 0xfedcba9876543210ull};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const PageGeometry geometry = Geometry();
  const std::vector<uint8_t> value(data, data + size);  // exactly `size` bytes: a read past them is an ASan report
  const dhs::memd::DecodedPageValue d = dhs::memd::DecodePageValue(value, geometry, kIdentity);
  if (d.ok()) {
    std::string again;
    if (!dhs::memd::EncodePageValue(geometry, kIdentity, d.payload, &again).ok()) std::abort();
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
  } else if (d.error == dhs::memd::PageValueError::kOk || !d.payload.empty()) {
    std::abort();
  }
  if (size >= geometry.host_page_bytes) {
    std::string encoded;
    if (!dhs::memd::EncodePageValue(geometry, kIdentity, std::span<const uint8_t>(data, geometry.host_page_bytes),
                                    &encoded)
             .ok()) {
      std::abort();
    }
    const std::vector<uint8_t> bytes(encoded.begin(), encoded.end());
    const dhs::memd::DecodedPageValue back = dhs::memd::DecodePageValue(bytes, geometry, kIdentity);
    if (!back.ok() || std::memcmp(back.payload.data(), data, geometry.host_page_bytes) != 0) std::abort();
  }
  return 0;
}

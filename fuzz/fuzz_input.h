// fuzz/fuzz_input.h: a small reader that turns a fuzz input into values (what clang's FuzzedDataProvider does, kept
// here so that the corpus-replay tests build with g++ too). Reads from the front; once the bytes run out every read
// returns 0 / empty, so any input is a valid program for the targets.
//
// Thread-safety: none; one per input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dhs::fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  size_t remaining() const { return size_ - pos_; }

  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint32_t U32() { return static_cast<uint32_t>(U16()) | (static_cast<uint32_t>(U16()) << 16); }
  uint64_t U64() { return static_cast<uint64_t>(U32()) | (static_cast<uint64_t>(U32()) << 32); }
  bool Bool() { return (U8() & 1) != 0; }
  // A value in [0, bound) (bound > 0) from one byte; `bound` <= 256 keeps it uniform enough.
  uint32_t Below(uint32_t bound) { return bound == 0 ? 0 : U8() % bound; }
  // Mostly small values (ids, page indices), sometimes a full 32- or 64-bit one (0xff escape).
  uint32_t Small32(uint32_t bound) {
    const uint8_t b = U8();
    return b == 0xff ? U32() : b % bound;
  }
  uint64_t Small64(uint32_t bound) {
    const uint8_t b = U8();
    return b == 0xff ? U64() : b % bound;
  }
  std::vector<uint32_t> SmallVector(uint32_t max_len, uint32_t bound) {
    std::vector<uint32_t> v(Below(max_len + 1));
    for (uint32_t& x : v) x = Small32(bound);
    return v;
  }
  // Up to `max_len` raw bytes: a 16-bit length then the bytes (fewer when the input ends).
  std::string Bytes(size_t max_len) {
    size_t n = U16() % (max_len + 1);
    if (n > remaining()) n = remaining();
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace dhs::fuzz

// tests/common/redis_slot_test.cc: Redis Cluster hash slots (common/redis_slot.h) against the specification's CRC16
// check value, the specification's hash-tag examples, slots a real redis-server 7.0 answered to CLUSTER KEYSLOT, and a
// bit-by-bit CRC16/XMODEM written here independently of the table-driven one.
#include "common/redis_slot.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace dhs::redis {
namespace {

// CRC16/XMODEM one bit at a time (poly 0x1021, init 0, MSB first, no reflection, no final xor).
uint16_t BitwiseCrc16(const std::string& s) {
  uint32_t crc = 0;
  for (unsigned char c : s) {
    crc ^= uint32_t{c} << 8;
    for (int i = 0; i < 8; ++i) crc = (crc & 0x8000) ? ((crc << 1) ^ 0x1021) : (crc << 1);
    crc &= 0xffff;
  }
  return static_cast<uint16_t>(crc);
}

TEST(RedisSlot, Crc16CheckValueOfTheSpecification) {
  EXPECT_EQ(Crc16("123456789"), 0x31C3);
  EXPECT_EQ(Crc16(""), 0);
}

TEST(RedisSlot, HashTagRulesOfTheSpecification) {
  EXPECT_EQ(HashTag("{user1000}.following"), "user1000");
  EXPECT_EQ(HashTag("{user1000}.followers"), "user1000");
  EXPECT_EQ(HashTag("foo{}{bar}"), "foo{}{bar}");  // nothing between the first { and }: the whole key
  EXPECT_EQ(HashTag("foo{{bar}}zap"), "{bar");       // the first { and the first } after it
  EXPECT_EQ(HashTag("foo{bar}{zap}"), "bar");
  EXPECT_EQ(HashTag("a{b"), "a{b");                 // no } after the {
  EXPECT_EQ(HashTag("}{a}"), "a");
  EXPECT_EQ(HashTag("plain"), "plain");
}

TEST(RedisSlot, SlotsAsARealServerAnswersClusterKeyslot) {
  // `redis-cli cluster keyslot KEY` on redis-server 7.0.15 (cluster-enabled yes).
  const std::pair<std::string, uint32_t> answers[] = {
      {"123456789", 12739},           {"key", 12539},        {"id:{key}", 12539},
      {"{user1000}.following", 3443}, {"{user1000}.followers", 3443},
      {"foo{}{bar}", 8363},           {"foo{{bar}}zap", 4015}, {"foo{bar}{zap}", 5061},
      {"", 0},                        {"{", 4092},           {"}{a}", 15495},
      {"a{b", 13340},                 {"dhs:1:pp:0123456789abcdef", 14280},
  };
  for (const auto& [key, slot] : answers) EXPECT_EQ(KeySlot(key), slot) << key;
}

TEST(RedisSlot, TableCrcEqualsTheBitwiseCrcOnRandomBinaryKeys) {
  std::mt19937 rng(26);
  for (int i = 0; i < 2000; ++i) {
    std::string key(rng() % 64, '\0');
    for (char& c : key) c = static_cast<char>(rng());
    ASSERT_EQ(Crc16(key), BitwiseCrc16(key)) << i;
    EXPECT_LT(KeySlot(key), kClusterSlots);
  }
}

}  // namespace
}  // namespace dhs::redis

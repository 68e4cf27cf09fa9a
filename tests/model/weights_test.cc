// Safetensors reader/writer, the model loader's checks, and dhs-gen-weights determinism (brief §11 weights).
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <xxhash.h>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/model/test_util.h"
#include "workerd/model/safetensors.h"
#include "workerd/model/model.h"
#include "workerd/model/weights.h"

namespace dhs::model {
namespace {

// Builds a file image from a header text and a data buffer of `data_bytes` bytes (values 0..255 repeating).
std::string MakeFile(const std::string& header, size_t data_bytes, int64_t header_len_override = -1) {
  uint64_t n = header_len_override >= 0 ? static_cast<uint64_t>(header_len_override) : header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  out += header;
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i & 0xff));
  return out;
}

// Rewrites the JSON header of a valid image, keeping the data buffer.
std::string RewriteHeader(const std::string& image, const std::function<void(nlohmann::json&)>& edit) {
  uint64_t n = 0;
  std::memcpy(&n, image.data(), 8);
  nlohmann::json h = nlohmann::json::parse(image.substr(8, n));
  edit(h);
  return MakeFile(h.dump(), 0) + image.substr(8 + n);
}

absl::Status ParseStatus(std::string bytes) { return SafetensorsFile::Parse(std::move(bytes)).status(); }

void ExpectError(const absl::Status& s, std::string_view needle) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find(needle), std::string::npos) << s;
}

TEST(SafetensorsTest, RoundTrip) {
  SafetensorsWriter w;
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  const std::vector<float> b = {42.0f};
  ASSERT_TRUE(w.AddF32("a", {2, 3}, a).ok());
  ASSERT_TRUE(w.AddF32("b", {1}, b).ok());
  w.SetMetadata("k", "v");
  const std::string image = w.Serialize();
  uint64_t n = 0;
  std::memcpy(&n, image.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(image.size(), 8 + n + 7 * sizeof(float));
  auto f = SafetensorsFile::Parse(image);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->metadata().at("k"), "v");
  const int64_t shape_a[] = {2, 3};
  auto ra = f->ReadF32("a", shape_a);
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(*ra, a);
  EXPECT_EQ(f->tensors().at("b").begin, 24u);
  EXPECT_FALSE(w.AddF32("a", {6}, a).ok());      // duplicate
  EXPECT_FALSE(w.AddF32("c", {4}, a).ok());      // size mismatch
}

TEST(SafetensorsTest, RejectsBadFiles) {
  const std::string ok_header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_TRUE(ParseStatus(MakeFile(ok_header, 8)).ok());
  ExpectError(ParseStatus("abc"), "no header length");
  ExpectError(ParseStatus(MakeFile(ok_header, 8, 0)), "bad header length 0");
  ExpectError(ParseStatus(MakeFile(ok_header, 8, 1000)), "header length 1000 past the end");
  ExpectError(ParseStatus(MakeFile(ok_header, 8, int64_t{1} << 40)), "bad header length");
  ExpectError(ParseStatus(MakeFile("{not json", 8)), "not a JSON object");
  ExpectError(ParseStatus(MakeFile("[1,2]", 8)), "not a JSON object");
  // Truncated data: the last tensor runs past the buffer.
  ExpectError(ParseStatus(MakeFile(ok_header, 5)), "tensor 'x': data_offsets end 8 past the data buffer");
  // Out of bounds.
  ExpectError(ParseStatus(MakeFile(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 16)),
              "tensor 'x': data_offsets end 24 past");
  // Overlapping.
  ExpectError(ParseStatus(MakeFile(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                   R"("y":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                                   24)),
              "tensor 'y': data_offsets [8, 24] overlap tensor 'x'");
  // Gap between tensors.
  ExpectError(ParseStatus(MakeFile(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("y":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                                   20)),
              "tensor 'y': gap of 4 bytes");
  // Not covering the data buffer.
  ExpectError(ParseStatus(MakeFile(ok_header, 16)), "tensors cover 8 bytes of a 16-byte data buffer");
  // Offsets disagree with dtype x shape.
  ExpectError(ParseStatus(MakeFile(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
              "tensor 'x': data_offsets span 8 bytes but F32 [3] needs 12");
  ExpectError(ParseStatus(MakeFile(R"({"x":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8)),
              "tensor 'x': unknown dtype 'Q7'");
  ExpectError(ParseStatus(MakeFile(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)),
              "tensor 'x': shape entries must be non-negative");
  ExpectError(ParseStatus(MakeFile(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)),
              "tensor 'x': data_offsets [8, 0] reversed");
  ExpectError(ParseStatus(MakeFile(R"({"x":{"dtype":"F32","shape":[2]}})", 8)), "tensor 'x': data_offsets must be");
  // Reading with a wrong dtype / shape / name.
  auto f = SafetensorsFile::Parse(MakeFile(R"({"x":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8));
  ASSERT_TRUE(f.ok());
  const int64_t two[] = {2};
  ExpectError(f->ReadF32("x", two).status(), "tensor 'x': dtype I32, expected F32");
  EXPECT_EQ(f->ReadF32("zz", two).status().code(), absl::StatusCode::kNotFound);
}

class ModelLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = PresetConfig("glm5-like");
    ASSERT_TRUE(config.ok());
    config_ = *config;
    auto w = GenerateWeights(config_, 5);
    ASSERT_TRUE(w.ok());
    writer_ = std::move(*w);
    image_ = writer_.Serialize();
  }
  absl::Status LoadStatus(std::string image) {
    auto f = SafetensorsFile::Parse(std::move(image));
    if (!f.ok()) return f.status();
    return Model::FromSafetensors(*f).status();
  }
  ModelConfig config_;
  SafetensorsWriter writer_;
  std::string image_;
};

TEST_F(ModelLoaderTest, LoadsGeneratedWeightsAndRebuildsConfig) {
  auto f = SafetensorsFile::Parse(image_);
  ASSERT_TRUE(f.ok());
  auto m = Model::FromSafetensors(*f);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().ToJson(), config_.ToJson());
  EXPECT_EQ(f->metadata().at("preset"), "glm5-like");
  EXPECT_EQ(f->tensors().size(), ModelTensorSpecs(config_).size());
}

TEST_F(ModelLoaderTest, RejectsMissingTensor) {
  auto s = LoadStatus(RewriteHeader(image_, [](nlohmann::json& h) {
    h["renamed"] = h["layers.3.w_dkv"];
    h.erase("layers.3.w_dkv");
  }));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  ExpectError(s, "'layers.3.w_dkv'");
}

TEST_F(ModelLoaderTest, RejectsWrongShape) {
  auto s = LoadStatus(RewriteHeader(image_, [](nlohmann::json& h) { h["lm_head"]["shape"] = {64, 256}; }));
  ExpectError(s, "tensor 'lm_head': shape [64, 256], expected [256, 64]");
}

TEST_F(ModelLoaderTest, RejectsWrongDtype) {
  auto s = LoadStatus(RewriteHeader(image_, [](nlohmann::json& h) { h["final_norm"]["dtype"] = "I32"; }));
  ExpectError(s, "tensor 'final_norm': dtype I32, expected F32");
}

TEST_F(ModelLoaderTest, RejectsUnexpectedTensorAndMissingConfig) {
  const std::vector<float> extra = {1.0f, 2.0f};
  ASSERT_TRUE(writer_.AddF32("layers.0.bogus", {2}, extra).ok());
  ExpectError(LoadStatus(writer_.Serialize()), "unexpected tensor 'layers.0.bogus'");
  ExpectError(LoadStatus(RewriteHeader(image_, [](nlohmann::json& h) { h["__metadata__"].erase("config"); })),
              "no \"config\"");
  ExpectError(LoadStatus(RewriteHeader(image_, [](nlohmann::json& h) { h["__metadata__"]["config"] = "{}"; })),
              "model config");
}

// Issue 26: Model::fingerprint, the cluster tier's model (memd's page geometry). Worked out here from the file by its
// docstring's formula with libxxhash's one-shot XXH3-64 over one concatenated buffer (the loader streams it).
TEST_F(ModelLoaderTest, FingerprintIsTheDocumentedHashOfConfigAndWeights) {
  auto fingerprint = [](const std::string& image) -> uint64_t {
    auto f = SafetensorsFile::Parse(image);
    EXPECT_TRUE(f.ok()) << f.status();
    auto m = Model::FromSafetensors(*f);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? (*m)->fingerprint() : 0;
  };
  auto f = SafetensorsFile::Parse(image_);
  ASSERT_TRUE(f.ok());
  std::string buffer = config_.ToJson();
  for (const TensorSpec& spec : ModelTensorSpecs(config_)) {
    auto data = f->ReadF32(spec.name, spec.shape);
    ASSERT_TRUE(data.ok());
    buffer.append(spec.name.c_str(), spec.name.size() + 1);
    buffer.append(reinterpret_cast<const char*>(data->data()), data->size() * sizeof(float));
  }
  const uint64_t a = fingerprint(image_);
  EXPECT_EQ(a, XXH3_64bits(buffer.data(), buffer.size()));
  EXPECT_NE(a, 0u);
  // The same weights again, and the config's JSON written another way (canonical config: the same model).
  EXPECT_EQ(fingerprint(image_), a);
  EXPECT_EQ(fingerprint(RewriteHeader(image_, [](nlohmann::json& h) {
              h["__metadata__"]["config"] = nlohmann::json::parse(h["__metadata__"]["config"].get<std::string>()).dump(2);
            })),
            a);
  // Another seed, one bit of the last weight, another preset: other models.
  EXPECT_NE(fingerprint(GenerateWeights(config_, 6)->Serialize()), a);
  std::string flipped = image_;
  flipped.back() ^= 1;
  EXPECT_NE(fingerprint(flipped), a);
  auto other = PresetConfig("dsv4flash-like");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(fingerprint(GenerateWeights(*other, 5)->Serialize()), a);
}

TEST_F(ModelLoaderTest, RejectsTruncatedFile) {
  ExpectError(LoadStatus(image_.substr(0, image_.size() - 3)), "past the data buffer");
}

TEST(GenWeightsTest, SameSeedSameBytesDifferentSeedDifferent) {
  for (const std::string& preset : PresetNames()) {
    auto config = PresetConfig(preset);
    ASSERT_TRUE(config.ok());
    const std::string a = GenerateWeights(*config, 7)->Serialize();
    const std::string b = GenerateWeights(*config, 7)->Serialize();
    const std::string c = GenerateWeights(*config, 8)->Serialize();
    EXPECT_EQ(a, b) << preset;
    ASSERT_EQ(a.size(), c.size());
    EXPECT_NE(a, c) << preset;
  }
}

std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(GenWeightsTest, ToolWritesDeterministicLoadableFiles) {
  const char* exe = std::getenv("DHS_GEN_WEIGHTS");
  if (exe == nullptr) GTEST_SKIP() << "DHS_GEN_WEIGHTS not set (run through meson test)";
  const auto dir = std::filesystem::temp_directory_path() / ("dhs_gen_weights_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto run = [&](const std::string& args, const std::string& out) {
    const std::string cmd = std::string(exe) + " " + args + " --out " + (dir / out).string();
    return std::system(cmd.c_str());
  };
  ASSERT_EQ(run("--preset dsv4flash-like --seed 3", "a.st"), 0);
  ASSERT_EQ(run("--preset dsv4flash-like --seed 3", "b.st"), 0);
  ASSERT_EQ(run("--preset dsv4flash-like --seed 4", "c.st"), 0);
  EXPECT_NE(run("--preset nope --seed 3", "d.st"), 0);
  const std::string a = ReadAll(dir / "a.st");
  EXPECT_EQ(a, ReadAll(dir / "b.st"));
  EXPECT_NE(a, ReadAll(dir / "c.st"));
  auto model = Model::Load((dir / "a.st").string());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().preset, "dsv4flash-like");
  EXPECT_EQ(Model::Load((dir / "missing.st").string()).status().code(), absl::StatusCode::kNotFound);
  // The benchmark preset: accepted by the tool, its config round-trips through the file's __metadata__.
  ASSERT_EQ(run("--preset bench-wide --seed 3", "wide.st"), 0);
  auto wide = Model::Load((dir / "wide.st").string());
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ((*wide)->config().ToJson(), PresetConfig("bench-wide")->ToJson());
  EXPECT_EQ((*wide)->config().d_model, 1024);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dhs::model

// Training logs: CRC-32C against published check values, TFRecord framing and Event encoding
// byte for byte against TensorBoard's own writer (scripts/golden_tensorboard.py), the reader's
// refusal of damaged records, and the event file + CSV a TrainingLog writes, read back.
#include <kiln/io/training_log.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;

std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}
std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
fs::path scratch_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kiln_tb_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

// scripts/golden_tensorboard.py with tensorboard 2.21: Event(wall_time=1234.5, file_version=
// "brain.Event:2") and Event(wall_time=1234.75, step=7, summary: train/loss 0.25, train/lr 0.001),
// each framed by tensorboard.summary.writer.record_writer.RecordWriter.
const char* golden_header =
    "1800000000000000a37f4b220900000000004a93401a0d627261696e2e4576656e743a3265b8d3fb";
const char* golden_scalars =
    "31000000000000009d8383e90900000000004b934010072a240a110a0a747261696e2f6c6f7373150000803e0a0f0a08747261696e2f"
    "6c72156f12833aa15e8875";

}  // namespace

TEST_CASE("crc32c matches the published check values, in hardware and portable forms") {
  const std::string digits = "123456789";
  CHECK(kiln::io::crc32c(digits.data(), digits.size()) == 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xFF');
  CHECK(kiln::io::crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);  // RFC 3720 B.4
  CHECK(kiln::io::crc32c(ones.data(), ones.size()) == 0x62A8AB43u);
  std::string mixed;
  for (int i = 0; i < 1000; ++i) mixed.push_back(char(i * 37 + 11));
  for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 1000u}) {
    CAPTURE(n);
    CHECK(kiln::io::crc32c(mixed.data(), n) == kiln::io::crc32c_portable(mixed.data(), n));
    // Continuing over a split gives the CRC of the whole.
    CHECK(kiln::io::crc32c(mixed.data() + n / 2, n - n / 2, kiln::io::crc32c(mixed.data(), n / 2)) ==
          kiln::io::crc32c(mixed.data(), n));
  }
}

TEST_CASE("events are byte-identical to TensorBoard's own writer") {
  std::string header, scalars;
  kiln::io::append_tfrecord(header, kiln::io::encode_event(1234.5, 0, {}, "brain.Event:2"));
  kiln::io::append_tfrecord(scalars, kiln::io::encode_event(1234.75, 7, {{"train/loss", 0.25}, {"train/lr", 0.001}}));
  CHECK(header == from_hex(golden_header));
  CHECK(scalars == from_hex(golden_scalars));

  const auto records = kiln::io::read_tfrecords(from_hex(golden_header) + from_hex(golden_scalars), "golden");
  REQUIRE(records.size() == 2);
  const auto first = kiln::io::decode_event(records[0]);
  CHECK(first.file_version == "brain.Event:2");
  CHECK(first.wall_time == 1234.5);
  CHECK(first.scalars.empty());
  const auto second = kiln::io::decode_event(records[1]);
  CHECK(second.step == 7);
  CHECK(second.wall_time == 1234.75);
  REQUIRE(second.scalars.size() == 2);
  CHECK(second.scalars[0].first == "train/loss");
  CHECK(second.scalars[0].second == 0.25f);
  CHECK(second.scalars[1].first == "train/lr");
  CHECK(second.scalars[1].second == 0.001f);
}

TEST_CASE("a damaged record is a DataError naming the file and offset") {
  const std::string good = from_hex(golden_header) + from_hex(golden_scalars);
  const std::size_t second = from_hex(golden_header).size();
  auto expect = [](const std::string& bytes, const std::string& part) {
    std::string message;
    try {
      (void)kiln::io::read_tfrecords(bytes, "run.tfevents");
    } catch (const kiln::DataError& e) {
      message = e.what();
    }
    CAPTURE(message);
    CHECK(message.find("run.tfevents") != std::string::npos);
    CHECK(message.find(part) != std::string::npos);
  };
  expect(good.substr(0, good.size() - 1), "offset " + std::to_string(second));  // torn last record
  expect(good.substr(0, second + 5), "truncated");
  std::string flipped = good;
  flipped[second + 20] ^= 0x10;
  expect(flipped, "data CRC mismatch");
  flipped = good;
  flipped[second] ^= 0x01;
  expect(flipped, "length CRC mismatch");
  // Every single-byte flip is refused (the CRCs cover every byte), never read out of bounds.
  for (std::size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x5A;
    CHECK_THROWS_AS((void)kiln::io::read_tfrecords(bad, "run.tfevents"), kiln::DataError);
  }
  // A malformed protobuf inside a valid frame is a DataError too.
  CHECK_THROWS_AS((void)kiln::io::decode_event(std::string("\x2a\x7f", 2)), kiln::DataError);
  CHECK_THROWS_AS((void)kiln::io::decode_event(std::string(11, '\xff')), kiln::DataError);
}

TEST_CASE("a TrainingLog writes an event file and a CSV that read back, and a second run appends") {
  const fs::path dir = scratch_dir("log");
  std::string event_file;
  {
    kiln::io::TrainingLog log(dir.string());
    event_file = log.event_file();
    for (int step = 10; step <= 30; step += 10)
      log.write(step, {{"train/loss", 1.0 / step}, {"train/lr", 1e-3}, {"perf/samples_per_s", 1e5 + step}});
  }
  const auto records = kiln::io::read_tfrecords(read_all(event_file), event_file);
  REQUIRE(records.size() == 4);
  CHECK(kiln::io::decode_event(records[0]).file_version == "brain.Event:2");
  for (int i = 1; i <= 3; ++i) {
    const auto e = kiln::io::decode_event(records[std::size_t(i)]);
    CHECK(e.step == 10 * i);
    REQUIRE(e.scalars.size() == 3);
    CHECK(e.scalars[0].first == "train/loss");
    CHECK(e.scalars[0].second == float(1.0 / (10 * i)));
    CHECK(e.scalars[2].second == float(1e5 + 10 * i));
  }
  {
    kiln::io::TrainingLog resumed(dir.string());  // a resumed run: a new event file, the same CSV
    CHECK(resumed.event_file() != event_file);
    resumed.write(40, {{"train/loss", 0.025}, {"train/lr", 1e-3}, {"perf/samples_per_s", 100040}});
    CHECK_THROWS_AS(resumed.write(50, {{"train/loss", 0.02}}), kiln::ValueError);  // other columns
  }
  std::istringstream csv(read_all(dir / "scalars.csv"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  REQUIRE(lines.size() == 5);
  CHECK(lines[0] == "step,wall_time,train/loss,train/lr,perf/samples_per_s");
  CHECK(lines[1].rfind("10,", 0) == 0);
  CHECK(lines[1].substr(lines[1].find(',', 3)) == ",0.1,0.001,100010");
  CHECK(lines[4].rfind("40,", 0) == 0);
  fs::remove_all(dir);
}

TEST_CASE("a log directory that cannot be made is a DataError naming it") {
  const fs::path blocker = scratch_dir("blocker");
  std::ofstream(blocker) << "a file, not a directory";
  std::string message;
  try {
    kiln::io::TrainingLog log((blocker / "sub").string());
  } catch (const kiln::DataError& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find(blocker.string()) != std::string::npos);
  fs::remove(blocker);
}

// libFuzzer harness: the IDX reader on any bytes, raw or gzip (as read_idx takes them). Every
// failure must be a kiln::DataError; anything else (a crash, a sanitizer report, another
// exception) is a finding. scripts/fuzz.sh builds and runs it.
#include <cstddef>
#include <cstdint>
#include <span>

#include "kiln/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  try {
    if (kiln::data::is_gzip(bytes)) {
      const auto raw = kiln::data::gunzip(bytes, "fuzz.idx.gz");
      (void)kiln::data::parse_idx(raw, "fuzz.idx.gz");
    } else {
      (void)kiln::data::parse_idx(bytes, "fuzz.idx");
    }
  } catch (const kiln::DataError&) {
  }
  return 0;
}

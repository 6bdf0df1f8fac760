// libFuzzer harness: the CSV classification reader on any text, with the letter-recognition
// options and the defaults (label last, integer). Every failure must be a kiln::DataError.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/data/csv.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& options : {kiln::data::CsvOptions::letter_recognition(), kiln::data::CsvOptions{}}) {
    try {
      (void)kiln::data::parse_csv_classification(text, "fuzz.csv", options);
    } catch (const kiln::DataError&) {
    }
  }
  return 0;
}

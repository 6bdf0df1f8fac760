// kiln/io/json.hpp — the small, strict JSON reader and writer helpers that safetensors headers
// need (kiln/io/safetensors.hpp). Outside bytes reach it, so it is written for hostile input:
// every error is a DataError with the byte offset, nesting is bounded (no stack exhaustion), an
// integer that does not fit int64 is an error rather than a rounded double, duplicate keys are
// refused (two readers could otherwise see two different files in one).
//
//   kiln::io::JsonValue v = kiln::io::parse_json(text, "model.safetensors header");
//   if (const JsonValue* shape = v.find("shape")) ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::io {

struct JsonValue {
  enum class Type { null, boolean, number, string, array, object };
  Type type = Type::null;
  bool boolean = false;
  bool is_integer = false;  // a number written without fraction or exponent that fits int64
  std::int64_t integer = 0;
  double number = 0;
  std::string string;
  std::vector<JsonValue> items;                             // array
  std::vector<std::pair<std::string, JsonValue>> members;  // object, in file order

  // The member named key of an object, or nullptr.
  const JsonValue* find(std::string_view key) const;

  // Declared here and defaulted out of class (json_bodies.hpp): clang would otherwise instantiate
  // the members' vector of std::pair<std::string, JsonValue> inside the class, while JsonValue is
  // still incomplete.
  JsonValue();
  JsonValue(const JsonValue&);
  JsonValue(JsonValue&&) noexcept;
  JsonValue& operator=(const JsonValue&);
  JsonValue& operator=(JsonValue&&) noexcept;
  ~JsonValue();
};

KILN_COMPILED const char* json_type_name(JsonValue::Type t);

namespace detail {

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& what) : s_(text), what_(what) {}

  JsonValue document();

 private:
  static constexpr int max_depth = 64;

  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    throw DataError(::kiln::detail::concat(what_, ": not valid JSON at byte ", pos_, ": ", parts...));
  }
  static std::string printable(char c);

  void skip_space();
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }
  void expect(char c);
  void literal(std::string_view word);

  JsonValue value(int depth);
  void object(JsonValue& v, int depth);
  void array(JsonValue& v, int depth);
  unsigned hex4();
  static void put_utf8(std::string& out, unsigned cp);
  std::string string();
  void number(JsonValue& v);

  std::string_view s_;
  const std::string& what_;
  std::size_t pos_ = 0;
};

}  // namespace detail

// Parses one JSON document; `what` names the text in errors ("<file>: header").
// throws: DataError naming `what`, the byte offset and what was wrong.
KILN_COMPILED JsonValue parse_json(std::string_view text, const std::string& what);

// `s` as a JSON string literal, quotes included.
KILN_COMPILED std::string json_quote(std::string_view s);

}  // namespace kiln::io

#if KILN_HEADER_BODIES
#include "kiln/io/json_bodies.hpp"
#endif

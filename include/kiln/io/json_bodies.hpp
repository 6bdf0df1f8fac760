// kiln/io/json_bodies.hpp — the bodies of json.hpp's functions: included by it when kiln is
// header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/io/json.hpp"

namespace kiln::io {

KILN_COMPILED JsonValue::JsonValue() = default;
KILN_COMPILED JsonValue::JsonValue(const JsonValue&) = default;
KILN_COMPILED JsonValue::JsonValue(JsonValue&&) noexcept = default;
KILN_COMPILED JsonValue& JsonValue::operator=(const JsonValue&) = default;
KILN_COMPILED JsonValue& JsonValue::operator=(JsonValue&&) noexcept = default;
KILN_COMPILED JsonValue::~JsonValue() = default;

KILN_COMPILED const JsonValue* JsonValue::find(std::string_view key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

KILN_COMPILED const char* json_type_name(JsonValue::Type t) {
  switch (t) {
    case JsonValue::Type::null: return "null";
    case JsonValue::Type::boolean: return "a boolean";
    case JsonValue::Type::number: return "a number";
    case JsonValue::Type::string: return "a string";
    case JsonValue::Type::array: return "an array";
    case JsonValue::Type::object: return "an object";
  }
  return "?";
}

namespace detail {

KILN_COMPILED JsonValue JsonParser::document() {
  JsonValue v = value(0);
  skip_space();
  if (pos_ != s_.size()) fail("unexpected '", printable(s_[pos_]), "' after the JSON value");
  return v;
}

KILN_COMPILED std::string JsonParser::printable(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return std::string(1, c);
  static const char hex[] = "0123456789abcdef";
  return std::string("\\x") + hex[u >> 4] + hex[u & 15];
}

KILN_COMPILED void JsonParser::skip_space() {
  while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
}

KILN_COMPILED void JsonParser::expect(char c) {
  if (at_end()) fail("the text ends where '", std::string(1, c), "' was expected");
  if (peek() != c) fail("expected '", std::string(1, c), "', found '", printable(peek()), "'");
  ++pos_;
}

KILN_COMPILED void JsonParser::literal(std::string_view word) {
  if (s_.substr(pos_, word.size()) != word) fail("expected a JSON value");
  pos_ += word.size();
}

KILN_COMPILED JsonValue JsonParser::value(int depth) {
  if (depth > max_depth) fail("nested deeper than ", max_depth, " levels");
  skip_space();
  if (at_end()) fail("the text ends where a value was expected");
  JsonValue v;
  switch (peek()) {
    case '{': object(v, depth); break;
    case '[': array(v, depth); break;
    case '"':
      v.type = JsonValue::Type::string;
      v.string = string();
      break;
    case 't':
      literal("true");
      v.type = JsonValue::Type::boolean;
      v.boolean = true;
      break;
    case 'f':
      literal("false");
      v.type = JsonValue::Type::boolean;
      break;
    case 'n': literal("null"); break;
    default: number(v);
  }
  return v;
}

KILN_COMPILED void JsonParser::object(JsonValue& v, int depth) {
  v.type = JsonValue::Type::object;
  ++pos_;
  skip_space();
  if (!at_end() && peek() == '}') {
    ++pos_;
    return;
  }
  for (;;) {
    skip_space();
    if (at_end() || peek() != '"') fail("expected a quoted key");
    const std::size_t key_at = pos_;
    std::string key = string();
    if (v.find(key) != nullptr) {
      pos_ = key_at;
      fail("the key \"", key, "\" appears twice");
    }
    skip_space();
    expect(':');
    JsonValue member = value(depth + 1);
    v.members.emplace_back(std::move(key), std::move(member));
    skip_space();
    if (at_end()) fail("the text ends inside an object");
    if (peek() == ',') {
      ++pos_;
      continue;
    }
    expect('}');
    return;
  }
}

KILN_COMPILED void JsonParser::array(JsonValue& v, int depth) {
  v.type = JsonValue::Type::array;
  ++pos_;
  skip_space();
  if (!at_end() && peek() == ']') {
    ++pos_;
    return;
  }
  for (;;) {
    v.items.push_back(value(depth + 1));
    skip_space();
    if (at_end()) fail("the text ends inside an array");
    if (peek() == ',') {
      ++pos_;
      continue;
    }
    expect(']');
    return;
  }
}

KILN_COMPILED unsigned JsonParser::hex4() {
  if (s_.size() - pos_ < 4) fail("a \\u escape needs four hex digits");
  unsigned u = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = s_[pos_++];
    u <<= 4;
    if (c >= '0' && c <= '9') u |= unsigned(c - '0');
    else if (c >= 'a' && c <= 'f') u |= unsigned(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') u |= unsigned(c - 'A' + 10);
    else fail("'", printable(c), "' is not a hex digit in a \\u escape");
  }
  return u;
}

KILN_COMPILED void JsonParser::put_utf8(std::string& out, unsigned cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

KILN_COMPILED std::string JsonParser::string() {
  ++pos_;  // the opening quote
  std::string out;
  for (;;) {
    if (at_end()) fail("the text ends inside a string");
    const char c = s_[pos_++];
    if (c == '"') return out;
    if (static_cast<unsigned char>(c) < 0x20) {
      --pos_;
      fail("control character ", printable(c), " inside a string");
    }
    if (c != '\\') {
      out += c;
      continue;
    }
    if (at_end()) fail("the text ends inside an escape");
    const char e = s_[pos_++];
    switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        unsigned cp = hex4();
        if (cp >= 0xD800 && cp < 0xDC00) {  // a high surrogate needs its low half
          if (s_.substr(pos_, 2) != "\\u") fail("an unpaired UTF-16 surrogate");
          pos_ += 2;
          const unsigned lo = hex4();
          if (lo < 0xDC00 || lo >= 0xE000) fail("an unpaired UTF-16 surrogate");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp < 0xE000) {
          fail("an unpaired UTF-16 surrogate");
        }
        put_utf8(out, cp);
        break;
      }
      default: --pos_; fail("unknown escape \\", printable(e));
    }
  }
}

KILN_COMPILED void JsonParser::number(JsonValue& v) {
  const std::size_t start = pos_;
  v.type = JsonValue::Type::number;
  bool negative = false;
  if (peek() == '-') {
    negative = true;
    ++pos_;
  }
  if (at_end() || peek() < '0' || peek() > '9') fail("expected a JSON value");
  // Integer part: no leading zeros (JSON), accumulated exactly while it fits.
  bool fits = true;
  std::uint64_t mag = 0;
  if (peek() == '0') {
    ++pos_;
    if (!at_end() && peek() >= '0' && peek() <= '9') fail("a number with a leading zero");
  } else {
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      const auto d = std::uint64_t(peek() - '0');
      if (mag > (UINT64_MAX - d) / 10) fits = false;
      else mag = mag * 10 + d;
      ++pos_;
    }
  }
  bool integral = true;
  if (!at_end() && peek() == '.') {
    integral = false;
    ++pos_;
    if (at_end() || peek() < '0' || peek() > '9') fail("a digit must follow the decimal point");
    while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
  }
  if (!at_end() && (peek() == 'e' || peek() == 'E')) {
    integral = false;
    ++pos_;
    if (!at_end() && (peek() == '+' || peek() == '-')) ++pos_;
    if (at_end() || peek() < '0' || peek() > '9') fail("a digit must follow the exponent");
    while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
  }
  // strtod, not stod: 1e999 is a (huge) number, not an exception from the standard library.
  v.number = std::strtod(std::string(s_.substr(start, pos_ - start)).c_str(), nullptr);
  const std::uint64_t limit = negative ? std::uint64_t(INT64_MAX) + 1 : std::uint64_t(INT64_MAX);
  if (integral && fits && mag <= limit) {
    v.is_integer = true;
    v.integer = negative ? std::int64_t(0 - mag) : std::int64_t(mag);
  }
}

}  // namespace detail

KILN_COMPILED JsonValue parse_json(std::string_view text, const std::string& what) {
  return detail::JsonParser(text, what).document();
}

KILN_COMPILED std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      static const char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace kiln::io

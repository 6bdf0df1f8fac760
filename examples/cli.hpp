// examples/cli.hpp — the examples' command lines: `--name value` options bound to fields, and
// --help printing a usage text. Each example lists its options once:
//
//   Options o;
//   kiln_example::Flags flags;
//   flags.add("--epochs", o.epochs).add("--lr", o.lr).add("--data-dir", o.data_dir);
//   flags.parse(argc, argv, "usage: train_x [--epochs N] [--lr X] [--data-dir DIR]\n");
//
// An unknown option, a missing or malformed value, or one out of its bound is a kiln::ValueError
// naming the option and the value (`option --epochs: "abc" is not an integer (see --help)`).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"

namespace kiln_example {

// What a numeric option accepts besides being a number.
enum class Bound { any, positive, non_negative };
inline constexpr Bound positive = Bound::positive;
inline constexpr Bound non_negative = Bound::non_negative;

class Flags {
 public:
  // A switch: --name (no value) sets field to true.
  Flags& add(std::string name, bool& field) {
    switches_.emplace_back(std::move(name), &field);
    return *this;
  }

  // Binds --name to field: int, long long / index_t, std::uint64_t, double or std::string. With
  // `bound` = positive / non_negative the value must be > 0 / >= 0; doubles must be finite.
  template <class T>
  Flags& add(std::string name, T& field, Bound bound = Bound::any) {
    flags_.emplace_back(std::move(name), [&field, bound](const std::string& v) -> std::string {
      std::size_t used = 0;
      if constexpr (std::is_same_v<T, std::string>) {
        field = v;
        return {};
      } else {
        static_assert(std::is_arithmetic_v<T>, "kiln_example::Flags: a flag binds an integer, double or string");
        T parsed{};
        try {
          if constexpr (std::is_same_v<T, double>) {
            parsed = std::stod(v, &used);
            if (!std::isfinite(parsed)) return "is not a finite number";
          } else if constexpr (std::is_same_v<T, std::uint64_t>) {
            if (!v.empty() && v[0] == '-') return "is negative; it must be >= 0";  // stoull would wrap it
            parsed = std::stoull(v, &used);
          } else if constexpr (std::is_same_v<T, int>) {
            parsed = std::stoi(v, &used);
          } else {
            parsed = T(std::stoll(v, &used));
          }
        } catch (const std::out_of_range&) {
          return "is out of range";
        } catch (const std::exception&) {
          return std::is_same_v<T, double> ? "is not a number" : "is not an integer";
        }
        if (used != v.size()) return std::is_same_v<T, double> ? "is not a number" : "is not an integer";
        if (bound == Bound::positive && !(parsed > 0)) return "must be positive";
        if constexpr (std::is_signed_v<T>)
          if (bound == Bound::non_negative && parsed < 0) return "must be >= 0";
        field = parsed;
        return {};
      }
    });
    return *this;
  }

  // Reads argv; --help / -h prints `usage` and exits 0.
  void parse(int argc, char** argv, const char* usage) const {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(usage, stdout);
        std::exit(0);
      }
      if (bool* on = find_switch(a)) {
        *on = true;
        continue;
      }
      const auto* flag = find(a);
      const bool dashed = a.rfind("-", 0) == 0;
      KILN_CHECK(flag != nullptr, kiln::ValueError,
                 dashed ? "unknown option " + a : "unexpected argument \"" + a + "\" (options are --name value)",
                 " (see --help)");
      KILN_CHECK(i + 1 < argc, kiln::ValueError, "option ", a, " needs a value (see --help)");
      const std::string v = argv[++i];
      const std::string problem = flag->second(v);
      KILN_CHECK(problem.empty(), kiln::ValueError, "option ", a, ": \"", v, "\" ", problem, " (see --help)");
    }
  }

 private:
  using Entry = std::pair<std::string, std::function<std::string(const std::string&)>>;
  const Entry* find(const std::string& name) const {
    for (const auto& f : flags_)
      if (f.first == name) return &f;
    return nullptr;
  }
  bool* find_switch(const std::string& name) const {
    for (const auto& s : switches_)
      if (s.first == name) return s.second;
    return nullptr;
  }
  std::vector<Entry> flags_;
  std::vector<std::pair<std::string, bool*>> switches_;
};

}  // namespace kiln_example

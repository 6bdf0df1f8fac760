// examples/cli.hpp — the examples' command lines: `--name value` options bound to fields, and
// --help printing a usage text. Each example lists its options once:
//
//   Options o;
//   kiln_example::Flags flags;
//   flags.add("--epochs", o.epochs).add("--lr", o.lr).add("--data-dir", o.data_dir);
//   flags.parse(argc, argv, "usage: train_x [--epochs N] [--lr X] [--data-dir DIR]\n");
//
// An unknown option, a missing or malformed value is a kiln::ValueError naming the option.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"

namespace kiln_example {

class Flags {
 public:
  // A switch: --name (no value) sets field to true.
  Flags& add(std::string name, bool& field) {
    switches_.emplace_back(std::move(name), &field);
    return *this;
  }

  // Binds --name to field: int, long long / index_t, std::uint64_t, double or std::string.
  template <class T>
  Flags& add(std::string name, T& field) {
    flags_.emplace_back(std::move(name), [&field](const std::string& v) {
      std::size_t used = 0;
      if constexpr (std::is_same_v<T, std::string>) {
        field = v;
        used = v.size();
      } else if constexpr (std::is_same_v<T, double>) {
        field = std::stod(v, &used);
      } else if constexpr (std::is_same_v<T, std::uint64_t>) {
        field = std::stoull(v, &used);
      } else if constexpr (std::is_same_v<T, int>) {
        field = std::stoi(v, &used);
      } else {
        static_assert(std::is_integral_v<T>, "kiln_example::Flags: a flag binds an integer, double or string");
        field = T(std::stoll(v, &used));
      }
      return used == v.size();
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
      KILN_CHECK(i + 1 < argc, kiln::ValueError, "option ", a, " needs a value (see --help)");
      const std::string v = argv[++i];
      const auto* flag = find(a);
      KILN_CHECK(flag != nullptr, kiln::ValueError, "unknown option ", a, " (see --help)");
      bool ok = false;
      try {
        ok = flag->second(v);
      } catch (const std::exception&) {
        ok = false;  // std::stoi and friends: not a number, or out of range
      }
      KILN_CHECK(ok, kiln::ValueError, "option ", a, ": cannot read \"", v, "\" as its value (see --help)");
    }
  }

 private:
  using Entry = std::pair<std::string, std::function<bool(const std::string&)>>;
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

// kiln/doctor/report.hpp — what kiln-doctor finds, as data: named facts in sections, checks that
// passed or failed, and one verdict (where training will run, and why). The host part
// (doctor/host.hpp) and the CUDA part (doctor/cuda.cuh) fill it; print() writes it out.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace kiln::doctor {

struct Fact {
  std::string name, value;
};
struct Check {
  std::string name;
  bool passed = false;
  std::string detail;  // what was compared, or why it failed
};
struct Section {
  explicit Section(std::string t) : title(std::move(t)) {}
  std::string title;
  std::vector<Fact> facts;
  std::vector<Check> checks;
  Section& fact(std::string name, std::string value) {
    facts.push_back({std::move(name), std::move(value)});
    return *this;
  }
  Section& check(std::string name, bool passed, std::string detail) {
    checks.push_back({std::move(name), passed, std::move(detail)});
    return *this;
  }
};

struct Report {
  std::vector<Section> sections;
  bool gpu_usable = false;  // a device answered, this build has code for it, and its checks passed
  std::string verdict;      // "training will run on ..."

  bool all_checks_passed() const {
    for (const auto& s : sections)
      for (const auto& c : s.checks)
        if (!c.passed) return false;
    return true;
  }
  std::string str() const {
    std::string out;
    for (const auto& s : sections) {
      out += s.title + "\n";
      for (const auto& f : s.facts) {
        std::string name = "  " + f.name;
        if (name.size() < 28) name.resize(28, ' ');
        out += name + " " + f.value + "\n";
      }
      for (const auto& c : s.checks) out += std::string(c.passed ? "  ok    " : "  FAIL  ") + c.name + ": " + c.detail + "\n";
    }
    return out + "verdict: " + verdict + "\n";
  }
};

}  // namespace kiln::doctor

// kiln/nn/init.hpp — parameter initialisation from a seeded kiln Generator (same numbers on
// every machine: Philox is counter-based).
//
// PyTorch's defaults, in its parameter order: nn.Linear draws its weight with
// kaiming_uniform(a = sqrt(5)), which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), then its bias from
// the same bound.
#pragma once

#include <cmath>

#include "kiln/autograd/var.hpp"
#include "kiln/core/random.hpp"

namespace kiln::nn::init {

namespace detail {
// The loops, once per element type: a model's constructor calls them for every parameter, and
// inlined there they were the bulk of its code.
template <class T>
[[gnu::noinline]] void fill_uniform(T* p, index_t n, Generator& gen, float lo, float hi) {
  for (index_t i = 0; i < n; ++i) p[i] = T(gen.uniform(lo, hi));
}
template <class T>
[[gnu::noinline]] void fill_normal(T* p, index_t n, Generator& gen, float mean, float stddev) {
  for (index_t i = 0; i < n; ++i) p[i] = T(gen.normal(mean, stddev));
}
}  // namespace detail

// Fills v with U(lo, hi) in row-major order (draws v.size() values from gen).
template <class T, index_t... D>
void uniform(const ag::Var<T, host, D...>& v, Generator& gen, double lo, double hi) {
  detail::fill_uniform(v.value().data(), v.value().size(), gen, float(lo), float(hi));
}

// Fills v with N(mean, stddev^2).
template <class T, index_t... D>
void normal(const ag::Var<T, host, D...>& v, Generator& gen, double mean = 0.0, double stddev = 1.0) {
  detail::fill_normal(v.value().data(), v.value().size(), gen, float(mean), float(stddev));
}

template <class T, index_t... D>
void constant(const ag::Var<T, host, D...>& v, double value) {
  T* p = v.value().data();
  for (index_t i = 0, n = v.value().size(); i < n; ++i) p[i] = T(value);
}

// kaiming_uniform(a): U(-b, b) with b = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)).
// a = sqrt(5) (nn.Linear's choice) gives b = 1 / sqrt(fan_in).
template <class T, index_t... D>
void kaiming_uniform(const ag::Var<T, host, D...>& v, Generator& gen, index_t fan_in, double a = std::sqrt(5.0)) {
  const double bound = std::sqrt(2.0 / (1.0 + a * a)) * std::sqrt(3.0 / double(fan_in > 0 ? fan_in : 1));
  uniform(v, gen, -bound, bound);
}

// xavier_uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
template <class T, index_t... D>
void xavier_uniform(const ag::Var<T, host, D...>& v, Generator& gen, index_t fan_in, index_t fan_out,
                    double gain = 1.0) {
  const double bound = gain * std::sqrt(6.0 / double(fan_in + fan_out > 0 ? fan_in + fan_out : 1));
  uniform(v, gen, -bound, bound);
}

}  // namespace kiln::nn::init

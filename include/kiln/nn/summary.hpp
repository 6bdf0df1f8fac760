// kiln/nn/summary.hpp — a model as a tree, one layer per line with its output shape and parameter
// count (torchinfo's summary), for a model too deep for describe()'s one line.
//
//   std::puts(kiln::nn::summary(model, /*depth=*/2).c_str());
//
//   layer                                     output           parameters
//   Sequential                                [1000]           25,557,032
//   ├─ 0 Unflatten<3, 224, 224>               [3, 224, 224]             0
//   ├─ conv1 Conv2d<3, 64, 7, stride 2, ...>  [64, 112, 112]        9,408
//   ├─ layer1 Repeat x3                       [256, 56, 56]       215,808
//   │  ├─ 0 Residual+relu                     [256, 56, 56]        75,008
//   ...
//
// Rows are the layers as the state-dict walker names them (kiln/io/state_dict.hpp: a Named
// layer's name, else its position; a Residual's body layers under the block, its projection as
// its name or "shortcut"), nested to `depth` levels below the model (deeper layers are counted in
// their container's row). Shapes are per sample, the batch left out, from the model's type; a
// layer sized at run time (Linear<In, dyn>) shows its current size. A Linear or Conv2d and the
// activation it runs in its epilogue share a row ("+relu"). Parameters are the layer's values,
// frozen ones included; the first row's count says how many train when not all do.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/nn/named.hpp"
#include "kiln/nn/sample_shape.hpp"
#include "kiln/nn/sequential.hpp"

namespace kiln::nn {

namespace detail {

struct SummaryRow {
  int depth;
  std::string name, what, shape;
  index_t parameters;
};

template <class L>
index_t summary_parameters(const L& l) {
  index_t n = 0;
  if constexpr (requires { l.for_each_parameter([](const auto&) {}); })
    l.for_each_parameter([&](const auto& v) { n += v.value().size(); });
  return n;
}

inline std::string sample_text(any_sample*) { return "?"; }
template <index_t... D>
std::string sample_text(sample<D...>*) {
  std::string out = "[";
  bool first = true;
  ((out.append(first ? "" : ", ").append(D == dyn ? std::string("?") : std::to_string(D)), first = false), ...);
  return out + "]";
}
template <class S, class L>
std::string output_text(const L& l) {
  if constexpr (requires { l.outputs(); S::rank; }) {  // Linear<In, dyn>: its size now
    if constexpr (S::rank == 1 && S::size == dyn) return "[" + std::to_string(l.outputs()) + "]";
  }
  return sample_text(static_cast<S*>(nullptr));
}

template <class L>
std::string summary_what(const L& l);

// The walk of `m` with input sample In, its rows (itself, then what it holds down to max_depth).
template <class In, class M>
void summary_walk(const M& m, const std::string& name, int depth, int max_depth, std::vector<SummaryRow>& rows);

template <class In, class M, std::size_t I, std::size_t N>
void summary_sequential(const M& m, const std::string& prefix, int depth, int max_depth,
                        std::vector<SummaryRow>& rows) {
  if constexpr (I < N) {
    using Types = typename M::layer_types;
    using L = std::tuple_element_t<I, Types>;
    const std::string name = is_named_v<L> ? std::string(name_of<L>()) : prefix + std::to_string(I);
    if constexpr (M::fuses_with_next(I)) {  // the layer and the activation its epilogue runs: one row
      using Act = std::tuple_element_t<I + 1, Types>;
      using Out = output_sample_t<Act, output_sample_t<L, In>>;
      if (depth <= max_depth)
        rows.push_back({depth, name, summary_what(m.template layer<I>()) + "+" + Act::functor::name,
                        output_text<Out>(m.template layer<I>()), summary_parameters(m.template layer<I>())});
      summary_sequential<Out, M, I + 2, N>(m, prefix, depth, max_depth, rows);
    } else {
      summary_walk<In>(m.template layer<I>(), name, depth, max_depth, rows);
      summary_sequential<output_sample_t<L, In>, M, I + 1, N>(m, prefix, depth, max_depth, rows);
    }
  }
}

template <class L>
std::string summary_what(const L& l) {
  if constexpr (requires { typename L::layer_type; L::name; }) {
    return summary_what(static_cast<const typename L::layer_type&>(l));
  } else if constexpr (requires { typename L::layer_types; }) {
    return "Sequential";
  } else if constexpr (requires { l.body(); l.shortcut(); }) {
    using A = typename L::activation_type;
    if constexpr (std::is_void_v<A>) return "Residual";
    else return std::string("Residual+") + A::functor::name;
  } else if constexpr (requires { L::count; l.first(); }) {
    return "Repeat x" + std::to_string(L::count);
  } else {
    return describe_layer(l);
  }
}

template <class In, class M>
void summary_walk(const M& m, const std::string& name, int depth, int max_depth, std::vector<SummaryRow>& rows) {
  if (depth > max_depth) return;
  if constexpr (requires { typename M::layer_type; M::name; }) {  // named: the layer under its name
    summary_walk<In>(static_cast<const typename M::layer_type&>(m), name, depth, max_depth, rows);
    return;
  }
  using Out = output_sample_t<M, In>;
  rows.push_back({depth, name, summary_what(m), output_text<Out>(m), summary_parameters(m)});
  if (depth == max_depth) return;
  if constexpr (requires { typename M::layer_types; }) {
    summary_sequential<In, M, 0, std::tuple_size_v<typename M::layer_types>>(m, "", depth + 1, max_depth, rows);
  } else if constexpr (requires { m.body(); m.shortcut(); }) {
    using Body = std::remove_cvref_t<decltype(m.body())>;
    if constexpr (requires { typename Body::layer_types; } && !is_named_v<Body>)
      summary_sequential<In, Body, 0, std::tuple_size_v<typename Body::layer_types>>(m.body(), "body.", depth + 1,
                                                                                        max_depth, rows);
    else
      summary_walk<In>(m.body(), is_named_v<Body> ? std::string(name_of<Body>()) : "body", depth + 1, max_depth, rows);
    if constexpr (M::has_projection) {
      using SC = std::remove_cvref_t<decltype(m.shortcut())>;
      summary_walk<In>(m.shortcut(), is_named_v<SC> ? std::string(name_of<SC>()) : "shortcut", depth + 1, max_depth,
                       rows);
    }
  } else if constexpr (requires { M::count; m.first(); m.block(1); }) {
    summary_walk<In>(m.first(), "0", depth + 1, max_depth, rows);
    using After = output_sample_t<typename M::first_type, In>;
    for (index_t i = 1; i < M::count; ++i) summary_walk<After>(m.block(i), std::to_string(i), depth + 1, max_depth, rows);
  }
}

inline std::string grouped(index_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Display width of UTF-8 text (the tree's box characters are one column, three bytes each).
inline std::size_t columns(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

}  // namespace detail

// The tree of `model` to `depth` levels below it (see the header comment).
template <class Model>
std::string summary(const Model& model, int depth = 2) {
  std::vector<detail::SummaryRow> rows;
  detail::summary_walk<any_sample>(model, "", 0, depth, rows);
  // A model whose last layer is sized at run time: its output is that layer's.
  if (rows.size() > 1 && rows[0].shape.find('?') != std::string::npos)
    for (std::size_t r = rows.size(); r-- > 1;)
      if (rows[r].depth == 1) {
        rows[0].shape = rows[r].shape;
        break;
      }
  std::vector<std::string> labels;
  std::size_t width = 5, shape_width = 6;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::string label;
    for (int d = 1; d < rows[r].depth; ++d) label += "│  ";
    if (rows[r].depth > 0) label += "├─ ";
    label += rows[r].name.empty() ? rows[r].what : rows[r].name + " " + rows[r].what;
    width = std::max(width, detail::columns(label));
    shape_width = std::max(shape_width, rows[r].shape.size());
    labels.push_back(std::move(label));
  }
  auto pad = [](std::string s, std::size_t to) {
    const std::size_t have = detail::columns(s);
    return s + std::string(to > have ? to - have : 0, ' ');
  };
  std::string out = pad("layer", width + 2) + pad("output", shape_width + 2) + "parameters\n";
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const std::string count = detail::grouped(rows[r].parameters);
    out += pad(labels[r], width + 2) + pad(rows[r].shape, shape_width + 2) + std::string(10 > count.size() ? 10 - count.size() : 0, ' ') +
           count + "\n";
  }
  index_t trainable = 0, all = 0;
  model.for_each_parameter([&](const auto& v) {
    all += v.value().size();
    trainable += v.requires_grad() ? v.value().size() : 0;
  });
  out += "total " + detail::grouped(all) + " parameters";
  if (trainable != all) out += ", " + detail::grouped(trainable) + " trainable";
  return out + "\n";
}

}  // namespace kiln::nn

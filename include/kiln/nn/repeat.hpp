// kiln/nn/repeat.hpp — N blocks in a row, written once and compiled once.
//
//   using Stage = nn::Repeat<4, Bottleneck<512, 128>, BottleneckDown<256, 128, 2>>;   // a ResNet stage
//   using Trunk = nn::Repeat<12, TransformerBlock<768, 12>>;                          // 12 blocks
//
// Repeat<N, Block, First = Block> runs First, then N - 1 Blocks, each on the previous one's
// output: a ResNet stage is its strided, projected first block and N - 1 plain ones (torchvision's
// _make_layer), a transformer's trunk N identical blocks. Sequential<B, B, B> would compute the
// same; Repeat is what it costs to compile: the blocks after the first are one type and one loop,
// so their forward and backward are instantiated once whatever N is (a Sequential instantiates
// its machinery per position), and a deep network's type stays short.
//
// As a layer of an enclosing model it is what its blocks are: their parameters in order, their
// launches (First's, then N - 1 Blocks'), train / eval, mixed precision and low copies. Its
// state_dict names are those of torch.nn.Sequential: "0.", "1.", ... (kiln/io/state_dict.hpp).
// Blocks are drawn from one generator in order, so a Repeat starts from the same numbers as the
// Sequential it replaces.
// requires: Block keeps its input's shape (it follows itself), a static_assert naming the shapes.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/random.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/sample_shape.hpp"
#include "kiln/nn/sequential.hpp"

namespace kiln::nn {

namespace detail {
template <class In, class Out>
struct repeated_block_keeps_shape {
  static_assert(std::is_same_v<In, Out> || std::is_same_v<In, any_sample> || std::is_same_v<Out, any_sample>,
                "kiln::nn::Repeat: the repeated block changes its input's shape, so it cannot follow itself; give "
                "the block that changes it as Repeat's third argument, First (repeated_block_keeps_shape<In, Out> "
                "names both samples)");
  static constexpr bool value = true;
};
}  // namespace detail

template <index_t N, class Block, class First = Block>
class Repeat {
  static_assert(N >= 1, "kiln::nn::Repeat<N, Block>: N must be at least 1");

  template <class In>
  using after_first = output_sample_t<First, In>;

 public:
  static constexpr index_t count = N;
  using block_type = Block;
  using first_type = First;

  template <class In>
  using output_sample = std::conditional_t<
      N == 1, after_first<In>,
      std::enable_if_t<detail::repeated_block_keeps_shape<after_first<In>, output_sample_t<Block, after_first<In>>>::value,
                       output_sample_t<Block, after_first<In>>>>;
  using value_type = typename First::value_type;
  using space = typename First::space;
  template <class S>
  using on = Repeat<N, typename detail::rebind_space<Block, S>::type, typename detail::rebind_space<First, S>::type>;
  template <layout L>
  using with_layout =
      Repeat<N, typename detail::rebind_layout<Block, L>::type, typename detail::rebind_layout<First, L>::type>;

  static constexpr index_t in_features = in_features_of<First>();
  static constexpr index_t out_features = N == 1 ? out_features_of<First>() : out_features_of<Block>();

  explicit Repeat(Generator& gen) : first_(detail::make_layer<First>(gen)) {
    rest_.reserve(std::size_t(N - 1));
    for (index_t i = 1; i < N; ++i) rest_.push_back(detail::make_layer<Block>(gen));
  }
  explicit Repeat(std::uint64_t seed = 0) : Repeat(lvalue(Generator(seed))) {}

  template <class Exec, class X>
  auto forward(ag::Tape<Exec>& tape, const X& x) {
    auto y = first_.forward(tape, x);
    using Y = decltype(y);
    if constexpr (N > 1) {
      static_assert(std::is_same_v<decltype(rest_[0].forward(tape, y)), Y>,
                    "kiln::nn::Repeat: the repeated block's output is not of its input's type, so it cannot follow "
                    "itself; give the block that changes it as Repeat's third argument, First");
      for (Block& b : rest_) y = b.forward(tape, y);
    }
    return y;
  }

  // Block 0 (First) and block i >= 1.
  First& first() { return first_; }
  const First& first() const { return first_; }
  Block& block(index_t i) { return rest_[std::size_t(i - 1)]; }
  const Block& block(index_t i) const { return rest_[std::size_t(i - 1)]; }

  template <class F>
  void for_each_parameter(F&& f) const {
    if constexpr (has_parameters<First>) first_.for_each_parameter(f);
    if constexpr (has_parameters<Block>)
      for (const Block& b : rest_) b.for_each_parameter(f);
  }
  void train(bool on = true) {
    if constexpr (requires { first_.train(on); }) first_.train(on);
    if constexpr (requires(Block& b) { b.train(on); })
      for (Block& b : rest_) b.train(on);
    training_ = on;
  }
  bool training() const { return training_; }

  // First's launches, then N - 1 Blocks' (an input gradient below them once First has parameters).
  static constexpr Launches launches(const LaunchContext& c)
    requires(counts_launches<First> && counts_launches<Block>)
  {
    Launches l = First::launches(c);
    LaunchContext next = c;
    next.input_grad = c.input_grad || detail::parameter_tensors_of<First>() > 0;
    for (index_t i = 1; i < N; ++i) {
      l += Block::launches(next);
      next.input_grad = next.input_grad || detail::parameter_tensors_of<Block>() > 0;
    }
    return l;
  }
  // The same for the parameters' requires_grad flags now (a frozen block: nn/freeze.hpp).
  Launches launches_now(const LaunchContext& c) const
    requires(counts_launches<First> && counts_launches<Block>)
  {
    Launches l = launches_now_of(first_, c);
    LaunchContext next = c;
    next.input_grad = c.input_grad || param_grads_of(first_).any;
    for (const Block& b : rest_) {
      l += launches_now_of(b, next);
      next.input_grad = next.input_grad || param_grads_of(b).any;
    }
    return l;
  }
  static constexpr index_t parameter_tensors =
      detail::parameter_tensors_of<First>() + (N - 1) * detail::parameter_tensors_of<Block>();
  static constexpr bool takes_fold = detail::takes_fold_of<First>();
  static constexpr bool mixed_precision = detail::mixed_precision_of<First>() && detail::mixed_precision_of<Block>();
  static constexpr bool has_opaque = detail::opaque_of<First>() || detail::opaque_of<Block>();
  static constexpr bool is_opaque = has_opaque;
  static constexpr index_t low_copies = detail::low_copies_of<First>() + (N - 1) * detail::low_copies_of<Block>();

  template <class L, class Exec>
  void refresh_low_copy(Exec& exec) const {
    if constexpr (requires { first_.template refresh_low_copy<L>(exec); }) first_.template refresh_low_copy<L>(exec);
    if constexpr (requires(const Block& b) { b.template refresh_low_copy<L>(exec); })
      for (const Block& b : rest_) b.template refresh_low_copy<L>(exec);
  }

  // "4 x [...]", or "[first] -> 3 x [block]" when the first block differs.
  std::string describe() const {
    if constexpr (N == 1) {
      return detail::describe_layer(first_);
    } else if constexpr (std::is_same_v<First, Block>) {
      return std::to_string(N) + " x " + detail::describe_layer(first_);
    } else {
      std::string out = detail::describe_layer(first_);
      out.append(" -> ").append(std::to_string(N - 1)).append(" x ").append(detail::describe_layer(rest_[0]));
      return out;
    }
  }

 private:
  static Generator& lvalue(Generator&& g) { return g; }

  First first_;
  std::vector<Block> rest_;  // blocks 1 .. N - 1
  bool training_ = true;
};

}  // namespace kiln::nn

// kiln/nn/batchnorm.hpp — BatchNorm2d<C>: per-channel normalisation of [N, C, H, W], as PyTorch.
//
// Training mode normalises with the batch's mean and biased variance and updates the running
// statistics (momentum 0.1 by default, unbiased variance); evaluation mode normalises with the
// running statistics; so does a frozen batch norm in either mode (updates_statistics(), below:
// fine-tuning's rule). weight (ones) and bias (zeros) are learned. forward_fused<Act> applies an
// activation in the same pass (Sequential does this for BatchNorm2d followed by an activation:
// conv-bn-relu is then two passes, not three), and its backward recomputes the pre-activation
// from the saved statistics instead of keeping it.
// Forward ONE pass per channel (statistics, then normalise); backward ONE (the activation's
// derivative, the sums, dx, dweight and dbias together). Channels run in parallel on the CPU.
// On kiln::cuda the functors of kiln/nn/convnet_functors.hpp run (run_device, below): a team of
// threads per channel for the statistics and the backward sums (no division per element: an
// ImageIndex walk), one elementwise kernel to normalise and one for dx — kiln's kernels, not
// cuDNN's batch norm, so the fused activation and residual stay one pass.
#pragma once

#include <memory>
#include <utility>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/backend/cpu/batchnorm2d.hpp"
#include "kiln/backend/cpu/batchnorm2d_nhwc.hpp"
#include "kiln/core/epilogue.hpp"
#include "kiln/core/random.hpp"
#include "kiln/nn/convnet_functors.hpp"
#include "kiln/nn/empty_batch.hpp"
#include "kiln/nn/half_io.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/sample_shape.hpp"

namespace kiln::nn {

namespace detail {
template <class Layer, class In>
struct batchnorm_accepts {
  static_assert(dependent_false<In>,
                "kiln::nn::BatchNorm2d: the input must be an image [C, H, W] (batchnorm_accepts<Layer, sample<...>> "
                "names the sizes)");
  using type = In;
};
template <class Layer>
struct batchnorm_accepts<Layer, any_sample> {
  using type = sample<Layer::channels, dyn, dyn>;
};
template <class Layer, index_t C, index_t H, index_t W>
struct batchnorm_accepts<Layer, sample<C, H, W>> {
  static_assert(C == dyn || C == Layer::channels,
                "kiln::nn::BatchNorm2d<C>: the input's channels differ from C (batchnorm_accepts<BatchNorm2d<C>, "
                "sample<C', H, W>> names both)");
  using type = sample<Layer::channels, H, W>;
};

// The CPU kernels of one layout, under one set of names.
template <layout L>
struct bn_kernels {
  template <class... A>
  static void train_forward(A&&... a) { cpu::batchnorm2d_train_forward(std::forward<A>(a)...); }
  template <class... A>
  static void eval_forward(A&&... a) { cpu::batchnorm2d_eval_forward(std::forward<A>(a)...); }
  template <class... A>
  static void backward(A&&... a) { cpu::batchnorm2d_backward(std::forward<A>(a)...); }
  template <class... A>
  static void eval_backward(A&&... a) { cpu::batchnorm2d_eval_backward(std::forward<A>(a)...); }
  template <class... A>
  static void apply(A&&... a) { cpu::batchnorm2d_apply(std::forward<A>(a)...); }
};
template <>
struct bn_kernels<layout::nhwc> {
  template <class... A>
  static void train_forward(A&&... a) { cpu::batchnorm2d_nhwc_train_forward(std::forward<A>(a)...); }
  template <class... A>
  static void eval_forward(A&&... a) { cpu::batchnorm2d_nhwc_eval_forward(std::forward<A>(a)...); }
  template <class... A>
  static void backward(A&&... a) { cpu::batchnorm2d_nhwc_backward(std::forward<A>(a)...); }
  template <class... A>
  static void eval_backward(A&&... a) { cpu::batchnorm2d_nhwc_eval_backward(std::forward<A>(a)...); }
  template <class... A>
  static void apply(A&&... a) { cpu::batchnorm2d_nhwc_apply(std::forward<A>(a)...); }
};

// A kiln::fn functor as the CPU kernels' activation (NoActivation for fn::Identity).
template <class F>
using bn_activation = std::conditional_t<is_identity_act_v<F>, cpu::NoActivation, F>;
}  // namespace detail

// Layout says how its input and output hold images ([N, C, H, W] or [N, H, W, C]).
template <index_t C, class T = float, class Space = host, layout Layout = layout::nchw>
class BatchNorm2d {
  static_assert(C > 0, "kiln::nn::BatchNorm2d<C>: C must be positive");

 public:
  static constexpr index_t channels = C;
  static constexpr bool fuses_activation = true;
  using value_type = T;
  using space = Space;
  template <class S>
  using on = BatchNorm2d<C, T, S, Layout>;
  template <layout L>
  using with_layout = BatchNorm2d<C, T, Space, L>;
  template <class In>
  using output_sample = typename detail::batchnorm_accepts<BatchNorm2d, In>::type;

  // The running statistics and how many training batches updated them (PyTorch's buffers
  // running_mean, running_var, num_batches_tracked). Shared by copies of the layer, like its
  // parameters.
  struct Buffers {
    Tensor<T, Space, C> running_mean;
    Tensor<T, Space, C> running_var;
    std::int64_t batches_tracked = 0;
  };

  explicit BatchNorm2d(double eps = 1e-5, double momentum = 0.1)
      : weight_(filled(T(1)), true), bias_(filled(T(0)), true), buffers_(std::make_shared<Buffers>()), eps_(eps),
        momentum_(momentum) {
    KILN_CHECK(eps > 0.0 && momentum >= 0.0 && momentum <= 1.0, ValueError, "BatchNorm2d<", C,
               ">: eps must be > 0 and momentum in [0, 1], got eps ", eps, " and momentum ", momentum);
    buffers_->running_mean = filled(T(0));
    buffers_->running_var = filled(T(1));
  }
  explicit BatchNorm2d(Generator&) : BatchNorm2d() {}

  // The layer's own type, or bf16 / f16 when T is float (mixed precision: the statistics, the
  // parameters and the arithmetic stay float, nn/half_io.hpp).
  template <class X>
  static constexpr bool accepts_input = std::is_same_v<X, T> || (kiln::detail::is_half_v<X> && std::is_same_v<T, float>);

  template <class Exec, class X, index_t B, index_t D1, index_t D2, index_t D3>
    requires accepts_input<X>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<X, Space, B, D1, D2, D3>& x) const {
    return run<fn::Identity>(tape, x);
  }
  template <class Act, class Exec, class X, index_t B, index_t D1, index_t D2, index_t D3>
    requires accepts_input<X>
  auto forward_fused(ag::Tape<Exec>& tape, const ag::Var<X, Space, B, D1, D2, D3>& x) const {
    static_assert(requires { typename Act::functor; },
                  "kiln::nn::BatchNorm2d::forward_fused<Act>: the activation must name its kiln::fn functor "
                  "(kiln::nn::Activation<F>)");
    if (tape.force_eager()) {  // two kernels, as asked (kiln/force_eager.hpp)
      using XV = std::decay_t<decltype(x)>;
      using Y = decltype(run<typename Act::functor>(tape, x));
      return kiln::ag::detail::run_eager_form(&detail::forward_fused_eager<Act, BatchNorm2d, Exec, XV, Y>,
                                              "BatchNorm2d::forward_fused", *this, tape, x);
    }
    return run<typename Act::functor>(tape, x);
  }

  // y = act(bn(x) + r): a skip connection's sum (and its activation) in the normalising pass,
  // one kernel forward — nn::Residual runs a body ending in a batch norm this way. Act is
  // fn::Identity or fn::Relu, whose derivative backward reads from y (y > 0), so neither bn(x)
  // nor the sum is ever stored; backward is one pass for dz = dy * act'(y) (r's gradient) and
  // batch norm's own backward on dz. Y is the result's variable type (the caller's, so fused and
  // unfused forms of a block have one type); r has x's shape. The CPU only: a device, and
  // stance::force_eager, run the unfused form (nn::Residual decides).
  template <class Act, class Y, class Exec, class X, index_t B, index_t D1, index_t D2, index_t D3, class R>
    requires(accepts_input<X> && std::is_same_v<Space, host> &&
             (std::is_same_v<Act, fn::Identity> || std::is_same_v<Act, fn::Relu>))
  Y forward_residual(ag::Tape<Exec>& tape, const ag::Var<X, Space, B, D1, D2, D3>& x, const R& r) const {
    static_assert(std::is_same_v<typename R::value_type, X> && std::is_same_v<typename Y::value_type, X>,
                  "kiln::nn::BatchNorm2d::forward_residual: the residual, the input and the result must have one "
                  "element type");
    KILN_CHECK(r.shape() == x.shape(), ShapeError, "BatchNorm2d<", C, ">::forward_residual: the residual has shape ",
               r.shape().str(), " but the input has shape ", x.shape().str(), "; they must agree");
    return run<Act, Y>(tape, x, &r);
  }
  static constexpr bool fuses_residual = true;
  // A fused activation's backward recomputes the pre-activation from x and the statistics: no
  // copy is kept (what the memory planner counts).
  static constexpr bool recomputes_pre_activation = true;
  // Its output (fp32 / fp64 on the host, without a residual) can be made again from its input in
  // backward: nn::Sequential frees it once a next layer that takes it back ran (autograd/remake.hpp).
  static constexpr bool remakeable_output = std::is_same_v<Space, host>;
  // Its backward reads its input, the statistics and the output's gradient, never the output.
  static constexpr bool backward_reads_output = false;

  void train(bool on = true) { training_ = on; }
  void eval() { train(false); }
  bool training() const { return training_; }
  // Whether a forward normalises with the batch's statistics and moves the running ones: in train
  // mode, unless the layer is frozen (its weight and bias both without requires_grad, nn::freeze).
  // A frozen batch norm normalises with its running statistics and leaves them as they are, in
  // train and eval mode alike: fine-tuning's rule (torchvision's FrozenBatchNorm2d), so a frozen
  // backbone stays bit for bit what it was, whatever the training loop's model.train() says.
  bool updates_statistics() const { return training_ && (weight_.requires_grad() || bias_.requires_grad()); }

  template <class F>
  void for_each_parameter(F&& f) const {
    f(weight_);
    f(bias_);
  }
  const ag::Var<T, Space, C>& weight() const { return weight_; }
  const ag::Var<T, Space, C>& bias() const { return bias_; }
  const Buffers& buffers() const { return *buffers_; }
  Buffers& buffers() { return *buffers_; }
  double eps() const { return eps_; }
  double momentum() const { return momentum_; }

  // ONE pass each way, the activation included; force_eager runs it as its own kernel each way.
  template <class Act = void>
  static constexpr Launches launches_fused(const LaunchContext& c) {
    constexpr bool act = applies_activation<Act>();
    // A device runs the statistics and the normalisation as two kernels forward, and the sums and
    // dx as two backward (the CPU: one pass each way).
    // The backward's sums serve dx as well, so only a layer with nothing to differentiate (frozen,
    // its input needing no gradient) saves them.
    const index_t dev = c.device ? 1 : 0, dx = c.device && c.input_grad ? 1 : 0;
    const bool any = c.input_grad || c.weight_grad || c.bias_grad;
    return {1 + dev + index_t(act && c.eager), any ? 1 + dx + index_t(act && c.eager) : 0};
  }
  static constexpr Launches launches(const LaunchContext& c) { return launches_fused<void>(c); }
  static constexpr index_t parameter_tensors = 2;
  // Runs on bf16 / f16 activations (train::Step's mixed precisions, on the CPU).
  static constexpr bool mixed_precision = true;
  static std::string describe() {
    return (Layout == layout::nhwc ? "BatchNorm2d[nhwc]<" : "BatchNorm2d<") + std::to_string(C) + ">";
  }

 private:
  static Tensor<T, Space, C> filled(T v) {
    Tensor<T, host, C> t;
    std::fill(t.data(), t.data() + C, v);
    return space_ops<Space>::from_host(std::move(t));
  }

  // The layer's forward: y = F(bn(x)), or F(bn(x) + *r) with a residual r (R a variable type;
  // void: none). Y is the result's type (void: the layer's own).
  template <class F, class Y = void, class R = void, class Exec, class XT, index_t B, index_t D1, index_t D2,
            index_t D3>
  auto run(ag::Tape<Exec>& tape, const ag::Var<XT, Space, B, D1, D2, D3>& x, const R* r = nullptr) const {
    static_assert(std::is_same_v<Space, typename Exec::space>,
                  "kiln::nn::BatchNorm2d: the input must live in the executor's memory space");
    // bf16 / f16 activations: the kernels run on widened copies (nn/half_io.hpp).
    constexpr bool half = !std::is_same_v<XT, T>;
    // Channels-last bf16: the kernels read and write the bf16 tensors themselves, converting row
    // by row (cpu/batchnorm2d_nhwc.hpp); otherwise half-precision tensors are widened first.
    constexpr bool direct_half = half && Layout == layout::nhwc && std::is_same_v<XT, bf16>;
    static_assert(!half || std::is_same_v<Space, host>,
                  "kiln::nn::BatchNorm2d: bf16 / f16 activations run on the CPU so far (the device's half-precision "
                  "convnet path is not written yet): use fp32 or tf32 on the device");
    constexpr bool res = !std::is_void_v<R>;
    using Out = std::conditional_t<std::is_void_v<Y>,
                                   image_var_t<XT, Space, B, output_sample<image_sample_t<Layout, D1, D2, D3>>, Layout>,
                                   Y>;
    // With a residual the activation runs after the sum, in the kernels' residual form; backward
    // takes its derivative from the output.
    using Act = detail::bn_activation<F>;
    using K = detail::bn_kernels<Layout>;
    constexpr bool nhwc = Layout == layout::nhwc;
    const Shape s = x.shape();
    KILN_CHECK(s.rank == 4 && s[nhwc ? 3 : 1] == C, ShapeError, "BatchNorm2d<", C, ">: the input has shape ", s.str(),
               nhwc ? "; it must be [N, H, W, " : "; it must be [N, ", C, nhwc ? "]" : ", H, W]");
    const index_t n = s[0], hw = nhwc ? s[1] * s[2] : s[2] * s[3];
    if (n == 0) {
      // PyTorch's empty batch (nn/empty_batch.hpp): the running statistics stay as they are (a mean
      // over nothing would make them NaN) while the count of batches moves on, as its module's does.
      if (updates_statistics()) {
        tape.exec().stats().host_state("batch norm's count of batches");
        ++buffers_->batches_tracked;
      }
      if constexpr (res) return detail::empty_batch_output<Out>(tape, s, x, weight_.data(), bias_.data(), r->data());
      else return detail::empty_batch_output<Out>(tape, s, x, weight_.data(), bias_.data());
    }
    Out out{typename Out::tensor_type(s)};
    if constexpr (!std::is_same_v<Space, host>) {
      static_assert(!res, "kiln::nn::BatchNorm2d: the residual form runs on the CPU only");
      if constexpr (!half) run_device<F>(tape, x, out, n, hw);
    } else {
      const int threads = tape.exec().threads();
      const std::size_t bytes = std::size_t(s.size()) * sizeof(XT) * 2;
      detail::scratch_vector<float> x_wide, y_wide, r_wide;  // half-precision activations: the kernels' float copies
      using KS = std::conditional_t<direct_half, XT, T>;       // what the kernels read and write
      const KS* xin = nullptr;
      const KS* rin = nullptr;
      KS* yout = nullptr;
      if constexpr (direct_half) {
        xin = x.value().data();
        yout = out.value().data();
        if constexpr (res) rin = r->value().data();
      } else if constexpr (half) {
        x_wide = detail::widened(x.value().data(), s.size(), threads);
        y_wide.resize(std::size_t(s.size()));
        xin = x_wide.data();
        yout = y_wide.data();
        if constexpr (res) {
          r_wide = detail::widened(r->value().data(), s.size(), threads);
          rin = r_wide.data();
        }
      } else {
        xin = x.value().data();
        yout = out.value().data();
        if constexpr (res) rin = r->value().data();
      }
      std::string name = "batch_norm";
      if constexpr (res) name += "+add";
      if constexpr (!is_identity_act_v<F>) name.append("+").append(F::name);
      tape.exec().stats().count(kind::norm, name, s.size(), res ? bytes * 3 / 2 : bytes);
      const bool train = updates_statistics();
      const auto wd = weight_.data(), bd = bias_.data();
      bool any = x.requires_grad() || wd->requires_grad || bd->requires_grad;
      if constexpr (res) any = any || r->requires_grad();
      const bool recording = any && tape.recording();
      // What backward keeps, per channel: the batch's mean and invstd (training) or the running
      // statistics as they are now (eval: copied, so an optimizer step or a later training forward
      // before backward cannot change the gradient); then, for an output that can be made again
      // (autograd/remake.hpp: fp32 / fp64 without a residual), the scale and shift this forward
      // normalised with.
      constexpr bool remakeable = !half && !res;
      auto saved = std::make_shared<std::vector<T>>(std::size_t((train ? 2 : 0) * C));
      if (recording && !train) {
        saved->assign(buffers_->running_mean.data(), buffers_->running_mean.data() + C);
        saved->insert(saved->end(), buffers_->running_var.data(), buffers_->running_var.data() + C);
      }
      if (recording && remakeable) {
        saved->resize(std::size_t(3 * C));
        saved->insert(saved->end(), bias_.value().data(), bias_.value().data() + C);
      }
      T* save_scale = recording && remakeable ? saved->data() + 2 * C : nullptr;
      Buffers& buf = *buffers_;
      if (train) {
        K::train_forward(n, C, hw, xin, weight_.value().data(), bias_.value().data(), eps_, momentum_,
                         buf.running_mean.data(), buf.running_var.data(), yout, saved->data(), saved->data() + C,
                         threads, Act{}, rin, save_scale);
        tape.exec().stats().host_state("batch norm's count of batches");
        ++buf.batches_tracked;
      } else {
        K::eval_forward(n, C, hw, xin, weight_.value().data(), bias_.value().data(), eps_, buf.running_mean.data(),
                        buf.running_var.data(), yout, threads, Act{}, rin, save_scale);
      }
      if constexpr (half && !direct_half) detail::store_rounded(out.value().data(), yout, s.size(), false, threads);
      if (!recording) return out;
      out.set_requires_grad(true);
      if constexpr (remakeable) {
        out.data()->remake = [xd = x.data(), saved, n, hw](void* y, int th) {
          const T* c = saved->data();  // mean, invstd or running variance, scale, shift
          K::apply(n, C, hw, xd->value.data(), c, c + 2 * C, c + 3 * C, static_cast<T*>(y), th, Act{});
        };
      }
      std::vector<std::shared_ptr<ag::VarNode>> inputs{x.data(), wd, bd};
      // The residual's node, raw: the step's inputs own it (a second owner here would keep its
      // value from being freed by nn::Residual).
      ag::VarNode* rd = nullptr;
      if constexpr (res) inputs.push_back(r->data()), rd = r->data().get();
      tape.record(out, std::move(inputs),
                  [xd = x.data(), wd, bd, rd, saved, train, n, hw, eps = eps_, bytes, name](Exec& exec, auto& od) {
                    if (!od.grad_valid) return;
                    // The residual form: dz = dy * act'(y) once, r's gradient and the normalisation's.
                    detail::scratch_vector<float> dz_wide;
                    detail::scratch_vector<T> dz_own;
                    const T* dz = nullptr;
                    if constexpr (res) dz = residual_backward<F, half>(exec, od, *rd, xd.get(), n * C * hw, dz_own, dz_wide);
                    exec.stats().count(kind::norm, name + "_backward", n * C * hw, bytes * 2);
                    const bool want_dx = xd->requires_grad;
                    const bool add_x = want_dx && xd->grad_valid;
                    using BAct = std::conditional_t<res, cpu::NoActivation, Act>;  // the residual form handed over dz
                    T dgamma[C], dbeta[C];
                    auto kernels = [&](const auto* X, const auto* G, auto* dx) {
                      if (train) {
                        K::backward(n, C, hw, X, G, wd->value.data(), saved->data(), saved->data() + C, dx, dgamma,
                                    dbeta, exec.threads(), bd->value.data(), BAct{});
                      } else {
                        K::eval_backward(n, C, hw, X, G, wd->value.data(), bd->value.data(), eps, saved->data(),
                                         saved->data() + C, dx, dgamma, dbeta, exec.threads(), BAct{});
                      }
                    };
                    auto put_param_grads = [&] {
                      for (auto [node, src] : {std::pair{wd.get(), dgamma}, std::pair{bd.get(), dbeta}}) {
                        if (!node->requires_grad) continue;
                        const bool add = node->grad_valid;
                        T* g = node->ensure_grad();
                        for (index_t c = 0; c < C; ++c) g[c] = add ? T(g[c] + src[c]) : src[c];
                        node->grad_valid = true;
                      }
                    };
                    if constexpr (direct_half) {
                      // bf16 x and dy read as they are; dx written rounded, or in float and added
                      // rounded once when the gradient already holds a contribution.
                      const XT* X = xd->value.data();
                      detail::scratch_vector<T> sum(add_x ? std::size_t(n * C * hw) : 0);
                      auto with_g = [&](const auto* G) {
                        if (!want_dx) kernels(X, G, static_cast<XT*>(nullptr));
                        else if (add_x) kernels(X, G, sum.data());
                        else kernels(X, G, xd->ensure_grad());
                      };
                      if constexpr (res) with_g(dz);
                      else with_g(od.grad.data());
                      if (add_x) detail::store_rounded(xd->ensure_grad(), sum.data(), n * C * hw, true, exec.threads());
                      if (want_dx) xd->grad_valid = true;
                      put_param_grads();
                      return;
                    }
                    // A half-precision dx is computed in float and rounded into the gradient.
                    detail::scratch_vector<T> tmp((add_x || (half && want_dx)) ? std::size_t(n * C * hw) : 0);
                    T* dx = nullptr;
                    if (want_dx) {
                      if (!tmp.empty()) dx = tmp.data();
                      else if constexpr (!half) dx = xd->ensure_grad();
                    }
                    detail::scratch_vector<float> x_wide, g_wide;
                    const T* X = nullptr;
                    const T* G = nullptr;
                    if constexpr (half) {
                      x_wide = detail::widened(xd->value.data(), n * C * hw, exec.threads());
                      if constexpr (!res) g_wide = detail::widened(od.grad.data(), n * C * hw, exec.threads());
                      X = x_wide.data();
                      G = res ? dz : g_wide.data();
                    } else {
                      X = xd->value.data();
                      G = res ? dz : od.grad.data();
                    }
                    kernels(X, G, dx);
                    if (want_dx) {
                      if constexpr (half) {
                        detail::store_rounded(xd->ensure_grad(), tmp.data(), n * C * hw, add_x, exec.threads());
                      } else if (add_x) {
                        T* g = xd->ensure_grad();
                        for (index_t i = 0; i < n * C * hw; ++i) g[i] += tmp[std::size_t(i)];
                      }
                      xd->grad_valid = true;
                    }
                    put_param_grads();
                  });
    }
    return out;
  }

  // The residual form's first backward pass: dz = dy * act'(y) (act' from the output y: 1 where
  // y > 0 for a ReLU — a NaN gets 0, as relu's derivative at NaN), added into (or written as)
  // r's gradient. Returns dz in the kernels' type: r's gradient buffer itself when it was empty
  // and is not x's (x's gradient is written after dz is read), else `own` (or `wide` for bf16 /
  // f16 activations, whose gradient is stored rounded).
  template <class F, bool Half, class Exec, class OD>
  static const T* residual_backward(Exec& exec, OD& od, ag::VarNode& rnode, const ag::VarNode* xnode, index_t size,
                                    detail::scratch_vector<T>& own, detail::scratch_vector<float>& wide) {
    using XT = typename OD::tensor_type::value_type;
    std::string name = "residual_backward";
    if constexpr (!is_identity_act_v<F>) name.append("+").append(F::name);
    exec.stats().count(kind::elementwise, name, size, std::size_t(size) * sizeof(XT) * 3);
    const XT* dy = od.grad.data();
    const XT* y = od.value.data();
    XT* rg = nullptr;
    bool add = false;
    if (rnode.requires_grad) {
      rg = static_cast<XT*>(rnode.ensure_grad_data());
      add = rnode.grad_valid;
      rnode.grad_valid = true;
    }
    auto d = [dy, y](index_t i) {
      const float g = float(dy[i]);
      if constexpr (is_identity_act_v<F>) return g;
      else return float(y[i]) > 0.f ? g : 0.f;
    };
    // Elementwise, in blocks over the executor's threads (each value independent).
    if constexpr (Half) {
      wide.resize(std::size_t(size));
      float* w = wide.data();
      detail::half_io_blocks(size, exec.threads(), [w, d, rg, add](index_t b, index_t e) {
        for (index_t i = b; i < e; ++i) w[i] = d(i);
        if (rg) detail::store_rounded(rg + b, w + b, e - b, add);
      });
      return wide.data();
    } else {
      const bool in_place = rg && !add && &rnode != xnode;
      T* dz = in_place ? rg : (own.resize(std::size_t(size)), own.data());
      // The pointers by value: captured by reference, this pass made the fp32 ResNet-50 step 5% slower.
      detail::half_io_blocks(size, exec.threads(), [dz, dy, y, rg, add, in_place](index_t b, index_t e) {
        for (index_t i = b; i < e; ++i) {
          if constexpr (is_identity_act_v<F>) dz[i] = dy[i];
          else dz[i] = y[i] > T(0) ? dy[i] : T(0);
        }
        if (rg && !in_place) {
          if (add) {
            for (index_t i = b; i < e; ++i) rg[i] += dz[i];
          } else {
            std::copy(dz + b, dz + e, rg + b);
          }
        }
      });
      return dz;
    }
  }

  // A device executor: the functors of kiln/nn/convnet_functors.hpp — the statistics (a team per
  // channel, with the running statistics' update) or the running ones (evaluation), then ONE
  // normalising kernel; backward the per-channel sums with dweight and dbias, then dx.
  template <class F, class Exec, class X, class Out>
  void run_device(ag::Tape<Exec>& tape, const X& x, Out& out, index_t n, index_t hw) const {
    using Act = F;
    Exec& exec = tape.exec();
    const detail::ImageIndex ix{C, hw, Layout == layout::nhwc};
    const index_t m = n * hw, size = m * C;
    const std::size_t bytes = std::size_t(size) * sizeof(T) * 2;
    const bool train = updates_statistics();
    auto saved = std::make_shared<Tensor<T, Space, dyn>>(Shape{2 * C});  // mean, invstd
    T* mean = saved->data();
    T* invstd = mean + C;
    Buffers& buf = *buffers_;
    const std::string name = is_identity_act_v<F> ? std::string("batch_norm") : std::string("batch_norm+") + F::name;
    if (train) {
      KILN_CHECK(m > 1, ValueError, "BatchNorm2d<", C, ">: expected more than 1 value per channel when training, got ",
                 m);
      detail::launch_lines<false>(exec, C, m,
                                  detail::BnStatsRows<T>{x.value().data(), mean, invstd, buf.running_mean.data(),
                                                         buf.running_var.data(), ix, m, eps_, momentum_},
                                  "batch_norm_stats", bytes / 2);
      exec.stats().host_state("batch norm's count of batches");
      ++buf.batches_tracked;
    } else {
      exec.for_each_element(1, C,
                            detail::BnRunningStats<T>{buf.running_mean.data(), buf.running_var.data(), mean, invstd, eps_},
                            kind::norm, "batch_norm_running_stats", std::size_t(4 * C) * sizeof(T));
    }
    const detail::BnApply<T, Act> apply{x.value().data(), out.value().data(), weight_.value().data(),
                                        bias_.value().data(), mean, invstd, ix};
    exec.for_each_element(1, size, apply, kind::norm, name, bytes);
    const auto wd = weight_.data(), bd = bias_.data();
    if (!(x.requires_grad() || wd->requires_grad || bd->requires_grad) || !tape.recording()) return;
    out.set_requires_grad(true);
    tape.record(out, {x.data(), wd, bd}, [xd = x.data(), wd, bd, saved, apply, train, m, size, bytes, name](Exec& e, auto& od) {
      if (!od.grad_valid) return;
      auto fwd = apply;
      fwd.x = xd->value.data();
      const T* dy = od.grad.data();
      auto sums = Tensor<T, Space, dyn>(Shape{2 * C});
      const bool dw = wd->requires_grad, db = bd->requires_grad;
      detail::launch_lines<false>(e, C, m,
                                  detail::BnBackwardRows<T, Act>{fwd, dy, sums.data(), dw ? wd->ensure_grad() : nullptr,
                                                                 db ? bd->ensure_grad() : nullptr, dw && wd->grad_valid,
                                                                 db && bd->grad_valid, m},
                                  (name + "_backward").c_str(), bytes);
      if (dw) wd->grad_valid = true;
      if (db) bd->grad_valid = true;
      if (xd->requires_grad) {
        const bool add = xd->grad_valid;
        e.for_each_element(1, size, detail::BnBackwardDx<T, Act>{fwd, dy, sums.data(), xd->ensure_grad(), m, train, add},
                           kind::norm, name + "_backward_dx", bytes * 2);
        xd->grad_valid = true;
      }
    });
  }

  ag::Var<T, Space, C> weight_;
  ag::Var<T, Space, C> bias_;
  std::shared_ptr<Buffers> buffers_;
  double eps_, momentum_;
  bool training_ = true;
};

}  // namespace kiln::nn

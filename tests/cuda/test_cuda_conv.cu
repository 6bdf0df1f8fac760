// cuDNN convolution (kiln/backend/cuda/cudnn_conv.cuh) against the CPU kernels
// (kiln/backend/cpu/conv2d.hpp, themselves checked against a direct fp64 reference in
// tests/cpu/test_conv2d.cpp): forward, backward-data and backward-filter over odd shapes (C = 1
// and 3, non-square images, padding 0/1/2, stride 1/2, kernel 1/3/5, dilation 2), float and
// double; the deterministic policy gives the same bits on a rerun; plans are cached per shape.
// The reference runs in double on the same inputs, so the bound is the device's float error:
// |got - ref| <= 1e-4 * (|ref| + max |ref| / 10) per element for float (fp32 engines only: TF32
// is excluded by the default policy), 1e-11 for double (tests/cuda/support.hpp).
#include <doctest/doctest.h>

#include <kiln/cuda.cuh>

#if defined(KILN_HAVE_CUDNN)
#include <kiln/backend/cuda/cudnn_conv.cuh>
#endif

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "support.hpp"

#if defined(KILN_HAVE_CUDNN)
namespace {

using kiln::index_t;
using kiln::cpu::Conv2dShape;

template <class T>
std::vector<T> device_run(const std::vector<T>& host_in0, const std::vector<T>& host_in1, std::size_t out_size,
                          auto&& call) {
  kiln::cu::DeviceBuffer<T> a{index_t(host_in0.size())}, b{index_t(host_in1.size())}, c{index_t(out_size)};
  KILN_CUDA_CHECK(cudaMemcpy(a.data(), host_in0.data(), a.size_bytes(), cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemcpy(b.data(), host_in1.data(), b.size_bytes(), cudaMemcpyHostToDevice));
  call(a.data(), b.data(), c.data());
  std::vector<T> out(out_size);
  KILN_CUDA_CHECK(cudaMemcpy(out.data(), c.data(), c.size_bytes(), cudaMemcpyDeviceToHost));
  return out;
}

template <class T>
void check_close(const char* what, const std::vector<T>& got, const std::vector<double>& ref) {
  kiln_cuda_test::check_close(std::vector<double>(got.begin(), got.end()), ref,
                              std::is_same_v<T, float> ? 1e-4 : 1e-11, what);
}

template <class T>
void run_case(kiln::cu::CudnnConv& conv, const Conv2dShape& s, unsigned seed) {
  INFO("n=", s.n, " c_in=", s.c_in, " h=", s.h, " w=", s.w, " c_out=", s.c_out, " k=", s.kh, "x", s.kw, " stride ",
       s.stride_h, " pad ", s.pad_h, " dil ", s.dil_h);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1, 1);
  auto fill = [&](std::size_t n) {
    std::vector<double> v(n);
    for (double& e : v) e = dist(rng);
    return v;
  };
  const std::size_t nx = std::size_t(s.n * s.c_in * s.h * s.w), nw = std::size_t(s.c_out * s.c_in * s.kh * s.kw);
  const std::size_t ny = std::size_t(s.n * s.c_out * s.out_h() * s.out_w());
  const auto xd = fill(nx), wd = fill(nw), dyd = fill(ny);
  const std::vector<T> x(xd.begin(), xd.end()), w(wd.begin(), wd.end()), dy(dyd.begin(), dyd.end());
  // The reference in double on the inputs as T holds them (rounded to float for float).
  std::vector<double> y_ref(ny), dx_ref(nx), dw_ref(nw);
  std::vector<double> xr(x.begin(), x.end()), wr(w.begin(), w.end()), dyr(dy.begin(), dy.end());
  kiln::cpu::conv2d_forward<double>(s, xr.data(), wr.data(), nullptr, y_ref.data(), 1);
  kiln::cpu::conv2d_backward_data<double>(s, dyr.data(), wr.data(), dx_ref.data(), 1);
  kiln::cpu::conv2d_backward_filter<double>(s, xr.data(), dyr.data(), dw_ref.data(), nullptr, 1);
  check_close("forward", device_run<T>(x, w, ny, [&](T* a, T* b, T* c) { conv.forward(s, a, b, c, nullptr); }), y_ref);
  check_close("backward_data",
              device_run<T>(dy, w, nx, [&](T* a, T* b, T* c) { conv.backward_data(s, a, b, c, nullptr); }), dx_ref);
  check_close("backward_filter",
              device_run<T>(x, dy, nw, [&](T* a, T* b, T* c) { conv.backward_filter(s, a, b, c, nullptr); }), dw_ref);
}

std::vector<Conv2dShape> shapes() {
  std::vector<Conv2dShape> out;
  for (index_t c_in : {1, 3})
    for (index_t k : {1, 3, 5})
      for (index_t pad : {0, 1, 2})
        for (index_t stride : {1, 2}) {
          Conv2dShape s{.n = 2, .c_in = c_in, .h = 9, .w = 12, .c_out = 4, .kh = k, .kw = k, .stride_h = stride,
                        .stride_w = stride, .pad_h = pad, .pad_w = pad};
          if (s.out_h() > 0 && s.out_w() > 0) out.push_back(s);
        }
  out.push_back({.n = 3, .c_in = 3, .h = 11, .w = 7, .c_out = 5, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                 .pad_h = 2, .pad_w = 2, .dil_h = 2, .dil_w = 2});
  out.push_back({.n = 8, .c_in = 64, .h = 16, .w = 16, .c_out = 64, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                 .pad_h = 1, .pad_w = 1});  // a ResNet block's shape
  return out;
}

}  // namespace

TEST_CASE("cuDNN convolution matches the CPU kernels: forward, backward-data, backward-filter") {
  kiln::cu::CudnnConv conv;
  for (const auto& s : shapes()) run_case<float>(conv, s, 7);
  for (const auto& s : shapes()) run_case<double>(conv, s, 8);
  CHECK(conv.cached_plans() == 3 * 2 * shapes().size());
}

TEST_CASE("cuDNN convolution under the deterministic policy gives the same bits twice") {
  kiln::cu::CudnnConv conv({.deterministic = true});
  const Conv2dShape s{.n = 16, .c_in = 32, .h = 14, .w = 14, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 1,
                      .stride_w = 1, .pad_h = 1, .pad_w = 1};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> x(std::size_t(s.n * s.c_in * s.h * s.w)), dy(std::size_t(s.n * s.c_out * s.out_h() * s.out_w()));
  for (float& v : x) v = dist(rng);
  for (float& v : dy) v = dist(rng);
  const std::size_t nw = std::size_t(s.c_out * s.c_in * 9);
  auto once = [&] {
    return device_run<float>(x, dy, nw, [&](float* a, float* b, float* c) { conv.backward_filter(s, a, b, c, nullptr); });
  };
  CHECK(once() == once());
}

TEST_CASE("cuDNN convolution plans for the alignment its tensors have: 16 bytes for whole tensors, 4 for an offset view") {
  // Issue 32: every plan promised only sizeof(T) bytes of alignment, which keeps cuDNN's
  // vectorised and tensor-core engines out even for 256-byte aligned tensors.
  kiln::cu::CudnnConv conv;
  const Conv2dShape s{.n = 2, .c_in = 8, .h = 10, .w = 10, .c_out = 8, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                      .pad_h = 1, .pad_w = 1};
  std::mt19937 rng(9);
  std::uniform_real_distribution<double> dist(-1, 1);
  const std::size_t nx = std::size_t(s.n * s.c_in * s.h * s.w), nw = std::size_t(s.c_out * s.c_in * 9);
  const std::size_t ny = std::size_t(s.n * s.c_out * s.out_h() * s.out_w());
  std::vector<double> xd(nx), wd(nw), y_ref(ny);
  for (double& v : xd) v = dist(rng);
  for (double& v : wd) v = dist(rng);
  const std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end());
  std::vector<double> xr(x.begin(), x.end()), wr(w.begin(), w.end());
  kiln::cpu::conv2d_forward<double>(s, xr.data(), wr.data(), nullptr, y_ref.data(), 1);
  // The same tensors one float into larger buffers: 4-byte aligned, not 16.
  for (index_t offset : {0, 1}) {
    INFO("offset " << offset);
    kiln::cu::DeviceBuffer<float> bx{index_t(nx) + 1}, bw{index_t(nw) + 1}, by{index_t(ny) + 1};
    KILN_CUDA_CHECK(cudaMemcpy(bx.data() + offset, x.data(), nx * sizeof(float), cudaMemcpyHostToDevice));
    KILN_CUDA_CHECK(cudaMemcpy(bw.data() + offset, w.data(), nw * sizeof(float), cudaMemcpyHostToDevice));
    conv.forward(s, bx.data() + offset, bw.data() + offset, by.data() + offset, nullptr);
    std::vector<float> y(ny);
    KILN_CUDA_CHECK(cudaMemcpy(y.data(), by.data() + offset, ny * sizeof(float), cudaMemcpyDeviceToHost));
    check_close<float>("forward", y, y_ref);
    CHECK(conv.cached_plans() == std::size_t(offset + 1));  // a plan per alignment
  }
}

TEST_CASE("cuDNN convolution is captured into a CUDA graph and replays the eager result: no synchronisation inside") {
  // Issue 32: each call allocated its workspace and waited for the stream (cudaStreamSynchronize),
  // which invalidates a capture — every convnet fell back to eager under reduce_overhead.
  kiln::cu::CudnnConv conv({.deterministic = true});  // the replay is compared bit for bit
  const Conv2dShape s{.n = 8, .c_in = 64, .h = 16, .w = 16, .c_out = 64, .kh = 3, .kw = 3, .stride_h = 1,
                      .stride_w = 1, .pad_h = 1, .pad_w = 1};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> x(std::size_t(s.n * s.c_in * s.h * s.w)), w(std::size_t(s.c_out * s.c_in * 9));
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng);
  const index_t ny = s.n * s.c_out * s.out_h() * s.out_w();
  kiln::cu::DeviceBuffer<float> dx{index_t(x.size())}, dw{index_t(w.size())}, dy{ny};
  KILN_CUDA_CHECK(cudaMemcpy(dx.data(), x.data(), dx.size_bytes(), cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemcpy(dw.data(), w.data(), dw.size_bytes(), cudaMemcpyHostToDevice));
  cudaStream_t stream = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  conv.forward(s, dx.data(), dw.data(), dy.data(), stream);  // eager: the plan and its workspace
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> eager(static_cast<std::size_t>(ny)), replayed(eager.size());
  KILN_CUDA_CHECK(cudaMemcpy(eager.data(), dy.data(), dy.size_bytes(), cudaMemcpyDeviceToHost));
  // NaNs until the replay writes y; on the capture's stream (a non-blocking stream does not wait
  // for the legacy stream's cudaMemset, which could land after the replay).
  KILN_CUDA_CHECK(cudaMemsetAsync(dy.data(), 0xFF, dy.size_bytes(), stream));
  cudaGraph_t graph = nullptr;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  conv.forward(s, dx.data(), dw.data(), dy.data(), stream);
  const cudaError_t captured = cudaStreamEndCapture(stream, &graph);
  REQUIRE_MESSAGE(captured == cudaSuccess, "the capture was invalidated: ", cudaGetErrorString(captured));
  cudaGraphExec_t exec = nullptr;
  KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  KILN_CUDA_CHECK(cudaMemcpy(replayed.data(), dy.data(), dy.size_bytes(), cudaMemcpyDeviceToHost));
  CHECK(replayed == eager);
  KILN_CUDA_CHECK(cudaGraphExecDestroy(exec));
  KILN_CUDA_CHECK(cudaGraphDestroy(graph));
  KILN_CUDA_CHECK(cudaStreamDestroy(stream));
}
#else
TEST_CASE("cuDNN convolution: this build has no cuDNN") {
  MESSAGE("kiln was built without cuDNN (no libcudnn next to the CUDA toolkit): the cuDNN convolution tests do not run");
}
#endif

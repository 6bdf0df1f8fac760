// kiln/doctor/cuda.cuh — the CUDA half of kiln-doctor (compiled by nvcc): driver and runtime
// versions and whether they fit, each device and whether this build holds code for it, the
// libraries found at run time (cuBLASLt, cuDNN, NCCL), and three device checks against the CPU
// backend (a fused elementwise kernel, a GEMM, a reduction). examine() puts the host section
// first and ends with the verdict.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/cuda.cuh"
#include "kiln/doctor/host.hpp"
#if KILN_HAVE_CUDNN
#include <cudnn.h>
#endif

// The architectures this translation unit was compiled for ("900", "800,900"); nvcc defines
// __CUDA_ARCH_LIST__ in host code too (CUDA 11.5 and later).
#define KILN_DOCTOR_STR2(x) #x
#define KILN_DOCTOR_STR(x) KILN_DOCTOR_STR2(x)
#if defined(__CUDA_ARCH_LIST__)
#define KILN_DOCTOR_ARCH_LIST KILN_DOCTOR_STR(__CUDA_ARCH_LIST__)
#else
#define KILN_DOCTOR_ARCH_LIST ""
#endif

namespace kiln::doctor {

namespace detail {

// A kernel whose attributes say whether the build has an image this device can load.
__global__ void probe_kernel(int* out) {
  if (out != nullptr) *out = 1;
}

inline std::string cuda_version_text(int v) {  // 13000 -> "13.0"
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
inline std::string library_version_text(std::size_t v) {  // 90100 / 130000 -> "9.1.0" / "13.0.0"
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
}
inline std::string sm_list() {
  std::string raw = KILN_DOCTOR_ARCH_LIST, out;
  if (raw.empty()) return "unknown (nvcc did not say)";
  std::size_t at = 0;
  while (at < raw.size()) {
    auto comma = raw.find(',', at);
    if (comma == std::string::npos) comma = raw.size();
    const int arch = std::stoi(raw.substr(at, comma - at));  // 900
    out += std::string(out.empty() ? "" : ", ") + "sm_" + std::to_string(arch / 10);
    at = comma + 1;
  }
  return out;
}

inline std::string nccl_version() {
  void* lib = ::dlopen("libnccl.so.2", RTLD_LAZY | RTLD_LOCAL);
  if (lib == nullptr) return "not found (libnccl.so.2 does not load: data parallelism across GPUs needs it)";
  using GetVersion = int (*)(int*);
  auto get = reinterpret_cast<GetVersion>(::dlsym(lib, "ncclGetVersion"));
  int v = 0;
  std::string out = "found, version unknown";
  if (get != nullptr && get(&v) == 0) out = library_version_text(std::size_t(v));  // 22304 -> 2.23.4
  ::dlclose(lib);
  return out;
}

// y = tanh(x) * 2 + x * x on the device (one fused kernel) and on the CPU.
inline Check check_elementwise(CudaExecutor& gpu) {
  const index_t n = 1 << 16;
  Tensor<float, host, dyn> hx(n), hy(n);
  for (index_t i = 0; i < n; ++i) hx.data()[i] = float(i % 997) / 997.0f * 6.0f - 3.0f;
  auto dx = to_device(hx, gpu);
  Tensor<float, cuda, dyn> dy(n);
  gpu.stats().reset();
  assign(dy, kiln::tanh(dx) * 2.0f + dx * dx, gpu);
  const auto launches = gpu.stats().launches();
  CpuExecutor cpu(1);
  assign(hy, kiln::tanh(hx) * 2.0f + hx * hx, cpu);
  const auto got = to_host(dy, gpu);
  double worst = 0;
  for (index_t i = 0; i < n; ++i)
    worst = std::max(worst, std::abs(double(got.data()[i]) - double(hy.data()[i])) / (1.0 + std::abs(double(hy.data()[i]))));
  const bool ok = worst <= 1e-5 && launches == 1;
  return {"fused elementwise kernel, 65536 values", ok,
          "largest relative difference from the CPU " + std::to_string(worst) + " (bound 1e-5), " +
              std::to_string(launches) + " launch" + (launches == 1 ? "" : "es (expected 1)")};
}

// A 96x80x64 GEMM of small integers (exact on both) through cuBLASLt.
inline Check check_gemm(CudaExecutor& gpu) {
  const index_t m = 96, n = 80, k = 64;
  Tensor<float, host, dyn, dyn> ha(m, k), hb(k, n), hc(m, n);
  for (index_t i = 0; i < ha.size(); ++i) ha.data()[i] = float(int(i * 7 % 11) - 5);
  for (index_t i = 0; i < hb.size(); ++i) hb.data()[i] = float(int(i * 5 % 13) - 6);
  auto da = to_device(ha, gpu), db = to_device(hb, gpu);
  Tensor<float, cuda, dyn, dyn> dc(m, n);
  assign(dc, kiln::matmul(da.view(), db.view()), gpu);
  CpuExecutor cpu(1);
  assign(hc, kiln::matmul(ha.view(), hb.view()), cpu);
  const auto got = to_host(dc, gpu);
  index_t wrong = 0;
  for (index_t i = 0; i < hc.size(); ++i) wrong += got.data()[i] != hc.data()[i];
  return {"GEMM 96x80x64", wrong == 0,
          wrong == 0 ? "equals the CPU backend exactly" : std::to_string(wrong) + " values differ from the CPU backend"};
}

// A sum of 1,000,003 multiples of 1/4 (exact in float on both).
inline Check check_reduction(CudaExecutor& gpu) {
  const index_t n = 1000003;
  Tensor<float, host, dyn> hx(n);
  for (index_t i = 0; i < n; ++i) hx.data()[i] = float(int(i % 9) - 4) * 0.25f;
  auto dx = to_device(hx, gpu);
  Tensor<float, cuda> ds;
  Tensor<float, host> hs;
  assign(ds, kiln::sum(dx), gpu);
  CpuExecutor cpu(1);
  assign(hs, kiln::sum(hx), cpu);
  const float got = to_host(ds, gpu).data()[0], want = hs.data()[0];
  return {"reduction of 1000003 values", got == want,
          "device " + std::to_string(got) + ", CPU " + std::to_string(want)};
}

}  // namespace detail

// Everything kiln-doctor prints, for the first usable device (or why there is none).
inline Report examine() {
  Report r;
  bool cpu_ok = true;
  r.sections.push_back(examine_host(cpu_ok));
  Section s{"cuda"};
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  (void)cudaRuntimeGetVersion(&runtime);
  s.fact("driver supports CUDA", driver > 0 ? detail::cuda_version_text(driver) : "no driver found");
  s.fact("runtime (this build)", detail::cuda_version_text(runtime));
  s.fact("built for", detail::sm_list());
  s.fact("cuBLASLt", detail::library_version_text(cublasLtGetVersion()));
#if KILN_HAVE_CUDNN
  s.fact("cuDNN", detail::library_version_text(cudnnGetVersion()) + " (built against " +
                      detail::library_version_text(CUDNN_VERSION) + ")");
#else
  s.fact("cuDNN", "not built in (cudnn.h was not found when configuring): convolutions run kiln's own kernels");
#endif
  s.fact("NCCL", detail::nccl_version());

  std::string why_not;
  if (driver == 0) {
    why_not = "no CUDA driver is loaded, so the driver is insufficient for CUDA runtime " +
              detail::cuda_version_text(runtime);
  } else if (driver < runtime) {
    why_not = "the driver (CUDA " + detail::cuda_version_text(driver) + ") is older than the runtime this build uses (" +
              detail::cuda_version_text(runtime) + "): update the driver";
  }
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    if (why_not.empty()) why_not = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    else why_not += std::string(" (") + cudaGetErrorName(status) + ")";
    count = 0;
  } else if (count == 0 && why_not.empty()) {
    why_not = "the driver sees no CUDA device";
  }
  s.fact("devices", std::to_string(count));
  std::string usable_name;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    const std::string sm = "sm_" + std::to_string(p.major) + std::to_string(p.minor);
    std::size_t free_bytes = 0, total_bytes = 0;
    (void)cudaSetDevice(d);
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    cudaFuncAttributes attr{};
    const cudaError_t image = cudaFuncGetAttributes(&attr, detail::probe_kernel);
    (void)cudaGetLastError();
    const bool has_code = image == cudaSuccess;
    s.fact("device " + std::to_string(d), std::string(p.name) + ", " + sm + ", " +
                                               std::to_string(total_bytes >> 20) + " MiB (" +
                                               std::to_string(free_bytes >> 20) + " MiB free), " +
                                               (has_code ? "this build has code for it (binary sm_" +
                                                               std::to_string(attr.binaryVersion) + ")"
                                                         : "NO code for it in this build: configure with "
                                                           "-DCMAKE_CUDA_ARCHITECTURES=" +
                                                               std::to_string(p.major) + std::to_string(p.minor)));
    if (has_code && usable_name.empty()) usable_name = std::string(p.name) + " (" + sm + ")";
    if (!has_code && why_not.empty())
      why_not = "this build has no code for " + std::string(p.name) + " (" + sm + ", built for " + detail::sm_list() +
                "): configure with -DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(p.major) + std::to_string(p.minor);
  }
  if (!usable_name.empty()) {
    try {
      CudaExecutor gpu;
      s.checks.push_back(detail::check_elementwise(gpu));
      s.checks.push_back(detail::check_gemm(gpu));
      s.checks.push_back(detail::check_reduction(gpu));
    } catch (const std::exception& e) {
      s.check("device checks", false, std::string("threw: ") + e.what());
    }
  }
  r.sections.push_back(std::move(s));
  bool device_checks_ok = true;
  for (const auto& c : r.sections.back().checks) device_checks_ok = device_checks_ok && c.passed;
  r.gpu_usable = !usable_name.empty() && device_checks_ok;
  if (!cpu_ok) {
    r.verdict = "this build cannot run on this CPU (it targets extensions the CPU lacks): rebuild here";
  } else if (r.gpu_usable) {
    r.verdict = "training will run on the GPU: " + usable_name + ", CUDA " + detail::cuda_version_text(runtime) +
                " on a driver for " + detail::cuda_version_text(driver) + ", device checks passed";
  } else if (!usable_name.empty()) {
    r.verdict = "training would run on " + usable_name + " but a device check FAILED (above): do not trust it";
  } else {
    r.verdict = "training will run on the CPU: no usable CUDA device — " + why_not;
  }
  return r;
}

}  // namespace kiln::doctor

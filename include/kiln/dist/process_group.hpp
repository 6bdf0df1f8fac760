// kiln/dist/process_group.hpp — the processes of a data-parallel job and the collectives between
// them on host memory: all-reduce (sum, average), broadcast, all-gather, on MPI.
//
// How a process learns its place:
// - Launched by mpirun / mpiexec (OpenMPI's OMPI_COMM_WORLD_SIZE, MPICH's PMI_SIZE, PMIx's
//   PMIX_RANK in the environment): MPI is initialised and gives the rank, the world size and the
//   rank on this node (MPI_COMM_TYPE_SHARED), which picks the GPU.
// - Launched by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
//   MASTER_PORT set, no MPI launcher): the place comes from those variables. Such a group serves
//   GPU jobs, whose collectives run on NCCL (kiln/dist/nccl.cuh): it shares NCCL's unique id by a
//   TCP rendezvous (kiln/dist/tcp_rendezvous.hpp) on MASTER_ADDR, port MASTER_PORT + 1 (torchrun's
//   own store holds MASTER_PORT; KILN_RENDEZVOUS_PORT overrides). Its host collectives refuse with
//   a sentence: they run on MPI, so a CPU job is launched with mpirun.
// - Neither: world size 1. Collectives return at once (an average divides by 1), nothing of MPI
//   is touched, and the code runs exactly as it does without this header.
//
// Failure: every MPI call returns its error (MPI_ERRORS_RETURN) and becomes a dist::DistError that
// names the collective, the rank and MPI's message. A rank that fails must not leave the others
// blocked in a collective: dist::fail_job (train_digits' error path) prints the error with the
// rank and calls MPI_Abort, which ends every process of the job with a non-zero status (under
// torchrun the rank exits, and torchrun ends the others). A rank killed outright is noticed by
// the launcher, which ends the job the same way.
//
// Threads: MPI is initialised with MPI_THREAD_SERIALIZED — several threads may call the group,
// one at a time (the data-parallel step's communication thread while backward runs, the main
// thread otherwise).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <type_traits>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/dist/dist_error.hpp"
#include "kiln/dist/tcp_rendezvous.hpp"

#ifndef KILN_HAVE_MPI
#define KILN_HAVE_MPI 0  // CMake defines it to 1 where it found MPI (the kiln::mpi target)
#endif
#if KILN_HAVE_MPI
// Only MPI's C interface: its deprecated C++ bindings warn under -Wextra.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace kiln::dist {

enum class ReduceOp { sum, average };

namespace detail {

inline const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}
// Launched by an MPI launcher (OpenMPI, MPICH / Hydra, PMIx-based ones such as srun).
inline bool launched_by_mpi() {
  return env("OMPI_COMM_WORLD_SIZE") != nullptr || env("PMI_SIZE") != nullptr || env("PMIX_RANK") != nullptr;
}
inline bool launched_by_torchrun() { return env("WORLD_SIZE") != nullptr && env("RANK") != nullptr; }

// A whole number from the environment variable `name` in [low, high).
// throws: DistError naming the variable and its value.
inline int env_int(const char* name, int low, long long high, const char* fallback = nullptr) {
  const char* v = env(name);
  if (v == nullptr) v = fallback;
  KILN_CHECK(v != nullptr, DistError, "kiln::dist: launched by torchrun (RANK and WORLD_SIZE set) but ", name,
             " is not set; torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  KILN_CHECK(end != v && *end == '\0' && x >= low && x < high, DistError, "kiln::dist: ", name, "=", v,
             " must be a whole number in [", low, ", ", high, ")");
  return int(x);
}

// A process's place in a job torchrun launched, from its variables (see the file comment).
struct TorchrunPlace {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  RendezvousOptions rendezvous;
};
// throws: DistError naming a variable that is missing or out of range.
inline TorchrunPlace torchrun_place() {
  TorchrunPlace p;
  p.size = env_int("WORLD_SIZE", 1, INT32_MAX);
  p.rank = env_int("RANK", 0, p.size);
  p.local_size = env_int("LOCAL_WORLD_SIZE", 1, p.size + 1ll, p.size == 1 ? "1" : nullptr);
  p.local_rank = env_int("LOCAL_RANK", 0, p.local_size, p.size == 1 ? "0" : nullptr);
  if (p.size > 1) {
    const char* address = env("MASTER_ADDR");
    KILN_CHECK(address != nullptr, DistError, "kiln::dist: launched by torchrun with WORLD_SIZE=", p.size,
               " but MASTER_ADDR is not set (rank 0's host, for the rendezvous)");
    p.rendezvous.address = address;
    p.rendezvous.port = env("KILN_RENDEZVOUS_PORT") != nullptr ? env_int("KILN_RENDEZVOUS_PORT", 1, 65536)
                                                              : env_int("MASTER_PORT", 1, 65535) + 1;
    p.rendezvous.timeout_seconds = timeout_seconds();
  }
  return p;
}

}  // namespace detail

class ProcessGroup {
 public:
  // The job's group, set up on first use (see the file comment).
  // throws: DistError when MPI cannot be initialised, or the launcher is one this build cannot serve.
  static ProcessGroup& world() {
    static ProcessGroup group;
    return group;
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  bool is_root() const { return rank_ == 0; }
  // "mpi", "torchrun" (no host collectives), or "single" for a process on its own.
  const char* backend() const { return mpi_ ? "mpi" : size_ > 1 ? "torchrun" : "single"; }
  // Whether all_reduce, broadcast, all_gather and barrier work on host memory here (every group
  // but one of several ranks that torchrun launched).
  bool host_collectives() const { return mpi_ || size_ == 1; }

  // Rank 0's n bytes at `bytes` on every rank: MPI's broadcast, or under torchrun the TCP
  // rendezvous (how a device group shares NCCL's unique id).
  void share_from_root(void* bytes, std::size_t n) {
    if (size_ == 1) return;
#if KILN_HAVE_MPI
    if (mpi_) {
      check("broadcast", index_t(n), MPI_Bcast(bytes, int(n), MPI_BYTE, 0, MPI_COMM_WORLD));
      return;
    }
#endif
    tcp_share_from_root(rendezvous_, rank_, size_, bytes, n);
  }

  // data[0, n) on every rank becomes the element-wise sum (or average) over the ranks.
  template <class T>
  void all_reduce(T* data, index_t n, ReduceOp op = ReduceOp::sum) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
                      std::is_same_v<T, std::int64_t>,
                  "kiln::dist::all_reduce sums float, double, int32 or int64 elements; reduce half-precision "
                  "gradients in float");
    check_count("all_reduce", n);
    require_host_collectives("all_reduce");
#if KILN_HAVE_MPI
    if (mpi_ && n > 0)
      check("all_reduce", n, MPI_Allreduce(MPI_IN_PLACE, data, int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD));
#endif
    if (op == ReduceOp::average && size_ > 1) {
      if constexpr (std::is_floating_point_v<T>) {
        const T scale = T(1) / T(size_);
        for (index_t i = 0; i < n; ++i) data[i] *= scale;
      } else {
        for (index_t i = 0; i < n; ++i) data[i] /= T(size_);
      }
    }
  }

  // data[0, n) on every rank becomes root's.
  template <class T>
  void broadcast(T* data, index_t n, int root = 0) {
    static_assert(std::is_trivially_copyable_v<T>, "kiln::dist::broadcast copies bytes: T must be trivially copyable");
    check_count("broadcast", n);
    require_host_collectives("broadcast");
    KILN_CHECK(root >= 0 && root < size_, DistError, "kiln::dist: broadcast from rank ", root, " in a group of ",
               size_);
#if KILN_HAVE_MPI
    if (mpi_ && n > 0) check("broadcast", n, MPI_Bcast(data, int(n * index_t(sizeof(T))), MPI_BYTE, root, MPI_COMM_WORLD));
#else
    (void)data;
#endif
  }

  // out[r * n, (r + 1) * n) becomes rank r's in[0, n), on every rank (out holds size() * n).
  template <class T>
  void all_gather(const T* in, index_t n, T* out) {
    static_assert(std::is_trivially_copyable_v<T>, "kiln::dist::all_gather copies bytes: T must be trivially copyable");
    check_count("all_gather", n * size_);
    require_host_collectives("all_gather");
#if KILN_HAVE_MPI
    if (mpi_) {
      if (n > 0) {
        const int bytes = int(n * index_t(sizeof(T)));
        check("all_gather", n, MPI_Allgather(in, bytes, MPI_BYTE, out, bytes, MPI_BYTE, MPI_COMM_WORLD));
      }
      return;
    }
#endif
    for (index_t i = 0; i < n; ++i) out[i] = in[i];
  }

  // Waits until every rank has come here. Politely: the wait sleeps between polls instead of
  // spinning, so a rank that waits leaves the cores to those still working (ranks often
  // outnumber cores on a development machine).
  void barrier() {
    require_host_collectives("barrier");
#if KILN_HAVE_MPI
    if (!mpi_) return;
    MPI_Request request = MPI_REQUEST_NULL;
    check("barrier", 0, MPI_Ibarrier(MPI_COMM_WORLD, &request));
    for (int done = 0;;) {
      check("barrier", 0, MPI_Test(&request, &done, MPI_STATUS_IGNORE));
      if (done) return;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
#endif
  }

  // "rank 1 of 2 (mpi)".
  std::string describe() const {
    return ::kiln::detail::concat("rank ", rank_, " of ", size_, " (", backend(), ")");
  }

  // Ends the whole job now: every rank exits with `status` (MPI_Abort); a single process exits.
  [[noreturn]] void abort(int status) {
#if KILN_HAVE_MPI
    if (mpi_) MPI_Abort(MPI_COMM_WORLD, status);
#endif
    std::_Exit(status);
  }

  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  ~ProcessGroup() {
#if KILN_HAVE_MPI
    int finalized = 0;
    if (mpi_ && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
#endif
  }

 private:
  ProcessGroup() {
    if (detail::launched_by_mpi()) {
#if KILN_HAVE_MPI
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        throw DistError("kiln::dist: MPI_Init_thread failed (launched by mpirun, but MPI cannot start)");
      mpi_ = true;
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &size_);
      KILN_CHECK(provided >= MPI_THREAD_SERIALIZED, DistError, "kiln::dist: this MPI offers thread level ", provided,
                 ", below MPI_THREAD_SERIALIZED (the data-parallel step communicates from a second thread)");
      MPI_Comm node = MPI_COMM_NULL;
      check("split by node", 0, MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
      MPI_Comm_rank(node, &local_rank_);
      MPI_Comm_size(node, &local_size_);
      MPI_Comm_free(&node);
#else
      throw DistError(
          "kiln::dist: launched by mpirun, but this build has no MPI; install it (scripts/deps.sh installs "
          "openmpi-bin and libopenmpi-dev) and configure again");
#endif
    } else if (detail::launched_by_torchrun()) {
      const detail::TorchrunPlace p = detail::torchrun_place();
      rank_ = p.rank, size_ = p.size, local_rank_ = p.local_rank, local_size_ = p.local_size;
      rendezvous_ = p.rendezvous;
    }
  }

  void require_host_collectives(const char* what) const {
    // The job's size, not this rank: every rank fails alike, and fail_job's prefix names the rank.
    KILN_CHECK(host_collectives(), DistError, "kiln::dist: ", what, " on host memory in a job of ", size_,
               " ranks torchrun launched: kiln's host collectives run on MPI; launch a CPU job with mpirun -np N (a ",
               "GPU job runs its collectives on NCCL under either launcher)");
  }

  static void check_count(const char* what, index_t n) {
    KILN_CHECK(n >= 0 && n <= index_t(INT32_MAX), DistError, "kiln::dist: ", what, " of ", n,
               " elements: MPI counts must lie in [0, 2^31); split the buffer");
  }

#if KILN_HAVE_MPI
  template <class T>
  static MPI_Datatype mpi_type() {
    if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
    else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
    else if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
    else return MPI_INT64_T;
  }
  void check(const char* what, index_t n, int status) const {
    if (status == MPI_SUCCESS) return;
    char message[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(status, message, &length);
    throw DistError(::kiln::detail::concat("kiln::dist: ", what, " of ", n, " elements on ", describe(),
                                           " failed: MPI: ", message));
  }
#endif

  bool mpi_ = false;
  RendezvousOptions rendezvous_;  // torchrun's
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

// A rank uses the device numbered by its rank on the node, so a node cannot run more ranks than
// it has devices.
// throws: DistError naming both counts.
inline void check_devices_per_node(int ranks_on_node, int devices) {
  KILN_CHECK(ranks_on_node <= devices, DistError, "kiln::dist: ", ranks_on_node, " ranks run on this node but it has ",
             devices, " CUDA device", devices == 1 ? "" : "s", "; each rank needs its own (launch at most ", devices,
             " per node)");
}

// The error path of a program that may run data-parallel: "program: message" on stderr, and in a
// job of several ranks "program: error on rank r of w (mpi): message", after which every rank of
// the job ends (a rank that only returned would leave the others blocked in their next
// collective). Returns `status` for a process on its own: `return dist::fail_job(...)` ends main.
inline int fail_job(const char* program, const std::exception& e, int status = 1) noexcept {
  ProcessGroup* group = nullptr;
  try {
    group = &ProcessGroup::world();
  } catch (...) {  // the error may be that the group could not be set up
  }
  if (group != nullptr && group->size() > 1) {
    std::fprintf(stderr, "%s: error on %s: %s\n", program, group->describe().c_str(), e.what());
    std::fflush(stderr);
    group->abort(status);
  }
  std::fprintf(stderr, "%s: %s\n", program, e.what());
  return status;
}

}  // namespace kiln::dist

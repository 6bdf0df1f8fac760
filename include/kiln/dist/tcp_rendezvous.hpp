// kiln/dist/tcp_rendezvous.hpp — rank 0's bytes to every rank over one TCP port: how a job that
// torchrun launched (no MPI) shares the NCCL unique id. Not a transport: it runs once per
// communicator, and the collectives then run on NCCL.
//
// Rank 0 listens on every interface at `port` and answers size - 1 connections; every other rank
// connects to address:port (retrying while rank 0 starts), says who it is, and reads the bytes.
// Each message starts with a magic word and the payload's size, so a stray connection (a port
// scanner, a job from yesterday) is turned away, and ranks that disagree on the size fail with
// both numbers. Everything waits at most `timeout_seconds`; then a DistError names the address,
// the port, the rank and, on rank 0, the ranks that never came.
//
// POSIX sockets, IPv4 (MASTER_ADDR as torchrun documents it: a host name or dotted address).
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/dist/dist_error.hpp"

namespace kiln::dist {

struct RendezvousOptions {
  std::string address = "127.0.0.1";  // rank 0's host, as the other ranks reach it
  int port = 0;
  double timeout_seconds = 300;
};

namespace detail {

inline constexpr std::uint32_t rendezvous_magic = 0x6b6c6e31;  // "kln1"

// One socket, closed when it goes.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

using Clock = std::chrono::steady_clock;

inline int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : int(std::min<long long>(left, 1000));
}

// Moves all n bytes (recv when `in`, send otherwise) before the deadline; false on timeout, a
// closed peer or an error (errno says which; 0 for a closed peer, ETIMEDOUT for time).
inline bool transfer(int fd, void* data, std::size_t n, bool in, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    pollfd waiter{fd, short(in ? POLLIN : POLLOUT), 0};
    const int ready = ::poll(&waiter, 1, ms_left(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return false;
    if (ready == 0) {
      if (Clock::now() >= deadline) {
        errno = ETIMEDOUT;
        return false;
      }
      continue;
    }
    const ssize_t got = in ? ::recv(fd, p, n, 0) : ::send(fd, p, n, MSG_NOSIGNAL);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) {
      if (got == 0) errno = 0;
      return false;
    }
    p += got;
    n -= std::size_t(got);
  }
  return true;
}

inline std::string reason(int error) { return error == 0 ? "the peer closed the connection" : std::strerror(error); }

struct Header {
  std::uint32_t magic = rendezvous_magic;
  std::uint32_t rank = 0;
  std::uint64_t bytes = 0;
};

inline void serve(const RendezvousOptions& o, int size, const void* bytes, std::size_t n) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(o.timeout_seconds));
  const std::string where = ::kiln::detail::concat("kiln::dist: rendezvous on port ", o.port, " (rank 0 of ", size, ")");
  Socket listener(::socket(AF_INET, SOCK_STREAM, 0));
  KILN_CHECK(listener.fd() >= 0, DistError, where, ": socket: ", std::strerror(errno));
  const int on = 1;
  ::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  any.sin_port = htons(std::uint16_t(o.port));
  KILN_CHECK(::bind(listener.fd(), reinterpret_cast<sockaddr*>(&any), sizeof any) == 0, DistError, where,
             ": cannot listen: ", std::strerror(errno), " (another job on this port? set KILN_RENDEZVOUS_PORT)");
  KILN_CHECK(::listen(listener.fd(), size) == 0, DistError, where, ": listen: ", std::strerror(errno));
  std::vector<bool> served(std::size_t(size), false);
  served[0] = true;
  for (int left = size - 1; left > 0;) {
    pollfd waiter{listener.fd(), POLLIN, 0};
    const int ready = ::poll(&waiter, 1, ms_left(deadline));
    if (ready <= 0) {
      if (ready < 0 && errno != EINTR)
        throw DistError(::kiln::detail::concat(where, ": poll: ", std::strerror(errno)));
      if (Clock::now() < deadline) continue;
      std::string missing;
      for (int r = 1; r < size; ++r)
        if (!served[std::size_t(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      throw DistError(::kiln::detail::concat(where, ": after ", o.timeout_seconds, " s, ", left, " of ", size - 1,
                                             " ranks had not connected (rank ", missing, ")"));
    }
    Socket peer(::accept(listener.fd(), nullptr, nullptr));
    if (peer.fd() < 0) continue;
    Header h;
    // A connection that is not a kiln rank of this job is turned away; the wait goes on.
    if (!transfer(peer.fd(), &h, sizeof h, true, std::min(deadline, Clock::now() + std::chrono::seconds(5))) ||
        h.magic != rendezvous_magic || h.rank == 0 || h.rank >= std::uint32_t(size) || served[h.rank])
      continue;
    Header reply{rendezvous_magic, 0, n};
    if (h.bytes != n) {  // tell the rank (it fails naming both sizes), and fail here too
      (void)transfer(peer.fd(), &reply, sizeof reply, false, deadline);
      throw DistError(::kiln::detail::concat(where, ": rank ", h.rank, " expects ", h.bytes, " bytes, rank 0 sends ", n));
    }
    if (!transfer(peer.fd(), &reply, sizeof reply, false, deadline) ||
        !transfer(peer.fd(), const_cast<void*>(bytes), n, false, deadline))
      throw DistError(::kiln::detail::concat(where, ": sending to rank ", h.rank, ": ", reason(errno)));
    served[h.rank] = true;
    --left;
  }
}

inline void fetch(const RendezvousOptions& o, int rank, int size, void* bytes, std::size_t n) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(o.timeout_seconds));
  const std::string where = ::kiln::detail::concat("kiln::dist: rendezvous with rank 0 at ", o.address, ":", o.port,
                                                   " (rank ", rank, " of ", size, ")");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int looked = ::getaddrinfo(o.address.c_str(), std::to_string(o.port).c_str(), &hints, &found);
  KILN_CHECK(looked == 0, DistError, where, ": cannot resolve the address: ", ::gai_strerror(looked));
  const sockaddr_in target = *reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  std::string last = "no attempt";
  for (;;) {  // rank 0 may not listen yet: try again until the deadline
    Socket s(::socket(AF_INET, SOCK_STREAM, 0));
    KILN_CHECK(s.fd() >= 0, DistError, where, ": socket: ", std::strerror(errno));
    if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&target), sizeof target) == 0) {
      Header h{rendezvous_magic, std::uint32_t(rank), n}, reply;
      if (!transfer(s.fd(), &h, sizeof h, false, deadline) || !transfer(s.fd(), &reply, sizeof reply, true, deadline))
        throw DistError(::kiln::detail::concat(where, ": ", reason(errno)));
      KILN_CHECK(reply.magic == rendezvous_magic, DistError, where, ": the answer is not kiln's rendezvous (another ",
                 "program on the port?)");
      KILN_CHECK(reply.bytes == n, DistError, where, ": rank 0 sends ", reply.bytes, " bytes, this rank expects ", n);
      if (!transfer(s.fd(), bytes, n, true, deadline))
        throw DistError(::kiln::detail::concat(where, ": receiving: ", reason(errno)));
      return;
    }
    last = std::strerror(errno);
    if (Clock::now() >= deadline)
      throw DistError(::kiln::detail::concat(where, ": no answer after ", o.timeout_seconds, " s (last: ", last, ")"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace detail

// Rank 0's n bytes at `bytes` into every rank's `bytes` (see the file comment).
// throws: DistError naming the address, the port and the rank on a timeout, a refused port or
//   ranks that disagree on n.
inline void tcp_share_from_root(const RendezvousOptions& options, int rank, int size, void* bytes, std::size_t n) {
  KILN_CHECK(size >= 1 && rank >= 0 && rank < size, DistError, "kiln::dist: rendezvous as rank ", rank, " of ", size);
  KILN_CHECK(options.port > 0 && options.port < 65536, DistError, "kiln::dist: rendezvous port ", options.port,
             " is not a TCP port (1 to 65535)");
  if (size == 1) return;
  if (rank == 0) detail::serve(options, size, bytes, n);
  else detail::fetch(options, rank, size, bytes, n);
}

}  // namespace kiln::dist

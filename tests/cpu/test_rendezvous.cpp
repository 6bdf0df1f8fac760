// The parts of a multi-process job that need no second process: the TCP rendezvous that carries
// NCCL's unique id under torchrun (ranks as threads on 127.0.0.1), a torchrun launch read from
// its variables, and the check that a node has a device per rank.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <kiln/dist/process_group.hpp>

namespace dist = kiln::dist;

namespace {

// A port nobody listens on now: the kernel's pick for an ephemeral bind, released.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t length = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Sets environment variables for one scope and puts the old values back.
class ScopedEnv {
 public:
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.push_back({name, old != nullptr, old != nullptr ? old : ""});
    if (value != nullptr) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->had) ::setenv(it->name.c_str(), it->value.c_str(), 1);
      else ::unsetenv(it->name.c_str());
    }
  }

 private:
  struct Saved {
    std::string name;
    bool had;
    std::string value;
  };
  std::vector<Saved> saved_;
};

}  // namespace

TEST_CASE("the TCP rendezvous gives every rank rank 0's bytes, whoever starts first") {
  const int port = free_port();
  constexpr int ranks = 4;
  std::array<std::array<unsigned char, 128>, ranks> id{};
  for (std::size_t i = 0; i < 128; ++i) id[0][i] = static_cast<unsigned char>(i * 37 + 11);
  std::array<std::exception_ptr, ranks> failed{};
  std::vector<std::thread> threads;
  // The other ranks first: they must retry until rank 0 listens.
  for (int r = ranks - 1; r >= 0; --r) {
    threads.emplace_back([&, r] {
      try {
        dist::tcp_share_from_root({.address = "127.0.0.1", .port = port, .timeout_seconds = 20}, r, ranks,
                                  id[std::size_t(r)].data(), 128);
      } catch (...) {
        failed[std::size_t(r)] = std::current_exception();
      }
    });
    if (r == ranks - 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    CHECK_FALSE(failed[std::size_t(r)]);
    CHECK(id[std::size_t(r)] == id[0]);
  }
  CHECK(id[0][5] == static_cast<unsigned char>(5 * 37 + 11));  // rank 0's own bytes untouched
}

TEST_CASE("the TCP rendezvous fails with the address, the port and the missing ranks, within its timeout") {
  const int port = free_port();
  std::array<unsigned char, 16> id{};
  const std::string where = "127.0.0.1:" + std::to_string(port);
  // Nobody listens: rank 1 gives up after the timeout, naming where it looked.
  CHECK_THROWS_WITH_AS(dist::tcp_share_from_root({.address = "127.0.0.1", .port = port, .timeout_seconds = 0.3}, 1, 2,
                                                 id.data(), id.size()),
                       doctest::Contains(("rendezvous with rank 0 at " + where + " (rank 1 of 2): no answer").c_str()),
                       dist::DistError);
  // Rank 0 of 3 sees only rank 1: it names rank 2.
  std::exception_ptr client_failed;
  std::thread client([&] {
    std::array<unsigned char, 16> mine{};
    try {
      dist::tcp_share_from_root({.address = "127.0.0.1", .port = port, .timeout_seconds = 5}, 1, 3, mine.data(), 16);
    } catch (...) {
      client_failed = std::current_exception();
    }
  });
  CHECK_THROWS_WITH_AS(
      dist::tcp_share_from_root({.port = port, .timeout_seconds = 1}, 0, 3, id.data(), id.size()),
      doctest::Contains("1 of 2 ranks had not connected (rank 2)"), dist::DistError);
  client.join();
  CHECK_FALSE(client_failed);
}

TEST_CASE("ranks that disagree on the size of what the rendezvous carries both fail, naming both sizes") {
  const int port = free_port();
  std::array<unsigned char, 32> id{};
  std::string client_error;
  std::thread client([&] {
    std::array<unsigned char, 16> mine{};
    try {
      dist::tcp_share_from_root({.address = "localhost", .port = port, .timeout_seconds = 5}, 1, 2, mine.data(), 16);
    } catch (const dist::DistError& e) {
      client_error = e.what();
    }
  });
  CHECK_THROWS_WITH_AS(dist::tcp_share_from_root({.port = port, .timeout_seconds = 5}, 0, 2, id.data(), id.size()),
                       doctest::Contains("rank 1 expects 16 bytes, rank 0 sends 32"), dist::DistError);
  client.join();
  CHECK(client_error.find("rank 0 sends 32 bytes, this rank expects 16") != std::string::npos);
}

TEST_CASE("the TCP rendezvous turns away a connection that is not a rank of the job and goes on waiting") {
  const int port = free_port();
  std::array<unsigned char, 8> id{1, 2, 3, 4, 5, 6, 7, 8}, got{};
  std::exception_ptr failed;
  std::thread root([&] {
    try {
      dist::tcp_share_from_root({.port = port, .timeout_seconds = 10}, 0, 2, id.data(), id.size());
    } catch (...) {
      failed = std::current_exception();
    }
  });
  // A stranger connects first and sends garbage.
  for (int tries = 0;; ++tries) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(std::uint16_t(port));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      const char junk[16] = "GET / HTTP/1.0";
      CHECK(::send(fd, junk, sizeof junk, MSG_NOSIGNAL) == ssize_t(sizeof junk));
      ::close(fd);
      break;
    }
    ::close(fd);
    REQUIRE(tries < 500);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  dist::tcp_share_from_root({.address = "127.0.0.1", .port = port, .timeout_seconds = 10}, 1, 2, got.data(), got.size());
  root.join();
  CHECK_FALSE(failed);
  CHECK(got == id);
}

TEST_CASE("a torchrun launch is read from its variables; a missing or wrong one is named") {
  ScopedEnv env;
  env.set("RANK", "3");
  env.set("WORLD_SIZE", "8");
  env.set("LOCAL_RANK", "1");
  env.set("LOCAL_WORLD_SIZE", "4");
  env.set("MASTER_ADDR", "node7");
  env.set("MASTER_PORT", "29500");
  env.set("KILN_RENDEZVOUS_PORT", nullptr);
  env.set("KILN_DIST_TIMEOUT", "12.5");
  CHECK(dist::detail::launched_by_torchrun());
  auto p = dist::detail::torchrun_place();
  CHECK(p.rank == 3);
  CHECK(p.size == 8);
  CHECK(p.local_rank == 1);
  CHECK(p.local_size == 4);
  CHECK(p.rendezvous.address == "node7");
  CHECK(p.rendezvous.port == 29501);  // torchrun's own store holds MASTER_PORT
  CHECK(p.rendezvous.timeout_seconds == 12.5);
  env.set("KILN_RENDEZVOUS_PORT", "40000");
  CHECK(dist::detail::torchrun_place().rendezvous.port == 40000);
  env.set("RANK", "8");
  CHECK_THROWS_WITH_AS(dist::detail::torchrun_place(), doctest::Contains("RANK=8 must be a whole number in [0, 8)"),
                       dist::DistError);
  env.set("RANK", "3");
  env.set("LOCAL_RANK", nullptr);
  CHECK_THROWS_WITH_AS(dist::detail::torchrun_place(), doctest::Contains("LOCAL_RANK is not set"), dist::DistError);
  env.set("LOCAL_RANK", "1");
  env.set("MASTER_ADDR", nullptr);
  CHECK_THROWS_WITH_AS(dist::detail::torchrun_place(), doctest::Contains("MASTER_ADDR is not set"), dist::DistError);
  env.set("MASTER_ADDR", "node7");
  env.set("KILN_DIST_TIMEOUT", "soon");
  CHECK_THROWS_WITH_AS(dist::detail::torchrun_place(), doctest::Contains("KILN_DIST_TIMEOUT=soon"), dist::DistError);
}

TEST_CASE("a node running more ranks than it has devices is an error naming both counts") {
  CHECK_NOTHROW(dist::check_devices_per_node(8, 8));
  CHECK_NOTHROW(dist::check_devices_per_node(1, 2));
  CHECK_THROWS_WITH_AS(dist::check_devices_per_node(3, 2),
                       doctest::Contains("3 ranks run on this node but it has 2 CUDA devices"), dist::DistError);
  CHECK_THROWS_WITH_AS(dist::check_devices_per_node(2, 1),
                       doctest::Contains("2 ranks run on this node but it has 1 CUDA device;"), dist::DistError);
}

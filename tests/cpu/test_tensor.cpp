// Tensors, views, extents and shapes, launch statistics and the scratch-buffer pool: the
// bookkeeping every expression relies on.
#include <kiln.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace {

using kiln::dyn;
using kiln::host;
using kiln::index_t;
using kiln::Shape;

template <class F>
std::string shape_error(F&& f) {
  try {
    f();
  } catch (const kiln::ShapeError& e) {
    return e.what();
  }
  return "no ShapeError";
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("static extents are checked at run time") {
  using T = kiln::Tensor<float, host, dyn, 4>;
  CHECK_NOTHROW(T(3, 4));
  {
    const std::string m = shape_error([] { T t(3, 5); });
    INFO(m);
    CHECK(contains(m, "4"));
    CHECK(contains(m, "5"));
  }
  // The same check through a Shape, and a rank that does not fit.
  CHECK_THROWS_AS(T(Shape{3, 5}), kiln::ShapeError);
  {
    const std::string m = shape_error([] { T t(Shape{3, 4, 1}); });
    INFO(m);
    CHECK(contains(m, "[3, 4, 1]"));
  }
  CHECK_THROWS_AS((kiln::Tensor<float, host, dyn>(-1)), kiln::ShapeError);
  // The static extents and sizes of the type.
  static_assert(T::rank == 2);
  static_assert(T::extents_type::static_dims[1] == 4);
  static_assert(!T::extents_type::all_static);
  static_assert(kiln::extents<2, 3>::all_static);
  static_assert(kiln::extents<>::rank == 0);
}

TEST_CASE("default construction: static sizes are allocated, dynamic ones are empty") {
  kiln::Tensor<double, host, 2, 3> s;
  CHECK(s.shape() == Shape{2, 3});
  CHECK(s.size() == 6);
  CHECK(s.bytes() == 6 * sizeof(double));
  CHECK(s.data() != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(s.data()) % 64 == 0);

  kiln::Tensor<float, host, dyn, 4> d;
  CHECK(d.shape() == Shape{0, 4});
  CHECK(d.size() == 0);
  CHECK(d.data() == nullptr);

  kiln::Tensor<float, host> scalar;
  CHECK(scalar.shape().rank == 0);
  CHECK(scalar.size() == 1);
  scalar() = 2.5f;
  CHECK(scalar() == 2.5f);
}

TEST_CASE("element access is row-major") {
  kiln::HostMatrix<int> m(2, 3);
  for (index_t i = 0; i < 6; ++i) m.data()[i] = int(i);
  CHECK(m(0, 2) == 2);
  CHECK(m(1, 0) == 3);
  CHECK(m.dim(0) == 2);
  CHECK(m.dim(1) == 3);
  const auto& cm = m;
  CHECK(cm(1, 2) == 5);
  static_assert(std::is_same_v<decltype(cm.view()), kiln::View<const int, host, kiln::extents<dyn, dyn>>>);
  CHECK(m.view().stride(0) == 3);
  CHECK(m.view().stride(1) == 1);
}

TEST_CASE("tensors move but do not copy") {
  static_assert(!std::is_copy_constructible_v<kiln::HostVector<float>>);
  static_assert(!std::is_copy_assignable_v<kiln::HostVector<float>>);
  static_assert(std::is_nothrow_move_constructible_v<kiln::HostVector<float>>);
  static_assert(std::is_nothrow_move_assignable_v<kiln::HostVector<float>>);

  kiln::HostVector<float> a(5);
  for (index_t i = 0; i < 5; ++i) a(i) = float(i);
  float* p = a.data();
  kiln::HostVector<float> b(std::move(a));
  CHECK(b.data() == p);
  CHECK(b.size() == 5);
  CHECK(b(4) == 4.0f);
  CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  CHECK(a.size() == 0);

  kiln::HostVector<float> c(3);
  c = std::move(b);
  CHECK(c.data() == p);
  CHECK(c.shape() == Shape{5});
  CHECK(b.data() == nullptr);  // NOLINT(bugprone-use-after-move)
  CHECK(b.size() == 0);
  // A moved-from tensor can be reused.
  b.resize(Shape{2});
  CHECK(b.size() == 2);
  CHECK(b.data() != nullptr);
  // Self-move leaves the tensor intact.
  auto& alias = c;
  c = std::move(alias);
  CHECK(c.data() == p);
  CHECK(c.size() == 5);
}

TEST_CASE("resize keeps the buffer when the element count is unchanged") {
  kiln::HostMatrix<float> m(2, 6);
  float* p = m.data();
  m.resize(Shape{3, 4});
  CHECK(m.shape() == Shape{3, 4});
  CHECK(m.data() == p);
  m.resize(Shape{5, 5});
  CHECK(m.shape() == Shape{5, 5});
  CHECK(m.size() == 25);
  m(4, 4) = 1.0f;  // the new buffer is large enough
  m.resize(Shape{0, 5});
  CHECK(m.size() == 0);
  CHECK(m.data() == nullptr);
  // resize checks the rank and the static extents.
  CHECK_THROWS_AS(m.resize(Shape{25}), kiln::ShapeError);
  kiln::Tensor<float, host, dyn, 4> s(2, 4);
  CHECK_THROWS_AS(s.resize(Shape{2, 5}), kiln::ShapeError);
  s.resize(Shape{7, 4});
  CHECK(s.shape() == Shape{7, 4});
}

TEST_CASE("clone is a deep copy") {
  kiln::Tensor<double, host, dyn, 3> a(4, 3);
  for (index_t i = 0; i < a.size(); ++i) a.data()[i] = 0.5 * double(i);
  auto b = kiln::clone(a);
  static_assert(std::is_same_v<decltype(b), decltype(a)>);
  CHECK(b.shape() == a.shape());
  CHECK(b.data() != a.data());
  for (index_t i = 0; i < a.size(); ++i) CHECK(b.data()[i] == a.data()[i]);
  b(0, 0) = -1;
  CHECK(a(0, 0) == 0.0);
  kiln::HostVector<float> empty;
  auto e = kiln::clone(empty);
  CHECK(e.size() == 0);
}

TEST_CASE("Shape: str, size, rows and cols") {
  CHECK(Shape{}.str() == "[]");
  CHECK(Shape{7}.str() == "[7]");
  CHECK(Shape{2, 3, 4}.str() == "[2, 3, 4]");
  CHECK(Shape{}.size() == 1);
  CHECK(Shape{2, 3, 4}.size() == 24);
  CHECK(Shape{2, 0, 4}.size() == 0);
  // The 2-D fold: the last dimension is the columns, all the others are rows.
  CHECK(Shape{2, 3, 4}.cols() == 4);
  CHECK(Shape{2, 3, 4}.rows() == 6);
  CHECK(Shape{5}.rows() == 1);
  CHECK(Shape{}.rows() == 1);
  CHECK(Shape{}.cols() == 1);
  CHECK(Shape{0, 4}.rows() == 0);
  // Rows of length zero are still rows: a reduction over the last axis writes one result each.
  CHECK(Shape{3, 0}.rows() == 3);
  CHECK(Shape{2, 3, 0}.rows() == 6);
  CHECK(Shape{2, 3} == Shape{2, 3});
  CHECK_FALSE(Shape{2, 3} == Shape{3, 2});
  CHECK_FALSE(Shape{6} == Shape{6, 1});
  CHECK_THROWS_AS((Shape{1, 2, 3, 4, 5}), kiln::ShapeError);
  static_assert(Shape{2, 3}.size() == 6);  // shapes are constexpr
}

TEST_CASE("broadcast_shapes follows NumPy and names both shapes when it fails") {
  CHECK(kiln::broadcast_shapes(Shape{3, 4}, Shape{4}) == Shape{3, 4});
  CHECK(kiln::broadcast_shapes(Shape{3, 1}, Shape{1, 4}) == Shape{3, 4});
  CHECK(kiln::broadcast_shapes(Shape{}, Shape{2, 5}) == Shape{2, 5});
  CHECK(kiln::broadcast_shapes(Shape{2, 1, 5}, Shape{3, 1}) == Shape{2, 3, 5});
  CHECK(kiln::broadcast_shapes(Shape{0, 4}, Shape{1, 4}) == Shape{0, 4});
  const std::string m = shape_error([] { kiln::broadcast_shapes(Shape{3, 4}, Shape{2, 4}); });
  INFO(m);
  CHECK(contains(m, "[3, 4]"));
  CHECK(contains(m, "[2, 4]"));
  CHECK_THROWS_AS(kiln::broadcast_shapes(Shape{4}, Shape{5}), kiln::ShapeError);
  CHECK_THROWS_AS(kiln::broadcast_shapes(Shape{0}, Shape{2}), kiln::ShapeError);
}

TEST_CASE("static broadcasting of extents") {
  using kiln::extents;
  static_assert(std::is_same_v<kiln::broadcast_extents_t<extents<dyn, 4>, extents<4>>, extents<dyn, 4>>);
  static_assert(std::is_same_v<kiln::broadcast_extents_t<extents<dyn, 1>, extents<3, 4>>, extents<3, 4>>);
  static_assert(std::is_same_v<kiln::broadcast_extents_t<extents<1>, extents<dyn>>, extents<dyn>>);
  static_assert(std::is_same_v<kiln::broadcast_extents_t<extents<>, extents<2, 3>>, extents<2, 3>>);
  static_assert(std::is_same_v<kiln::broadcast_extents_t<extents<dyn>, extents<7>>, extents<7>>);
  // The same results read at run time: static sizes kept, dyn where a size-1 meets dyn.
  using E = kiln::broadcast_extents_t<extents<dyn, 1>, extents<3, 4>>;
  CHECK(E::rank == 2);
  CHECK(E::static_dims[0] == 3);
  CHECK(E::static_dims[1] == 4);
  using F = kiln::broadcast_extents_t<extents<1, dyn>, extents<dyn, 5>>;
  CHECK(F::static_dims[0] == dyn);
  CHECK(F::static_dims[1] == 5);
}

TEST_CASE("views: contiguity, strides and sub-views") {
  kiln::HostMatrix<float> m(4, 6);
  for (index_t i = 0; i < m.size(); ++i) m.data()[i] = float(i);
  const auto v = m.view();
  CHECK(v.is_contiguous());
  const auto t = kiln::transpose(v);
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.shape() == Shape{6, 4});
  CHECK(t.stride(0) == 1);
  CHECK(t.stride(1) == 6);
  CHECK(t(5, 3) == m(3, 5));
  CHECK(kiln::transpose(t).is_contiguous());

  const auto c = kiln::columns(v, 1, 4);
  CHECK(c.shape() == Shape{4, 3});
  CHECK_FALSE(c.is_contiguous());
  CHECK(c(2, 0) == m(2, 1));
  CHECK(kiln::columns(v, 0, 6).is_contiguous());
  CHECK(kiln::columns(kiln::rows(v, 2, 3), 1, 4).is_contiguous());  // one row: any stride works

  const auto r = kiln::rows(v, 1, 3);
  CHECK(r.shape() == Shape{2, 6});
  CHECK(r.is_contiguous());
  CHECK(r(0, 0) == m(1, 0));
  CHECK(kiln::rows(v, 2, 2).size() == 0);

  CHECK_THROWS_AS(kiln::columns(v, 3, 7), kiln::ShapeError);
  CHECK_THROWS_AS(kiln::columns(v, 4, 3), kiln::ShapeError);
  CHECK_THROWS_AS(kiln::rows(v, 0, 5), kiln::ShapeError);
  CHECK_THROWS_AS(kiln::rows(v, -1, 2), kiln::ShapeError);

  // A transposed [1, n] or [n, 1] matrix is still contiguous: size-1 strides do not matter.
  kiln::HostMatrix<float> row(1, 5);
  CHECK(kiln::transpose(row.view()).is_contiguous());

  // Writing through a view writes the tensor.
  t(0, 1) = -1.0f;
  CHECK(m(1, 0) == -1.0f);
  // A view converts to a view of const elements, not back.
  kiln::View<const float, host, kiln::extents<dyn, dyn>> cv = v;
  CHECK(cv.data() == m.data());
  static_assert(!std::is_convertible_v<decltype(cv), decltype(v)>);
  // A view's rank is fixed by its extents.
  CHECK_THROWS_AS((kiln::View<float, host, kiln::extents<dyn>>(m.data(), Shape{2, 2})), kiln::ShapeError);
}

TEST_CASE("LaunchStats counts by kind, records on request, summarises and resets") {
  kiln::LaunchStats s;
  CHECK(s.launches() == 0);
  CHECK(s.summary() == "0 launches");
  s.count(kiln::kind::elementwise, "fused[mul,add]", 100, 800);
  CHECK(s.summary() == "1 launch: 1 elementwise");
  CHECK(s.records().empty());  // recording is off by default
  s.set_recording(true);
  CHECK(s.recording());
  s.count(kiln::kind::reduce, "sum", 50, 200);
  s.count(kiln::kind::gemm, "gemm", 10, 40);
  s.count(kiln::kind::reduce, "max", 50, 200);
  CHECK(s.launches() == 4);
  CHECK(s.launches(kiln::kind::reduce) == 2);
  CHECK(s.launches("elementwise") == 1);
  CHECK(s.launches("optimizer") == 0);
  CHECK(s.summary() == "4 launches: 1 elementwise, 1 gemm, 2 reduce");
  REQUIRE(s.records().size() == 3);
  CHECK(s.records()[0].kind == "reduce");
  CHECK(s.records()[0].name == "sum");
  CHECK(s.records()[0].elements == 50);
  CHECK(s.records()[0].bytes == 200);
  CHECK(s.records()[2].name == "max");
  s.reset();
  CHECK(s.launches() == 0);
  CHECK(s.by_kind().empty());
  CHECK(s.records().empty());
  CHECK(s.summary() == "0 launches");
  CHECK(s.recording());  // reset clears counts, not the mode
}

TEST_CASE("the executor counts its launches in its own LaunchStats") {
  kiln::CpuExecutor exec(1), other(1);
  CHECK(exec.threads() == 1);
  CHECK(kiln::CpuExecutor().threads() >= 1);
  kiln::HostVector<float> x(10), y(10);
  kiln::assign(x, 1.0f, exec);
  kiln::assign(y, x * 2, exec);
  kiln::Tensor<float, host> s;
  kiln::assign(s, kiln::sum(y), exec);
  CHECK(exec.stats().launches() == 3);
  CHECK(exec.stats().summary() == "3 launches: 2 elementwise, 1 reduce");
  CHECK(other.stats().launches() == 0);
  CHECK(s() == 20.0f);
}

TEST_CASE("TempPool zeroes a fresh buffer once when asked, and hands a reused one back as it is") {
  kiln::TempPool<host> pool;
  void* first = nullptr;
  {
    auto a = pool.take(4000, /*zero_fresh=*/true);
    first = a.get();
    const auto* bytes = static_cast<const unsigned char*>(a.get());
    CHECK(std::all_of(bytes, bytes + 4000, [](unsigned char v) { return v == 0; }));
    std::memset(a.get(), 0x5A, 4000);  // what a producer wrote
  }
  auto b = pool.take(4000, true);  // the same buffer again: not zeroed a second time
  REQUIRE(b.get() == first);
  CHECK(static_cast<const unsigned char*>(b.get())[3999] == 0x5A);
}

TEST_CASE("TempPool reuses returned buffers by size") {
  kiln::TempPool<host> pool;
  void* first = nullptr;
  {
    auto a = pool.take(1000);
    first = a.get();
    CHECK(first != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(first) % 64 == 0);
    CHECK(pool.cached_buffers() == 0);
  }
  CHECK(pool.cached_buffers() == 1);
  {
    auto b = pool.take(1000);  // the same rounded size: the cached buffer comes back
    CHECK(b.get() == first);
    CHECK(pool.cached_buffers() == 0);
    auto c = pool.take(1000);  // a second one while the first is taken is fresh
    CHECK(c.get() != first);
    auto moved = std::move(c);
    CHECK(moved.get() != nullptr);
    CHECK(c.get() == nullptr);  // NOLINT(bugprone-use-after-move)
  }
  CHECK(pool.cached_buffers() == 2);
  pool.clear();
  CHECK(pool.cached_buffers() == 0);
  // Steady state of an eager expression: after the first run, no new buffers are needed.
  kiln::CpuExecutor exec;
  kiln::HostVector<float> x(1000), y(1000);
  kiln::assign(x, 1.0f, exec);
  kiln::assign<kiln::stance::force_eager>(y, (x * 2 + 1) * 3 - 1, exec);
  const std::size_t cached = exec.temps().cached_buffers();
  CHECK(cached == 3);
  kiln::assign<kiln::stance::force_eager>(y, (x * 2 + 1) * 3 - 1, exec);
  CHECK(exec.temps().cached_buffers() == cached);
  CHECK(y(999) == 8.0f);
}

// Error messages are built by detail::concat without a stream per check (core/error.hpp): every
// kind of part must read exactly as std::ostream's operator<< writes it.
namespace {
template <class... Parts>
std::string streamed(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace

TEST_CASE("concat writes each part as std::ostream would") {
  const std::string s = "text";
  const std::string_view sv = "view";
  char* mutable_chars = const_cast<char*>("chars");
  const Shape shape{2, 3};
  enum Unscoped { first = 3 };
  CHECK(kiln::detail::concat("a", s, sv, mutable_chars, 'c') == streamed("a", s, sv, mutable_chars, 'c'));
  CHECK(kiln::detail::concat(-7, 7u, -123456789012345ll, 18446744073709551615ull, short(-3), std::size_t(9)) ==
        streamed(-7, 7u, -123456789012345ll, 18446744073709551615ull, short(-3), std::size_t(9)));
  CHECK(kiln::detail::concat(true, false) == "10");
  CHECK(kiln::detail::concat(static_cast<signed char>('x'), static_cast<unsigned char>('y')) == "xy");
  for (double v : {0.0, -0.0, 1.0, 0.1, 1e-7, 123456.0, 1234567.0, 3.14159265, -2.5e300, 1e-310})
    CHECK(kiln::detail::concat(v) == streamed(v));
  for (float v : {0.1f, 1e20f, -3.5f}) CHECK(kiln::detail::concat(v) == streamed(v));
  CHECK(kiln::detail::concat(std::numeric_limits<double>::infinity()) == streamed(std::numeric_limits<double>::infinity()));
  CHECK(kiln::detail::concat(std::numeric_limits<float>::quiet_NaN()) == streamed(std::numeric_limits<float>::quiet_NaN()));
  CHECK(kiln::detail::concat(1.5L) == "1.5");
  CHECK(kiln::detail::concat("shape ", shape, " and ", first) == streamed("shape ", shape, " and ", first));
  // A manipulator changes how the parts after it read, as on a stream.
  CHECK(kiln::detail::concat("0x", std::hex, 255, " ", -1, std::dec, " ", 255) ==
        streamed("0x", std::hex, 255, " ", -1, std::dec, " ", 255));
  CHECK(kiln::detail::concat(std::fixed, 0.5, " ", std::scientific, 1500.0) ==
        streamed(std::fixed, 0.5, " ", std::scientific, 1500.0));
  CHECK(kiln::detail::concat(std::hex, short(-2), " ", std::uint16_t(65535), " ", -3ll) ==
        streamed(std::hex, short(-2), " ", std::uint16_t(65535), " ", -3ll));
  CHECK(kiln::detail::concat() == "");
  CHECK(kiln::detail::concat(static_cast<const char*>(nullptr)) == "(null)");
  // An object part refers to its argument and writes it when the message is joined: after a
  // manipulator too, and through KILN_CHECK, whose parts are copies (temporaries included).
  CHECK(kiln::detail::concat(std::hex, 255, shape, first) == streamed(std::hex, 255, shape, first));
  try {
    KILN_CHECK(false, kiln::ShapeError, "got ", Shape{4, 5}, " after ", shape, " (", first, ")");
    FAIL("KILN_CHECK(false, ...) did not throw");
  } catch (const kiln::ShapeError& e) {
    CHECK(std::string(e.what()) == streamed("got ", Shape{4, 5}, " after ", shape, " (", first, ")"));
  }
}

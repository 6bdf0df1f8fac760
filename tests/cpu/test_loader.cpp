// The batch loader: sizes, order, determinism, prefetching against synchronous loading, worker
// exceptions and shutdown.
#include <kiln/data/idx.hpp>
#include <kiln/data/loader.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

using kiln::index_t;
using kiln::data::Batch;
using kiln::data::Dataset;
using kiln::data::Loader;
using kiln::data::LoaderOptions;

namespace {

// Row i holds {i, i + 0.5, -i} with label i % 7, so a batch's content tells which rows it holds.
Dataset make_rows(index_t n) {
  Dataset ds;
  ds.n = n;
  ds.d = 3;
  ds.num_classes = 7;
  ds.sample_shape = {3};
  for (index_t i = 0; i < n; ++i) {
    ds.features.insert(ds.features.end(), {float(i), float(i) + 0.5f, -float(i)});
    ds.labels.push_back(static_cast<std::int32_t>(i % 7));
  }
  return ds;
}

// A copy of what one epoch delivered: each batch's rows, features and labels.
struct Epoch {
  std::vector<std::vector<index_t>> rows;
  std::vector<std::vector<float>> features;
  std::vector<std::vector<std::int32_t>> labels;
  bool operator==(const Epoch&) const = default;
};

Epoch run_epoch(Loader& loader, index_t epoch) {
  Epoch out;
  loader.start_epoch(epoch);
  while (const Batch* b = loader.next()) {
    out.rows.emplace_back(b->rows.begin(), b->rows.end());
    out.features.emplace_back(b->features.begin(), b->features.end());
    out.labels.emplace_back(b->labels.begin(), b->labels.end());
  }
  return out;
}

// Rows in delivery order, and a check that each batch's data matches its rows.
std::vector<index_t> flat_rows(const Epoch& e) {
  std::vector<index_t> all;
  for (std::size_t k = 0; k < e.rows.size(); ++k) {
    for (std::size_t r = 0; r < e.rows[k].size(); ++r) {
      const index_t i = e.rows[k][r];
      CHECK(e.features[k][3 * r] == float(i));
      CHECK(e.features[k][3 * r + 2] == -float(i));
      CHECK(e.labels[k][r] == i % 7);
      all.push_back(i);
    }
  }
  return all;
}

// Runs f on its own thread; false if it has not returned within `limit` (the thread is then
// abandoned: the test has failed and the process is about to report it).
template <class F>
bool finishes_within(F f, std::chrono::seconds limit) {
  auto task = std::make_shared<std::packaged_task<void()>>(std::move(f));
  std::future<void> done = task->get_future();
  std::thread runner([task] { (*task)(); });
  if (done.wait_for(limit) != std::future_status::ready) {
    runner.detach();
    return false;
  }
  runner.join();
  done.get();  // re-throws what f threw
  return true;
}

}  // namespace

TEST_CASE("loader: batch count, last partial batch and drop_last") {
  const Dataset ds = make_rows(103);
  for (int workers : {0, 1}) {
    CAPTURE(workers);
    Loader keep(ds, {.batch_size = 10, .workers = workers});
    CHECK(keep.batches_per_epoch() == 11);
    const Epoch e = run_epoch(keep, 0);
    REQUIRE(e.rows.size() == 11);
    for (std::size_t k = 0; k < 10; ++k) CHECK(e.rows[k].size() == 10);
    CHECK(e.rows[10].size() == 3);
    CHECK(e.features[10].size() == 9);
    CHECK(keep.next() == nullptr);  // stays exhausted
    CHECK(keep.batches_served() == 11);

    Loader drop(ds, {.batch_size = 10, .drop_last = true, .workers = workers});
    CHECK(drop.batches_per_epoch() == 10);
    const Epoch d = run_epoch(drop, 0);
    REQUIRE(d.rows.size() == 10);
    for (const auto& r : d.rows) CHECK(r.size() == 10);
    CHECK(flat_rows(d).size() == 100);
  }
}

TEST_CASE("loader: every sample exactly once per epoch, data matching its rows") {
  const Dataset ds = make_rows(257);
  Loader loader(ds, {.batch_size = 16, .seed = 3, .workers = 2, .prefetch = 3});
  for (index_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<index_t> rows = flat_rows(run_epoch(loader, epoch));
    std::sort(rows.begin(), rows.end());
    REQUIRE(rows.size() == 257);
    for (index_t i = 0; i < 257; ++i) CHECK(rows[static_cast<std::size_t>(i)] == i);
  }
  CHECK(loader.batches_served() == 3 * 17);
}

TEST_CASE("loader: order is a function of (seed, epoch) only") {
  const Dataset ds = make_rows(200);
  Loader a(ds, {.batch_size = 32, .seed = 5});
  Loader b(ds, {.batch_size = 32, .seed = 5});
  Loader c(ds, {.batch_size = 32, .seed = 6});
  const Epoch a0 = run_epoch(a, 0), a1 = run_epoch(a, 1);
  CHECK(run_epoch(b, 1) == a1);  // epochs in any order
  CHECK(run_epoch(b, 0) == a0);
  CHECK(a0.rows != a1.rows);
  CHECK(run_epoch(c, 0).rows != a0.rows);
  CHECK(run_epoch(a, 0) == a0);  // repeating an epoch repeats it

  Loader in_order(ds, {.batch_size = 32, .shuffle = false});
  const std::vector<index_t> rows = flat_rows(run_epoch(in_order, 4));
  for (index_t i = 0; i < 200; ++i) CHECK(rows[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("loader: prefetching workers give the same batches as workers = 0") {
  const Dataset ds = make_rows(301);
  // The transform makes the comparison also cover work done on the worker threads.
  auto transform = [](Batch& b) {
    for (float& x : b.features) x = x * 2.0f + static_cast<float>(b.index);
  };
  Loader sync(ds, {.batch_size = 7, .seed = 9, .workers = 0, .transform = transform});
  for (const auto& config : {std::pair{1, 1}, std::pair{1, 4}, std::pair{3, 2}, std::pair{4, 8}}) {
    const int workers = config.first, prefetch = config.second;
    CAPTURE(workers);
    CAPTURE(prefetch);
    Loader async(ds, {.batch_size = 7,
                      .seed = 9,
                      .workers = workers,
                      .prefetch = prefetch,
                      .transform = transform});
    for (index_t epoch : {0, 1, 7}) CHECK(run_epoch(async, epoch) == run_epoch(sync, epoch));
  }
}

TEST_CASE("loader: a batch stays valid and unchanged until the next call") {
  const Dataset ds = make_rows(64);
  // The workers count the batches they assemble; while the consumer holds a batch it waits (a
  // latch, not a sleep) until the workers have assembled the next one into another buffer.
  std::atomic<index_t> assembled{0};
  Loader loader(ds, {.batch_size = 4, .seed = 1, .workers = 2, .prefetch = 2,
                     .transform = [&](Batch&) { assembled.fetch_add(1); }});
  loader.start_epoch(0);
  const index_t batches = loader.batches_per_epoch();
  while (const Batch* b = loader.next()) {
    const std::vector<float> before(b->features.begin(), b->features.end());
    const index_t next_one = std::min(batches, b->index + 2);
    REQUIRE(finishes_within([&] { while (assembled.load() < next_one) std::this_thread::yield(); },
                            std::chrono::seconds(10)));
    CHECK(std::equal(before.begin(), before.end(), b->features.begin()));
    CHECK(b->dim == 3);
    CHECK(b->epoch == 0);
  }
  CHECK(assembled.load() == batches);
}

TEST_CASE("loader: an exception in a worker reaches the consumer at its batch") {
  const Dataset ds = make_rows(100);
  for (int workers : {0, 1, 3}) {
    CAPTURE(workers);
    LoaderOptions options{.batch_size = 10, .seed = 2, .workers = workers, .prefetch = 3};
    options.transform = [](Batch& b) {
      if (b.epoch == 0 && b.index == 4) throw std::runtime_error("augmentation failed on batch 4");
    };
    Loader loader(ds, options);
    loader.start_epoch(0);
    for (int k = 0; k < 4; ++k) CHECK(loader.next() != nullptr);  // batches before it arrive
    CHECK_THROWS_WITH_AS(loader.next(), "augmentation failed on batch 4", std::runtime_error);
    CHECK_THROWS_AS(loader.next(), std::runtime_error);    // sticky until the next epoch
    CHECK(flat_rows(run_epoch(loader, 1)).size() == 100);  // a new epoch starts clean
  }
}

TEST_CASE("loader: destruction mid-epoch does not hang") {
  const Dataset ds = make_rows(1000);
  std::atomic<index_t> assembled{0};
  auto slow = [&](Batch&) {
    assembled.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  // Workers blocked on a full ring, workers mid-batch, never started, and restarted epochs.
  CHECK(finishes_within(
      [&] {
        Loader loader(ds, {.batch_size = 8, .workers = 3, .prefetch = 2, .transform = slow});
        loader.start_epoch(0);
        while (assembled.load() < 2) std::this_thread::yield();  // both buffers taken: workers mid-batch, then blocked
      },
      std::chrono::seconds(10)));
  CHECK(finishes_within(
      [&] {
        Loader loader(ds, {.batch_size = 8, .workers = 2, .prefetch = 4, .transform = slow});
        loader.start_epoch(0);
        CHECK(loader.next() != nullptr);
        CHECK(loader.next() != nullptr);
      },
      std::chrono::seconds(10)));
  CHECK(finishes_within([&] { Loader loader(ds, {.workers = 2}); }, std::chrono::seconds(10)));
  CHECK(finishes_within(
      [&] {
        Loader loader(ds, {.batch_size = 8, .workers = 2, .prefetch = 2});
        loader.start_epoch(0);
        loader.next();
        loader.start_epoch(1);  // abandons epoch 0 midway
        CHECK(flat_rows(run_epoch(loader, 1)).size() == 1000);
      },
      std::chrono::seconds(10)));
}

TEST_CASE("loader: wait_seconds measures time the consumer was blocked") {
  const Dataset ds = make_rows(40);
  // Synchronous: every next() waits for the whole 2 ms assembly, so 10 batches wait >= 20 ms.
  Loader sync(ds, {.batch_size = 4, .workers = 0, .transform = [](Batch&) {
                     std::this_thread::sleep_for(std::chrono::milliseconds(2));
                   }});
  CHECK(sync.wait_seconds() == 0.0);
  run_epoch(sync, 0);
  const double sync_wait = sync.wait_seconds();
  CHECK(sync_wait >= 0.020);
  CHECK(sync.batches_served() == 10);
  sync.reset_stats();
  CHECK(sync.wait_seconds() == 0.0);
  CHECK(sync.batches_served() == 0);

  // A consumer that asks only once the worker has assembled the batch (a latch on the worker's
  // count, not a sleep) finds it ready, or nearly (the worker still queues it): it waits a small
  // part of what the synchronous loader waited in this run — a ratio, so a loaded machine (CI's
  // ThreadSanitizer run beside other tests) slows both sides.
  std::atomic<index_t> assembled{0};
  Loader ahead(ds, {.batch_size = 4, .workers = 1, .prefetch = 2, .transform = [&](Batch&) { assembled.fetch_add(1); }});
  ahead.start_epoch(0);
  for (index_t k = 1; k <= ahead.batches_per_epoch(); ++k) {
    while (assembled.load() < k) std::this_thread::yield();
    REQUIRE(ahead.next() != nullptr);
  }
  CHECK(ahead.next() == nullptr);
  CHECK(ahead.batches_served() == 10);
  CHECK(ahead.wait_seconds() < 0.5 * sync_wait);
}

TEST_CASE("loader: invalid use is a ValueError") {
  const Dataset ds = make_rows(10);
  CHECK_THROWS_AS(Loader(ds, {.batch_size = 0}), kiln::ValueError);
  CHECK_THROWS_AS(Loader(ds, {.workers = -1}), kiln::ValueError);
  CHECK_THROWS_AS(Loader(ds, {.workers = 1, .prefetch = 0}), kiln::ValueError);
  Dataset broken = ds;
  broken.labels[0] = 9;  // >= num_classes
  CHECK_THROWS_AS(Loader(broken, {}), kiln::ValueError);
  Loader loader(ds, {});
  CHECK_THROWS_AS(loader.next(), kiln::ValueError);  // before start_epoch
  CHECK_THROWS_AS(loader.start_epoch(-1), kiln::ValueError);

  Dataset empty;
  empty.num_classes = 1;
  Loader none(empty, {.batch_size = 4});
  CHECK(none.batches_per_epoch() == 0);
  none.start_epoch(0);
  CHECK(none.next() == nullptr);
}

TEST_CASE("loader: digits20 in batches of 64" * doctest::skip(!kiln::data::have_zlib)) {  // the data is gzip'd
  const std::filesystem::path dir = std::filesystem::path(KILN_SOURCE_DIR) / "data";
  const Dataset train = kiln::data::load_idx_classification(
      dir / "digits20-train-images-idx3-ubyte.gz", dir / "digits20-train-labels-idx1-ubyte.gz", 10);
  Loader loader(train, {.batch_size = 64, .seed = 0, .workers = 1, .prefetch = 2});
  CHECK(loader.batches_per_epoch() == 63);  // 62 full batches and one of 32
  loader.start_epoch(0);
  index_t rows = 0, last = 0;
  std::vector<index_t> per_class(10, 0);
  while (const Batch* b = loader.next()) {
    CHECK(b->dim == 400);
    rows += b->size;
    last = b->size;
    for (std::int32_t y : b->labels) ++per_class[static_cast<std::size_t>(y)];
  }
  CHECK(rows == 4000);
  CHECK(last == 32);
  for (index_t c : per_class) CHECK(c == 400);
}

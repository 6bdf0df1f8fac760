// LoaderOptions::shard, a data-parallel job's share of every epoch (kiln/data/loader.hpp), against
// PyTorch's DistributedSampler rule written out here: the same permutation on every rank, padded
// to a multiple of the rank count by repeating its first rows, rank r taking every count-th
// position from r; and the property data-parallel training rests on: batch k of every rank
// together hold one process's batch k at count times the batch size.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "kiln/data/loader.hpp"

using kiln::index_t;
namespace data = kiln::data;

namespace {

data::Dataset numbered(index_t n) {
  data::Dataset d;
  d.n = n;
  d.d = 1;
  d.num_classes = 2;
  d.features.resize(std::size_t(n));
  d.labels.resize(std::size_t(n));
  for (index_t i = 0; i < n; ++i) {
    d.features[std::size_t(i)] = float(i);
    d.labels[std::size_t(i)] = std::int32_t(i % 2);
  }
  return d;
}

// The rows an epoch of `loader` hands out, in order.
std::vector<index_t> epoch_rows(data::Loader& loader, index_t epoch) {
  std::vector<index_t> rows;
  loader.start_epoch(epoch);
  while (const data::Batch* b = loader.next()) rows.insert(rows.end(), b->rows.begin(), b->rows.end());
  return rows;
}

}  // namespace

TEST_CASE("shard: each rank takes DistributedSampler's share of the epoch's permutation, padded from its start") {
  for (index_t n : {10, 12, 2, 7}) {
    for (int count : {2, 3, 4}) {
      const auto ds = numbered(n);
      data::Loader whole(ds, {.batch_size = n, .seed = 9, .workers = 0});
      for (index_t epoch : {0, 3}) {
        const std::vector<index_t> perm = epoch_rows(whole, epoch);
        const index_t per_rank = (n + count - 1) / count;
        std::vector<index_t> seen(std::size_t(n), 0);
        for (int rank = 0; rank < count; ++rank) {
          data::Loader mine(ds, {.batch_size = 3, .seed = 9, .workers = 1, .shard = {rank, count}});
          CHECK(mine.rows_per_epoch() == per_rank);
          const std::vector<index_t> rows = epoch_rows(mine, epoch);
          REQUIRE(index_t(rows.size()) == per_rank);
          for (index_t i = 0; i < per_rank; ++i) {
            CAPTURE(n);
            CAPTURE(count);
            CAPTURE(rank);
            CAPTURE(i);
            CHECK(rows[std::size_t(i)] == perm[std::size_t((rank + i * count) % n)]);
            ++seen[std::size_t(rows[std::size_t(i)])];
          }
        }
        // Every row once, the padding's rows (the permutation's first) once more.
        const index_t padding = per_rank * count - n;
        for (index_t i = 0; i < n; ++i) {
          const index_t row = perm[std::size_t(i)];
          CHECK(seen[std::size_t(row)] == 1 + (padding / n) + (i < padding % n ? 1 : 0));
        }
      }
    }
  }
}

TEST_CASE("shard: batch k of two ranks at batch B holds one process's batch k at batch 2B") {
  const auto ds = numbered(40);
  data::Loader whole(ds, {.batch_size = 8, .seed = 4, .workers = 0});
  data::Loader rank0(ds, {.batch_size = 4, .seed = 4, .workers = 0, .shard = {0, 2}});
  data::Loader rank1(ds, {.batch_size = 4, .seed = 4, .workers = 2, .shard = {1, 2}});
  CHECK(rank0.batches_per_epoch() == whole.batches_per_epoch());
  for (index_t epoch : {0, 1}) {
    whole.start_epoch(epoch);
    rank0.start_epoch(epoch);
    rank1.start_epoch(epoch);
    while (const data::Batch* w = whole.next()) {
      std::vector<index_t> expected(w->rows.begin(), w->rows.end()), got;
      const data::Batch* a = rank0.next();
      REQUIRE(a != nullptr);
      got.insert(got.end(), a->rows.begin(), a->rows.end());
      const data::Batch* b = rank1.next();
      REQUIRE(b != nullptr);
      got.insert(got.end(), b->rows.begin(), b->rows.end());
      std::sort(expected.begin(), expected.end());
      std::sort(got.begin(), got.end());
      CHECK(got == expected);
    }
    CHECK(rank0.next() == nullptr);
    CHECK(rank1.next() == nullptr);
  }
}

TEST_CASE("shard: a rank outside [0, count) or an empty dataset to shard is a ValueError naming it") {
  const auto ds = numbered(10);
  CHECK_THROWS_WITH_AS(data::Loader(ds, {.shard = {2, 2}}), doctest::Contains("shard rank 2 of 2"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(data::Loader(ds, {.shard = {0, 0}}), doctest::Contains("shard rank 0 of 0"), kiln::ValueError);
  const auto empty = numbered(0);
  CHECK_THROWS_WITH_AS(data::Loader(empty, {.shard = {0, 2}}), doctest::Contains("empty dataset"), kiln::ValueError);
}

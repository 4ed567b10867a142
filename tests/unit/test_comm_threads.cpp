// The threads backend: every collective against an oracle computed here on one rank, for several
// group sizes, element types and reduce ops; asynchronous operations; split groups; point-to-
// point; the CommLog; bad input; and failures (a throwing rank, a rank that never arrives).
//
// Catch2 is not thread-safe, so ranks never REQUIRE: they throw (check() below) and the test
// asserts on threads::run / run_collect in the main thread.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dtensor/comm/detail/wake_word.hpp"
#include "dtensor/comm/hosts.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/mesh/hosts.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_comm_threads {

// dtensor's, not OpenBLAS's global typedef (cblas.h), which another file of the group may include first.
using dtensor::bfloat16;
using namespace dtensor;
using namespace std::chrono_literals;
using dtensor::detail::cat;

namespace {

constexpr int group_sizes[] = {1, 2, 3, 4, 8};
constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

/// A value that depends on the rank, the index and a salt; fractional for floating types so
/// that the order of a reduction shows in the result's bits.
template <class T>
T gen(int rank, std::size_t i, int salt = 0) {
  const int v = int((std::size_t(rank) * 37 + i * 11 + std::size_t(salt) * 5) % 23);
  if constexpr (std::is_same_v<T, std::uint8_t>) return T(v);
  else if constexpr (std::is_integral_v<T>) return T(v - 11);
  else return T(float(v - 11) * 0.1f);
}

template <class T>
std::vector<T> gen_vec(int rank, std::size_t n, int salt = 0, std::size_t offset = 0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = gen<T>(rank, offset + i, salt);
  return v;
}

/// The single-rank oracle of a reduction: rank order, avg divides once at the end.
template <class T, class F>
T oracle_reduce(ReduceOp op, int n, F&& value_of_rank) {
  T acc = value_of_rank(0);
  for (int r = 1; r < n; ++r) acc = reduce_pair(op, acc, value_of_rank(r));
  if (op == ReduceOp::avg) acc = T(acc / T(n));
  return acc;
}

template <class T>
void expect_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  check(got.size() == want.size(), cat(what, ": ", got.size(), " elements, expected ", want.size()));
  // The message only for a mismatch: built for every element, it was most of this suite's time
  // (and of its ASan and TSan runs, where every byte it formats is instrumented).
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i])) check(false, cat(what, ": element ", i, " is ", +got[i], ", expected ", +want[i]));
}

std::string message_of(const std::exception_ptr& e) {
  if (!e) return "<no exception>";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// ------------------------------------------------------------------------------ run

TEST_CASE("threads::run gives each rank a world communicator", "[comm][threads]") {
  for (int n : group_sizes) {
    std::atomic<int> seen{0};
    REQUIRE_NOTHROW(threads::run(n, [&](CommPtr w) {
      check(w->size() == n && w->world_rank() == w->rank() && w->rank() >= 0 && w->rank() < n, "ranks");
      check(w->label() == "world" && w->backend() == "threads", "label/backend");
      seen.fetch_add(1 << w->rank());
    }));
    CHECK(seen == (1 << n) - 1);
  }
  CHECK_THROWS_AS(threads::run(0, [](CommPtr) {}), Error);
  CHECK_THROWS_WITH(threads::run(-2, [](CommPtr) {}), Catch::Contains("at least one rank"));
}

// ------------------------------------------------------------------------------ collectives

TEMPLATE_TEST_CASE("all_gather and all_to_all match the oracle", "[comm][threads]", float, double, bfloat16,
                   std::int32_t, std::int64_t, std::uint8_t) {
  using T = TestType;
  for (int n : group_sizes) {
    INFO("group size " << n);
    REQUIRE_NOTHROW(threads::run(n, [n](CommPtr w) {
      const int me = w->rank();
      for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(5), std::size_t(9001)}) {
        // all_gather: block j of recv is rank j's send.
        auto send = gen_vec<T>(me, count, 1);
        std::vector<T> recv(count * std::size_t(n));
        w->all_gather(std::span<const T>(send), std::span<T>(recv));
        std::vector<T> want;
        for (int j = 0; j < n; ++j) {
          auto b = gen_vec<T>(j, count, 1);
          want.insert(want.end(), b.begin(), b.end());
        }
        expect_equal(recv, want, cat("all_gather of ", count));

        // In place: send is this rank's own block of recv.
        std::vector<T> buf(count * std::size_t(n));
        std::copy(send.begin(), send.end(), buf.begin() + std::ptrdiff_t(count * std::size_t(me)));
        w->all_gather(std::span<const T>(buf.data() + count * std::size_t(me), count), std::span<T>(buf));
        expect_equal(buf, want, cat("in-place all_gather of ", count));

        // all_to_all: block j of my recv is block `me` of rank j's send.
        auto a2a_send = gen_vec<T>(me, count * std::size_t(n), 2);
        std::vector<T> a2a_recv(count * std::size_t(n));
        w->all_to_all(std::span<const T>(a2a_send), std::span<T>(a2a_recv));
        std::vector<T> a2a_want;
        for (int j = 0; j < n; ++j)
          for (std::size_t i = 0; i < count; ++i) a2a_want.push_back(gen<T>(j, std::size_t(me) * count + i, 2));
        expect_equal(a2a_recv, a2a_want, cat("all_to_all of ", count));

        // all_to_all with send == recv.
        w->all_to_all(std::span<const T>(a2a_send), std::span<T>(a2a_send));
        expect_equal(a2a_send, a2a_want, cat("in-place all_to_all of ", count));
      }
    }));
  }
}

TEMPLATE_TEST_CASE("all_to_all from strided blocks matches the oracle", "[comm][threads]", float, bfloat16,
                   std::int64_t) {
  using T = TestType;
  // Each rank's send is a [rows, cols] matrix; block j is columns [j * width, (j + 1) * width)
  // (cols may exceed n * width: a tail that is never sent). Even ranks describe the blocks as
  // StridedBlocks, odd ranks pack them and call the plain all_to_all: both meet in one
  // collective. Small sizes travel eagerly, large ones are read in place.
  for (int n : group_sizes) {
    INFO("group size " << n);
    REQUIRE_NOTHROW(threads::run(n, [n](CommPtr w) {
      const int me = w->rank();
      for (auto [rows, width, tail] : std::array<std::array<std::size_t, 3>, 4>{{{1, 1, 0}, {3, 2, 1}, {0, 4, 0}, {37, 61, 3}}}) {
        const std::size_t cols = width * std::size_t(n) + tail, block = rows * width;
        const auto send = gen_vec<T>(me, rows * cols, 3);
        std::vector<T> want;  // block j: rank j's columns of block `me`, row by row
        for (int j = 0; j < n; ++j)
          for (std::size_t r = 0; r < rows; ++r)
            for (std::size_t k = 0; k < width; ++k) want.push_back(gen<T>(j, r * cols + std::size_t(me) * width + k, 3));
        const StridedBlocks blocks{.rows = rows, .run = width, .row_stride = cols, .block_stride = width};
        std::vector<T> recv(block * std::size_t(n));
        const std::string what = cat(rows, " x ", width, " blocks, ", cols, " columns");
        if (me % 2 == 0) {
          w->all_to_all(std::span<const T>(send), blocks, std::span<T>(recv));
        } else {
          std::vector<T> packed;
          for (int j = 0; j < n; ++j)
            for (std::size_t r = 0; r < rows; ++r)
              for (std::size_t k = 0; k < width; ++k) packed.push_back(send[r * cols + std::size_t(j) * width + k]);
          w->all_to_all(std::span<const T>(packed), std::span<T>(recv));
        }
        expect_equal(recv, want, what);
        std::vector<T> async_recv(recv.size());
        w->all_to_all_async(std::span<const T>(send), blocks, std::span<T>(async_recv)).wait();
        expect_equal(async_recv, want, "async " + what);
      }
      // Blocks that reach past the send buffer are refused before any communication.
      std::vector<T> small(4), out(static_cast<std::size_t>(n));
      const StridedBlocks too_far{.rows = 1, .run = 1, .row_stride = 1, .block_stride = 4};
      bool refused = n == 1;  // one block of one element at offset 0 fits
      try {
        w->all_to_all(std::span<const T>(small), too_far, std::span<T>(out));
      } catch (const Error& e) {
        refused = contains(e.what(), "strided blocks") && contains(e.what(), "send has 4");
      }
      check(refused, "strided blocks past the end of send are an Error");
    }));
  }
}

TEMPLATE_TEST_CASE("all_reduce and reduce_scatter match the oracle for every op", "[comm][threads]", float, double,
                   bfloat16, std::int32_t, std::int64_t, std::uint8_t) {
  using T = TestType;
  for (int n : group_sizes) {
    INFO("group size " << n);
    REQUIRE_NOTHROW(threads::run(n, [n](CommPtr w) {
      const int me = w->rank();
      for (ReduceOp op : all_ops)
        for (std::size_t count : {std::size_t(1), std::size_t(13), std::size_t(5000)}) {
          const std::string what = cat(name_of(op), " of ", count, " x ", name_of(dtype_of<T>));
          std::vector<T> want(count);
          for (std::size_t i = 0; i < count; ++i)
            want[i] = oracle_reduce<T>(op, n, [&](int r) { return gen<T>(r, i, 3); });

          auto send = gen_vec<T>(me, count, 3);
          std::vector<T> recv(count);
          w->all_reduce(std::span<const T>(send), std::span<T>(recv), op);
          expect_equal(recv, want, "all_reduce " + what);
          w->all_reduce(std::span<T>(send), op);  // in place
          expect_equal(send, want, "in-place all_reduce " + what);

          // reduce_scatter: block `me` of the reduction of every rank's send.
          auto rs_send = gen_vec<T>(me, count * std::size_t(n), 4);
          std::vector<T> rs_recv(count), rs_want(count);
          for (std::size_t i = 0; i < count; ++i)
            rs_want[i] = oracle_reduce<T>(op, n, [&](int r) { return gen<T>(r, std::size_t(me) * count + i, 4); });
          w->reduce_scatter(std::span<const T>(rs_send), std::span<T>(rs_recv), op);
          expect_equal(rs_recv, rs_want, "reduce_scatter " + what);
        }
    }));
  }
}

TEMPLATE_TEST_CASE("broadcast from every root", "[comm][threads]", float, bfloat16, std::int64_t, std::uint8_t) {
  using T = TestType;
  for (int n : group_sizes) {
    REQUIRE_NOTHROW(threads::run(n, [n](CommPtr w) {
      for (int root = 0; root < n; ++root)
        for (std::size_t count : {std::size_t(0), std::size_t(7), std::size_t(20000)}) {
          auto buf = gen_vec<T>(w->rank(), count, root);
          w->broadcast(std::span<T>(buf), root);
          expect_equal(buf, gen_vec<T>(root, count, root), cat("broadcast of ", count, " from ", root));
        }
    }));
  }
}

TEST_CASE("all_to_all_v with uneven counts, zeros included", "[comm][threads]") {
  for (int n : group_sizes) {
    INFO("group size " << n);
    REQUIRE_NOTHROW(threads::run(n, [n](CommPtr w) {
      const int me = w->rank();
      // Rank s sends (s + 2 r) % 4 elements to rank r (0 for some pairs), large for one pair.
      auto amount = [](int s, int r) { return std::size_t((s + 2 * r) % 4) * (s == 1 && r == 0 ? 3000 : 1); };
      const auto count = static_cast<std::size_t>(n);  // not size_t(n): a vexing parse
      std::vector<std::size_t> sc(count), sd(count), rc(count), rd(count);
      std::size_t st = 0, rt = 0;
      for (int r = 0; r < n; ++r) {
        sc[std::size_t(r)] = amount(me, r);
        sd[std::size_t(r)] = st;
        st += sc[std::size_t(r)] + 1;  // a gap between blocks
        rc[std::size_t(r)] = amount(r, me);
      }
      // Receive blocks in reverse rank order, to check displacements are honoured.
      for (int r = n - 1; r >= 0; --r) {
        rd[std::size_t(r)] = rt;
        rt += rc[std::size_t(r)];
      }
      std::vector<double> send(st, -1.0), recv(rt, -2.0), want(rt);
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < sc[std::size_t(r)]; ++i) send[sd[std::size_t(r)] + i] = me * 1000.0 + r * 10.0 + double(i);
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < rc[std::size_t(r)]; ++i) want[rd[std::size_t(r)] + i] = r * 1000.0 + me * 10.0 + double(i);
      using S = std::span<const std::size_t>;
      w->all_to_all_v(std::span<const double>(send), S(sc), S(sd), std::span<double>(recv), S(rc), S(rd));
      expect_equal(recv, want, "all_to_all_v");

      // Asynchronous, with the count arrays gone before the wait.
      std::vector<double> recv2(rt);
      Work work;
      {
        auto c1 = sc, c2 = sd, c3 = rc, c4 = rd;
        work = w->all_to_all_v_async(std::span<const double>(send), S(c1), S(c2), std::span<double>(recv2), S(c3), S(c4));
        std::fill(c1.begin(), c1.end(), 999);
      }
      work.wait();
      expect_equal(recv2, want, "all_to_all_v_async");
    }));
  }
}

TEST_CASE("barrier orders the ranks", "[comm][threads]") {
  std::atomic<int> before{0};
  REQUIRE_NOTHROW(threads::run(4, [&](CommPtr w) {
    for (int k = 1; k <= 20; ++k) {
      before.fetch_add(1);
      w->barrier();
      check(before.load() >= 4 * k, "a rank left the barrier before all arrived");
      w->barrier();
    }
  }));
}

// ------------------------------------------------------------------------------ async

TEST_CASE("asynchronous collectives overlap work and each other", "[comm][threads]") {
  for (int n : {2, 3, 4}) {
    REQUIRE_NOTHROW(threads::run(n, [n](CommPtr w) {
      const int me = w->rank();
      const std::size_t count = 3000;
      auto ag_send = gen_vec<float>(me, count, 5);
      std::vector<float> ag_recv(count * std::size_t(n));
      auto ar = gen_vec<double>(me, count, 6);
      auto rs_send = gen_vec<std::int32_t>(me, count * std::size_t(n), 7);
      std::vector<std::int32_t> rs_recv(count);

      // Three outstanding at once, some "compute", then waited on in reverse order.
      Work a = w->all_gather_async(std::span<const float>(ag_send), std::span<float>(ag_recv));
      Work b = w->all_reduce_async(std::span<const double>(ar), std::span<double>(ar), ReduceOp::max);
      Work c = w->reduce_scatter_async(std::span<const std::int32_t>(rs_send), std::span<std::int32_t>(rs_recv),
                                       ReduceOp::sum);
      std::this_thread::sleep_for(std::chrono::milliseconds(2 * me));
      w->barrier();  // a blocking collective while three are in flight
      c.wait();
      b.wait();
      while (!a.test()) std::this_thread::yield();
      check(a.done(), "Work done after test()");

      std::vector<float> ag_want;
      for (int j = 0; j < n; ++j) {
        auto blk = gen_vec<float>(j, count, 5);
        ag_want.insert(ag_want.end(), blk.begin(), blk.end());
      }
      expect_equal(ag_recv, ag_want, "all_gather_async");
      std::vector<double> ar_want(count);
      std::vector<std::int32_t> rs_want(count);
      for (std::size_t i = 0; i < count; ++i) {
        ar_want[i] = oracle_reduce<double>(ReduceOp::max, n, [&](int r) { return gen<double>(r, i, 6); });
        rs_want[i] = oracle_reduce<std::int32_t>(ReduceOp::sum, n,
                                                 [&](int r) { return gen<std::int32_t>(r, std::size_t(me) * count + i, 7); });
      }
      expect_equal(ar, ar_want, "all_reduce_async");
      expect_equal(rs_recv, rs_want, "reduce_scatter_async");

      // Many small ones outstanding at once.
      std::vector<std::vector<std::int64_t>> bufs;
      std::vector<Work> works;
      for (int k = 0; k < 8; ++k) bufs.push_back(gen_vec<std::int64_t>(me, 16, k));
      for (auto& v : bufs) works.push_back(w->all_reduce_async(std::span<const std::int64_t>(v), std::span<std::int64_t>(v), ReduceOp::sum));
      for (auto& wk : works) wk.wait();
      for (int k = 0; k < 8; ++k) {
        std::vector<std::int64_t> want(16);
        for (std::size_t i = 0; i < 16; ++i)
          want[i] = oracle_reduce<std::int64_t>(ReduceOp::sum, n, [&](int r) { return gen<std::int64_t>(r, i, k); });
        expect_equal(bufs[std::size_t(k)], want, cat("outstanding all_reduce #", k));
      }
    }));
  }
}

// ------------------------------------------------------------------------------ split

TEST_CASE("split into rows and columns of a 2x4 grid", "[comm][threads]") {
  REQUIRE_NOTHROW(threads::run(8, [](CommPtr w) {
    const int me = w->rank();
    w->set_timeout(7s);
    CommPtr row = w->split(me / 4, me);  // {0..3}, {4..7}
    CommPtr col = w->split(me % 4, me);  // {0,4}, {1,5}, ...
    check(row && col, "split returned null for a non-negative color");
    check(row->size() == 4 && row->rank() == me % 4 && col->size() == 2 && col->rank() == me / 4, "group ranks");
    check(row->world_rank() == me && col->world_rank() == me, "world_rank is kept");
    check(row->label() == "world" && row->backend() == "threads", "label inherited");
    check(row->timeout() == 7s, "timeout copied");

    // Row and column collectives in flight together: an async gather along the row while
    // blocking reductions run along the column, issued in a rank-dependent order.
    std::vector<std::int32_t> mine{me, 10 * me}, rows(8);
    Work g;
    std::int32_t colsum = me;
    if (me % 2 == 0) {
      g = row->all_gather_async(std::span<const std::int32_t>(mine), std::span<std::int32_t>(rows));
      col->all_reduce(std::span<std::int32_t>(&colsum, 1), ReduceOp::sum);
    } else {
      col->all_reduce(std::span<std::int32_t>(&colsum, 1), ReduceOp::sum);
      g = row->all_gather_async(std::span<const std::int32_t>(mine), std::span<std::int32_t>(rows));
    }
    g.wait();
    check(colsum == (me % 4) + (me % 4 + 4), cat("column sum ", colsum));
    for (int j = 0; j < 4; ++j) {
      const int peer = (me / 4) * 4 + j;
      check(rows[std::size_t(2 * j)] == peer && rows[std::size_t(2 * j + 1)] == 10 * peer, "row gather");
    }

    // A split of a split, and the world still works afterwards.
    CommPtr pair = row->split(row->rank() / 2, 0);
    check(pair->size() == 2 && pair->world_rank() == me, "nested split");
    std::int64_t x = me;
    pair->all_reduce(std::span<std::int64_t>(&x, 1), ReduceOp::max);
    check(x == (me | 1), "nested all_reduce");
    w->barrier();
  }));
}

TEST_CASE("split with negative colors and keys that reorder", "[comm][threads]") {
  REQUIRE_NOTHROW(threads::run(7, [](CommPtr w) {
    const int me = w->rank();
    const int color = me % 3 == 0 ? -1 : me % 2;  // ranks 0, 3, 6 opt out
    CommPtr sub = w->split(color, -me);          // descending world rank
    if (color < 0) {
      check(sub == nullptr, "negative color gives nullptr");
      return;
    }
    std::vector<int> members;
    for (int r = 6; r >= 0; --r)
      if (r % 3 != 0 && r % 2 == color) members.push_back(r);
    check(sub->size() == int(members.size()), "group size");
    check(members[std::size_t(sub->rank())] == me, "ordered by key");
    std::vector<std::int32_t> ranks(members.size());
    std::int32_t wr = me;
    sub->all_gather(std::span<const std::int32_t>(&wr, 1), std::span<std::int32_t>(ranks));
    for (std::size_t i = 0; i < members.size(); ++i) check(ranks[i] == members[i], "gathered world ranks");
  }));
}

// ------------------------------------------------------------------------------ point-to-point

TEST_CASE("send and recv: pairs, FIFO per tag, tags out of order, sub-groups", "[comm][threads]") {
  REQUIRE_NOTHROW(threads::run(4, [](CommPtr w) {
    const int me = w->rank();
    if (me % 2 == 0) {
      const int peer = me + 1;
      auto a = gen_vec<float>(me, 5000, 1), b = gen_vec<float>(me, 3, 2), c = gen_vec<float>(me, 4, 3);
      Work wa = w->send_async(std::span<const float>(a), peer, 7);
      Work wb = w->send_async(std::span<const float>(b), peer, 7);  // same tag: arrives after a
      w->send(std::span<const float>(c), peer, 9);
      wa.wait();
      wb.wait();
    } else {
      const int peer = me - 1;
      std::vector<float> a(5000), b(3), c(4);
      w->recv(std::span<float>(c), peer, 9);  // tag 9 first, though it was sent last
      w->recv(std::span<float>(a), peer, 7);
      w->recv(std::span<float>(b), peer, 7);
      expect_equal(a, gen_vec<float>(peer, 5000, 1), "first message of tag 7");
      expect_equal(b, gen_vec<float>(peer, 3, 2), "second message of tag 7");
      expect_equal(c, gen_vec<float>(peer, 4, 3), "tag 9");
    }
    // Within a sub-group, peers are group ranks: columns {0,2} and {1,3}.
    CommPtr col = w->split(me % 2, me);
    std::int64_t v = me, got = -1;
    if (col->rank() == 0) col->send(std::span<const std::int64_t>(&v, 1), 1);
    else col->recv(std::span<std::int64_t>(&got, 1), 0);
    check(col->rank() == 0 || got == me - 2, cat("sub-group recv got ", got));
  }));
}

TEST_CASE("send_recv rings do not deadlock", "[comm][threads]") {
  for (int n : group_sizes) {
    REQUIRE_NOTHROW(threads::run(n, [n](CommPtr w) {
      const int me = w->rank();
      const int next = (me + 1) % n, prev = (me + n - 1) % n;
      // Pass every rank's block once around the ring; each step is a blocking send_recv.
      auto block = gen_vec<bfloat16>(me, 4000, 0);
      std::vector<bfloat16> incoming(block.size());
      int origin = me;
      for (int step = 0; step < n - 1; ++step) {
        w->send_recv(std::span<const bfloat16>(block), next, std::span<bfloat16>(incoming), prev, step);
        std::swap(block, incoming);
        origin = (origin + n - 1) % n;
        expect_equal(block, gen_vec<bfloat16>(origin, 4000, 0), cat("ring step ", step));
      }
    }));
  }
}

// ------------------------------------------------------------------------------ CommLog

TEST_CASE("CommLog records kind, group label and bytes per rank", "[comm][threads]") {
  REQUIRE_NOTHROW(threads::run(4, [](CommPtr w) {
    CommPtr row = w->split(w->rank() / 2, w->rank());
    row->set_label("tp");
    CommLog log;
    std::vector<float> x(16), g(32);
    w->all_reduce(std::span<float>(x), ReduceOp::avg);
    row->all_gather(std::span<const float>(x), std::span<float>(g));
    check(log.size() == 2, cat("records: ", log.size()));
    check(log.count(CollectiveKind::all_reduce, "world") == 1 && log.count(CollectiveKind::all_gather, "tp") == 1,
          log.to_string());
    const auto& r = log.records();
    check(r[0].bytes == 64 && r[0].group_size == 4 && r[0].op == ReduceOp::avg && r[0].dtype == DType::float32,
          log.to_string());
    check(r[1].bytes == 128 && r[1].group_size == 2, log.to_string());
    check(log.bytes() == 192, log.to_string());
  }));
}

// ------------------------------------------------------------------------------ bad input

TEST_CASE("wrong buffer sizes are reported by the rank that passed them", "[comm][threads]") {
  auto errors = threads::run_collect(2, [](CommPtr w) {
    std::vector<float> s(4), r(7);
    w->all_gather(std::span<const float>(s), std::span<float>(r));
  });
  for (auto& e : errors) {
    const std::string m = message_of(e);
    CHECK(contains(m, "all_gather"));
    CHECK(contains(m, "recv has 7 elements, expected 8"));
  }
  errors = threads::run_collect(3, [](CommPtr w) {
    std::vector<std::int32_t> s(10), r(3);
    w->reduce_scatter(std::span<const std::int32_t>(s), std::span<std::int32_t>(r), ReduceOp::sum);
  });
  for (auto& e : errors) CHECK(contains(message_of(e), "reduce_scatter"));
  for (auto& e : errors) CHECK(contains(message_of(e), "send has 10 elements, expected 9"));
}

TEST_CASE("inconsistent arguments between ranks fail on every rank", "[comm][threads]") {
  SECTION("different counts") {  // the fingerprints or, without them, the backend's validation
    auto errors = threads::run_collect(3, [](CommPtr w) {
      std::vector<float> x(w->rank() == 1 ? 5 : 4);
      w->all_reduce(std::span<float>(x), ReduceOp::sum);
    });
    for (auto& e : errors) {
      const std::string m = message_of(e);
      INFO(m);
      CHECK(contains(m, "all_reduce[world]"));
      CHECK(contains(m, "rank 0: all_reduce(4 x float32, sum)"));
      CHECK(contains(m, "rank 1: all_reduce(5 x float32, sum)"));
      CHECK(contains(m, "rank 2: all_reduce(4 x float32, sum)"));
    }
  }
  SECTION("different collectives, without the check") {
    auto errors = threads::run_collect(2, [](CommPtr w) {
      w->set_check_collectives(false);  // the backend's own validation, not the fingerprints
      std::vector<float> x(4), y(8);
      if (w->rank() == 0) w->all_reduce(std::span<float>(x), ReduceOp::max);
      else w->all_gather(std::span<const float>(x), std::span<float>(y));
    });
    for (auto& e : errors) {
      const std::string m = message_of(e);
      INFO(m);
      CHECK(contains(m, "rank 0: all_reduce(4 x float32, max)"));
      CHECK(contains(m, "rank 1: all_gather(4 x float32)"));
    }
  }
  SECTION("different collectives, with check_collectives on") {
    auto errors = threads::run_collect(2, [](CommPtr w) {
      w->set_check_collectives(true);
      std::vector<float> x(4), y(8);
      if (w->rank() == 0) w->all_reduce(std::span<float>(x), ReduceOp::sum);
      else w->all_gather(std::span<const float>(x), std::span<float>(y));
    });
    for (auto& e : errors) {
      const std::string m = message_of(e);
      INFO(m);
      CHECK(contains(m, "ranks issued different collectives"));
      CHECK(contains(m, "rank 0: all_reduce(4 x float32, sum)"));
      CHECK(contains(m, "rank 1: all_gather(4 x float32)"));
    }
  }
  SECTION("all_to_all_v counts that do not pair up") {
    auto errors = threads::run_collect(2, [](CommPtr w) {
      std::vector<float> s(4), r(4);
      std::vector<std::size_t> sc{2, 2}, sd{0, 2}, rc{2, std::size_t(w->rank() == 0 ? 1 : 2)}, rd{0, 2};
      using S = std::span<const std::size_t>;
      w->all_to_all_v(std::span<const float>(s), S(sc), S(sd), std::span<float>(r), S(rc), S(rd));
    });
    for (auto& e : errors) {
      const std::string m = message_of(e);
      INFO(m);
      CHECK(contains(m, "rank 1 sends 2 elements to rank 0, which expects 1"));
    }
  }
  SECTION("a recv that expects another size than was sent") {
    auto errors = threads::run_collect(2, [](CommPtr w) {
      std::vector<float> x(w->rank() == 0 ? 3 : 4);
      if (w->rank() == 0) w->send(std::span<const float>(x), 1);
      else w->recv(std::span<float>(x), 0);
    });
    for (auto& e : errors) {
      const std::string m = message_of(e);
      INFO(m);
      CHECK(contains(m, "rank 0 sent 3 x float32 to rank 1, which expected 4 x float32"));
    }
    CHECK(contains(message_of(errors[0]), "send[world]"));
    CHECK(contains(message_of(errors[1]), "recv[world]"));
  }
}

// ------------------------------------------------------------------------------ faults

TEST_CASE("a rank that throws releases the ranks waiting for it", "[comm][threads]") {
  const auto t0 = std::chrono::steady_clock::now();
  auto errors = threads::run_collect(4, [](CommPtr w) {
    w->set_timeout(60s);  // far longer than the test: only the abort can release the others
    if (w->rank() == 2) {
      std::this_thread::sleep_for(50ms);  // let the others block first
      throw std::runtime_error("boom in rank 2");
    }
    std::vector<float> x(8);
    if (w->rank() == 3) w->recv(std::span<float>(x), 2);  // blocked in point-to-point
    else if (w->rank() == 1) w->all_reduce_async(std::span<const float>(x), std::span<float>(x), ReduceOp::sum).wait();
    else w->all_reduce(std::span<float>(x), ReduceOp::sum);
  });
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  CHECK(message_of(errors[2]) == "boom in rank 2");
  for (int r : {0, 1, 3}) {
    const std::string m = message_of(errors[std::size_t(r)]);
    INFO(m);
    CHECK(contains(m, "rank 2 failed: boom in rank 2"));
    CHECK(contains(m, r == 3 ? "recv[world]" : "all_reduce[world]"));
  }

  // run() rethrows the failing rank's number and message.
  CHECK_THROWS_WITH(threads::run(3,
                                 [](CommPtr w) {
                                   if (w->rank() == 1) throw std::runtime_error("original text");
                                   w->barrier();
                                 }),
                    Catch::Contains("rank 1 failed: original text"));
}

TEST_CASE("after an abort, new operations fail at once", "[comm][threads]") {
  auto errors = threads::run_collect(2, [](CommPtr w) {
    w->set_timeout(60s);
    if (w->rank() == 1) throw std::runtime_error("gone");
    std::vector<float> x(4);
    try {
      w->all_reduce(std::span<float>(x), ReduceOp::sum);
    } catch (const Error&) {
    }
    const auto t = std::chrono::steady_clock::now();
    try {
      w->barrier();
    } catch (const Error& e) {
      check(std::chrono::steady_clock::now() - t < 1s, "the barrier waited");
      throw;
    }
  });
  CHECK(contains(message_of(errors[0]), "barrier[world]"));
  CHECK(contains(message_of(errors[0]), "rank 1 failed: gone"));
}

TEST_CASE("a rank that is alive but never arrives times out, naming it", "[comm][threads]") {
  SECTION("collective") {
    const auto t0 = std::chrono::steady_clock::now();
    auto errors = threads::run_collect(4, [](CommPtr w) {
      w->set_timeout(200ms);
      if (w->rank() == 2) {  // alive but busy: never calls the all_gather (a rank that returns
        std::this_thread::sleep_for(600ms);  // instead releases the others at once: test_hardening)
        return;
      }
      std::vector<std::int32_t> s(3), r(12);
      w->all_gather(std::span<const std::int32_t>(s), std::span<std::int32_t>(r));
    });
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
    CHECK(errors[2] == nullptr);
    for (int r : {0, 1, 3}) {
      const std::string m = message_of(errors[std::size_t(r)]);
      INFO(m);
      CHECK(contains(m, "all_gather[world]"));
      CHECK(contains(m, "timed out after 200 ms"));
      CHECK(contains(m, "rank 2 did not arrive"));
    }
  }
  SECTION("in a sub-group, two missing ranks") {
    auto errors = threads::run_collect(6, [](CommPtr w) {
      CommPtr sub = w->split(w->rank() % 2, w->rank());  // {0,2,4}, {1,3,5}
      sub->set_timeout(200ms);
      if (w->rank() == 1) sub->barrier();
      else if (w->rank() % 2 == 1) std::this_thread::sleep_for(600ms);  // busy: never arrive
    });
    const std::string m = message_of(errors[1]);
    INFO(m);
    CHECK(contains(m, "barrier[world]"));
    CHECK(contains(m, "rank 1 (world rank 3), rank 2 (world rank 5) did not arrive"));
  }
  SECTION("recv from a rank that never sends") {
    auto errors = threads::run_collect(2, [](CommPtr w) {
      w->set_timeout(200ms);
      std::vector<float> x(4);
      if (w->rank() == 0) w->recv(std::span<float>(x), 1, 5);
      else std::this_thread::sleep_for(600ms);
    });
    const std::string m = message_of(errors[0]);
    INFO(m);
    CHECK(contains(m, "recv[world]"));
    CHECK(contains(m, "rank 1 did not send"));
    CHECK(errors[1] == nullptr);
  }
  SECTION("send to a rank that never receives") {
    auto errors = threads::run_collect(2, [](CommPtr w) {
      w->set_timeout(200ms);
      std::vector<float> x(4);
      if (w->rank() == 1) w->send(std::span<const float>(x), 0, 3);
      else std::this_thread::sleep_for(600ms);
    });
    const std::string m = message_of(errors[1]);
    INFO(m);
    CHECK(contains(m, "send[world]"));
    CHECK(contains(m, "rank 0 did not receive (4 x float32, tag 3)"));
    CHECK(errors[0] == nullptr);
  }
}

// The word the backend's waiters sleep on (comm/detail/wake_word.hpp): a wake releases every
// sleeper, one that read the word before a wake does not sleep, a deadline returns.
TEST_CASE("WakeWord: wake releases every sleeper, a stale read does not sleep, deadlines return", "[comm][threads]") {
  threads::detail::WakeWord word;
  using Clock = threads::detail::WakeWord::Clock;
  const auto t0 = Clock::now();
  CHECK_FALSE(word.wait_until(word.now(), t0));                   // a deadline already passed: no sleep
  CHECK_FALSE(word.wait_until(word.now(), Clock::now() + 20ms));  // nobody wakes it: the deadline
  CHECK(Clock::now() - t0 >= 20ms);
  const auto seen = word.now();
  word.wake();
  CHECK(word.wait_until(seen, Clock::now() + 60s));  // moved since read: returns at once
  std::atomic<bool> ready{false};
  std::atomic<int> released{0};
  std::vector<std::thread> sleepers;
  for (int i = 0; i < 6; ++i)
    sleepers.emplace_back([&] {
      for (;;) {
        const auto s = word.now();
        if (ready.load()) break;
        word.wait_until(s, Clock::now() + 60s);
      }
      ++released;
    });
  std::this_thread::sleep_for(50ms);  // most of them asleep by now (any not yet asleep see the word move)
  const auto t1 = Clock::now();
  ready = true;
  word.wake();
  for (auto& t : sleepers) t.join();
  CHECK(released.load() == 6);
  CHECK(Clock::now() - t1 < 30s);  // released by the wake, not by their 60 s deadlines
}

// Hosts (comm/hosts.hpp, mesh/hosts.hpp): the threads ranks share one host; the mesh's crossing
// dimensions are checked against host layouts given by hand (what ranks on 2 or 4 machines
// would have exchanged), each answer worked out from the row-major mesh pp 2 x dp 2 x tp 2.
TEST_CASE("host_names and the mesh dimensions that cross hosts", "[comm][threads][hosts]") {
  using Mesh = DeviceMesh<"pp", "dp", "tp">;
  const std::vector<std::string> two{"a", "a", "a", "a", "b", "b", "b", "b"};  // mpirun --map-by slot
  const std::vector<std::string> four{"a", "a", "b", "b", "c", "c", "d", "d"};
  const std::vector<std::string> rr{"a", "b", "a", "b", "a", "b", "a", "b"};   // mpirun --map-by node
  std::vector<std::string> names;
  MeshHosts<3> one, h2, h4, hr;
  std::optional<bool> two_dp_tp, two_all, four_dp_tp, four_tp, two_pp_tp, two_ep, two_empty;
  std::string wrong_size;
  // Assertions stay on the main thread (Catch is not thread-safe): rank 0 keeps the answers.
  threads::run(8, [&](CommPtr w) {
    auto mine = host_names(*w);
    Mesh mesh(w, {2, 2, 2});
    if (w->rank() != 0) return;
    names = std::move(mine);
    one = mesh_hosts(mesh, names);
    h2 = mesh_hosts(mesh, two);
    h4 = mesh_hosts(mesh, four);
    hr = mesh_hosts(mesh, rr);
    two_dp_tp = crosses_hosts(mesh, two, "dp*tp");
    two_all = crosses_hosts(mesh, two, "pp*dp*tp");
    four_dp_tp = crosses_hosts(mesh, four, "dp*tp");
    four_tp = crosses_hosts(mesh, four, "tp");
    two_pp_tp = crosses_hosts(mesh, two, "pp*tp");
    two_ep = crosses_hosts(mesh, two, "ep");
    two_empty = crosses_hosts(mesh, two, "");
    try {
      mesh_hosts(mesh, std::vector<std::string>(3, "a"));
    } catch (const Error& e) {
      wrong_size = e.what();
    }
  });
  // The threads ranks share this process's host.
  REQUIRE(names == std::vector<std::string>(8, this_host()));
  CHECK((one.count == 1 && one.adjacent && !one.crosses[0] && !one.crosses[1] && !one.crosses[2]));
  // 2 hosts in blocks of 4: only pp crosses.
  CHECK((h2.count == 2 && h2.adjacent && h2.crosses[0] && !h2.crosses[1] && !h2.crosses[2]));
  CHECK(two_dp_tp == std::optional<bool>(false));
  CHECK(two_all == std::optional<bool>(true));
  // 4 hosts in blocks of 2: pp and dp cross, tp stays inside.
  CHECK((h4.count == 4 && h4.adjacent && h4.crosses[0] && h4.crosses[1] && !h4.crosses[2]));
  CHECK(four_dp_tp == std::optional<bool>(true));
  CHECK(four_tp == std::optional<bool>(false));
  // Round robin: tp crosses, the others stay; a host's ranks are not adjacent.
  CHECK((hr.count == 2 && !hr.adjacent && !hr.crosses[0] && !hr.crosses[1] && hr.crosses[2]));
  // Labels that are not a run of this mesh's adjacent dimensions (another mesh's group) say nothing.
  CHECK(!two_pp_tp.has_value());
  CHECK(!two_ep.has_value());
  CHECK(!two_empty.has_value());
  // A host list of the wrong size is an error naming both sizes.
  CHECK_THAT(wrong_size, Catch::Contains("mesh_hosts") && Catch::Contains("3 host names") && Catch::Contains("8 ranks"));
}

}  // namespace test_comm_threads

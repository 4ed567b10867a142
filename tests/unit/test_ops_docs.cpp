// docs/ops.md's rule tables are the code's: each table is rendered here from the rule functions
// of ops/rules.hpp (the ones the ops use) and compared with the block between
// `<!-- rules: NAME -->` and `<!-- end rules -->` in docs/ops.md.
// To regenerate the tables after changing a rule: DTENSOR_PRINT_OPS_TABLES=1 ./test_ops_docs
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/ops/rules.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_ops_docs {

using namespace dtensor;
namespace rules = dtensor::ops::rules;

namespace {

std::string name(const PlacementDesc& p) {
  switch (p.kind) {
    case PlacementKind::replicate: return "Replicate";
    case PlacementKind::shard: return "Shard<" + std::to_string(p.dim) + ">";
    case PlacementKind::partial: return "Partial<" + std::string(name_of(p.op)) + ">";
  }
  return "?";
}

const PlacementDesc P_sum = rules::P(ReduceOp::sum), P_avg = rules::P(ReduceOp::avg), P_max = rules::P(ReduceOp::max);

std::vector<PlacementDesc> candidates(int rank) {
  std::vector<PlacementDesc> c{rules::R};
  for (int d = 0; d < rank; ++d) c.push_back(rules::S(d));
  c.insert(c.end(), {P_sum, P_avg, P_max});
  return c;
}

/// The markdown table of every combination of candidates the rule accepts, on one mesh dimension.
template <std::size_t K, class Rule>
std::string table(const Rule& rule, const std::array<std::string, K>& heads,
                  const std::array<std::vector<PlacementDesc>, K>& cands) {
  std::ostringstream s;
  s << "|";
  for (const auto& h : heads) s << ' ' << h << " |";
  s << " output |\n|";
  for (std::size_t i = 0; i <= K; ++i) s << "---|";
  s << "\n";
  std::array<std::size_t, K> idx{};
  while (true) {
    std::array<PlacementDesc, K> p{};
    for (std::size_t j = 0; j < K; ++j) p[j] = cands[j][idx[j]];
    const auto r = rule(p);
    if (r.ok) {
      s << "|";
      for (const auto& q : p) s << ' ' << name(q) << " |";
      s << ' ' << name(r.out) << " |\n";
    }
    std::size_t j = K;
    while (j-- > 0) {
      if (++idx[j] < cands[j].size()) break;
      idx[j] = 0;
    }
    if (j == std::size_t(-1)) break;
  }
  return s.str();
}

struct Entry {
  std::string key, text;
};

std::vector<Entry> all_tables() {
  const auto c2 = candidates(2), c3 = candidates(3), c4 = candidates(4), c1 = candidates(1);
  const std::vector<PlacementDesc> ids{rules::R, rules::S(0), rules::S(1)};
  return {
      {"matmul", table<2>(rules::Matmul{2, 2, false, false}, {"a [m, k]", "b [k, n]"}, {c2, c2})},
      {"linear", table<2>(rules::Matmul{3, 2, false, true}, {"x [B, T, in]", "w [out, in]"}, {c3, c2})},
      {"bmm", table<2>(rules::Bmm{3, false, false}, {"a [b, m, k]", "b [b, k, n]"}, {c3, c3})},
      {"add", table<2>(rules::Binary{rules::Binary::add}, {"a [M, N]", "b [M, N]"}, {c2, c2})},
      {"mul", table<2>(rules::Binary{rules::Binary::mul}, {"a [M, N]", "b [M, N]"}, {c2, c2})},
      {"scale", table<1>(rules::Unary{true}, {"x [M, N]"}, {c2})},
      {"activation", table<1>(rules::Unary{false}, {"x [M, N]"}, {c2})},
      {"bias_add", table<2>(rules::BiasAdd{2}, {"x [N, C]", "bias [C]"}, {c2, c1})},
      {"sum", table<1>(rules::Reduce{rules::Reduce::sum, 1}, {"x [N, C], over dim 1"}, {c2})},
      {"max", table<1>(rules::Reduce{rules::Reduce::max, 1}, {"x [N, C], over dim 1"}, {c2})},
      {"softmax", table<1>(rules::Rowwise<1>{2}, {"x [N, C]"}, {c2})},
      {"layer_norm", table<3>(rules::Rowwise<3>{2}, {"x [N, C]", "weight [C]", "bias [C]"}, {c2, c1, c1})},
      {"embedding", table<2>(rules::Embedding{2}, {"weight [V, C]", "ids [B, T]"}, {c2, ids})},
      {"cross_entropy", table<2>(rules::CrossEntropy{}, {"logits [N, V]", "targets [N]"}, {c2, c1})},
      {"attention", table<3>(rules::Attention{}, {"q [B, H, T, D]", "k", "v"}, {c4, c4, c4})},
      {"transpose", table<1>(rules::Transpose{0, 1}, {"x [M, N], transpose<0, 1>"}, {c2})},
      {"split", table<1>(rules::AlongDim{1}, {"x [M, N], along dim 1"}, {c2})},
      {"reshape", table<2>(rules::Reshape{}, {"x", "requested output"}, {c2, c2})},
      // backward rules
      {"linear_in_grad", table<2>(rules::LinearInGrad{}, {"x (forward input)", "dy"}, {c2, c2})},
      {"sum_to", table<2>(rules::SumTo{}, {"dz [M, N]", "operand"}, {c2, c2})},
      {"sum_rows", table<1>(rules::SumRows{2}, {"dy [N, C]"}, {c2})},
      {"reduce_backward", table<2>(rules::ReduceBackward{1}, {"x [N, C], reduced over dim 1", "dy"}, {c2, c2})},
      {"embedding_backward",
       table<3>(rules::EmbeddingBackward{2}, {"weight [V, C]", "ids [B, T]", "dy [B, T, C]"}, {c2, ids, c3})},
      {"reshape_backward", table<2>(rules::ReshapeBackward{}, {"x", "dy"}, {c2, c2})},
  };
}

std::string docs_path() {
  if (const char* p = std::getenv("DTENSOR_OPS_DOCS")) return p;
  std::string f = __FILE__;  // <root>/tests/unit/test_ops_docs.cpp
  return f.substr(0, f.rfind("tests/unit/")) + "docs/ops.md";
}

}  // namespace

TEST_CASE("docs/ops.md holds the rule tables the code implements", "[ops][docs]") {
  const auto tables = all_tables();
  if (std::getenv("DTENSOR_PRINT_OPS_TABLES"))
    for (const auto& t : tables) std::cout << "<!-- rules: " << t.key << " -->\n" << t.text << "<!-- end rules -->\n\n";
  std::ifstream in(docs_path());
  INFO("reading " << docs_path());
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  for (const auto& t : tables) {
    const std::string open = "<!-- rules: " + t.key + " -->\n", close = "<!-- end rules -->";
    const auto b = doc.find(open);
    INFO("table " << t.key);
    REQUIRE(b != std::string::npos);
    const auto e = doc.find(close, b);
    REQUIRE(e != std::string::npos);
    const std::string have = doc.substr(b + open.size(), e - b - open.size());
    INFO("docs/ops.md has:\n" << have << "the code gives:\n" << t.text);
    CHECK(have == t.text);
  }
}

TEST_CASE("the rendered tables carry the rules the issue names", "[ops][docs]") {
  // A sanity check of the renderer itself, against hand-written rows.
  const auto t = all_tables();
  const auto& mm = t[0].text;
  CHECK(mm.find("| Shard<0> | Replicate | Shard<0> |") != std::string::npos);
  CHECK(mm.find("| Replicate | Shard<1> | Shard<1> |") != std::string::npos);
  CHECK(mm.find("| Shard<1> | Shard<0> | Partial<sum> |") != std::string::npos);
  CHECK(mm.find("| Shard<0> | Shard<0> |") == std::string::npos);
  CHECK(t[6].text.find("Partial") == std::string::npos);  // activations keep no Partial
}

}  // namespace test_ops_docs

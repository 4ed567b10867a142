// dtensor/mesh/hosts.hpp — which dimensions of a mesh cross hosts.
//
//   const auto hosts = dtensor::host_names(mesh.root());            // comm/hosts.hpp, collective
//   dtensor::MeshHosts<Mesh::ndim> h = dtensor::mesh_hosts(mesh, hosts);
//   h.crosses[d]          // some group along dimension d has ranks on two hosts
//   h.adjacent            // each host's ranks are one block of consecutive ranks
//   dtensor::crosses_hosts(mesh, hosts, "dp*fsdp")   // a group label (CommLog's), if it names adjacent dims
//   dtensor::describe_hosts(mesh, h)  // "hosts: 2, each host's ranks adjacent; across hosts: dp; inside a host: tp"
//
// Across machines the link between hosts is an order of magnitude slower than inside one, so the
// mesh's fastest-varying dimensions (tp, then cp) should stay inside a host and the data and
// pipeline dimensions cross — what a launcher placing each host's ranks in one block
// (`mpirun --map-by slot`, Slurm's block distribution) gives a row-major mesh. This says which
// dimensions do cross, so a program can print it and account its traffic inside vs across hosts
// (examples/train_gpt.cpp's summary; docs/multinode.md).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/core/error.hpp"

namespace dtensor {

template <std::size_t N>
struct MeshHosts {
  int count = 0;                  // distinct hosts
  bool adjacent = true;           // each host's ranks consecutive (in the mesh's root communicator)
  std::array<bool, N> crosses{};  // per dimension: a group along it spans hosts
};

namespace detail {
/// Whether some group over dimensions lo..hi of `mesh` has ranks on more than one host.
/// `hosts[r]` is the host of rank r of the mesh's root communicator.
template <class Mesh>
bool group_crosses_hosts(const Mesh& mesh, const std::vector<std::string>& hosts, std::size_t lo, std::size_t hi) {
  constexpr std::size_t n = Mesh::ndim;
  const auto shape = mesh.shape();
  const auto ranks = mesh.ranks();
  int total = 1;
  for (auto s : shape) total *= s;
  // Each rank against the first rank of its group (its coordinates on lo..hi set to 0).
  for (int i = 0; i < total; ++i) {
    std::array<int, n> c{};
    for (std::size_t k = n, rest = std::size_t(i); k-- > 0;) {
      c[k] = int(rest % std::size_t(shape[k]));
      rest /= std::size_t(shape[k]);
    }
    auto first = c;
    for (std::size_t k = lo; k <= hi; ++k) first[k] = 0;
    if (hosts[std::size_t(ranks.root_rank_at(c))] != hosts[std::size_t(ranks.root_rank_at(first))]) return true;
  }
  return false;
}
}  // namespace detail

/// Which dimensions of `mesh` cross hosts; `hosts` is host_names(mesh.root()).
template <class Mesh>
MeshHosts<Mesh::ndim> mesh_hosts(const Mesh& mesh, const std::vector<std::string>& hosts) {
  if (int(hosts.size()) != mesh.root().size())
    throw Error("mesh_hosts", detail::cat(hosts.size(), " host names for a mesh whose root communicator has ",
                                          mesh.root().size(), " ranks"));
  MeshHosts<Mesh::ndim> h;
  h.count = int(std::set<std::string>(hosts.begin(), hosts.end()).size());
  // Adjacent: the host changes between consecutive ranks only count - 1 times.
  int changes = 0;
  for (std::size_t r = 1; r < hosts.size(); ++r) changes += hosts[r] != hosts[r - 1] ? 1 : 0;
  h.adjacent = changes == h.count - 1;
  for (std::size_t d = 0; d < Mesh::ndim; ++d) h.crosses[d] = detail::group_crosses_hosts(mesh, hosts, d, d);
  return h;
}

/// Whether the group named `label` — dimension names joined by '*' (a mesh's group labels, as
/// CommLog records them: "fsdp", "dp*fsdp*cp*tp") — crosses hosts; nullopt if `label` is not a
/// run of adjacent dimensions of `mesh` (another mesh's group).
template <class Mesh>
std::optional<bool> crosses_hosts(const Mesh& mesh, const std::vector<std::string>& hosts, std::string_view label) {
  std::vector<std::size_t> dims;
  for (std::size_t start = 0; start <= label.size();) {
    const auto end = std::min(label.find('*', start), label.size());
    const auto name = label.substr(start, end - start);
    std::size_t d = 0;
    while (d < Mesh::ndim && Mesh::names[d] != name) ++d;
    if (d == Mesh::ndim) return std::nullopt;
    dims.push_back(d);
    start = end + 1;
  }
  for (std::size_t k = 1; k < dims.size(); ++k)
    if (dims[k] != dims[k - 1] + 1) return std::nullopt;
  if (dims.empty() || int(hosts.size()) != mesh.root().size()) return std::nullopt;
  return detail::group_crosses_hosts(mesh, hosts, dims.front(), dims.back());
}

/// One line for a program to print (docs/multinode.md): the host count, whether each host's ranks
/// are adjacent, and which of the mesh's dimensions of size > 1 cross hosts and which stay inside one.
template <class Mesh>
std::string describe_hosts(const Mesh& mesh, const MeshHosts<Mesh::ndim>& h) {
  std::string across, inside;
  for (std::size_t d = 0; d < Mesh::ndim; ++d)
    if (mesh.size(d) > 1) {
      auto& to = h.crosses[d] ? across : inside;
      to += (to.empty() ? "" : ", ") + std::string(Mesh::names[d]);
    }
  return detail::cat(
      "hosts: ", h.count, ", ",
      h.adjacent ? "each host's ranks adjacent"
                 : "a host's ranks NOT adjacent (launch with mpirun --map-by slot, srun --distribution=block)",
      "; across hosts: ", across.empty() ? "none" : across, "; inside a host: ", inside.empty() ? "none" : inside);
}

}  // namespace dtensor

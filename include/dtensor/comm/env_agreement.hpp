// dtensor/comm/env_agreement.hpp — the ranks of a job agree on the DTENSOR_* settings at start.
//
//   dtensor::require_same_environment(*world, "mpi::run");   // collective over world
//
// Each process reads DTENSOR_TIMEOUT_MS, DTENSOR_CHECK_COLLECTIVES, DTENSOR_VERIFY_EVERY and
// DTENSOR_AGREE_BEFORE_DATA from its own environment
// (comm/config.hpp). A variable exported on the launching host reaches the ranks on other hosts
// only if the launcher forwards it (`mpirun -x DTENSOR_TIMEOUT_MS`, Slurm's --export): without
// it those ranks keep the defaults, and a job meant to fail after 30 s waits 5 minutes on some
// hosts, or half the ranks compare fingerprints before each collective while the others do not
// (which hangs or fails with an unrelated message). So the ranks compare the settings they run
// with — the process-wide defaults of new communicators, whether from the environment or set by
// the program — once at start-up, and every rank throws the same dtensor::Error naming each
// setting that differs and which ranks hold which value, with how to forward it.
//
// dtensor::mpi::run calls it; a program that makes its MPI world by hand calls it itself. The
// threads backend needs none (its ranks share one process's environment).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/comm/config.hpp"
#include "dtensor/comm/settings_agreement.hpp"
#include "dtensor/core/error.hpp"

namespace dtensor {

/// The settings every rank of a job must share, by the environment variable that sets them,
/// with the values this process runs with.
inline std::vector<Setting> environment_settings() {
  const CommDefaults& d = comm_defaults();
  return {{"DTENSOR_TIMEOUT_MS", detail::cat(d.timeout.count())},
          {"DTENSOR_CHECK_COLLECTIVES", d.check_collectives ? "1" : "0"},
          // ranks comparing at different periods would pair the always-on check's all-gathers
          // with other collectives (comm/communicator.hpp, set_verify_every)
          {"DTENSOR_VERIFY_EVERY", detail::cat(d.verify_every)},
          // likewise agreement before data's all-reduce under MPI (Communicator::agrees_before_data)
          {"DTENSOR_AGREE_BEFORE_DATA", d.agree_before_data ? "1" : "0"}};
}

/// Throws on every rank of `comm` unless all of them run with the same environment_settings()
/// (collective over `comm`; one all-gather of about 2 KiB per rank). `op` names the step.
inline void require_same_environment(Communicator& comm, std::string_view op) {
  try {
    require_same_settings(comm, op, environment_settings());
  } catch (const Error& e) {
    throw Error(std::string(op),
                detail::cat(e.message(), "\n  each process reads DTENSOR_* from its own environment: forward them to every ",
                            "host (mpirun -x DTENSOR_TIMEOUT_MS -x DTENSOR_CHECK_COLLECTIVES; srun --export=ALL; ",
                            "docs/multinode.md)"),
                comm.rank());
  }
}

}  // namespace dtensor

// examples/flags.hpp — the flags' parsing and checks (train/flags.hpp), under the examples' names.
#pragma once

#include "dtensor/train/flags.hpp"

namespace examples {
using namespace dtensor::train::cli;
}  // namespace examples

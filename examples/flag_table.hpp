// examples/flag_table.hpp — a program's flags as one table (train/flag_table.hpp), under the
// examples' names.
#pragma once

#include "dtensor/train/flag_table.hpp"
#include "flags.hpp"

// dtensor/distributed/settings_agreement.hpp — require_same_settings, for the programs that
// include it from here: it lives in comm/settings_agreement.hpp, where the backends can use it
// at start-up (comm/env_agreement.hpp).
#pragma once

#include "dtensor/comm/settings_agreement.hpp"

// The Catch2 main of the single-process test programs.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

// Catch2 v2's main for every CPU test binary, compiled once.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

// The driver's KL coefficient against hand-computed values of verl's AdaptiveKLController
// (Ziegler et al.): coef *= 1 + clip(kl / target - 1, -0.2, 0.2) · samples / horizon.
#include "controller/driver/kl_controller.h"

#include <catch2/catch.hpp>

namespace rlhfd::controller {

TEST_CASE("the adaptive KL coefficient follows verl's AdaptiveKLController", "[kl]") {
  v1::KlSpec spec;
  spec.set_coef(0.1);
  spec.set_target(6.0);
  spec.set_horizon(10000);
  spec.set_controller(v1::KL_CONTROLLER_ADAPTIVE);
  KlController adaptive(spec, spec.coef());
  adaptive.Update(/*kl=*/12.0, /*samples=*/256);  // error clipped to +0.2
  const double first = 0.1 * (1 + 0.2 * 256 / 10000.0);
  CHECK(adaptive.value() == Approx(first).epsilon(1e-12));
  adaptive.Update(/*kl=*/5.4, /*samples=*/100);  // error -0.1
  CHECK(adaptive.value() == Approx(first * (1 - 0.1 * 100 / 10000.0)).epsilon(1e-12));
  adaptive.Update(/*kl=*/0.0, /*samples=*/10000);  // error clipped to -0.2
  CHECK(adaptive.value() == Approx(first * (1 - 0.1 * 100 / 10000.0) * 0.8).epsilon(1e-12));

  // A resumed job starts from the coefficient its checkpoint kept, not from algorithm.kl.coef.
  KlController resumed(spec, 0.037);
  CHECK(resumed.value() == 0.037);
  resumed.Update(6.0, 256);  // on target: unchanged
  CHECK(resumed.value() == 0.037);
}

TEST_CASE("a fixed KL coefficient, or one without a target, never moves", "[kl]") {
  v1::KlSpec spec;
  spec.set_coef(0.1);
  spec.set_target(6.0);
  spec.set_horizon(10000);
  spec.set_controller(v1::KL_CONTROLLER_FIXED);
  KlController fixed(spec, spec.coef());
  fixed.Update(100.0, 256);
  CHECK(fixed.value() == 0.1);
  spec.set_controller(v1::KL_CONTROLLER_ADAPTIVE);
  spec.set_target(0);
  KlController untargeted(spec, spec.coef());
  untargeted.Update(100.0, 256);
  CHECK(untargeted.value() == 0.1);
  // A horizon of 0 counts as 1 rather than dividing by zero.
  spec.set_target(1.0);
  spec.set_horizon(0);
  KlController short_horizon(spec, 1.0);
  short_horizon.Update(2.0, 1);
  CHECK(short_horizon.value() == Approx(1.2));
}

}  // namespace rlhfd::controller

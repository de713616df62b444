// Helpers the train unit tests share: float64 matrices in and out of tensors, a closeness check,
// the fixture models in float64, and the padded batch several references are written over.
#pragma once

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "worker/model/model_loader.h"

namespace rlhfd::train::testing {

using Matrix = std::vector<std::vector<double>>;

// A fixture model (tests/fixtures/models/NAME) in float64 on the CPU, fresh on every call.
inline model::Transformer LoadFloat64Fixture(const std::string& name) {
  // Appended in place: GCC 12 warns (-Warray-bounds, a false positive) on the temporaries of
  // std::string(...) + "..." + name once this is inlined into several files.
  std::string path = RLHFD_FIXTURES_DIR;
  path.append("/models/").append(name);
  auto loaded = model::LoadModel(path, {at::kDouble, at::kCPU});
  REQUIRE(loaded.ok());
  return *loaded;
}

inline at::Tensor ToTensor(const Matrix& m) {
  at::Tensor t =
      at::zeros({static_cast<int64_t>(m.size()), static_cast<int64_t>(m[0].size())}, at::kDouble);
  for (size_t i = 0; i < m.size(); ++i) {
    for (size_t j = 0; j < m[i].size(); ++j) t[i][j] = m[i][j];
  }
  return t;
}

inline Matrix ToMatrix(const at::Tensor& t) {
  at::Tensor c = t.to(at::kDouble).contiguous();
  Matrix m(c.size(0), std::vector<double>(c.size(1)));
  for (int64_t i = 0; i < c.size(0); ++i) {
    for (int64_t j = 0; j < c.size(1); ++j) m[i][j] = c[i][j].item<double>();
  }
  return m;
}

inline void CheckClose(const Matrix& actual, const Matrix& expected, double tolerance) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    for (size_t j = 0; j < actual[i].size(); ++j) {
      INFO("[" << i << "][" << j << "] " << actual[i][j] << " vs " << expected[i][j]);
      CHECK(std::abs(actual[i][j] - expected[i][j]) <= tolerance);
    }
  }
}

// Four responses, right-padded to T = 5, lengths 5, 3, 1 (a length-1 response) and 4.
inline const Matrix kMask = {{1, 1, 1, 1, 1}, {1, 1, 1, 0, 0}, {1, 0, 0, 0, 0}, {1, 1, 1, 1, 0}};

}  // namespace rlhfd::train::testing

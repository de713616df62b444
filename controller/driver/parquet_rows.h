// The rows of a Parquet data file as JSON objects, as verl's data files hold them
// (data_source, prompt as a list of {role, content}, reward_model {style, ground_truth},
// extra_info), read with Apache Arrow's C++ library. Only the top-level columns asked for are
// read; structs become objects (keys in the schema's order), lists arrays, maps objects, and
// strings, numbers, booleans and nulls themselves. A column of another type (binary, dates,
// decimals...) among those asked for is refused naming it.
//
// Arrow lives in a plugin, librlhfd_parquet.so (parquet_reader.cc), loaded on the first call:
// from $RLHFD_PARQUET_PLUGIN, else beside the controller's binary or in ../lib of it (a bundle).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace rlhfd::controller {

// Bounds on what reading one file may take.
struct ParquetReadLimits {
  // A string cell longer than this (at any depth of a column) is refused naming its row and
  // column, without being copied.
  int64_t max_cell_bytes = 1 << 20;
  // What Arrow may hold at once for the file (bytes read, pages decompressed, arrays decoded): a
  // page over it (one cell of 100 MB at submission's 64 MiB) is refused naming the rows and
  // column it holds. `batch_rows` rows of the largest a row may be fit well inside it.
  int64_t max_decode_bytes = 256 << 20;
  // Rows decoded at a time: a page that does not decode is named by these rows.
  int64_t batch_rows = 64;
  // One row's values (each scalar, list, struct and map entry counts) and string bytes, in all
  // its columns: a row of millions of tiny values, which a few KB of Parquet can say, is refused
  // naming its row and column before it is built. A JSONL line's bounds.
  int64_t max_row_values = 1'000'000;
  int64_t max_row_bytes = 16 << 20;
};

// Given each row (numbered from 1) as an object of the columns the file has.
using ParquetRowVisitor = std::function<absl::Status(int64_t row, nlohmann::ordered_json object)>;

// Calls `visit` for each row of `file` in order, with the `columns` the file has (those it lacks
// are absent from the object). Before the first row, the footer and every row group's metadata
// are checked (each column chunk inside the file), so a truncated or cut file is refused at once
// whatever row a caller stops at. A status `visit` returns that is not OK stops the read and is
// returned. NOT_FOUND: the file cannot be opened; INVALID_ARGUMENT: it is not Parquet, its
// metadata points outside it or its row groups' row counts do not add up to its own, a page
// does not decode or is over `limits`, a cell or a row is over `limits`, or a column's type is
// not one a row can hold — each naming the file, the row (or rows
// and row group) and the column; FAILED_PRECONDITION: no Parquet reader plugin could be loaded
// (naming where it was looked for).
absl::Status ReadParquetRows(const std::string& file, const std::vector<std::string>& columns,
                             const ParquetReadLimits& limits, const ParquetRowVisitor& visit);

}  // namespace rlhfd::controller

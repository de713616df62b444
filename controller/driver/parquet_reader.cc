// librlhfd_parquet.so: the Parquet reader behind ReadParquetRows (parquet_rows.h), the one piece
// of the controller that links Apache Arrow (libarrow, libparquet: about 60 MB). It is a plugin
// the controller loads on the first .parquet file, so a controller without it (a bundle made
// with RLHFD_BUNDLE_PARQUET=0) starts and reads JSONL as before.
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>
#include <filesystem>
#include <set>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/text.h"
#include "controller/driver/parquet_rows.h"

namespace rlhfd::controller {

namespace {

using Json = nlohmann::ordered_json;  // keys in the schema's (or a map's) order

// An object built key by key in order, the last value of a key winning (a map may repeat one,
// a struct's fields may share a name), without a search per key.
class OrderedObject {
 public:
  void Set(std::string key, Json value) {
    auto& entries = object_.get_ref<Json::object_t&>();
    const auto [at, added] = index_.try_emplace(key, entries.size());
    if (added) {
      entries.emplace_back(std::move(key), std::move(value));
    } else {
      (entries.begin() + static_cast<std::ptrdiff_t>(at->second))->second = std::move(value);
    }
  }
  Json Take() && { return std::move(object_); }

 private:
  Json object_ = Json::object();
  absl::flat_hash_map<std::string, size_t> index_;  // seeded per process
};

absl::Status FromArrow(const arrow::Status& status, const std::string& context) {
  return absl::InvalidArgumentError(absl::StrCat(context, ": ", status.message()));
}

template <typename ArrowType>
Json NumberAt(const arrow::Array& array, int64_t i) {
  return static_cast<const arrow::NumericArray<ArrowType>&>(array).Value(i);
}

// A float cell as the decimal it was written from: its shortest text read as a double (2.7f
// is 2.7, as pyarrow's to_pylist gives it, where the float's own double is 2.700000047683716,
// which a ground truth compared as text would not match).
Json FloatAt(const arrow::Array& array, int64_t i) {
  const float value = static_cast<const arrow::FloatArray&>(array).Value(i);
  if (!std::isfinite(value)) return value;
  char text[32];
  const std::to_chars_result written = std::to_chars(text, text + sizeof(text), value);
  double decimal = value;
  std::from_chars(text, written.ptr, decimal);
  return decimal;
}

// What is left of one row's bounds (ParquetReadLimits::max_row_values, max_row_bytes).
struct RowBudget {
  int64_t values;
  int64_t bytes;
};

absl::Status OverRow(const std::string& column, const ParquetReadLimits& limits) {
  return absl::InvalidArgumentError(
      absl::StrCat("the row holds more than ", limits.max_row_values, " values or ",
                   limits.max_row_bytes, " bytes of text (reached in column '", column,
                   "'), over what one row may: shorten it, or leave the row out"));
}

// A string cell's text, refused when over the limit: it is not copied (a 100 MB cell would be,
// twice over, before the row check could refuse it).
absl::StatusOr<Json> Text(std::string_view view, const std::string& column,
                          const ParquetReadLimits& limits, RowBudget& budget) {
  const int64_t max_cell_bytes = limits.max_cell_bytes;
  if (static_cast<int64_t>(view.size()) > max_cell_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("column '", column, "' holds a string of ", view.size(), " bytes, over the ",
                     max_cell_bytes,
                     " bytes a cell may (what one row may carry to the workers): shorten it, "
                     "or leave the row out"));
  }
  // Rows travel as protobuf strings, which must be UTF-8 (as a JSONL line's are, its parser
  // checks them); pyarrow and pandas refuse such a cell too.
  if (const size_t bad = FirstInvalidUtf8(absl::string_view(view.data(), view.size()));
      bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("column '", column,
                                                   "' holds a string that is not UTF-8 (byte ", bad,
                                                   "): write the file's text as UTF-8"));
  }
  budget.bytes -= static_cast<int64_t>(view.size());
  if (budget.bytes < 0) return OverRow(column, limits);
  return Json(std::string(view));
}

// The JSON value of `array`'s element `i`; `column` (the top-level column) names it in errors.
absl::StatusOr<Json> Cell(const arrow::Array& array, int64_t i, const std::string& column,
                          const ParquetReadLimits& limits, RowBudget& budget) {
  if (--budget.values < 0) return OverRow(column, limits);
  if (array.IsNull(i)) return Json(nullptr);
  switch (array.type_id()) {
    case arrow::Type::NA:
      return Json(nullptr);
    case arrow::Type::BOOL:
      return Json(static_cast<const arrow::BooleanArray&>(array).Value(i));
    case arrow::Type::INT8:
      return NumberAt<arrow::Int8Type>(array, i);
    case arrow::Type::INT16:
      return NumberAt<arrow::Int16Type>(array, i);
    case arrow::Type::INT32:
      return NumberAt<arrow::Int32Type>(array, i);
    case arrow::Type::INT64:
      return NumberAt<arrow::Int64Type>(array, i);
    case arrow::Type::UINT8:
      return NumberAt<arrow::UInt8Type>(array, i);
    case arrow::Type::UINT16:
      return NumberAt<arrow::UInt16Type>(array, i);
    case arrow::Type::UINT32:
      return NumberAt<arrow::UInt32Type>(array, i);
    case arrow::Type::UINT64:
      return NumberAt<arrow::UInt64Type>(array, i);
    case arrow::Type::FLOAT:
      return FloatAt(array, i);
    case arrow::Type::DOUBLE:
      return NumberAt<arrow::DoubleType>(array, i);
    case arrow::Type::STRING:
      return Text(static_cast<const arrow::StringArray&>(array).GetView(i), column, limits, budget);
    case arrow::Type::LARGE_STRING:
      return Text(static_cast<const arrow::LargeStringArray&>(array).GetView(i), column, limits,
                  budget);
    case arrow::Type::STRING_VIEW:
      return Text(static_cast<const arrow::StringViewArray&>(array).GetView(i), column, limits,
                  budget);
    case arrow::Type::LIST:
    case arrow::Type::LARGE_LIST:
    case arrow::Type::FIXED_SIZE_LIST: {
      int64_t begin = 0, length = 0;
      std::shared_ptr<arrow::Array> values;
      if (array.type_id() == arrow::Type::LIST) {
        const auto& list = static_cast<const arrow::ListArray&>(array);
        begin = list.value_offset(i);
        length = list.value_length(i);
        values = list.values();
      } else if (array.type_id() == arrow::Type::LARGE_LIST) {
        const auto& large = static_cast<const arrow::LargeListArray&>(array);
        begin = large.value_offset(i);
        length = large.value_length(i);
        values = large.values();
      } else {
        const auto& fixed = static_cast<const arrow::FixedSizeListArray&>(array);
        begin = fixed.value_offset(i);
        length = fixed.value_length(i);
        values = fixed.values();
      }
      Json items = Json::array();
      for (int64_t k = 0; k < length; ++k) {
        absl::StatusOr<Json> item = Cell(*values, begin + k, column, limits, budget);
        if (!item.ok()) return item.status();
        items.push_back(*std::move(item));
      }
      return items;
    }
    case arrow::Type::STRUCT: {
      const auto& record = static_cast<const arrow::StructArray&>(array);
      OrderedObject object;
      for (int k = 0; k < record.num_fields(); ++k) {
        absl::StatusOr<Json> value = Cell(*record.field(k), i, column, limits, budget);
        if (!value.ok()) return value.status();
        object.Set(record.struct_type()->field(k)->name(), *std::move(value));
      }
      return std::move(object).Take();
    }
    case arrow::Type::MAP: {
      const auto& map = static_cast<const arrow::MapArray&>(array);
      OrderedObject object;
      for (int64_t k = map.value_offset(i); k < map.value_offset(i) + map.value_length(i); ++k) {
        absl::StatusOr<Json> key = Cell(*map.keys(), k, column, limits, budget);
        if (!key.ok()) return key.status();
        if (!key->is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("column '", column, "' holds a map whose keys are not strings"));
        }
        absl::StatusOr<Json> value = Cell(*map.items(), k, column, limits, budget);
        if (!value.ok()) return value.status();
        object.Set(key->get<std::string>(), *std::move(value));
      }
      return std::move(object).Take();
    }
    case arrow::Type::DICTIONARY: {
      const auto& encoded = static_cast<const arrow::DictionaryArray&>(array);
      return Cell(*encoded.dictionary(), encoded.GetValueIndex(i), column, limits, budget);
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "column '", column, "' holds ", array.type()->ToString(),
          ", which a row cannot: rlhfd reads strings, numbers, booleans, lists, structs and maps"));
  }
}

// The leaf column indices under `field`, which is what a row group is read by.
void Leaves(const parquet::arrow::SchemaField& field, std::vector<int>* out) {
  if (field.is_leaf()) out->push_back(field.column_index);
  for (const parquet::arrow::SchemaField& child : field.children) Leaves(child, out);
}

// A top-level column a row is made of, and the leaf columns a row group is read by.
struct RowColumn {
  std::string name;
  std::vector<int> leaves;
};

// "rows 4-6 (row group 1)", or "row 4 (row group 1)".
std::string Rows(int group, int64_t first, int64_t last) {
  return first == last ? absl::StrCat("row ", first, " (row group ", group, ")")
                       : absl::StrCat("rows ", first, "-", last, " (row group ", group, ")");
}

// Every row group's column chunks of `columns` lie inside the file: what a truncated or
// overwritten footer betrays without decoding a page.
absl::Status CheckChunksInFile(const std::string& file, const parquet::FileMetaData& metadata,
                               const std::vector<RowColumn>& columns, int64_t file_size) {
  int64_t first_row = 1;
  for (int group = 0; group < metadata.num_row_groups(); ++group) {
    const std::unique_ptr<parquet::RowGroupMetaData> row_group = metadata.RowGroup(group);
    const int64_t rows = row_group->num_rows();
    // The groups' counts add up to the file's (and so none overflows the row numbers).
    if (rows < 0 || rows > metadata.num_rows() - (first_row - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": row group ", group, " claims ", rows, " rows, which with the groups before it ",
          "is not within the file's ", metadata.num_rows(), "; the file is corrupt"));
    }
    for (const RowColumn& column : columns) {
      for (int leaf : column.leaves) {
        const std::unique_ptr<parquet::ColumnChunkMetaData> chunk = row_group->ColumnChunk(leaf);
        const int64_t start = chunk->has_dictionary_page() && chunk->dictionary_page_offset() > 0
                                  ? chunk->dictionary_page_offset()
                                  : chunk->data_page_offset();
        const int64_t size = chunk->total_compressed_size();
        if (start < 0 || size < 0 || start > file_size || size > file_size - start) {
          return absl::InvalidArgumentError(absl::StrCat(
              file, ": ", Rows(group, first_row, first_row + rows - 1), ", column '", column.name,
              "': its data is said to lie at bytes ", start, "+", size, ", outside the file's ",
              file_size, " bytes; the file is truncated or corrupt: write it again"));
        }
      }
    }
    first_row += rows;
  }
  if (first_row - 1 != metadata.num_rows()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": its row groups hold ", first_row - 1,
                                                   " rows, its footer says ", metadata.num_rows(),
                                                   "; the file is corrupt"));
  }
  return absl::OkStatus();
}

absl::Status ReadRows(const std::string& file, const std::vector<std::string>& columns,
                      const ParquetReadLimits& limits, const ParquetRowVisitor& visit) {
  std::error_code ignored;
  if (!std::filesystem::exists(file, ignored)) {
    return absl::NotFoundError(
        absl::StrCat("data file ", file,
                     " cannot be read (data.train_files / val_files): it must exist on "
                     "the controller's machine"));
  }
  // Everything Arrow allocates for this file (the bytes it reads, the pages it decompresses, the
  // arrays it decodes) comes from this pool: a page over the cap (a huge cell) fails to decode
  // rather than taking the controller's memory. Pages are read one at a time through a buffered
  // stream, not a column chunk (or, pre-buffered, a row group) at once.
  arrow::CappedMemoryPool pool(arrow::default_memory_pool(), limits.max_decode_bytes);
  arrow::Result<std::shared_ptr<arrow::io::ReadableFile>> input =
      arrow::io::ReadableFile::Open(file, &pool);
  if (!input.ok()) return FromArrow(input.status(), file);
  arrow::Result<int64_t> file_size = (*input)->GetSize();
  if (!file_size.ok()) return FromArrow(file_size.status(), file);
  parquet::ReaderProperties properties(&pool);
  properties.enable_buffered_stream();
  properties.set_buffer_size(64 << 10);
  parquet::ArrowReaderProperties arrow_properties(/*use_threads=*/false);
  arrow_properties.set_pre_buffer(false);
  arrow_properties.set_batch_size(limits.batch_rows);
  parquet::arrow::FileReaderBuilder builder;
  if (arrow::Status opened = builder.Open(*input, properties); !opened.ok()) {
    return FromArrow(opened, absl::StrCat(file,
                                          " is not a Parquet file (its footer does not "
                                          "decode; a truncated file reads so)"));
  }
  std::unique_ptr<parquet::arrow::FileReader> built;
  if (arrow::Status made = builder.memory_pool(&pool)->properties(arrow_properties)->Build(&built);
      !made.ok()) {
    return FromArrow(made, absl::StrCat(file, " is not a Parquet file"));
  }
  parquet::arrow::FileReader& reader = *built;
  const std::set<std::string> wanted(columns.begin(), columns.end());
  std::vector<RowColumn> row_columns;
  std::vector<std::string> names;
  for (const parquet::arrow::SchemaField& field : reader.manifest().schema_fields) {
    names.push_back(field.field->name());
    if (!wanted.count(field.field->name())) continue;
    RowColumn column{.name = field.field->name()};
    Leaves(field, &column.leaves);
    if (!column.leaves.empty()) row_columns.push_back(std::move(column));
  }
  if (row_columns.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, " has none of the columns ", absl::StrJoin(columns, ", "),
        " (its columns: ", absl::StrJoin(names, ", "), "; data.prompt_key names the prompt's)"));
  }
  const std::shared_ptr<parquet::FileMetaData> metadata = reader.parquet_reader()->metadata();
  if (absl::Status chunks = CheckChunksInFile(file, *metadata, row_columns, *file_size);
      !chunks.ok()) {
    return chunks;
  }
  int64_t row = 0;
  for (int group = 0; group < reader.num_row_groups(); ++group) {
    const int64_t group_end = row + metadata->RowGroup(group)->num_rows();
    // One reader per column, read in step, so that a page that does not decode names its column.
    std::vector<std::unique_ptr<arrow::RecordBatchReader>> readers;
    for (const RowColumn& column : row_columns) {
      auto opened = reader.GetRecordBatchReader({group}, column.leaves);
      if (!opened.ok()) {
        return FromArrow(opened.status(), absl::StrCat(file, ": ", Rows(group, row + 1, group_end),
                                                       ", column '", column.name, "'"));
      }
      readers.push_back(*std::move(opened));
    }
    while (row < group_end) {
      const int64_t last = std::min(group_end, row + limits.batch_rows);
      std::vector<std::shared_ptr<arrow::RecordBatch>> batches(row_columns.size());
      for (size_t c = 0; c < row_columns.size(); ++c) {
        const std::string where = absl::StrCat(file, ": ", Rows(group, row + 1, last), ", column '",
                                               row_columns[c].name, "'");
        arrow::Status next = readers[c]->ReadNext(&batches[c]);
        if (next.IsOutOfMemory()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": decoding needs more than the ", limits.max_decode_bytes,
              " bytes this reader holds at once for a file, so a cell there is far larger than "
              "the ",
              limits.max_cell_bytes,
              " bytes one may be (or the file's pages are): "
              "shorten it, or leave the row out"));
        }
        if (!next.ok()) return FromArrow(next, absl::StrCat(where, " does not decode"));
        if (batches[c] == nullptr || batches[c]->num_rows() != last - row ||
            batches[c]->num_columns() != 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, " does not decode: the column holds fewer rows than its row group says (",
              metadata->RowGroup(group)->num_rows(), "); the file is corrupt"));
        }
      }
      for (int64_t i = 0; row < last; ++i) {
        ++row;
        Json object = Json::object();
        RowBudget budget{.values = limits.max_row_values, .bytes = limits.max_row_bytes};
        for (size_t c = 0; c < row_columns.size(); ++c) {
          const std::string& name = row_columns[c].name;
          absl::StatusOr<Json> value = Cell(*batches[c]->column(0), i, name, limits, budget);
          if (!value.ok()) {
            return absl::InvalidArgumentError(
                absl::StrCat(file, ":", row, ": ", value.status().message()));
          }
          object[name] = *std::move(value);
        }
        if (absl::Status visited = visit(row, std::move(object)); !visited.ok()) return visited;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

}  // namespace rlhfd::controller

// The plugin's entry point (kEntryPoint in parquet_rows.cc); nothing it throws leaves it.
extern "C" absl::Status rlhfd_read_parquet_rows_v4(
    const std::string& file, const std::vector<std::string>& columns,
    const rlhfd::controller::ParquetReadLimits& limits,
    const rlhfd::controller::ParquetRowVisitor& visit) {
  try {
    return rlhfd::controller::ReadRows(file, columns, limits, visit);
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, " does not read as Parquet: ", error.what()));
  }
}

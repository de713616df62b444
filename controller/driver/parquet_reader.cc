// librlhfd_parquet.so: the Parquet reader behind ReadParquetRows (parquet_rows.h), the one piece
// of the controller that links Apache Arrow (libarrow, libparquet: about 60 MB). It is a plugin
// the controller loads on the first .parquet file, so a controller without it (a bundle made
// with RLHFD_BUNDLE_PARQUET=0) starts and reads JSONL as before.
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>

#include <exception>
#include <filesystem>
#include <set>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/driver/parquet_rows.h"

namespace rlhfd::controller {

namespace {

absl::Status FromArrow(const arrow::Status& status, const std::string& context) {
  return absl::InvalidArgumentError(absl::StrCat(context, ": ", status.message()));
}

template <typename ArrowType>
nlohmann::json NumberAt(const arrow::Array& array, int64_t i) {
  return static_cast<const arrow::NumericArray<ArrowType>&>(array).Value(i);
}

// The JSON value of `array`'s element `i`; `column` (the top-level column) names it in errors.
absl::StatusOr<nlohmann::json> Cell(const arrow::Array& array, int64_t i,
                                    const std::string& column) {
  if (array.IsNull(i)) return nlohmann::json(nullptr);
  switch (array.type_id()) {
    case arrow::Type::NA:
      return nlohmann::json(nullptr);
    case arrow::Type::BOOL:
      return nlohmann::json(static_cast<const arrow::BooleanArray&>(array).Value(i));
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
      return NumberAt<arrow::FloatType>(array, i);
    case arrow::Type::DOUBLE:
      return NumberAt<arrow::DoubleType>(array, i);
    case arrow::Type::STRING:
      return nlohmann::json(std::string(static_cast<const arrow::StringArray&>(array).GetView(i)));
    case arrow::Type::LARGE_STRING:
      return nlohmann::json(
          std::string(static_cast<const arrow::LargeStringArray&>(array).GetView(i)));
    case arrow::Type::STRING_VIEW:
      return nlohmann::json(
          std::string(static_cast<const arrow::StringViewArray&>(array).GetView(i)));
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
      nlohmann::json items = nlohmann::json::array();
      for (int64_t k = 0; k < length; ++k) {
        absl::StatusOr<nlohmann::json> item = Cell(*values, begin + k, column);
        if (!item.ok()) return item.status();
        items.push_back(*std::move(item));
      }
      return items;
    }
    case arrow::Type::STRUCT: {
      const auto& record = static_cast<const arrow::StructArray&>(array);
      nlohmann::json object = nlohmann::json::object();
      for (int k = 0; k < record.num_fields(); ++k) {
        absl::StatusOr<nlohmann::json> value = Cell(*record.field(k), i, column);
        if (!value.ok()) return value.status();
        object[record.struct_type()->field(k)->name()] = *std::move(value);
      }
      return object;
    }
    case arrow::Type::MAP: {
      const auto& map = static_cast<const arrow::MapArray&>(array);
      nlohmann::json object = nlohmann::json::object();
      for (int64_t k = map.value_offset(i); k < map.value_offset(i) + map.value_length(i); ++k) {
        absl::StatusOr<nlohmann::json> key = Cell(*map.keys(), k, column);
        if (!key.ok()) return key.status();
        if (!key->is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("column '", column, "' holds a map whose keys are not strings"));
        }
        absl::StatusOr<nlohmann::json> value = Cell(*map.items(), k, column);
        if (!value.ok()) return value.status();
        object[key->get<std::string>()] = *std::move(value);
      }
      return object;
    }
    case arrow::Type::DICTIONARY: {
      const auto& encoded = static_cast<const arrow::DictionaryArray&>(array);
      return Cell(*encoded.dictionary(), encoded.GetValueIndex(i), column);
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

absl::Status ReadRows(const std::string& file, const std::vector<std::string>& columns,
                      const ParquetRowVisitor& visit) {
  std::error_code ignored;
  if (!std::filesystem::exists(file, ignored)) {
    return absl::NotFoundError(
        absl::StrCat("data file ", file,
                     " cannot be read (data.train_files / val_files): it must exist on "
                     "the controller's machine"));
  }
  arrow::Result<std::shared_ptr<arrow::io::ReadableFile>> input =
      arrow::io::ReadableFile::Open(file);
  if (!input.ok()) return FromArrow(input.status(), file);
  arrow::Result<std::unique_ptr<parquet::arrow::FileReader>> opened =
      parquet::arrow::OpenFile(*input, arrow::default_memory_pool());
  if (!opened.ok()) {
    return FromArrow(opened.status(), absl::StrCat(file, " is not a Parquet file"));
  }
  parquet::arrow::FileReader& reader = **opened;
  const std::set<std::string> wanted(columns.begin(), columns.end());
  std::vector<int> leaves;
  std::vector<std::string> names;
  for (const parquet::arrow::SchemaField& field : reader.manifest().schema_fields) {
    names.push_back(field.field->name());
    if (wanted.count(field.field->name())) Leaves(field, &leaves);
  }
  if (leaves.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, " has none of the columns ", absl::StrJoin(columns, ", "),
        " (its columns: ", absl::StrJoin(names, ", "), "; data.prompt_key names the prompt's)"));
  }
  int64_t row = 0;
  for (int group = 0; group < reader.num_row_groups(); ++group) {
    arrow::Result<std::shared_ptr<arrow::Table>> table = reader.ReadRowGroup(group, leaves);
    const std::string where =
        absl::StrCat(file, ": row group ", group, " (from row ", row + 1, ")");
    if (!table.ok()) return FromArrow(table.status(), absl::StrCat(where, " does not decode"));
    arrow::TableBatchReader batches(**table);
    std::shared_ptr<arrow::RecordBatch> batch;
    while (true) {
      if (arrow::Status next = batches.ReadNext(&batch); !next.ok()) {
        return FromArrow(next, absl::StrCat(where, " does not decode"));
      }
      if (batch == nullptr) break;
      for (int64_t i = 0; i < batch->num_rows(); ++i) {
        ++row;
        nlohmann::json object = nlohmann::json::object();
        for (int c = 0; c < batch->num_columns(); ++c) {
          const std::string& name = batch->schema()->field(c)->name();
          absl::StatusOr<nlohmann::json> value = Cell(*batch->column(c), i, name);
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

// The plugin's entry point (kParquetReaderSymbol); nothing it throws leaves it.
extern "C" absl::Status rlhfd_read_parquet_rows_v1(
    const std::string& file, const std::vector<std::string>& columns,
    const rlhfd::controller::ParquetRowVisitor& visit) {
  try {
    return rlhfd::controller::ReadRows(file, columns, visit);
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, " does not read as Parquet: ", error.what()));
  }
}

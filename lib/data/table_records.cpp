#include "data/table_records.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/ipc/reader.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::data {

namespace {

using json = nlohmann::ordered_json;  // a struct's fields in the schema's order, as datasets gives them

constexpr int64_t kBatchRows = 1024;  // rows decoded at a time from a Parquet file

template <typename T>
const T& as(const arrow::Array& a) {
  return static_cast<const T&>(a);
}

json value_of(const arrow::Array& a, int64_t i);

template <typename List>
json list_of(const List& list, int64_t i) {
  json out = json::array();
  const int64_t begin = list.value_offset(i), n = list.value_length(i);
  const arrow::Array& values = *list.values();
  for (int64_t k = 0; k < n; ++k) out.push_back(value_of(values, begin + k));
  return out;
}

json struct_of(const arrow::StructArray& s, int64_t i) {
  json out = json::object();
  const auto& type = *s.struct_type();
  for (int f = 0; f < type.num_fields(); ++f) out[type.field(f)->name()] = value_of(*s.field(f), i);
  return out;
}

// A map with string keys as an object (as Python's dict), else as a list of [key, value] pairs.
json map_of(const arrow::MapArray& m, int64_t i) {
  const int64_t begin = m.value_offset(i), n = m.value_length(i);
  const bool keyed = m.keys()->type_id() == arrow::Type::STRING || m.keys()->type_id() == arrow::Type::LARGE_STRING;
  json out = keyed ? json::object() : json::array();
  for (int64_t k = begin; k < begin + n; ++k) {
    json key = value_of(*m.keys(), k), item = value_of(*m.items(), k);
    if (keyed)
      out[key.get<std::string>()] = std::move(item);
    else
      out.push_back(json::array({std::move(key), std::move(item)}));
  }
  return out;
}

json value_of(const arrow::Array& a, int64_t i) {
  using arrow::Type;
  if (a.IsNull(i)) return nullptr;
  switch (a.type_id()) {
    case Type::NA:
      return nullptr;
    case Type::STRING:
    case Type::BINARY:
      return std::string(as<arrow::BinaryArray>(a).GetView(i));
    case Type::LARGE_STRING:
    case Type::LARGE_BINARY:
      return std::string(as<arrow::LargeBinaryArray>(a).GetView(i));
    case Type::STRING_VIEW:
    case Type::BINARY_VIEW:
      return std::string(as<arrow::BinaryViewArray>(a).GetView(i));
    case Type::BOOL:
      return as<arrow::BooleanArray>(a).Value(i);
    case Type::INT8:
      return as<arrow::Int8Array>(a).Value(i);
    case Type::INT16:
      return as<arrow::Int16Array>(a).Value(i);
    case Type::INT32:
      return as<arrow::Int32Array>(a).Value(i);
    case Type::INT64:
      return as<arrow::Int64Array>(a).Value(i);
    case Type::UINT8:
      return as<arrow::UInt8Array>(a).Value(i);
    case Type::UINT16:
      return as<arrow::UInt16Array>(a).Value(i);
    case Type::UINT32:
      return as<arrow::UInt32Array>(a).Value(i);
    case Type::UINT64:
      return as<arrow::UInt64Array>(a).Value(i);
    case Type::FLOAT:
      return as<arrow::FloatArray>(a).Value(i);
    case Type::DOUBLE:
      return as<arrow::DoubleArray>(a).Value(i);
    case Type::LIST:
      return list_of(as<arrow::ListArray>(a), i);
    case Type::LARGE_LIST:
      return list_of(as<arrow::LargeListArray>(a), i);
    case Type::FIXED_SIZE_LIST:
      return list_of(as<arrow::FixedSizeListArray>(a), i);
    case Type::STRUCT:
      return struct_of(as<arrow::StructArray>(a), i);
    case Type::MAP:
      return map_of(as<arrow::MapArray>(a), i);
    case Type::DICTIONARY: {
      const auto& d = as<arrow::DictionaryArray>(a);
      return value_of(*d.dictionary(), d.GetValueIndex(i));
    }
    default: {  // dates, times, decimals, ...: as Arrow writes them
      auto scalar = a.GetScalar(i);
      return scalar.ok() ? json((*scalar)->ToString()) : json(nullptr);
    }
  }
}

// The Parquet leaf columns under the top-level fields named `wanted` (all when empty).
void collect_leaves(const parquet::arrow::SchemaField& f, std::vector<int>& out) {
  if (f.is_leaf()) out.push_back(f.column_index);
  for (const auto& child : f.children) collect_leaves(child, out);
}

}  // namespace

struct TableRecords::Impl {
  std::string path, who;
  std::vector<std::string> columns;
  std::shared_ptr<arrow::io::ReadableFile> file;
  std::unique_ptr<parquet::arrow::FileReader> parquet;            // a Parquet file
  std::shared_ptr<arrow::RecordBatchReader> batches;              // a Parquet file's batches, or an Arrow stream
  std::shared_ptr<arrow::ipc::RecordBatchFileReader> arrow_file;  // an Arrow file (Feather v2)
  std::vector<int> selected;                                      // Arrow: the top-level columns to decode
  int next_group = 0;                                             // an Arrow file's next batch
  std::shared_ptr<arrow::RecordBatch> batch;
  std::vector<std::string> names;  // of the batch's kept columns
  std::vector<std::shared_ptr<arrow::Array>> arrays;
  int64_t row = 0, rows_before = 0, bytes = 0, total_rows = -1, file_bytes = 0;

  [[noreturn]] void fail(const std::string& what, const arrow::Status& s) const {
    const std::string check =
        ends_with(path, ".parquet")
            ? str("import pyarrow.parquet as pq; pq.read_table('", path, "')")
            : str("import pyarrow as pa; pa.ipc.open_stream(open('", path, "', 'rb')).read_all()");
    std::vector<std::string> lines;  // Arrow's reason may span lines, each ending in a period
    for (std::string line : split(s.message(), '\n')) {
      while (!line.empty() && (line.back() == '.' || line.back() == ' ')) line.pop_back();
      if (!line.empty()) lines.push_back(line);
    }
    const std::string reason = join(lines, ": ");
    throw InputError(str(who, " ", path, " ", what, ": ", reason,
                         ". The file is damaged or not what its name says; check it with python -c \"", check, "\""));
  }
  template <typename T>
  T take(arrow::Result<T> r, const std::string& what) const {
    if (!r.ok()) fail(what, r.status());
    return std::move(r).ValueUnsafe();
  }
  bool load_next();
  void keep(const std::shared_ptr<arrow::RecordBatch>& b);
};

bool TableRecords::is_table(const std::string& path) {
  return ends_with(path, ".parquet") || ends_with(path, ".arrow");
}

TableRecords::TableRecords(const std::string& path, const std::string& who, const std::vector<std::string>& wanted)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  m.who = who;
  const std::string problem = file_problem(path);
  FSDP_CHECK(problem.empty(), who, " cannot read ", quoted(path), ": ", problem);
  m.file = m.take(arrow::io::ReadableFile::Open(path), "cannot be opened");
  const bool parquet = ends_with(path, ".parquet");
  std::shared_ptr<arrow::Schema> schema;
  if (parquet) {
    parquet::ReaderProperties properties;
    properties.set_page_checksum_verification(true);  // where the writer stored them (write_page_checksum)
    properties.enable_buffered_stream();              // a page at a time, not a row group's column whole
    properties.set_buffer_size(int64_t{1} << 20);
    parquet::ArrowReaderProperties arrow_properties;
    arrow_properties.set_batch_size(kBatchRows);
    arrow_properties.set_pre_buffer(false);
    parquet::arrow::FileReaderBuilder builder;
    if (const arrow::Status s = builder.Open(m.file, properties); !s.ok()) m.fail("is not a readable Parquet file", s);
    builder.properties(arrow_properties);
    m.parquet = m.take(builder.Build(), "is not a readable Parquet file");
    if (const arrow::Status s = m.parquet->GetSchema(&schema); !s.ok()) m.fail("has a schema Arrow cannot read", s);
    m.total_rows = m.parquet->parquet_reader()->metadata()->num_rows();
  } else {
    const int64_t size = m.take(m.file->GetSize(), "cannot be read");
    const auto head = m.take(m.file->ReadAt(0, std::min<int64_t>(size, 6)), "cannot be read");
    if (head->ToString() == "ARROW1") {  // the IPC file format (Feather v2), else the stream format
      m.arrow_file = m.take(arrow::ipc::RecordBatchFileReader::Open(m.file), "is not a readable Arrow file");
      schema = m.arrow_file->schema();
      m.total_rows = m.take(m.arrow_file->CountRows(), "is not a readable Arrow file");
    } else {
      if (const arrow::Status s = m.file->Seek(0); !s.ok()) m.fail("cannot be read", s);
      m.batches = m.take(arrow::ipc::RecordBatchStreamReader::Open(m.file), "is not a readable Arrow stream");
      schema = m.batches->schema();
    }
  }
  for (const auto& f : schema->fields()) m.columns.push_back(f->name());
  std::vector<int> leaves;
  for (int c = 0; c < schema->num_fields(); ++c) {
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), m.columns[c]) == wanted.end()) continue;
    m.selected.push_back(c);
    if (parquet) collect_leaves(m.parquet->manifest().schema_fields[c], leaves);
  }
  if (parquet) {  // every row group, in order, kBatchRows rows at a time: memory holds one batch
    std::vector<int> groups(m.parquet->num_row_groups());
    for (size_t g = 0; g < groups.size(); ++g) groups[g] = static_cast<int>(g);
    m.batches = m.take(m.parquet->GetRecordBatchReader(groups, leaves), "cannot be read");
    m.file_bytes = m.take(m.file->GetSize(), "cannot be read");
  }
}

TableRecords::~TableRecords() = default;

const std::vector<std::string>& TableRecords::columns() const {
  return impl_->columns;
}
int64_t TableRecords::bytes_read() const {
  return impl_->bytes;
}
int64_t TableRecords::row_count() const {
  return impl_->total_rows;
}

void TableRecords::Impl::keep(const std::shared_ptr<arrow::RecordBatch>& b) {
  batch = b;
  names.clear();
  arrays.clear();
  for (int c = 0; c < b->num_columns(); ++c) {
    const std::string& name = b->schema()->field(c)->name();
    if (parquet || std::find(selected.begin(), selected.end(), c) != selected.end()) {
      names.push_back(name);
      arrays.push_back(b->column(c));
    }
  }
  rows_before += row;
  row = 0;
}

// The next batch that holds rows; false at the end.
bool TableRecords::Impl::load_next() {
  for (;;) {
    std::shared_ptr<arrow::RecordBatch> b;
    const std::string where = str("after row ", rows_before + row);
    if (parquet) {
      try {
        if (const arrow::Status s = batches->ReadNext(&b); !s.ok()) fail(str("cannot be decoded ", where), s);
      } catch (const parquet::ParquetException& e) {
        fail(str("cannot be decoded ", where), arrow::Status::IOError(e.what()));
      }
      if (b && total_rows > 0)
        bytes = std::min(file_bytes, file_bytes * (rows_before + row + b->num_rows()) / total_rows);
    } else if (arrow_file) {
      if (next_group >= arrow_file->num_record_batches()) return false;
      const int g = next_group++;
      b = take(arrow_file->ReadRecordBatch(g), str("record batch ", g, " cannot be decoded"));
      bytes = take(file->Tell(), "cannot be read");
    } else {
      if (const arrow::Status s = batches->ReadNext(&b); !s.ok()) fail(str("cannot be decoded ", where), s);
      ++next_group;
      if (!b) return false;
      bytes = take(file->Tell(), "cannot be read");
    }
    if (!b) return false;
    if (const arrow::Status s = b->ValidateFull(); !s.ok()) fail(str("holds data that is not valid ", where), s);
    keep(b);
    if (b->num_rows() > 0) return true;
  }
}

bool TableRecords::next(std::string& record) {
  Impl& m = *impl_;
  try {
    if (!m.batch || m.row >= m.batch->num_rows())
      if (!m.load_next()) return false;
    json row = json::object();
    for (size_t c = 0; c < m.arrays.size(); ++c) row[m.names[c]] = value_of(*m.arrays[c], m.row);
    try {
      record = row.dump();
    } catch (const json::type_error&) {
      throw InputError(str(m.who, " ", m.path, ": row ", m.rows_before + m.row + 1,
                           " holds bytes that are not UTF-8 text where text is read"));
    }
  } catch (const std::bad_alloc&) {  // a row (or its batch) larger than the memory this process may take
    throw InputError(str(m.who, " ", m.path, ": row ", m.rows_before + m.row + 1,
                         " (or the batch of rows holding "
                         "it) needs more memory than this process can have; split the file into smaller rows, or "
                         "raise the process's memory limit (ulimit -v)"));
  }
  ++m.row;
  return true;
}

}  // namespace fsdp::data

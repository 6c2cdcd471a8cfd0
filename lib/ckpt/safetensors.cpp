#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/json.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

struct DtypeRow {
  Dtype dtype;
  const char* name;
  int bits;
};

// Enum order is the reference writer's alignment order (larger first when sorted descending).
constexpr std::array<DtypeRow, 22> kDtypes = {{
    {Dtype::kBool, "BOOL", 8},
    {Dtype::kU8, "U8", 8},
    {Dtype::kI8, "I8", 8},
    {Dtype::kI16, "I16", 16},
    {Dtype::kU16, "U16", 16},
    {Dtype::kI32, "I32", 32},
    {Dtype::kU32, "U32", 32},
    {Dtype::kI64, "I64", 64},
    {Dtype::kU64, "U64", 64},
    {Dtype::kF16, "F16", 16},
    {Dtype::kBF16, "BF16", 16},
    {Dtype::kF32, "F32", 32},
    {Dtype::kF64, "F64", 64},
    {Dtype::kC64, "C64", 64},
    {Dtype::kF8_E5M2, "F8_E5M2", 8},
    {Dtype::kF8_E4M3, "F8_E4M3", 8},
    {Dtype::kF8_E8M0, "F8_E8M0", 8},
    {Dtype::kF8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {Dtype::kF8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {Dtype::kF4, "F4", 4},
    {Dtype::kF6_E2M3, "F6_E2M3", 6},
    {Dtype::kF6_E3M2, "F6_E3M2", 6},
}};

constexpr uint64_t kMaxHeaderBytes = 100000000;

// numel x bits / 8 with overflow checks; nullopt when it overflows or is not whole bytes.
std::optional<uint64_t> byte_count(Dtype d, const std::vector<int64_t>& shape) {
  unsigned __int128 bits = static_cast<unsigned>(dtype_bits(d));
  for (int64_t s : shape) {
    if (s < 0) return std::nullopt;
    bits *= static_cast<unsigned __int128>(s);
    if (bits > (static_cast<unsigned __int128>(1) << 100)) return std::nullopt;
  }
  if (bits % 8 != 0 || bits / 8 > UINT64_MAX) return std::nullopt;
  return static_cast<uint64_t>(bits / 8);
}

// An error names the file and the rule it breaks.
[[noreturn]] void refuse(const std::string& where, const std::string& reason) {
  throw InputError(str(where, ": not a valid safetensors file: ", reason));
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

const char* dtype_name(Dtype d) {
  return kDtypes[static_cast<size_t>(d)].name;
}

std::optional<Dtype> dtype_from_name(const std::string& name) {
  for (const DtypeRow& r : kDtypes)
    if (name == r.name) return r.dtype;
  return std::nullopt;
}

int dtype_bits(Dtype d) {
  return kDtypes[static_cast<size_t>(d)].bits;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

const TensorInfo* Header::find(const std::string& name) const {
  for (const TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Header parse_safetensors(const uint8_t* bytes, size_t size, const std::string& where) {
  if (size < 8) refuse(where, str("the file has ", size, " bytes, fewer than the 8-byte header length"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > kMaxHeaderBytes) refuse(where, str("the header claims ", n, " bytes, more than the limit of 100000000"));
  if (n > size - 8) refuse(where, str("the header claims ", n, " bytes but only ", size - 8, " follow"));
  const std::string text(reinterpret_cast<const char*>(bytes) + 8, n);
  nlohmann::json j;
  try {
    j = parse_json(text, "the header");  // rejects invalid UTF-8 and deep nesting too
  } catch (const InputError& e) {
    refuse(where, e.what());
  }
  if (!j.is_object()) refuse(where, "the header is not a JSON object");
  Header h;
  h.data_start = 8 + n;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) refuse(where, "__metadata__ is not an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) refuse(where, str("__metadata__[\"", m.key(), "\"] is not a string"));
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const nlohmann::json& e = *it;
    const std::string& name = it.key();
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      refuse(where, str("tensor \"", name, "\" needs dtype, shape and data_offsets"));
    TensorInfo t;
    t.name = name;
    if (!e["dtype"].is_string()) refuse(where, str("tensor \"", name, "\": dtype is not a string"));
    const auto d = dtype_from_name(e["dtype"].get<std::string>());
    if (!d) refuse(where, str("tensor \"", name, "\": unknown dtype \"", e["dtype"].get<std::string>(), "\""));
    t.dtype = *d;
    if (!e["shape"].is_array()) refuse(where, str("tensor \"", name, "\": shape is not an array"));
    for (const auto& s : e["shape"]) {
      if (!s.is_number_unsigned()) refuse(where, str("tensor \"", name, "\": shape holds ", s.dump()));
      t.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(s.get<uint64_t>(), INT64_MAX)));
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      refuse(where, str("tensor \"", name, "\": data_offsets is not [begin, end]"));
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    if (t.end < t.begin) refuse(where, str("tensor \"", name, "\": data_offsets end ", t.end, " < begin ", t.begin));
    const auto need = byte_count(t.dtype, t.shape);
    if (!need)
      refuse(where, str("tensor \"", name, "\": its shape overflows or is not whole bytes of ", dtype_name(t.dtype)));
    if (*need != t.nbytes())
      refuse(where, str("tensor \"", name, "\": ", dtype_name(t.dtype), " ", shape_text(t.shape), " needs ", *need,
                        " bytes but data_offsets hold ", t.nbytes()));
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin != expected)
      refuse(where, str("tensor \"", t.name, "\" starts at byte ", t.begin, " of the data, expected ", expected,
                        t.begin < expected ? " (it overlaps the tensor before)" : " (a hole before it)"));
    expected = t.end;
  }
  if (h.data_start + expected != size)
    refuse(where, str("the tensors end at byte ", h.data_start + expected, " but the file has ", size,
                      " bytes (the data must be indexed entirely)"));
  return h;
}

void SafetensorsFile::release(const uint8_t* p, size_t n) const {
  if (base_ == nullptr || n == 0) return;
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = std::max(reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(base_)) & ~(page - 1);
  const uintptr_t hi = std::min(reinterpret_cast<uintptr_t>(p) + n, reinterpret_cast<uintptr_t>(base_) + size_);
  const uintptr_t end = (hi + page - 1) & ~(page - 1);
  if (end > lo) ::madvise(reinterpret_cast<void*>(lo), end - lo, MADV_DONTNEED);  // advice: failure changes nothing
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  FSDP_CHECK(fd >= 0, "[ckpt] cannot open ", quoted(path), ": ", std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    FSDP_CHECK(p != MAP_FAILED, "[ckpt] cannot map ", quoted(path), ": ", std::strerror(errno));
    base_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  try {
    header_ = parse_safetensors(base_, size_, path);
  } catch (...) {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

namespace {

// The header bytes (length prefix included) and the tensors in layout order.
std::string build_header(const std::vector<TensorBytes>& tensors, std::map<std::string, std::string> metadata,
                         std::vector<const TensorBytes*>* order) {
  for (const TensorBytes& t : tensors) {
    const auto need = byte_count(t.dtype, t.shape);
    FSDP_CHECK(need && *need == t.nbytes, "[ckpt] tensor ", quoted(t.name), ": ", dtype_name(t.dtype), " ",
               shape_text(t.shape), " needs ", need ? *need : 0, " bytes, got ", t.nbytes);
    FSDP_CHECK(t.name != "__metadata__", "[ckpt] a tensor cannot be named __metadata__");
    order->push_back(&t);
  }
  // Larger alignment first, then by name (the reference writer's order): every tensor aligned.
  std::sort(order->begin(), order->end(), [](const TensorBytes* a, const TensorBytes* b) {
    const int ba = dtype_bits(a->dtype), bb = dtype_bits(b->dtype);
    return ba != bb ? ba > bb : a->name < b->name;
  });
  if (!metadata.count("format")) metadata["format"] = "pt";
  // __metadata__ first, then the tensors in layout order (ordered_json keeps insertion order).
  nlohmann::ordered_json j;
  j["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorBytes* t : *order) {
    FSDP_CHECK(!j.contains(t->name), "[ckpt] tensor name ", quoted(t->name), " appears twice");
    j[t->name] = {{"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {offset, offset + t->nbytes}}};
    offset += t->nbytes;
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header;
}

}  // namespace

std::string serialize_safetensors(const std::vector<TensorBytes>& tensors,
                                  std::map<std::string, std::string> metadata) {
  std::vector<const TensorBytes*> order;
  std::string out = build_header(tensors, std::move(metadata), &order);
  size_t total = 0;
  for (const TensorBytes* t : order) total += t->nbytes;
  out.reserve(out.size() + total);
  for (const TensorBytes* t : order) out.append(static_cast<const char*>(t->data), t->nbytes);
  return out;
}

SafetensorsLayout safetensors_layout(const std::vector<TensorBytes>& specs,
                                     std::map<std::string, std::string> metadata) {
  std::vector<const TensorBytes*> order;
  SafetensorsLayout l;
  l.header = build_header(specs, std::move(metadata), &order);
  l.size = l.header.size();
  for (const TensorBytes* t : order) {
    l.order.push_back(t->name);
    l.sizes.push_back(t->nbytes);
    l.offsets.push_back(l.size);
    l.size += t->nbytes;
  }
  return l;
}

SafetensorsWriter::SafetensorsWriter(std::string path, const std::vector<TensorBytes>& specs,
                                     std::map<std::string, std::string> metadata, FileSystem& fs)
    : fs_(fs), path_(std::move(path)), tmp_(path_ + ".tmp") {
  SafetensorsLayout l = safetensors_layout(specs, std::move(metadata));
  order_ = std::move(l.order);
  sizes_ = std::move(l.sizes);
  offsets_ = std::move(l.offsets);
  file_ = fs_.create(tmp_);
  file_->append(l.header.data(), l.header.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_) {
    file_.reset();
    try {
      fs_.remove_all(tmp_);
    } catch (const std::exception&) {  // a destructor during unwinding: the first error is the one to report
    }
  }
}

void SafetensorsWriter::append(const std::string& name, const void* data, size_t nbytes) {
  FSDP_ASSERT(next_ < order_.size() && order_[next_] == name, "SafetensorsWriter: expected ",
              next_ < order_.size() ? order_[next_] : "no more tensors", ", got ", name);
  FSDP_ASSERT(nbytes == sizes_[next_], "SafetensorsWriter: ", name, " has ", nbytes, " bytes, declared ",
              sizes_[next_]);
  file_->append(data, nbytes);
  ++next_;
}

void SafetensorsWriter::finish() {
  FSDP_ASSERT(next_ == order_.size(), "SafetensorsWriter: ", order_.size() - next_, " tensors not written");
  file_->sync();
  file_->close();
  bytes_ = file_->bytes();
  checksum_ = file_->checksum();
  file_.reset();
  fs_.rename(tmp_, path_);
}

}  // namespace fsdp::ckpt

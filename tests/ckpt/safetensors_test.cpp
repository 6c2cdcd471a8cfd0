// safetensors: every dtype round-trips, the writer's layout is the reference writer's, and a corpus
// of malformed files is refused with the reason (the rules of the reference reader).
#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>

#include "ckpt/direct_read.h"
#include "ckpt/file_system.h"
#include "ckpt/hf.h"
#include "ckpt/safetensors_torch.h"
#include "ckpt/sources.h"
#include "support/error_of.h"
#include "util/error.h"
#include "util/files.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp::ckpt;

namespace {

using fsdp::testing::error_of;

Header parse(const std::string& bytes) {
  return parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "f.safetensors");
}

// A file from a header text and a data buffer, as a writer that breaks the rules might make it.
std::string raw_file(const std::string& header, const std::string& data, std::optional<uint64_t> claimed = {}) {
  std::string out(8, '\0');
  const uint64_t n = claimed.value_or(header.size());
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

}  // namespace

TEST_CASE("every dtype round-trips through serialize and parse") {
  std::mt19937 rng(3);
  std::vector<std::string> buffers;
  std::vector<TensorBytes> tensors;
  for (int i = 0; i <= static_cast<int>(Dtype::kF6_E3M2); ++i) {
    const Dtype d = static_cast<Dtype>(i);
    const std::vector<int64_t> shape{2, 4};  // 8 elements: whole bytes even for 4- and 6-bit types
    std::string bytes(8 * dtype_bits(d) / 8, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    buffers.push_back(bytes);
    tensors.push_back(TensorBytes{std::string("t_") + dtype_name(d), d, shape, nullptr, bytes.size()});
  }
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = buffers[i].data();
  tensors.push_back(TensorBytes{"scalar", Dtype::kF32, {}, buffers[11].data(), 4});
  tensors.push_back(TensorBytes{"empty", Dtype::kBF16, {0, 3}, nullptr, 0});
  const std::string file = serialize_safetensors(tensors);
  const Header h = parse(file);
  CHECK(h.tensors.size() == tensors.size());
  CHECK(h.metadata.at("format") == "pt");
  for (const TensorBytes& t : tensors) {
    const TensorInfo* info = h.find(t.name);
    REQUIRE(info != nullptr);
    CHECK(info->dtype == t.dtype);
    CHECK(info->shape == t.shape);
    CHECK(info->nbytes() == t.nbytes);
    if (t.nbytes) CHECK(std::memcmp(file.data() + h.data_start + info->begin, t.data, t.nbytes) == 0);
  }
}

TEST_CASE("the writer's layout: padded header, metadata first, larger alignment first") {
  const double f64[2] = {1, 2};
  const float f32[1] = {3};
  const uint8_t u8[3] = {4, 5, 6};
  const uint16_t bf[1] = {7};
  const std::string file = serialize_safetensors({{"b_u8", Dtype::kU8, {3}, u8, 3},
                                                  {"a_bf16", Dtype::kBF16, {1}, bf, 2},
                                                  {"z_f64", Dtype::kF64, {2}, f64, 16},
                                                  {"y_f32", Dtype::kF32, {1}, f32, 4}});
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  CHECK(n % 8 == 0);
  const std::string header = file.substr(8, n);
  CHECK(header.rfind("{\"__metadata__\":{\"format\":\"pt\"}", 0) == 0);
  CHECK(header.find_last_not_of(' ') == header.find_last_of('}'));
  const Header h = parse(file);
  std::vector<std::string> order;
  for (const auto& t : h.tensors) order.push_back(t.name);
  CHECK(order == std::vector<std::string>{"z_f64", "y_f32", "a_bf16", "b_u8"});
  CHECK(error_of([&] {
          serialize_safetensors({{"x", Dtype::kF32, {2}, f32, 4}});
        }).find("needs 8 bytes, got 4") != std::string::npos);
  CHECK(error_of([&] {
          serialize_safetensors({{"x", Dtype::kU8, {1}, u8, 1}, {"x", Dtype::kU8, {1}, u8, 1}});
        }).find("appears twice") != std::string::npos);
}

TEST_CASE("malformed files are refused with the reason") {
  const std::string ok_header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, 'x');
  REQUIRE_NOTHROW(parse(raw_file(ok_header, data)));
  const std::vector<std::pair<std::string, std::string>> corpus = {
      {std::string("\x01\x02\x03", 3), "fewer than the 8-byte header length"},
      {raw_file(ok_header, data, 200000000), "more than the limit of 100000000"},
      {raw_file(ok_header, data, ok_header.size() + 100), "only"},
      {raw_file(ok_header.substr(0, 20), data.substr(0, 0)), "not valid JSON"},
      {raw_file(R"(["a"])", ""), "not a JSON object"},
      {raw_file(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", data), "unknown dtype \"F33\""},
      {raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", data), "needs dtype, shape and data_offsets"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data), "needs 12 bytes"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data), "end 0 < begin 8"},
      {raw_file(
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
           data.substr(0, 6)),
       "overlaps"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data), "a hole before it"},
      {raw_file(ok_header, data + "trailing"), "must be indexed entirely"},
      {raw_file(ok_header, data.substr(0, 4)), "the file has"},
      {raw_file(R"({"__metadata__":{"format":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data),
       "is not a string"},
      {raw_file(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", "x"), "not whole bytes"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data), "shape holds -2"},
      {raw_file("{\"\xff\":{}}", ""), "not valid JSON"},
  };
  for (const auto& [bytes, reason] : corpus) {
    const std::string e = error_of([&] { parse(bytes); });
    INFO("expected: ", reason, "; got: ", e);
    CHECK(e.find("f.safetensors: not a valid safetensors file") == 0);
    CHECK(e.find(reason) != std::string::npos);
  }
}

TEST_CASE("LibTorch tensors round-trip through a file, memory-mapped on the way back") {
  const std::string path = "/tmp/fsdp_st_" + std::to_string(::getpid()) + ".safetensors";
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f32", torch::randn({3, 5})},
      {"bf16", torch::randn({4}).to(torch::kBFloat16)},
      {"f16", torch::randn({2, 2}).to(torch::kHalf)},
      {"f64", torch::randn({1}, torch::kDouble)},
      {"i64", torch::arange(7)},
      {"i32", torch::arange(3, torch::kInt)},
      {"i16", torch::arange(3, torch::kShort)},
      {"i8", torch::arange(-2, 2, torch::kChar)},
      {"u8", torch::arange(4, torch::kByte)},
      {"bool", torch::tensor({true, false})},
      {"f8", torch::randn({5}).to(at::kFloat8_e4m3fn)},
      {"scalar", torch::tensor(2.5)},
      {"strided", torch::randn({4, 6}).t()},
  };
  save_safetensors(path, tensors, {{"step", "12"}});
  SafetensorsFile f(path);
  CHECK(f.header().metadata.at("format") == "pt");
  CHECK(f.header().metadata.at("step") == "12");
  auto loaded = load_safetensors(path);
  REQUIRE(loaded.size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    auto it = std::find_if(loaded.begin(), loaded.end(), [&](const auto& kv) { return kv.first == name; });
    REQUIRE(it != loaded.end());
    CHECK((it->second.scalar_type() == t.scalar_type()));
    CHECK(it->second.sizes().vec() == t.sizes().vec());
    CHECK(at::equal(it->second.reshape({-1}).view(at::kByte), t.contiguous().reshape({-1}).view(at::kByte)));
  }
  const at::Tensor w = torch::randn({2});
  CHECK(error_of([&] { save_safetensors(path, {{"a", w}, {"b", w}}); }).find("shares storage") != std::string::npos);
  std::remove(path.c_str());
}

// Regression (the first GPU run): an export handed a CUDA pointer to write() and failed with "Bad
// address". The writer takes host memory only and says which tensor was not there; the meta device
// stands in for the GPU.
TEST_CASE("the writer refuses a tensor that is not in host memory, naming it") {
  const std::string path = "/tmp/fsdp_st_dev_" + std::to_string(::getpid()) + ".safetensors";
  const at::Tensor on_meta = at::empty({2, 3}, at::TensorOptions().device(at::kMeta));
  {
    SafetensorsWriter out(path, {TensorBytes{"model.norm.weight", Dtype::kF32, {2, 3}, nullptr, 24}});
    const std::string e = error_of([&] { append_tensor(out, "model.norm.weight", on_meta); });
    CHECK(e.find("model.norm.weight is a meta tensor") != std::string::npos);
    CHECK(e.find("host memory only") != std::string::npos);
    append_tensor(out, "model.norm.weight", at::ones({2, 3}));  // nothing was written by the refusal
    out.finish();
  }
  CHECK(at::equal(load_safetensors(path).at(0).second, at::ones({2, 3})));
  std::remove(path.c_str());
}

// Regression (a new user's first day): a model downloaded by huggingface_hub lives in the cache as
// models--ORG--NAME/snapshots/COMMIT/, whose files are relative links into ../../blobs/; the old rule
// resolved the links before confining them and refused every such folder. Names the index writes
// are still confined.
TEST_CASE("a Hugging Face cache snapshot, whose files link into ../../blobs, is read; names leaving it are not") {
  // Paths by hand: std::filesystem resolves to LibTorch's bundled copy here, which crashes.
  FileSystem& fs = local_file_system();
  const std::string root = "/tmp/fsdp_hub_" + std::to_string(::getpid()), repo = root + "/models--org--tiny";
  const std::string snapshot = repo + "/snapshots/0123abcd";
  fs.make_dirs(repo + "/blobs");
  fs.make_dirs(snapshot);
  fs.make_dirs(repo + "/refs");
  fsdp::write_file_atomic(repo + "/refs/main", "0123abcd");
  const at::Tensor w = torch::arange(6, torch::kFloat).view({2, 3});
  save_safetensors(repo + "/blobs/9f1e", {{"model.norm.weight", w}});
  fsdp::write_file_atomic(repo + "/blobs/77aa", "{\"model_type\": \"llama\"}");
  fsdp::write_file_atomic(repo + "/blobs/5c5c",
                          "{\"metadata\": {}, \"weight_map\": {\"model.norm.weight\": \"model.safetensors\"}}");
  REQUIRE(::symlink("../../blobs/9f1e", (snapshot + "/model.safetensors").c_str()) == 0);
  REQUIRE(::symlink("../../blobs/77aa", (snapshot + "/config.json").c_str()) == 0);
  REQUIRE(::symlink("../../blobs/5c5c", (snapshot + "/model.safetensors.index.json").c_str()) == 0);
  {
    HfCheckpoint ck(snapshot);
    CHECK(at::equal(ck.read("model.norm.weight"), w));
  }
  std::remove((snapshot + "/model.safetensors.index.json").c_str());
  fsdp::write_file_atomic(snapshot + "/model.safetensors.index.json",
                          "{\"metadata\": {}, \"weight_map\": {\"model.norm.weight\": \"../../blobs/9f1e\"}}");
  const std::string e = error_of([&] { HfCheckpoint bad(snapshot); });
  CHECK(e.find("names \"../../blobs/9f1e\", which is outside") != std::string::npos);
  fs.remove_all(root);
}

TEST_CASE("CRC-32C: the standard check value, running sums, and what the writer records") {
  const char* check = "123456789";
  CHECK(crc32c(check, 9) == 0xE3069283u);  // the Castagnoli check value (RFC 3720 B.4)
  CHECK(crc32c(nullptr, 0) == 0u);
  std::mt19937 gen(7);
  std::vector<uint8_t> data(100003);
  for (auto& b : data) b = static_cast<uint8_t>(gen());
  const uint32_t whole = crc32c(data.data(), data.size());
  uint32_t running = 0;
  for (size_t at = 0, step = 1; at < data.size(); at += step, step = step * 3 + 1)
    running = crc32c(data.data() + at, std::min(step, data.size() - at), running);
  CHECK(running == whole);
  data[5000] ^= 1;
  CHECK(crc32c(data.data(), data.size()) != whole);
  // Large buffers run three chains joined by polynomial arithmetic: the same value as small pieces,
  // also continuing a running sum and with a tail that is not a multiple of 24 bytes.
  std::vector<uint8_t> big(1000003);
  for (auto& b : big) b = static_cast<uint8_t>(gen());
  uint32_t pieces = 0;
  for (size_t at = 0; at < big.size(); at += 4099) pieces = crc32c(big.data() + at, std::min<size_t>(4099, big.size() - at), pieces);
  CHECK(crc32c(big.data(), big.size()) == pieces);
  CHECK(crc32c(big.data() + 7, big.size() - 7, crc32c(big.data(), 7)) == pieces);
  big[999999] ^= 0x10;
  CHECK(crc32c(big.data(), big.size()) != pieces);

  const std::string path = "/tmp/fsdp_crc_" + std::to_string(::getpid()) + ".safetensors";
  const std::vector<float> v(1000, 1.5f);
  SafetensorsWriter w(path, {TensorBytes{"v", Dtype::kF32, {1000}, nullptr, 4000}});
  w.append("v", v.data(), 4000);
  w.finish();
  CHECK(w.checksum() == crc32c_of_file(path));
  CHECK(w.bytes() == fsdp::read_file(path).size());
  std::remove(path.c_str());
}

TEST_CASE("a file written past the writeback window (its first 64 MiB queued for the disk early) reads back whole") {
  const std::string path = "/tmp/fsdp_writeback_" + std::to_string(::getpid()) + ".bin";
  std::vector<uint8_t> piece(7 << 20);  // 7 MiB appends: the 64 MiB window falls inside one
  std::unique_ptr<WritableFile> f = local_file_system().create(path);
  uint32_t crc = 0;
  for (int i = 0; i < 21; ++i) {  // 147 MiB: two windows queued, the rest left for sync()
    for (size_t j = 0; j < piece.size(); j += 4096) piece[j] = static_cast<uint8_t>(i * 31 + j / 4096);
    f->append(piece.data(), piece.size());
    crc = crc32c(piece.data(), piece.size(), crc);
  }
  f->sync();
  f->close();
  CHECK(f->bytes() == uint64_t{21} * piece.size());
  CHECK(crc32c_of_file(path) == crc);
  CHECK(f->checksum() == crc);
  std::remove(path.c_str());
}

namespace {

// Whether the file system holding `dir` takes O_DIRECT writes (tmpfs does not).
bool takes_direct_writes(const std::string& dir) {
  const std::string probe = dir + "/fsdp_direct_probe_" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd >= 0) ::close(fd);
  std::remove(probe.c_str());
  return fd >= 0;
}

// How many of `path`'s pages are in the page cache.
size_t cached_pages(const std::string& path, size_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((size + page - 1) / page);
  ::mincore(map, size, resident.data());
  ::munmap(map, size);
  size_t n = 0;
  for (unsigned char r : resident) n += r & 1;
  return n;
}

}  // namespace

TEST_CASE("a file's image goes to the disk past the page cache where the file system allows, cut to its size") {
  const size_t n = (size_t{70} << 20) + 123;  // more than one 64 MiB chunk, and a partial last block
  const size_t room = (n + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment + kDirectAlignment;
  void* raw = std::aligned_alloc(kDirectAlignment, room);
  auto* buffer = static_cast<uint8_t*>(raw);
  for (size_t i = 0; i < room; ++i) buffer[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  const std::string dir = "/tmp";
  const std::string path = dir + "/fsdp_image_" + std::to_string(::getpid()) + ".bin";
  struct Case {
    const char* what;
    size_t skew;     // bytes past the aligned start: an unaligned buffer goes through the page cache
    size_t already;  // bytes appended first: a file whose end is inside a block goes through the page cache
    bool direct;     // false: checkpoint.direct_io off
    size_t piece;    // appended in pieces of this many bytes (whole blocks) as a save's copies land; 0: at once
  };
  const bool direct = takes_direct_writes(dir);
  for (const Case& c :
       {Case{"aligned", 0, 0, true, 0}, Case{"unaligned buffer", 8, 0, true, 0}, Case{"after a header", 0, 24, true, 0},
        Case{"direct_io off", 0, 0, false, 0}, Case{"in pieces", 0, 0, true, size_t{16} << 20}}) {
    CAPTURE(c.what);
    std::unique_ptr<WritableFile> f = local_file_system(c.direct).create(path);
    if (c.already > 0) f->append(buffer + room - c.already, c.already);
    const size_t piece = c.piece > 0 ? c.piece : n;
    for (size_t at = c.skew; at < n; at += piece) f->append_image(buffer + at, std::min(piece, n - at));
    f->sync();
    f->close();
    uint32_t crc = c.already > 0 ? crc32c(buffer + room - c.already, c.already) : 0;
    crc = crc32c(buffer + c.skew, n - c.skew, crc);
    CHECK(f->bytes() == n - c.skew + c.already);
    CHECK(static_cast<size_t>(fsdp::file_size(path)) == n - c.skew + c.already);
    CHECK(f->checksum() == crc);
    if (c.skew == 0 && c.already == 0 && direct)        // before anything reads it
      CHECK((cached_pages(path, n) == 0) == c.direct);  // the host memory a save needs: its staging buffer
    CHECK(crc32c_of_file(path) == crc);
    std::remove(path.c_str());
  }
  std::free(raw);
}

TEST_CASE("pieces written at any offset by several writers (a FULL save's rows) read back whole") {
  // Two writers of one file, as two ranks: pieces of 1.5 MiB and more at offsets inside blocks,
  // alternating, each piece's whole blocks past the page cache and its edges through it. From
  // memory whose addresses agree with the file offsets modulo the block (a FULL save's staging
  // buffer) the blocks go straight to the disk; from memory 8 bytes off, through an aligned copy.
  const std::vector<size_t> sizes = {(size_t{3} << 19) + 1000, 4093, (size_t{5} << 20) + 12, (size_t{2} << 20) + 4,
                                     (size_t{3} << 20) + 2048};
  std::vector<uint64_t> offsets{100};  // after a header of 100 bytes
  for (size_t s : sizes) offsets.push_back(offsets.back() + s);
  std::vector<uint8_t> bytes(offsets.back());
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>((i * 2654435761u) >> 11);
  const std::string path = "/tmp/fsdp_pieces_" + std::to_string(::getpid()) + ".bin";
  const size_t room = round_up_to_block(bytes.size() + 8);
  std::unique_ptr<uint8_t, decltype(&std::free)> memory(static_cast<uint8_t*>(std::aligned_alloc(kDirectAlignment, room)),
                                                        &std::free);
  for (size_t shift : {size_t{0}, size_t{8}}) {
    INFO("memory ", shift, " bytes off the file's offsets");
    uint8_t* source = memory.get() + shift;  // source[k] is the file's byte k
    std::memcpy(source, bytes.data(), bytes.size());
    {
      std::unique_ptr<WritableFile> f = local_file_system().create(path);
      f->append(bytes.data(), offsets[0]);
      f->resize(bytes.size());
      f->close();
    }
    std::unique_ptr<WritableFile> a = local_file_system().open_existing(path);
    std::unique_ptr<WritableFile> b = local_file_system().open_existing(path);
    for (size_t i = 0; i < sizes.size(); ++i) (i % 2 ? b : a)->write_at(offsets[i], source + offsets[i], sizes[i]);
    for (auto* f : {a.get(), b.get()}) {
      f->sync();
      f->close();
    }
    if (takes_direct_writes("/tmp"))  // the edges' blocks alone in the page cache: two per piece at most
      CHECK(cached_pages(path, bytes.size()) <= 2 * sizes.size());
    CHECK(fsdp::read_file(path) == std::string(bytes.begin(), bytes.end()));
    std::remove(path.c_str());
  }
}

TEST_CASE("byte ranges read past the page cache, several in flight, land whole with their checksums") {
  // Two files; ranges at any offset, overlapping, one ending at a file's last byte (whose request
  // runs past the end), read in requests of two blocks so each range spans several.
  const std::string dir = "/tmp";
  const std::vector<size_t> sizes = {(size_t{3} << 20) + 777, (size_t{1} << 20) + 5};
  std::vector<std::string> paths;
  std::vector<std::vector<uint8_t>> bytes;
  for (size_t k = 0; k < sizes.size(); ++k) {
    paths.push_back(dir + "/fsdp_ranges_" + std::to_string(::getpid()) + "_" + std::to_string(k) + ".bin");
    std::vector<uint8_t> b(sizes[k]);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>((i + k) * 2654435761u >> 11);
    std::unique_ptr<WritableFile> f = local_file_system(false).create(paths[k]);
    f->append(b.data(), b.size());
    f->sync();  // clean pages, which leave the page cache on advice
    f->close();
    bytes.push_back(std::move(b));
  }
  auto evict = [&]() {
    for (const std::string& p : paths) {
      const int fd = ::open(p.c_str(), O_RDONLY);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  };
  struct Want {
    size_t file;
    uint64_t offset, length;
  };
  const std::vector<Want> wants = {{0, 0, 8},       {0, 100, 20000},     {0, 10000, 1 << 20}, {0, (3 << 20) + 1, 776},
                                   {1, 4095, 4097}, {1, 500000, 548581}, {0, 2 << 20, 3}};
  auto ranges = [&]() {
    std::vector<RangeRead> reads;
    for (const Want& w : wants) reads.push_back({paths[w.file], w.offset, w.length, nullptr, 0, false});
    return reads;
  };
  std::vector<std::vector<uint8_t>> out(wants.size());
  auto check = [&](const std::vector<RangeRead>& reads, bool direct) {
    for (size_t i = 0; i < wants.size(); ++i) {
      CAPTURE(i);
      CHECK(reads[i].done == direct);
      if (!direct) continue;
      const uint8_t* expected = bytes[wants[i].file].data() + wants[i].offset;
      CHECK(std::memcmp(out[i].data(), expected, wants[i].length) == 0);
      CHECK(reads[i].crc == crc32c(expected, wants[i].length));
    }
  };
  DirectReadOptions o;
  o.request_bytes = 2 * kDirectAlignment;
  o.merge_gap = 4096;
  evict();
  std::vector<RangeRead> reads = ranges();
  for (size_t i = 0; i < reads.size(); ++i) {
    out[i].assign(wants[i].length, 0);
    reads[i].dest = out[i].data();
  }
  read_ranges_direct(reads, o);
  const bool direct = takes_direct_writes(dir);
  check(reads, direct);
  if (direct)  // the host memory a resume needs: its destinations and one request per thread
    for (size_t k = 0; k < paths.size(); ++k) CHECK(cached_pages(paths[k], sizes[k]) == 0);

  // A file already in the page cache is left to the caller: memory is faster than the disk.
  for (const std::string& p : paths) (void)fsdp::read_file(p);
  reads = ranges();
  for (size_t i = 0; i < reads.size(); ++i) reads[i].dest = out[i].data();
  read_ranges_direct(reads, o);
  check(reads, false);
  for (const std::string& p : paths) std::remove(p.c_str());
}

// Block FP8 folders (DeepSeek-V3's, the Qwen *-FP8 ones): each value times its block's scale, in fp32, for any
// rows a rank reads: blocks cut short at the ends, a fused tensor's parts starting inside a block, experts stored
// one by one (each with its scales) or stacked with a grid each. An FP8 tensor without its scales is refused.
TEST_CASE("block FP8 weights read dequantized: partial blocks, fused parts, experts apart and stacked") {
  const std::string dir = "/tmp/fsdp_fp8_" + std::to_string(::getpid());
  FileSystem& fs = local_file_system();
  fs.remove_all(dir);
  fs.make_dirs(dir);
  torch::manual_seed(3);
  const std::vector<int64_t> block = {4, 4};
  // The values and a scale per 4 x 4 block (the last ones cut short), and their product computed one by one.
  auto quantized = [&](int64_t rows, int64_t cols, at::ScalarType scale_type) {
    const at::Tensor q = (torch::randn({rows, cols}) * 40).to(at::kFloat8_e4m3fn);
    const at::Tensor s = (torch::rand({(rows + 3) / 4, (cols + 3) / 4}) + 0.01).to(scale_type);
    at::Tensor expected = torch::empty({rows, cols});
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        expected[i][j] = q[i][j].item<float>() * s[i / 4][j / 4].to(at::kFloat).item<float>();
    return std::tuple{q, s, expected};
  };
  const auto [a, a_s, a_x] = quantized(10, 7, at::kFloat);
  const auto [f, f_s, f_x] = quantized(12, 8, at::kFloat);
  const auto [x0, x0_s, x0_x] = quantized(6, 5, at::kBFloat16);
  const auto [x1, x1_s, x1_x] = quantized(6, 5, at::kBFloat16);
  std::vector<std::pair<std::string, at::Tensor>> tensors = {{"a.weight", a},
                                                             {"a.weight_scale_inv", a_s},
                                                             {"fused.weight", f},
                                                             {"fused.weight_scale_inv", f_s},
                                                             {"plain.weight", torch::randn({3, 3})},
                                                             {"x.weight", at::stack({x0, x1})},
                                                             {"x.weight_scale_inv", at::stack({x0_s, x1_s})}};
  std::vector<at::Tensor> parts;
  for (int64_t e = 0; e < 2; ++e)
    for (const char* w : {"gate", "up"}) {
      const auto [q, s, x] = quantized(4, 6, at::kFloat);
      tensors.push_back({fsdp::str("e.", e, ".", w, ".weight"), q});
      tensors.push_back({fsdp::str("e.", e, ".", w, ".weight_scale_inv"), s});
      parts.push_back(x);
    }
  save_safetensors(dir + "/model.safetensors", tensors);
  fsdp::write_file_atomic(dir + "/config.json", "{}");  // a folder needs one; the layout says what the config would

  fsdp::model::FolderLayout layout;
  layout.fp8_block = block;
  layout.fused.push_back({"fused.weight", {{"p.weight", 5}, {"q.weight", 7}}});  // q's rows start inside a block
  layout.stacked.push_back({"gate_up", {{"e.0.gate.weight", "e.0.up.weight"}, {"e.1.gate.weight", "e.1.up.weight"}}});
  auto src = open_hf_source(dir, layout);
  CHECK(src->names() ==
        std::vector<std::string>{"a.weight", "gate_up", "p.weight", "plain.weight", "q.weight", "x.weight"});
  CHECK(at::equal(src->rows("a.weight", 0, 10), a_x));
  CHECK(at::equal(src->rows("a.weight", 3, 9), a_x.narrow(0, 3, 6)));  // across blocks, as a rank's rows
  CHECK(at::equal(src->rows("p.weight", 0, 5), f_x.narrow(0, 0, 5)));
  CHECK(at::equal(src->rows("q.weight", 2, 7), f_x.narrow(0, 7, 5)));
  CHECK(at::equal(src->rows("x.weight", 1, 2), x1_x.unsqueeze(0)));
  at::Tensor stacked = torch::zeros({2, 8, 6});
  src->read_rows_into("gate_up", 0, 2, stacked);
  CHECK(at::equal(stacked, at::stack({at::cat({parts[0], parts[1]}), at::cat({parts[2], parts[3]})})));
  std::set<std::string> files;
  src->files("gate_up", 0, 2, files);
  CHECK(files == std::set<std::string>{"model.safetensors"});

  // Without quantization_config's block, or without its scales, an FP8 tensor is refused: read as it is, it is wrong.
  CHECK(error_of([&] { open_hf_source(dir, {}); })
            .find("model.safetensors: a.weight is F8_E4M3, and config.json has no quantization_config "
                  "{\"quant_method\": \"fp8\"} saying how to scale it") != std::string::npos);
  save_safetensors(dir + "/model.safetensors", {{"a.weight", a}, {"b.weight", a.clone()}, {"b.weight_scale_inv", a_s}});
  CHECK(error_of([&] {
          open_hf_source(dir, layout);
        }).find("a.weight is F8_E4M3 without a.weight_scale_inv, the scales its values are multiplied by") !=
        std::string::npos);
  // Scales of another grid (a block of 8 rows): named with both shapes and the block.
  save_safetensors(dir + "/model.safetensors", {{"a.weight", a}, {"a.weight_scale_inv", a_s.narrow(0, 0, 2)}});
  CHECK(error_of([&] { open_hf_source(dir, layout)->rows("a.weight", 0, 10); })
            .find("a.weight (F8_E4M3 [10, 7]) and a.weight_scale_inv (F32 [2, 2]) are not a block FP8 weight and its "
                  "scales") != std::string::npos);
  fs.remove_all(dir);
}

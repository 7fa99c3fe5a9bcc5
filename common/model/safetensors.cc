#include "common/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file_mode.h"
#include "common/base/status.h"
#include "nlohmann/json.hpp"

namespace dflash::model {
namespace {

using nlohmann::json;

// The reference implementation refuses headers above 100 MB; a real one is a few hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests 3 deep ({name: {shape: [..]}}); deeper input is refused before it can cost
// memory or stack anywhere.
constexpr size_t kMaxJsonDepth = 16;
constexpr size_t kMaxQuoted = 120;  // untrusted names are clipped to this many bytes in errors
constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// 'name', clipped: names come from untrusted headers and may be megabytes long.
std::string Quote(const std::string& s) {
  if (s.size() <= kMaxQuoted) return absl::StrCat("'", s, "'");
  return absl::StrCat("'", s.substr(0, kMaxQuoted), "...' (", s.size(), " bytes)");
}

std::string Clip(const std::string& s) {
  return s.size() <= 2 * kMaxQuoted ? s : absl::StrCat(s.substr(0, 2 * kMaxQuoted), "...");
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

const char* JsonTypeName(const json& j) { return j.type_name(); }

// Thrown from the parser callback to stop at the first structural problem; caught in ParseJson.
struct StopParse {
  std::string message;
};

// Parses JSON text, refusing duplicate keys (nlohmann silently keeps the last one, which would let
// a header name one tensor twice) and nesting deeper than kMaxJsonDepth. Never throws.
absl::StatusOr<json> ParseJson(const char* begin, const char* end, const std::string& what) {
  std::vector<std::set<std::string>> keys;  // one set per open object or array
  std::vector<std::string> path;            // the key last seen at each depth
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (keys.size() >= kMaxJsonDepth) {
          throw StopParse{absl::StrCat("nesting deeper than ", kMaxJsonDepth, " levels")};
        }
        keys.emplace_back();
        path.emplace_back();
        break;
      case json::parse_event_t::key: {
        std::string key = parsed.get<std::string>();
        if (!keys.back().insert(key).second) {
          std::string where;
          for (size_t i = 0; i + 1 < path.size(); ++i) absl::StrAppend(&where, Quote(path[i]), ".");
          throw StopParse{absl::StrCat("duplicate key ", where, Quote(key))};
        }
        path.back() = std::move(key);
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!keys.empty()) keys.pop_back();
        if (!path.empty()) path.pop_back();
        break;
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, callback, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const StopParse& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not acceptable JSON: ", e.message));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON: ", Clip(e.what())));
  }
}

// A non-negative JSON integer (no floats, no booleans), or an error saying what `field` holds.
absl::StatusOr<uint64_t> NonNegativeInt(const json& j, const std::string& field) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", j.get<int64_t>(), ", must be a non-negative integer"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must be a non-negative integer, got ", JsonTypeName(j)));
}

// Fills `info` from one header entry; errors are relative to the tensor (the caller adds names).
absl::Status ParseEntry(const json& entry, uint64_t data_size, TensorInfo* info) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry must be an object, got ", JsonTypeName(entry)));
  }
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown key ", Quote(key), " (expected dtype, shape, data_offsets)"));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key))
      return absl::InvalidArgumentError(absl::StrCat("missing '", key, "'"));
  }
  const json& dtype = entry["dtype"];
  if (!dtype.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype must be a string, got ", JsonTypeName(dtype)));
  }
  ASSIGN_OR_RETURN(info->dtype, ParseDType(dtype.get<std::string>()));

  const json& shape = entry["shape"];
  if (!shape.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape must be an array, got ", JsonTypeName(shape)));
  }
  uint64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    ASSIGN_OR_RETURN(uint64_t dim, NonNegativeInt(shape[i], absl::StrCat("shape[", i, "]")));
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, dim, &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", shape.dump(), " has more than 2^63 elements"));
    }
    info->shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t needed = 0;
  if (__builtin_mul_overflow(numel, DTypeSize(info->dtype), &needed)) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(info->shape), " of ",
                                                   DTypeName(info->dtype),
                                                   " needs more than 2^64 bytes"));
  }

  const json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data_offsets must be an array [begin, end], got ",
        offsets.is_array() ? absl::StrCat(offsets.size(), " elements") : JsonTypeName(offsets)));
  }
  ASSIGN_OR_RETURN(info->begin, NonNegativeInt(offsets[0], "data_offsets[0]"));
  ASSIGN_OR_RETURN(info->end, NonNegativeInt(offsets[1], "data_offsets[1]"));
  const std::string range = absl::StrCat("data_offsets [", info->begin, ", ", info->end, "]");
  if (info->begin > info->end) {
    return absl::InvalidArgumentError(absl::StrCat(range, ": begin is past end"));
  }
  if (info->end > data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(range, " run past the end of the data area (", data_size, " bytes)"));
  }
  if (info->end - info->begin != needed) {
    return absl::InvalidArgumentError(
        absl::StrCat(range, " hold ", info->end - info->begin, " bytes but shape ",
                     ShapeString(info->shape), " of ", DTypeName(info->dtype), " needs ", needed));
  }
  return absl::OkStatus();
}

absl::Status ParseMetadata(const json& j, std::map<std::string, std::string>* out) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("__metadata__ must be an object of strings, got ", JsonTypeName(j)));
  }
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "__metadata__ ", Quote(key), " must be a string, got ", JsonTypeName(value)));
    }
    (*out)[key] = value.get<std::string>();
  }
  return absl::OkStatus();
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t limit) {
  std::error_code ec;
  uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(path, ": ", ec.message()));
  if (size > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes, more than the ", limit, "-byte limit"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return text.str();
}

// A shard name from an index must stay inside the checkpoint directory.
absl::Status CheckShardName(const std::string& shard) {
  if (shard.empty()) return absl::InvalidArgumentError("shard name is empty");
  if (shard.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("shard name contains a NUL byte");
  }
  std::filesystem::path p(shard);
  if (p.is_absolute()) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", Quote(shard),
                                                   " is an absolute path; it must be inside the "
                                                   "checkpoint directory"));
  }
  for (const auto& part : p) {
    if (part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", Quote(shard), " escapes the checkpoint directory through '..'"));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("write failed: ", std::strerror(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// The header text of WriteSafetensors, padded with spaces so that the data area starts 8-aligned.
absl::StatusOr<std::string> BuildHeader(const std::vector<TensorToWrite>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const std::string who = absl::StrCat("tensor ", Quote(t.name));
    if (t.name.empty() || t.name == kMetadataKey) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": reserved or empty name"));
    }
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": written twice"));
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
        return absl::InvalidArgumentError(absl::StrCat(who, ": bad shape ", ShapeString(t.shape)));
      }
    }
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(numel, DTypeSize(t.dtype), &bytes) || bytes != t.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": ", t.nbytes, " bytes given but shape ",
                                                     ShapeString(t.shape), " of ",
                                                     DTypeName(t.dtype), " needs ", bytes));
    }
    if (bytes > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": no data"));
    }
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const std::exception& e) {  // names or metadata that are not valid UTF-8
    return absl::InvalidArgumentError(absl::StrCat("cannot encode header: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF64:
      return "F64";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI16:
      return "I16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(const std::string& name) {
  static const std::pair<const char*, DType> kAll[] = {
      {"F32", DType::kF32}, {"F16", DType::kF16},  {"BF16", DType::kBF16}, {"F64", DType::kF64},
      {"I64", DType::kI64}, {"I32", DType::kI32},  {"I16", DType::kI16},   {"I8", DType::kI8},
      {"U8", DType::kU8},   {"BOOL", DType::kBool}};
  for (const auto& [n, d] : kAll) {
    if (name == n) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype ", Quote(name), " (known: F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL)"));
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 1;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* bytes, size_t size,
                                                         uint64_t file_size,
                                                         const std::string& file_name) {
  auto fail = [&](const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": ", msg));
  };
  if (size > file_size) {
    return fail(absl::StrCat(size, " bytes given for a file of ", file_size, " bytes"));
  }
  if (file_size < 8) {
    return fail(
        absl::StrCat("file is ", file_size, " bytes, shorter than the 8-byte header length"));
  }
  if (size < 8) return fail(absl::StrCat("only ", size, " bytes given, need the first 8"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian
  if (n > kMaxHeaderBytes) {
    return fail(
        absl::StrCat("header length ", n, " is more than the ", kMaxHeaderBytes, "-byte limit"));
  }
  if (n > file_size - 8) {
    return fail(absl::StrCat("header length ", n, " runs past the end of the file (", file_size,
                             " bytes)"));
  }
  if (n > size - 8) {
    return fail(absl::StrCat("header length ", n, " needs ", 8 + n, " bytes but only ", size,
                             " were given"));
  }
  SafetensorsHeader header;
  header.data_offset = 8 + n;
  const uint64_t data_size = file_size - header.data_offset;

  const char* text = reinterpret_cast<const char*>(bytes + 8);
  ASSIGN_OR_RETURN(json root, ParseJson(text, text + n, absl::StrCat(file_name, ": header")));
  if (!root.is_object()) {
    return fail(absl::StrCat("header must be a JSON object, got ", JsonTypeName(root)));
  }
  for (const auto& [name, entry] : root.items()) {
    if (name == kMetadataKey) {
      absl::Status s = ParseMetadata(entry, &header.metadata);
      if (!s.ok()) return fail(std::string(s.message()));
      continue;
    }
    TensorInfo info;
    info.name = name;
    absl::Status s = ParseEntry(entry, data_size, &info);
    if (!s.ok()) return fail(absl::StrCat("tensor ", Quote(name), ": ", s.message()));
    header.tensors.push_back(std::move(info));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  // Sorted by begin, any overlap shows between neighbours; empty tensors overlap nothing.
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : header.tensors) {
    if (t.begin == t.end) continue;
    if (prev != nullptr && t.begin < prev->end) {
      return fail(absl::StrCat("tensor ", Quote(t.name), " [", t.begin, ", ", t.end,
                               "] overlaps tensor ", Quote(prev->name), " [", prev->begin, ", ",
                               prev->end, "]"));
    }
    prev = &t;
  }
  return header;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
    return absl::InternalError(msg);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return ParseSafetensorsHeader(nullptr, 0, file_size, path).status();
  }
  // The mapping outlives the descriptor. If another process truncates the file while it is
  // mapped, reads past the new end raise SIGBUS: checkpoints must not be rewritten in place
  // (WriteSafetensors renames a new file over the old one, which keeps this mapping valid).
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    return DFLASH_INTERNAL_ERROR(absl::StrCat(path, ": mmap failed: ", std::strerror(map_errno)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = static_cast<const uint8_t*>(map);
  file->map_size_ = file_size;
  ASSIGN_OR_RETURN(file->header_,
                   ParseSafetensorsHeader(file->map_, file->map_size_, file_size, path));
  for (size_t i = 0; i < file->header_.tensors.size(); ++i) {
    file->index_[file->header_.tensors[i].name] = i;
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

absl::StatusOr<TensorView> SafetensorsFile::Get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor ", Quote(name)));
  }
  const TensorInfo& info = header_.tensors[it->second];
  TensorView view;
  view.info = &info;
  view.data = map_ + header_.data_offset + info.begin;
  view.file = path_;
  return view;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->dir_ = dir;
  std::error_code ec;
  const std::string single = JoinPath(dir, kSingleName);
  const std::string index_path = JoinPath(dir, kIndexName);
  // Like transformers: a single model.safetensors wins over an index.
  if (std::filesystem::exists(single, ec)) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single));
    for (const TensorInfo& t : file->header().tensors) ckpt->where_[t.name] = file.get();
    ckpt->files_.push_back(std::move(file));
    return ckpt;
  }
  if (!std::filesystem::exists(index_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": neither ", kSingleName, " nor ", kIndexName, " is there"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(index_path, kMaxHeaderBytes));
  ASSIGN_OR_RETURN(json index, ParseJson(text.data(), text.data() + text.size(), index_path));
  auto fail = [&](const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", msg));
  };
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return fail("must be a JSON object with a \"weight_map\" object");
  }
  std::map<std::string, SafetensorsFile*> shards;  // normalized shard name -> opened file
  for (const auto& [tensor, shard_json] : index["weight_map"].items()) {
    if (!shard_json.is_string()) {
      return fail(absl::StrCat("weight_map ", Quote(tensor), " must name a shard file, got ",
                               JsonTypeName(shard_json)));
    }
    const std::string shard = shard_json.get<std::string>();
    absl::Status s = CheckShardName(shard);
    if (!s.ok()) return fail(absl::StrCat("tensor ", Quote(tensor), ": ", s.message()));
    const std::string key = std::filesystem::path(shard).lexically_normal().string();
    auto it = shards.find(key);
    if (it == shards.end()) {
      const std::string shard_path = JoinPath(dir, key);
      if (!std::filesystem::exists(shard_path, ec)) {
        return absl::NotFoundError(absl::StrCat(index_path, ": shard ", Quote(shard),
                                                " (holding tensor ", Quote(tensor),
                                                ") is missing: ", shard_path));
      }
      ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(shard_path));
      it = shards.emplace(key, file.get()).first;
      ckpt->files_.push_back(std::move(file));
    }
    if (!it->second->Get(tensor).ok()) {
      return absl::NotFoundError(absl::StrCat(index_path, " assigns tensor ", Quote(tensor),
                                              " to shard ", it->second->path(),
                                              ", which does not hold it"));
    }
    ckpt->where_[tensor] = it->second;
  }
  return ckpt;
}

absl::StatusOr<TensorView> Checkpoint::Get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": checkpoint has no tensor ", Quote(name)));
  }
  return it->second->Get(name);
}

bool Checkpoint::Has(const std::string& name) const { return where_.count(name) > 0; }

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(where_.size());
  for (const auto& [name, file] : where_) names.push_back(name);
  return names;  // std::map keeps them sorted
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  auto annotated = [&](const absl::Status& s) { return Annotate(s, path); };
  absl::StatusOr<std::string> header = BuildHeader(tensors, metadata);
  if (!header.ok()) return annotated(header.status());

  std::string tmp = path + ".tmp.XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    return annotated(absl::PermissionDeniedError(
        absl::StrCat("cannot create a temporary file: ", std::strerror(errno))));
  }
  auto write_body = [&]() -> absl::Status {
    if (::fchmod(fd, NewFileMode()) != 0) {  // the process's umask (file_mode.h)
      return absl::InternalError(absl::StrCat("fchmod failed: ", std::strerror(errno)));
    }
    uint8_t len[8];
    uint64_t n = header->size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    RETURN_IF_ERROR(WriteAll(fd, len, sizeof(len)));
    RETURN_IF_ERROR(WriteAll(fd, header->data(), header->size()));
    for (const TensorToWrite& t : tensors) RETURN_IF_ERROR(WriteAll(fd, t.data, t.nbytes));
    if (::fsync(fd) != 0) {
      return absl::InternalError(absl::StrCat("fsync failed: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  };
  absl::Status s = write_body();
  if (::close(fd) != 0 && s.ok()) {
    s = absl::InternalError(absl::StrCat("close failed: ", std::strerror(errno)));
  }
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::InternalError(absl::StrCat("rename from ", tmp, " failed: ", std::strerror(errno)));
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return annotated(s);
  }
  // Make the rename itself durable.
  std::string parent = std::filesystem::path(path).parent_path().string();
  int dfd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace dflash::model

// The C API (src/capi/kvsnap.h) over the migration layer. Everything that can
// fail returns a Status inside; here it becomes a kvsnap_status and a
// malloc'ed message. No C++ exception crosses the boundary: every exported
// function that can throw runs inside guarded(), which turns any exception
// into an error return.
#include "capi/kvsnap.h"

#include <algorithm>
#include <cstdlib>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <type_traits>

#include "base/byte_order.h"
#include "base/io.h"
#include "base/remedy.h"
#include "format/llama_state.h"
#include "migrate/conversion_spec.h"
#include "migrate/convert_state.h"
#include "migrate/model_info.h"

#ifndef KVSNAP_VERSION
#define KVSNAP_VERSION "0"
#endif

struct kvsnap_model {
  kvsnap::ModelInfo info;
};

namespace {

using kvsnap::Code;
using kvsnap::Status;

kvsnap_status to_c(Code c) {
  switch (c) {
    case Code::kOk: return KVSNAP_OK;
    case Code::kInvalidArgument: return KVSNAP_ERR_INVALID_ARGUMENT;
    case Code::kCorruption: return KVSNAP_ERR_CORRUPT;
    case Code::kNotSupported: return KVSNAP_ERR_NOT_SUPPORTED;
    case Code::kMismatch: return KVSNAP_ERR_MISMATCH;
    case Code::kAmbiguous: return KVSNAP_ERR_AMBIGUOUS;
    case Code::kIOError: return KVSNAP_ERR_IO;
    case Code::kInterrupted: return KVSNAP_ERR_IO;  // the C API's files are the caller's: never interrupted by kvsnap
    case Code::kNotFound: return KVSNAP_ERR_NOT_FOUND;
  }
  return KVSNAP_ERR_INVALID_ARGUMENT;
}

char* dup_message(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

// A remedy the layers below name as a command-line flag (base/remedy.h), in this API's terms.
std::string c_api_remedy(std::string_view remedy) {
  const std::string r(remedy);
  const std::string flag = r.substr(0, r.find(' '));
  const std::string value = flag.size() < r.size() ? r.substr(flag.size() + 1) : "";
  if (flag == "--model") return "a kvsnap_model (kvsnap_model_open of the model's GGUF)";
  // A value the layers below give as a pattern ("on|off", "bNNNN|vX.Y.Z") is no C string to set.
  const bool pattern = value.find('|') != std::string::npos || value.find("NNNN") != std::string::npos;
  auto assigned = [&](const std::string& member) {
    if (value.empty()) return member;
    if (!pattern) return member + " = \"" + value + "\"";
    std::string choices = value;
    for (size_t at = 0; (at = choices.find('|', at)) != std::string::npos;) choices.replace(at, 1, "\" or \"");
    return member + " (\"" + choices + "\")";
  };
  if (flag == "--threads") return "kvsnap_convert_params.n_threads";
  if (flag == "--ctk" || flag == "--ctv" || flag == "--rotation") return assigned("kvsnap_convert_params." + flag.substr(2));
  if (flag == "--flash-attn")
    return "kvsnap_convert_params.flash_attn" + std::string(value == "on" ? " = 1" : value == "off" ? " = 0" : "");
  // Settings of version 2 of the parameters only.
  for (const auto& [cli, member] : {std::pair{"--src-rotation", "src_rotation"}, {"--dst-rotation", "dst_rotation"},
                                    {"--source-build", "source_build"}, {"--target-build", "target_build"},
                                    {"--format", "format"}, {"--requant", "requant"}}) {
    if (flag == cli) return assigned(std::string("kvsnap_convert_params_v2.") + member);
  }
  if (flag == "--input-format") {
    if (value == "raw-seq") return "kvsnap_convert_params.input = KVSNAP_INPUT_SEQ_BUFFER";
    if (value == "raw-context") return "kvsnap_convert_params.input = KVSNAP_INPUT_CONTEXT_BUFFER";
    return "kvsnap_convert_params.input";
  }
  return "the kvsnap command line's " + r + " (not a parameter of this API)";
}

kvsnap_status fail(const Status& s, char** error) {
  if (error) *error = dup_message(kvsnap::render_remedies(s.ToString(), c_api_remedy));
  return to_c(s.code());
}

kvsnap_status succeed(char** error) {
  if (error) *error = nullptr;
  return KVSNAP_OK;
}

// The error return for an exception, without throwing again: when even the
// message cannot be allocated, the caller gets the code and no message.
kvsnap_status exception_status(kvsnap_status code, const char* function, const char* problem, const char* detail,
                               char** error) noexcept {
  try {
    if (error) *error = dup_message(std::string(kvsnap_status_name(code)) + ": " + function + ": " + problem + detail);
  } catch (...) {
    if (error) *error = nullptr;
  }
  return code;
}

// Runs `body` and turns any exception into an error return: out of memory is
// an I/O error, as a failed allocation elsewhere; anything else is a kvsnap
// bug, reported as an internal error rather than unwinding into C.
template <class Body>
kvsnap_status guarded(const char* function, char** error, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return exception_status(KVSNAP_ERR_IO, function, "out of memory", "", error);
  } catch (const std::exception& e) {
    return exception_status(KVSNAP_ERR_INTERNAL, function, "", e.what(), error);
  } catch (...) {
    return exception_status(KVSNAP_ERR_INTERNAL, function, "", "unknown exception", error);
  }
}

// A sink that grows one malloc'ed buffer, so the caller frees it with kvsnap_free.
class MallocSink final : public kvsnap::ByteSink {
 public:
  ~MallocSink() override { std::free(data_); }
  using ByteSink::append;
  Status append(std::span<const std::byte> d) override {
    if (size_ + d.size() > cap_) {
      size_t cap = std::max(cap_ * 2, size_ + d.size());
      void* p = std::realloc(data_, cap);
      if (!p) return Status::IOError("out of memory growing the output buffer to " + std::to_string(cap) + " bytes");
      data_ = static_cast<std::byte*>(p);
      cap_ = cap;
    }
    if (!d.empty()) std::memcpy(data_ + size_, d.data(), d.size());
    size_ += d.size();
    return Status::OK();
  }
  void reserve(size_t n) {
    if (void* p = std::realloc(data_, n)) {
      data_ = static_cast<std::byte*>(p);
      cap_ = n;
    }
  }
  void release(void** out, size_t* n) {
    *out = data_;
    *n = size_;
    data_ = nullptr;
    size_ = cap_ = 0;
  }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0, cap_ = 0;
};

bool has_file_magic(const void* src, size_t n) {
  if (n < 4) return false;
  const uint32_t m = kvsnap::load_le<uint32_t>(static_cast<const std::byte*>(src));
  return m == kvsnap::kMagicGgsq || m == kvsnap::kMagicGgsn;
}

// Version 1 of the parameters as version 2 with the later members at their defaults.
kvsnap_convert_params_v2 as_v2(const kvsnap_convert_params& p) {
  kvsnap_convert_params_v2 v;
  kvsnap_convert_params_v2_init(&v, sizeof v);
  v.ctk = p.ctk;
  v.ctv = p.ctv;
  v.flash_attn = p.flash_attn;
  v.rotation = p.rotation;
  v.n_threads = p.n_threads;
  std::memcpy(&v.input, &p.input, sizeof v.input);  // as bytes: a value out of the enum's range is no valid load
  return v;
}

// The first release of kvsnap_convert_params_v2 ended with dst_rotation: no smaller size is valid.
constexpr size_t kFirstV2Size = offsetof(kvsnap_convert_params_v2, kv_streams);
// Where the last member this library knows ends (its struct may have padding after it).
constexpr size_t kKnownV2End = offsetof(kvsnap_convert_params_v2, kv_streams) + sizeof(int);

// The caller's version 2 parameters as this library knows them: the members its struct_size holds
// (an older kvsnap.h's, at least the first release's; the others keep their defaults); members a
// newer kvsnap.h added after this library's must be unset (zero), since it cannot honour them.
kvsnap::Result<kvsnap_convert_params_v2> read_v2(const kvsnap_convert_params_v2* p) {
  kvsnap_convert_params_v2 v;
  kvsnap_convert_params_v2_init(&v, sizeof v);
  if (!p) return v;
  // A size no kvsnap.h will reach: the struct was not initialised (kvsnap_convert_params_v2_init).
  if (p->struct_size > 4096) {
    return Status::InvalidArgument("kvsnap_convert_params_v2.struct_size is " + std::to_string(p->struct_size) +
                                   ": not initialised? call kvsnap_convert_params_v2_init(&p, sizeof p) first");
  }
  if (p->struct_size < kFirstV2Size) {
    return Status::InvalidArgument("kvsnap_convert_params_v2.struct_size is " + std::to_string(p->struct_size) +
                                   ", smaller than any kvsnap_convert_params_v2 (" + std::to_string(kFirstV2Size) +
                                   "): initialise it with kvsnap_convert_params_v2_init(&p, sizeof p)");
  }
  // From the end of the last member this library knows, not of its struct: a newer kvsnap.h's next
  // member may sit in this one's tail padding (a review's finding: an int after kv_streams, set,
  // was copied into the padding and ignored, status OK).
  const auto* bytes = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = kKnownV2End; i < p->struct_size; ++i) {
    if (bytes[i] != 0) {
      return Status::NotSupported("kvsnap_convert_params_v2 sets a member at byte " + std::to_string(i) +
                                  ", past the " + std::to_string(kKnownV2End) + " bytes this libkvsnap " KVSNAP_VERSION
                                  " knows: the program was built against a newer kvsnap.h; use its libkvsnap");
    }
  }
  std::memcpy(&v, p, std::min(p->struct_size, sizeof v));
  v.struct_size = sizeof v;
  return v;
}

// A value outside an enum's or a member's range is refused, not read as a neighbour: a program built
// against a newer kvsnap.h may mean a kind this library does not know.
kvsnap::Result<kvsnap::ParseOptions> parse_options(const kvsnap_convert_params_v2& p, const void* src, size_t n) {
  if (p.flash_attn < -1 || p.flash_attn > 1)
    return Status::InvalidArgument("kvsnap_convert_params.flash_attn is " + std::to_string(p.flash_attn) +
                                   ": 1 (on), 0 (off) or -1 (keep the V layout)");
  kvsnap::ParseOptions o;
  // Read as its integer: a kind this library does not know is out of the enum's range, and loading it
  // as the enum is undefined (UBSan: "not a valid value for type 'kvsnap_input_kind'").
  std::underlying_type_t<kvsnap_input_kind> kind;
  std::memcpy(&kind, &p.input, sizeof kind);
  switch (kind) {
    case KVSNAP_INPUT_SEQ_BUFFER: o.kind = kvsnap::StateKind::kRawSeq; return o;
    case KVSNAP_INPUT_CONTEXT_BUFFER: o.kind = kvsnap::StateKind::kRawContext; return o;
    case KVSNAP_INPUT_FILE_BYTES: return o;
    case KVSNAP_INPUT_AUTO:
      if (!has_file_magic(src, n)) o.kind = kvsnap::StateKind::kRawSeq;
      return o;
  }
  return Status::NotSupported("kvsnap_convert_params.input is " + std::to_string(kind) +
                              ", a kind this libkvsnap " KVSNAP_VERSION " does not know");
}

kvsnap::ConversionSpec spec_of(const kvsnap_convert_params_v2& p) {
  kvsnap::ConversionSpec s;
  if (p.ctk) s.ctk = p.ctk;
  if (p.ctv) s.ctv = p.ctv;
  if (p.flash_attn >= 0) s.flash_attn = p.flash_attn ? "on" : "off";
  if (p.rotation) s.rotation = p.rotation;
  if (p.src_rotation) s.src_rotation = p.src_rotation;
  if (p.dst_rotation) s.dst_rotation = p.dst_rotation;
  if (p.requant) s.requant = p.requant;
  if (p.source_build) s.source_build = p.source_build;
  if (p.target_build) s.target_build = p.target_build;
  if (p.format) s.format = p.format;
  s.threads = p.n_threads;
  s.kv_streams = p.kv_streams;
  return s;
}

kvsnap_status convert(const kvsnap_model* model, const void* src, size_t src_size, const kvsnap_convert_params_v2& p,
                      void** out, size_t* out_size, char** error) {
  kvsnap::MemoryFile in("state buffer", std::span<const std::byte>(static_cast<const std::byte*>(src), src_size));
  const kvsnap::ModelInfo* info = model ? &model->info : nullptr;
  auto options = parse_options(p, src, src_size);
  if (!options.ok()) return fail(options.status(), error);
  auto state = kvsnap::parse_for_model(in, *options, info);
  if (!state.ok()) return fail(state.status(), error);
  auto req = kvsnap::make_request(spec_of(p), *state, info, in.name(), nullptr, &in);
  if (!req.ok()) return fail(req.status(), error);
  MallocSink sink;
  sink.reserve(src_size);
  auto res = kvsnap::convert_state(*state, in, *req, sink);
  if (!res.ok()) return fail(res.status(), error);
  sink.release(out, out_size);
  return succeed(error);
}

}  // namespace

extern "C" {

const char* kvsnap_version(void) { return KVSNAP_VERSION; }

const char* kvsnap_status_name(kvsnap_status status) {
  // Read as the int a C caller passed (any value is one there): a value outside the enum's range
  // is no valid load of the enum in C++ (as for the params' input above).
  int s = 0;
  static_assert(sizeof s == sizeof status);
  std::memcpy(&s, &status, sizeof s);
  switch (s) {
    case KVSNAP_OK: return "ok";
    case KVSNAP_ERR_INVALID_ARGUMENT: return "invalid argument";
    case KVSNAP_ERR_CORRUPT: return "corrupt";
    case KVSNAP_ERR_NOT_SUPPORTED: return "not supported";
    case KVSNAP_ERR_MISMATCH: return "mismatch";
    case KVSNAP_ERR_AMBIGUOUS: return "ambiguous";
    case KVSNAP_ERR_IO: return "I/O error";
    case KVSNAP_ERR_NOT_FOUND: return "not found";
    case KVSNAP_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

void kvsnap_free(void* p) { std::free(p); }

void kvsnap_convert_params_init(kvsnap_convert_params* p) {
  if (!p) return;
  *p = kvsnap_convert_params{};
  p->flash_attn = -1;
  p->input = KVSNAP_INPUT_AUTO;
}

void kvsnap_convert_params_v2_init(kvsnap_convert_params_v2* p, size_t size) {
  if (!p || size < sizeof(size_t)) return;
  kvsnap_convert_params_v2 d{};
  d.flash_attn = -1;
  d.input = KVSNAP_INPUT_AUTO;
  std::memset(static_cast<void*>(p), 0, size);  // members of a newer kvsnap.h: unset
  std::memcpy(static_cast<void*>(p), &d, std::min(size, sizeof d));
  p->struct_size = size;
}

kvsnap_status kvsnap_model_open(const char* gguf_path, kvsnap_model** out, char** error) {
  return guarded("kvsnap_model_open", error, [&] {
    if (out) *out = nullptr;  // on every failure, a NULL argument's too
    if (!gguf_path || !out) return fail(Status::InvalidArgument("kvsnap_model_open: NULL argument"), error);
    auto info = kvsnap::load_model_info(kvsnap::posix_io(), gguf_path);
    if (!info.ok()) return fail(info.status(), error);
    *out = new kvsnap_model{std::move(info).value()};
    return succeed(error);
  });
}

void kvsnap_model_free(kvsnap_model* m) { delete m; }

kvsnap_status kvsnap_convert_state(const kvsnap_model* model, const void* src, size_t src_size,
                                   const kvsnap_convert_params* params, void** out, size_t* out_size, char** error) {
  return guarded("kvsnap_convert_state", error, [&] {
    if (out) *out = nullptr;  // on every failure, a NULL argument's too
    if (out_size) *out_size = 0;
    if (!out || !out_size || (!src && src_size))
      return fail(Status::InvalidArgument("kvsnap_convert_state: NULL argument"), error);
    kvsnap_convert_params defaults;
    kvsnap_convert_params_init(&defaults);
    return convert(model, src, src_size, as_v2(params ? *params : defaults), out, out_size, error);
  });
}

kvsnap_status kvsnap_convert_state_v2(const kvsnap_model* model, const void* src, size_t src_size,
                                      const kvsnap_convert_params_v2* params, void** out, size_t* out_size,
                                      char** error) {
  return guarded("kvsnap_convert_state_v2", error, [&] {
    if (out) *out = nullptr;  // on every failure, a NULL argument's too
    if (out_size) *out_size = 0;
    if (!out || !out_size || (!src && src_size))
      return fail(Status::InvalidArgument("kvsnap_convert_state_v2: NULL argument"), error);
    auto p = read_v2(params);
    if (!p.ok()) return fail(p.status(), error);
    return convert(model, src, src_size, *p, out, out_size, error);
  });
}

}  // extern "C"

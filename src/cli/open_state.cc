#include "cli/open_state.h"

#include <sys/stat.h>

#include "format/ggml_types.h"
#include "format/llama_era.h"

namespace kvsnap::cli {

Result<OpenedState> open_state(Io& io, const std::string& path, const std::string& model_path,
                               const std::string& input_format, const std::string& src_types,
                               const std::string& source_build, HeadDimCheck check) {
  OpenedState o;
  if (!input_format.empty() && input_format != "raw-seq" && input_format != "raw-context") {
    return Status::InvalidArgument("--input-format '" + input_format +
                                   "': expected raw-seq (a llama_state_seq_get_data buffer) or raw-context "
                                   "(llama_state_get_data)");
  }
  if (!model_path.empty()) {
    KV_ASSIGN_OR_RETURN(o.model, load_model_info(io, model_path));
  }
  KV_ASSIGN_OR_RETURN(o.file, io.open_read(path));
  ParseOptions po;
  if (input_format == "raw-seq") po.kind = StateKind::kRawSeq;
  if (input_format == "raw-context") po.kind = StateKind::kRawContext;
  if (!src_types.empty()) {
    const size_t slash = src_types.find('/');
    const TypeLayout* k = slash == std::string::npos ? nullptr : find_type(src_types.substr(0, slash));
    const TypeLayout* v = slash == std::string::npos ? nullptr : find_type(src_types.substr(slash + 1));
    if (!k || !v || !k->kv_cache() || !v->kv_cache()) {
      return Status::InvalidArgument("--src-types '" + src_types + "': expected K/V cache types, e.g. q4_0/q8_0");
    }
    po.legacy_kv_types = std::make_pair(int32_t(k->id), int32_t(v->id));
  }
  po.v9_outputs = v9_outputs_of_build(source_build);  // a bad build is refused by the rotation's check
  KV_ASSIGN_OR_RETURN(o.state, parse_for_model(*o.file, po, o.model_ptr(), check));
  if (po.legacy_kv_types && !o.state.legacy) {
    return Status::InvalidArgument(path + ": --src-types applies to ggsn v6 (b3166) sessions only; this file records "
                                   "its types");
  }
  return o;
}

Status refuse_irregular_output(const std::string& out, const std::string& command) {
  // Many tools read "-" as standard output; kvsnap writes a file atomically (a review's finding: a
  // file named "-" was written).
  if (out == "-")
    return Status::InvalidArgument(command + " writes a file, not standard output: give a path (./- names a file '-')");
  struct stat b {};
  if (::lstat(out.c_str(), &b) != 0 || S_ISREG(b.st_mode)) return Status::OK();
  // A symlink is replaced by the rename, which is what it is for when it names a regular file (or
  // nothing); one to a device, pipe or directory (/dev/stdout) is refused like what it names: the
  // rename would put a file where the system's link was.
  std::string link;
  if (S_ISLNK(b.st_mode)) {
    if (::stat(out.c_str(), &b) != 0 || S_ISREG(b.st_mode)) return Status::OK();
    link = "a symbolic link to ";
  }
  const char* what = S_ISDIR(b.st_mode)                        ? "a directory"
                     : S_ISFIFO(b.st_mode)                     ? "a named pipe"
                     : S_ISCHR(b.st_mode) || S_ISBLK(b.st_mode) ? "a device"
                                                                : "not a regular file";
  return Status::InvalidArgument(out + ": is " + link + what + "; " + command +
                                 " writes a regular file in its place (by rename), so it refuses to");
}

}  // namespace kvsnap::cli

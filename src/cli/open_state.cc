#include "cli/open_state.h"

namespace kvsnap::cli {

Result<OpenedState> open_state(Io& io, const std::string& path, const std::string& model_path,
                               const std::string& input_format) {
  OpenedState o;
  if (!model_path.empty()) {
    KV_ASSIGN_OR_RETURN(o.model, load_model_info(io, model_path));
  }
  KV_ASSIGN_OR_RETURN(o.file, io.open_read(path));
  ParseOptions po;
  if (input_format == "raw-seq") po.kind = StateKind::kRawSeq;
  if (input_format == "raw-context") po.kind = StateKind::kRawContext;
  KV_ASSIGN_OR_RETURN(o.state, parse_for_model(*o.file, po, o.model_ptr()));
  return o;
}

}  // namespace kvsnap::cli

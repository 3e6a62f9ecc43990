#include "store/store_paths.h"

#include "base/io.h"
#include "store/store_location.h"

namespace kvsnap {

Result<StorePaths> resolve_store_paths(const std::string& explicit_dir) {
  KV_ASSIGN_OR_RETURN(StoreLocation where, resolve_store_location(posix_io(), explicit_dir));
  return StorePaths{where.local_dir};
}

}  // namespace kvsnap

// The stores kvsnap serve saves into and restores from, by namespace
// (serve/persist.h namespace_of). By default every namespace shares one store,
// sealed (when a key is given) under one tenant (--tenant or store.json's).
// With --tenant-per-namespace each namespace is its own tenant: its snapshots'
// chunks, manifests and tokens are sealed under keys derived for it (HKDF of
// the master key and the namespace), its prefix index is keyed for it, and a
// store opened for one namespace can neither find nor open another's
// snapshots, whatever the serve.ns tags say.
//
// Promises:
//   - per-namespace needs a key: without one there is nothing to seal with,
//     and open() refuses (kInvalidArgument), as it refuses an explicit tenant
//     beside it (one or the other);
//   - a namespace that is not a valid tenant name (1..128 printable ASCII
//     bytes, no space) gets kInvalidArgument naming it: nothing is stored for
//     it, never under another tenant;
//   - at most kMaxOpen namespaces' stores are open at once (a client choosing
//     session names cannot open connections without bound); the least recently
//     used is closed, and opened again when needed.
// Not thread-safe: each user serializes its calls (with the mutex it holds
// while it uses the returned store).
#pragma once

#include <list>
#include <memory>
#include <string>

#include "base/io.h"
#include "base/status.h"
#include "store/store.h"
#include "store/store_location.h"

namespace kvsnap {

class TenantStores {
 public:
  static constexpr size_t kMaxOpen = 16;

  // `where` with the key flags applied (apply_key_flags). Opens the shared
  // store, or with `per_namespace` checks the key and opens nothing yet.
  static Result<std::unique_ptr<TenantStores>> open(Io& io, StoreLocation where, bool per_namespace);

  bool per_namespace() const { return per_namespace_; }
  // The store that seals `ns`'s snapshots: valid until the next call.
  Result<Store*> for_namespace(const std::string& ns);

 private:
  TenantStores(Io& io, StoreLocation where, bool per_namespace)
      : io_(io), where_(std::move(where)), per_namespace_(per_namespace) {}

  Io& io_;
  StoreLocation where_;
  bool per_namespace_;
  std::unique_ptr<Store> shared_;  // !per_namespace_
  std::list<std::pair<std::string, std::unique_ptr<Store>>> open_;  // per_namespace_: most recent first
};

}  // namespace kvsnap

#include "serve/tenant_stores.h"

#include "base/chunk_cipher.h"

namespace kvsnap {

Result<std::unique_ptr<TenantStores>> TenantStores::open(Io& io, StoreLocation where, bool per_namespace) {
  if (per_namespace) {
    if (!where.keys.tenant.empty())
      return Status::InvalidArgument("--tenant-per-namespace: the tenant is each request's namespace, not '" +
                                     where.keys.tenant + "' (drop --tenant, or the store config's \"tenant\")");
    KV_ASSIGN_OR_RETURN(const std::optional<MasterKey> key, load_store_key(where.keys));
    if (!key)
      return Status::InvalidArgument("--tenant-per-namespace seals each namespace under its own key: it needs the "
                                     "master key (--key-file or --key-command, or the store config's)");
  }
  std::unique_ptr<TenantStores> s(new TenantStores(io, std::move(where), per_namespace));
  if (!per_namespace) {
    KV_ASSIGN_OR_RETURN(s->shared_, Store::open(io, s->where_));
  }
  return s;
}

Result<Store*> TenantStores::for_namespace(const std::string& ns) {
  if (!per_namespace_) return shared_.get();
  for (auto it = open_.begin(); it != open_.end(); ++it) {
    if (it->first != ns) continue;
    open_.splice(open_.begin(), open_, it);
    return open_.front().second.get();
  }
  if (Status s = check_tenant_name(ns); !s.ok())
    return Status::InvalidArgument("namespace '" + ns.substr(0, 140) + "' cannot be a tenant: " + s.message());
  StoreLocation where = where_;
  where.keys.tenant = ns;
  KV_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::open(io_, where));
  if (open_.size() >= kMaxOpen) open_.pop_back();
  open_.emplace_front(ns, std::move(store));
  return open_.front().second.get();
}

}  // namespace kvsnap

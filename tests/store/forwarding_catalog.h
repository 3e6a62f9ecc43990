// A Catalog that forwards every call to another one, with hooks where a test needs to act between
// two of a store's steps (another process's restore between an eviction's plan and its removals)
// or to make one read fail (a catalog failing its eviction read after a save committed).
// Unencrypted stores only: the prefix keying an encrypted store sets is not handed on.
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "store/catalog.h"

namespace kvsnap::test {

class ForwardingCatalog : public Catalog {
 public:
  explicit ForwardingCatalog(std::unique_ptr<Catalog> inner) : inner_(std::move(inner)) {}

  Catalog& inner() { return *inner_; }
  // Called before each remove_snapshot_if (the victim's id); an error is returned as the removal's.
  std::function<Status(int64_t id)> before_remove;
  // Called before each eviction_scope; an error is returned as the read's.
  std::function<Status()> before_eviction_scope;

  Result<std::optional<std::string>> get_meta(const std::string& key) override { return inner_->get_meta(key); }
  Result<std::optional<std::string>> any_sealed_key_id() override { return inner_->any_sealed_key_id(); }
  Result<std::string> init_meta(const std::string& key, const std::string& value) override {
    return inner_->init_meta(key, value);
  }
  Status begin_key_rotation(const std::string& from, const std::string& to) override {
    return inner_->begin_key_rotation(from, to);
  }
  Result<int64_t> finish_key_rotation(const std::string& from, const std::string& to) override {
    return inner_->finish_key_rotation(from, to);
  }
  Status replace_sealed(int64_t id, SnapshotRecord rec, const std::vector<ChunkUse>& chunks,
                        const std::string& expect_key_id, const PrefixKeying& keying, GcLockHold& hold) override {
    return inner_->replace_sealed(id, std::move(rec), chunks, expect_key_id, keying, hold);
  }
  Result<SnapshotInfo> add_snapshot(SnapshotRecord rec, const std::vector<ChunkUse>& chunks) override {
    return inner_->add_snapshot(std::move(rec), chunks);
  }
  Result<SnapshotInfo> commit_save(SnapshotRecord rec, const std::vector<ChunkUse>& chunks,
                                   GcLockHold& hold) override {
    return inner_->commit_save(std::move(rec), chunks, hold);
  }
  Result<std::vector<ChunkHash>> remove_snapshot_if(int64_t id, const RemovalCheck& check) override {
    if (before_remove) KV_RETURN_IF_ERROR(before_remove(id));
    return inner_->remove_snapshot_if(id, check);
  }
  Result<SnapshotRecord> get(int64_t id) override { return inner_->get(id); }
  Result<SnapshotInfo> get_info(int64_t id) override { return inner_->get_info(id); }
  Result<std::vector<ChunkUse>> chunks_of(int64_t id) override { return inner_->chunks_of(id); }
  Result<SnapshotRows> get_with_chunks(int64_t id) override { return inner_->get_with_chunks(id); }
  Result<std::optional<ChunkUse>> find_chunk(const ChunkHash& h) override { return inner_->find_chunk(h); }
  Result<std::vector<std::optional<ChunkUse>>> find_chunks(std::span<const ChunkHash> hashes) override {
    return inner_->find_chunks(hashes);
  }
  uint64_t lookup_hold_bytes() const override { return inner_->lookup_hold_bytes(); }
  Result<int64_t> resolve(const std::string& ref) override { return inner_->resolve(ref); }
  Result<std::vector<SnapshotInfo>> list(const ListFilter& filter) override { return inner_->list(filter); }
  Result<std::vector<SnapshotInfo>> find_prefix(std::span<const int32_t> query, const std::string& model_fingerprint,
                                                size_t limit) override {
    return inner_->find_prefix(query, model_fingerprint, limit);
  }
  Result<GcCandidates> gc_candidates(const std::vector<ChunkHash>& on_disk) override {
    return inner_->gc_candidates(on_disk);
  }
  Result<std::vector<ChunkHash>> forget_unreferenced(const std::vector<ChunkHash>& hashes) override {
    return inner_->forget_unreferenced(hashes);
  }
  Result<std::vector<std::string>> unused_packs(const std::vector<std::string>& packs) override {
    return inner_->unused_packs(packs);
  }
  Result<std::map<std::string, uint64_t>> live_packs() override { return inner_->live_packs(); }
  Result<std::vector<PackUsage>> pack_usage(const std::vector<std::string>& packs) override {
    return inner_->pack_usage(packs);
  }
  Result<std::vector<ChunkUse>> chunks_in_pack(const std::string& pack) override {
    return inner_->chunks_in_pack(pack);
  }
  Status move_chunks(const std::vector<ChunkMove>& moves, GcLockHold& hold) override {
    return inner_->move_chunks(moves, hold);
  }
  Status mark_restored(int64_t id, const std::string& when) override { return inner_->mark_restored(id, when); }
  Status set_pinned(int64_t id, bool pinned) override { return inner_->set_pinned(id, pinned); }
  Status set_expiry(int64_t id, const std::optional<std::string>& expires_at) override {
    return inner_->set_expiry(id, expires_at);
  }
  Result<EvictionScope> eviction_scope(const std::optional<std::string>& tenant) override {
    if (before_eviction_scope) KV_RETURN_IF_ERROR(before_eviction_scope());
    return inner_->eviction_scope(tenant);
  }
  Result<std::vector<int64_t>> expired_snapshots(const std::string& now) override {
    return inner_->expired_snapshots(now);
  }
  Result<CatalogStats> stats() override { return inner_->stats(); }
  Result<std::vector<std::string>> integrity_check() override { return inner_->integrity_check(); }
  Result<int> schema_version() override { return inner_->schema_version(); }
  std::string describe() const override { return inner_->describe(); }

 private:
  std::unique_ptr<Catalog> inner_;
};

}  // namespace kvsnap::test

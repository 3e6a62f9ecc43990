// kvsnap restore: a snapshot as a llama.cpp file (--out) or into a llama-server slot (--server).
#include "base/json_access.h"
#include "base/printf_text.h"
#include "cli/progress.h"
#include "cli/store_common.h"
#include "cli/commands.h"
#include "cli/era_options.h"
#include "cli/server_options.h"
#include "server/server_flows.h"

namespace kvsnap::cli {
namespace {

struct RestoreOpts {
  std::string ref, out, ctk, ctv, flash_attn, format, rotation, requant, model, store;
  std::string src_rotation, source_build;  // of the stored file (convert --help)
  std::string dst_rotation;                // of the llama.cpp that loads it
  std::string target_build;                // of the llama.cpp that loads it
  std::string kv_bits, mlx_device, mlx_lm;  // mlx-lm snapshots (kvsnap convert --help)
  int kv_group_size = 0;
  uint64_t tokens = 0;
  int threads = 0;
  int kv_streams = 0;
  bool force = false, json = false, check = false, allow_plain = false;
  ProgressFlags progress;
  ServerOpts srv;
};

std::string streams_note(const ServerRestoreResult& r) {
  return "written with " + std::to_string(r.kv_streams) + (r.kv_streams == 1 ? " KV stream (" : " KV streams (") +
         r.kv_streams_from + ")";
}

Status run_restore_server(const RestoreOpts& o, std::string& out) {
  if (!o.out.empty() || o.tokens || !o.format.empty())
    return Status::InvalidArgument("--server restores into the server; --out, --tokens and --format do not apply");
  KV_ASSIGN_OR_RETURN(ServerTarget t, server_target(o.srv, o.store, o.ctk, o.ctv, o.flash_attn, o.model));
  t.stored_source_build = o.source_build;
  t.stored_src_rotation = o.src_rotation;
  t.rotation = o.rotation;
  t.server_rotation = o.dst_rotation;
  t.target_build = o.target_build;
  t.threads = o.threads;
  t.kv_streams = o.kv_streams;
  t.allow_plain = o.allow_plain;
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  Result<ServerRestoreResult> restored = [&] {
    ProgressDisplay shown("restore " + o.ref, Counted::kRead, stored_bytes_of(*store, {o.ref}), o.progress.mode(o.json));
    return shown.finish(restore_to_server(cli_io(), *store, t, o.ref, o.check));
  }();
  KV_ASSIGN_OR_RETURN(ServerRestoreResult r, std::move(restored));
  json j = {{"snapshot", info_json(r.restore.info)}, {"server", t.endpoint.url}, {"slot", t.slot},
            {"n_restored", r.n_restored}, {"ctk", r.ctk}, {"ctv", r.ctv}, {"flash_attn", r.flash_attn},
            {"types_from", r.types_from}, {"model_from", r.model_from},
            {"model_unchecked", r.model_unchecked.empty() ? json(nullptr) : json(r.model_unchecked)}, {"converted", r.restore.converted},
            {"bytes", r.restore.bytes_out}, {"server_ms", r.server_ms}, {"seconds", r.seconds},
            {"server_build", server_build_json(r.build)},
            {"target_build", r.target_build.empty() ? json(nullptr) : json(r.target_build)},
            {"target_build_from", r.target_build_from},
            {"kv_streams", r.kv_streams ? json(r.kv_streams) : json(nullptr)}, {"kv_streams_from", r.kv_streams_from},
            {"slot_file", !t.keep_scratch ? "new, removed after" : r.scratch_reused ? "written over the kept scratch"
                                                                                   : "new, kept as scratch"},
            {"phases_ms", {{"prepare", r.phases.prepare}, {"write", r.phases.write}, {"commit", r.phases.commit},
                           {"server", r.phases.server}, {"check", r.phases.check}}}};
  if (r.check)
    j["check"] = {{"n_tokens", r.check->n_tokens}, {"prompt_n", r.check->prompt_n}, {"cache_n", r.check->cache_n},
                  {"reused", r.check->reused}};
  if (o.json) {
    out = json_text(j, 2) + "\n";
  } else {
    std::string buf;
    buf = printf_text(
                  "restored %s into %s slot %d: %llu tokens, K %s V %s fa %s (%s), %s, %.2f s (server %.0f ms)\n",
                  label(r.restore.info).c_str(), t.endpoint.url.c_str(), t.slot, (unsigned long long)r.n_restored,
                  r.ctk.c_str(), r.ctv.c_str(), r.flash_attn.c_str(), r.types_from.c_str(),
                  r.restore.converted ? "converted" : "as stored", r.seconds, r.server_ms);
    out = buf;
    out += "  written for " + (r.target_build.empty() ? std::string("the stored file's format")
                                                     : "llama.cpp " + r.target_build + " (" + r.target_build_from + ")") +
           server_build_note(r.build) + "\n";
    if (r.kv_streams) out += "  " + streams_note(r) + "\n";
    if (!r.model_unchecked.empty()) {
      out += "  model not checked: " + r.model_unchecked + ": nothing shows that the server runs the snapshot's model "
             "(pass --model GGUF, the server's model file, to check it)\n";
    }
    if (r.check) {
      buf = printf_text("check: the stored prompt (%llu tokens) needed %llu evaluated, %llu from the cache: %s\n",
                    (unsigned long long)r.check->n_tokens, (unsigned long long)r.check->prompt_n,
                    (unsigned long long)r.check->cache_n,
                    r.check->reused ? "the server reused the cache" : "the server did NOT reuse the cache");
      out += buf;
    }
  }
  if (r.check && !r.check->reused)
    return Status::Mismatch("the server restored the slot but reprocessed the prompt (see above): check that it runs "
                            "the snapshot's model and that --ctk/--ctv/--fa match its flags");
  return Status::OK();
}

Status run_restore(const RestoreOpts& o, std::string& out) {
  if (o.srv.given()) {
    if (!o.kv_bits.empty() || o.kv_group_size || !o.mlx_device.empty() || !o.mlx_lm.empty())
      return Status::InvalidArgument("--server restores llama.cpp states into llama-server; --kv-bits, "
                                     "--kv-group-size, --mlx-device and --mlx-lm are for mlx-lm snapshots");
    return run_restore_server(o, out);
  }
  KV_RETURN_IF_ERROR(refuse_server_flags_without_server(o.srv, o.check ? "--check" : ""));
  if (o.out.empty()) return Status::InvalidArgument("--out FILE is needed (or --server to restore into a server)");
  KV_RETURN_IF_ERROR(refuse_existing(o.out, o.force, "kvsnap restore"));
  std::optional<ModelInfo> model;
  if (!o.model.empty()) {
    KV_ASSIGN_OR_RETURN(model, load_model_info(cli_io(), o.model));
  }
  RestoreRequest req;
  req.spec.ctk = o.ctk;
  req.spec.ctv = o.ctv;
  req.spec.flash_attn = o.flash_attn;
  req.spec.format = o.format;
  req.spec.rotation = o.rotation;
  req.spec.requant = o.requant;
  req.spec.src_rotation = o.src_rotation;
  req.spec.dst_rotation = o.dst_rotation;
  req.spec.source_build = o.source_build;
  req.spec.target_build = o.target_build;
  req.spec.threads = o.threads;
  req.spec.kv_streams = o.kv_streams;
  req.mlx = {o.kv_bits, o.kv_group_size, o.mlx_device, o.mlx_lm};
  req.model = model ? &*model : nullptr;
  req.allow_plain = o.allow_plain;
  if (o.tokens) req.tokens = o.tokens;
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_RETURN_IF_ERROR(refuse_output_over_inputs(o.out, *store, {{o.model, "the model (--model)"}}));
  AtomicWriteOptions written;
  // The plaintext of what an encrypted store seals: readable by its owner only.
  written.owner_only = !store->encryption_key_id().empty();
  KV_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(cli_io(), o.out, written));
  Result<RestoreResult> restored = [&] {
    ProgressDisplay shown("restore " + o.ref, Counted::kRead, stored_bytes_of(*store, {o.ref}), o.progress.mode(o.json));
    return shown.finish(store->restore(o.ref, req, *writer));
  }();
  KV_ASSIGN_OR_RETURN(RestoreResult r, std::move(restored));
  KV_RETURN_IF_ERROR(writer->commit());
  if (o.json) {
    json j = {{"snapshot", info_json(r.info)}, {"output", o.out}, {"bytes", r.bytes_out},
              {"n_tokens", r.n_tokens}, {"converted", r.converted}, {"seconds", r.seconds}};
    out = json_text(j, 2) + "\n";
    return Status::OK();
  }
  std::string buf;
  buf = printf_text("restored %s -> %s: %llu tokens, %s%s, %.2f s\n", label(r.info).c_str(),
                o.out.c_str(), (unsigned long long)r.n_tokens, mib(r.bytes_out).c_str(),
                r.converted ? " (converted)" : req.tokens ? " (prefix, stored types)" : " (original bytes)", r.seconds);
  out = buf;
  return Status::OK();
}

}  // namespace

void setup_restore(CLI::App& app, int& exit_status) {
  {
    auto o = std::make_shared<RestoreOpts>();
    auto* sub = app.add_subcommand("restore", "Write a stored snapshot as a llama.cpp file, optionally at other cache "
                                              "types / flash attention / format, or only its first N tokens");
    sub->add_option("snapshot", o->ref, "name, id or uuid (prefix) of the snapshot")->required();
    sub->add_option("--out,-o", o->out, "the llama.cpp file to write (atomically)");
    add_server_options(sub, o->srv);
    sub->add_flag("--check", o->check, "after --server: send the stored prompt and report whether the server reused the cache");
    sub->add_option("--ctk", o->ctk, "K type of the server that will load it (default: as stored; with --server: detected)");
    sub->add_option("--ctv", o->ctv, "V type (default: as stored; with --server: detected)");
    sub->add_option("--flash-attn,--fa", o->flash_attn, "on|off of that server (default: as stored; with --server: detected)");
    sub->add_option("--format", o->format, "output format: " + target_format_names());
    sub->add_option("--rotation", o->rotation, "auto|on|off (see kvsnap convert --help)");
    sub->add_option("--dst-rotation", o->dst_rotation,
                    "auto|on|off for the output only: off for a server run with LLAMA_ATTN_ROT_DISABLE=1, which "
                    "kvsnap cannot see (default: as --target-build or the server's build decides)")
        ->check(CLI::IsMember({"", "auto", "on", "off"}));
    sub->add_option("--requant", o->requant, "auto|quick|search|exact|reference (see kvsnap convert --help)")
        ->check(CLI::IsMember({"auto", "quick", "search", "exact", "reference"}));
    add_source_options(sub, o->src_rotation, o->source_build, "the stored file (default: as recorded at save)");
    add_target_build_option(sub, o->target_build, "the file (with --server, default: the server's /props build_info)");
    sub->add_option("--tokens", o->tokens,
                    "restore only the first N tokens (a slot file without media, or an mlx-lm cache: docs/mlx.md)")
        ->check(CLI::Validator(
            [](std::string& v) {
              const bool zero = !v.empty() && v.find_first_not_of('0') == std::string::npos;
              return zero ? std::string("0 tokens make no file: give N >= 1 (all of them: no --tokens)") : std::string();
            },
            "N >= 1"));
    sub->add_option("--model,-m", o->model, "the model's GGUF (default: the head dims recorded at save)");
    sub->add_option("--kv-bits", o->kv_bits,
                    "mlx-lm snapshots: requantize K/V to 2|3|4|5|6|8 bits (MLX affine), or none (float); the bytes of "
                    "kvsnap convert --kv-bits on the restored file");
    sub->add_option("--kv-group-size", o->kv_group_size, "mlx-lm snapshots: 32|64|128 (default: the file's, else 64)");
    sub->add_option("--mlx-device", o->mlx_device, "mlx-lm snapshots: cpu (default) or gpu (see kvsnap convert --help)");
    sub->add_option("--mlx-lm", o->mlx_lm, "mlx-lm snapshots: the mlx-lm release that will load it (see kvsnap convert --help)");
    sub->add_option("--kv-streams", o->kv_streams,
                    "KV streams of the server's cache: N for -np N without -kvu, 1 for -kvu or no -np (default: as "
                    "stored; with --server, when the server refuses the file, its slot count and then 1 are tried)")
        ->check(CLI::Range(1, 256));
    sub->add_option("--threads,-t", o->threads, "conversion threads (default: all cores)")->check(CLI::Range(0, 256));
    sub->add_flag("--force", o->force, "replace --out if it exists");
    sub->add_flag("--allow-plain", o->allow_plain,
                  "with a key: restore a plain (unencrypted) snapshot too; without it that is refused (exit 5), since "
                  "nothing protects a plain snapshot from whoever can write the catalog");
    sub->add_flag("--json", o->json, "machine-readable result");
    add_progress_flags(sub, o->progress);
    sub->footer("\nWithout --ctk/--ctv/--fa/--format/--tokens/--rotation/--dst-rotation/--target-build the output is\n"
                "the saved file, byte for byte.\n"
                "With --server, --ctk/--ctv/--fa not given are the profile's, else detected from a file the server saves\n"
                "of the slot (an empty slot, as after a restart, is given one token first: the restore overwrites it).\n"
                "What else changes a cache is not visible to kvsnap through the server: its LLAMA_ATTN_ROT_DISABLE=1\n"
                "(say --dst-rotation off) and its --rope-freq-base, --rope-scale, --yarn-*, --lora, --control-vector\n"
                "and --override-kv, which must be those of the server that saved the snapshot.\n"
                "An mlx-lm snapshot is restored as its prompt cache (.safetensors), requantized with --kv-bits, or\n"
                "moved to another release's layout with --mlx-lm.\n"
                "\nExamples:\n  kvsnap restore chat-42 -o slot.bin --ctk q8_0 --ctv q8_0\n"
                "  kvsnap restore mlx-chat -o q4.safetensors --kv-bits 4 --kv-group-size 64   # mlx-lm\n"
                "  kvsnap restore chat-42 --server http://127.0.0.1:8080 --slot-dir /srv/slots --ctk q8_0 --ctv q8_0 --check\n");
    bind(sub, o, run_restore, "restore", exit_status);
  }
}

}  // namespace kvsnap::cli

// kvsnap convert: a llama.cpp state file at one ctk/ctv (V layout, format
// version) into the file a llama.cpp started with other types accepts.
#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "base/json.h"
#include "base/json_access.h"
#include "base/printf_text.h"
#include "base/remedy.h"
#include "cli/progress.h"
#include "cli/commands.h"
#include "cli/era_options.h"
#include "cli/exit_codes.h"
#include "cli/open_state.h"
#include "format/ggml_types.h"
#include "format/mlx_prompt_cache.h"
#include "format/state_summary.h"
#include "migrate/conversion_spec.h"
#include "migrate/convert_state.h"
#include "migrate/source_rotation.h"

namespace kvsnap::cli {
namespace {

using json = nlohmann::ordered_json;

// Refuses an OUT that the output's rename would destroy rather than write: one of the command's
// inputs (IN, --model, --tokens: same inode), or a file that is not a regular one (a directory,
// a named pipe, a device), which the rename would replace by a regular file; and any other
// existing file without --force, as restore and export do (a review's finding: convert replaced
// whatever OUT named, a store's catalog included).
Status check_output(const ConvertOptions& o) {
  const std::string& out = o.out;
  KV_RETURN_IF_ERROR(refuse_irregular_output(out, "kvsnap convert"));
  struct stat b {};
  if (::stat(out.c_str(), &b) != 0) return Status::OK();  // a new file, or a dangling symlink: nothing lost
  for (const auto& [path, what] : {std::pair{&o.in, "the input file"}, {&o.model, "the model (--model)"},
                                   {&o.tokens, "the token file (--tokens)"}}) {
    struct stat a {};
    if (!path->empty() && ::stat(path->c_str(), &a) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
      return Status::InvalidArgument(out + ": is " + what + "; kvsnap never writes over its input");
  }
  if (!o.force) return Status::InvalidArgument(out + " exists; pass --force to replace it");
  return Status::OK();
}

ConversionSpec spec_of(const ConvertOptions& o) {
  ConversionSpec c;
  c.ctk = o.ctk;
  c.ctv = o.ctv;
  c.flash_attn = o.flash_attn;
  c.rotation = o.rotation;
  c.requant = o.requant;
  c.src_rotation = o.src_rotation;
  c.dst_rotation = o.dst_rotation;
  c.format = o.format;
  c.source_build = o.source_build;
  c.target_build = o.target_build;
  c.head_dim_k = o.head_dim_k;
  c.head_dim_v = o.head_dim_v;
  c.kv_streams = o.kv_streams;
  c.threads = o.threads;
  c.report = o.report || o.json;
  return c;
}

}  // namespace

Status run_convert(const ConvertOptions& o, std::string& out, std::string& warnings) {
  Io& io = cli_io();
  KV_RETURN_IF_ERROR(check_output(o));
  if (!o.to.empty()) return run_convert_cross(o, out);
  if (!o.tokens.empty() || !o.mlx_dtype.empty() || !o.llama_file.empty()) {
    return Status::InvalidArgument(o.in + ": --tokens/--mlx-dtype/--llama-file move a session between engines: give "
                                   "--to llama|mlx");
  }
  // An mlx-lm prompt cache (a safetensors header, told by content) goes its own way.
  if (auto f = io.open_read(o.in); f.ok() && looks_like_mlx_prompt_cache(**f)) return run_convert_mlx(o, **f, out);
  if (!o.kv_bits.empty() || o.kv_group_size || !o.mlx_lm.empty()) {
    return Status::InvalidArgument(o.in + ": not an mlx-lm prompt cache: --kv-bits/--kv-group-size/--mlx-lm are for "
                                   "mlx-lm files; for llama.cpp files give --ctk/--ctv");
  }
  KV_ASSIGN_OR_RETURN(OpenedState opened, open_state(io, o.in, o.model, o.input_format, o.src_types, o.source_build));
  const ReadableFile* file = opened.file.get();
  const StateFile& src = opened.state;
  std::string notes;
  SourceRotation rotation;
  KV_ASSIGN_OR_RETURN(ConvertRequest req,
                      make_request(spec_of(o), src, opened.model_ptr(), o.in, &notes, file, &rotation));
  if (!notes.empty()) warnings += "kvsnap convert: " + notes;

  // Every refusal of the plan comes before the output exists (convert_state plans again: it is cheap).
  if (auto plan = plan_target(src, req); !plan.ok()) return plan.status().Prefixed(o.in);
  const auto t0 = std::chrono::steady_clock::now();
  KV_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(io, o.out));
  Result<ConvertResult> converted = [&]() -> Result<ConvertResult> {
    ProgressDisplay shown("convert " + o.in, Counted::kRead, file->size(), o.progress.mode(o.json));
    return shown.finish(convert_state(src, *file, req, *writer));
  }();
  KV_ASSIGN_OR_RETURN(ConvertResult res, std::move(converted));
  KV_RETURN_IF_ERROR(writer->commit());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  json j;
  j["input"] = o.in;
  j["output"] = o.out;
  j["bytes_in"] = res.bytes_in;
  j["bytes_out"] = res.bytes_out;
  j["seconds"] = secs;
  j["threads"] = req.threads;
  j["requant"] = requant_mode_name(req.requant);
  auto streams = [](const StateFile& f) { return f.memory.kv.empty() ? size_t(1) : f.memory.kv[0].streams.size(); };
  j["source"] = {{"format", state_format_name(src)}, {"ctk", state_types(src, false)}, {"ctv", state_types(src, true)},
                 {"v_layout", state_v_layout(src)}, {"kv_streams", streams(src)}};
  j["target"] = {{"format", state_format_name(res.target)}, {"ctk", state_types(res.target, false)},
                 {"ctv", state_types(res.target, true)}, {"v_layout", state_v_layout(res.target)},
                 {"kv_streams", streams(res.target)}};
  json layers = json::array();
  for (const auto& r : res.layers) {
    layers.push_back({{"section", r.section}, {"layer", r.layer}, {"side", r.is_v ? "V" : "K"},
                      {"from", r.src_type}, {"to", r.dst_type}, {"rotation", r.rotation}, {"copied", r.copied},
                      {"values", r.values}, {"blocks_exact", r.blocks_exact},
                      {"blocks_requantized", r.blocks_requantized}, {"requant", r.requant}, {"rmse", r.rmse}, {"max_abs", r.max_abs},
                      {"snr_db", shown_snr_db(r.snr_db)}, {"signal_rms", r.signal_rms}});
  }
  j["layers"] = layers;
  j["source_rotation"] = source_rotation_json(rotation);
  if (o.json) {
    out = json_text(j, 2) + "\n";
    return Status::OK();
  }
  std::string buf;
  buf = printf_text("%s: %s, %llu bytes\n  -> %s: %s, %llu bytes, %.3f s\n", o.in.c_str(), describe_state(src).c_str(),
                    (unsigned long long)res.bytes_in, o.out.c_str(), describe_state(res.target).c_str(),
                    (unsigned long long)res.bytes_out, secs);
  out = buf;
  if (o.report) {
    out += source_rotation_text(rotation);
    buf = printf_text("  %-5s %-4s %-15s %-14s %12s %12s %9s\n", "layer", "side", "types", "rotation",
                  "rmse", "max|err|", "snr dB");
    out += buf;
    for (const auto& r : res.layers) {
      std::string types = r.src_type + "->" + r.dst_type;
      std::string layer = (res.target.memory.kv.size() > 1 ? std::to_string(r.section) + ":" : "") +
                          std::to_string(r.layer);
      if (r.copied) {
        buf = printf_text("  %-5s %-4s %-15s %-14s %12s %12s %9s\n", layer.c_str(), r.is_v ? "V" : "K",
                      types.c_str(), r.rotation.c_str(), "exact", "0", "inf");
      } else {
        buf = printf_text("  %-5s %-4s %-15s %-14s %12.3e %12.3e %9.2f\n", layer.c_str(),
                      r.is_v ? "V" : "K", types.c_str(), r.rotation.c_str(), r.rmse, r.max_abs,
                      shown_snr_db(r.snr_db));
      }
      out += buf;
    }
  }
  return Status::OK();
}

void setup_convert(CLI::App& app, int& exit_status) {
  auto o = std::make_shared<ConvertOptions>();
  auto* sub = app.add_subcommand(
      "convert",
      "Convert a llama.cpp slot/session file to other KV cache types (-ctk/-ctv), V layout (flash attention) or "
      "file format, so a server started with those settings restores it without reprocessing the prompt; or an "
      "mlx-lm prompt cache to other --kv-bits/--kv-group-size and/or the file layout of another mlx-lm release "
      "(--mlx-lm); or move a session between llama.cpp and mlx-lm (--to mlx|llama)");
  sub->add_option("in", o->in, "input state file (ggsq slot file, ggsn session file, raw buffer, or mlx-lm prompt cache)")->required();
  sub->add_option("out", o->out, "output file; written atomically, never over the input; an existing one only with --force")->required();
  sub->add_option("--ctk", o->ctk, "target K type: " + kv_cache_type_names() + " (default: keep)");
  sub->add_option("--ctv", o->ctv, "target V type (default: keep)");
  sub->add_option("--model,-m", o->model,
                  "the model's GGUF: head dims (needed when a conversion crosses the Hadamard rotation), exact layout, "
                  "and a check that the file belongs to it");
  sub->add_option("--flash-attn,--fa", o->flash_attn,
                  "flash attention of the target server: on = V stored as rows, off = V transposed (default: keep)");
  sub->add_option("--rotation", o->rotation,
                  "auto|on|off: whether the llama.cpp at both ends rotates quantized caches (see below)");
  add_source_options(sub, o->src_rotation, o->source_build, "the input");
  sub->add_option("--requant", o->requant,
                  "quantized -> quantized blocks: auto (default: exact from q8_0 into q4_0, q4_1, q5_0 or "
                  "q5_1, else quick), exact (a block the target holds exactly is kept, the others get "
                  "ggml's reference block: GB/s), quick (the others get the smaller error of the reference block, "
                  "4 nearby scales and a least-squares fit), search (16 nearby scales and up to 3 fits: closest "
                  "to the original values, but ~20-30 MB/s a thread where blocks do not fit), reference (ggml's "
                  "reference requantization of every block, exact ones too)")
      ->check(CLI::IsMember({"auto", "quick", "search", "exact", "reference"}));
  sub->add_option("--dst-rotation", o->dst_rotation,
                  "auto|on|off for the output only (off: the target server runs with LLAMA_ATTN_ROT_DISABLE=1)");
  add_target_build_option(sub, o->target_build, "the output");
  sub->add_option("--format", o->format,
                  "output format: " + target_format_names() + " (default: current; a raw buffer keeps its own)");
  sub->add_option("--head-dim-k", o->head_dim_k, "K head dim, when no --model is given");
  sub->add_option("--head-dim-v", o->head_dim_v, "V head dim, when no --model is given");
  sub->add_option("--kv-streams", o->kv_streams,
                  "KV streams of the target server's cache: N for -np N without -kvu (one per slot), 1 for -kvu or "
                  "no -np; a slot file restores only into a cache with as many (default: keep)")
      ->check(CLI::Range(1, 256));
  sub->add_option("--threads,-t", o->threads, "worker threads (default: all cores)")->check(CLI::Range(0, 256));
  sub->add_option("--input-format", o->input_format, "raw-seq or raw-context for raw state buffers");
  sub->add_option("--src-types", o->src_types,
                  "K/V: the cache types of a ggsn v6 (b3166) session, which records none, when its sizes fit several "
                  "pairs (q4_0/q8_0 vs iq4_nl/q8_0)");
  sub->add_option("--kv-bits", o->kv_bits,
                  "mlx-lm prompt caches: K/V bits 2|3|4|5|6|8 (MLX affine, as mx.quantize), or none to dequantize "
                  "(default: the file's)");
  sub->add_option("--kv-group-size", o->kv_group_size,
                  "mlx-lm prompt caches: values per scale/bias group, 32|64|128 (default: the file's, else 64)");
  sub->add_option("--mlx-device", o->mlx_device,
                  "mlx-lm prompt caches: quantize as MLX's cpu backend does (default; mlx[cpu]) or as its gpu kernel "
                  "(Metal/CUDA: what a Mac writes)");
  sub->add_option("--mlx-lm", o->mlx_lm,
                  "mlx-lm prompt caches: the mlx-lm release that will load the output (e.g. 0.28.0, 0.31.3, 0.32.2; "
                  "`pip show mlx-lm` says yours): the file is moved to its layout (alone, or with --kv-bits); also "
                  "what decides 'step' for a float file of mlx-lm 0.19-0.31 going to --kv-bits. A layout name "
                  "(meta_state-with-step, meta_state, scalars) stands for 0.28.0, 0.31.3, 0.32.2");
  sub->add_option("--to", o->to,
                  "mlx|llama: move the session to the other engine (same model in both; --model required): a "
                  "llama.cpp slot/session file to an mlx-lm prompt cache, or a prompt cache to a llama.cpp slot or "
                  "session file (--llama-file)");
  sub->add_option("--tokens", o->tokens,
                  "--to llama: file with the prompt's token ids (JSON list or whitespace-separated), when the prompt "
                  "cache has no 'tokens' metadata (mlx-lm stores none; kvsnap's --to mlx writes them)");
  sub->add_option("--llama-file", o->llama_file,
                  "--to llama: slot (default: llama_state_seq_load_file, llama-server's slot restore) or session "
                  "(llama_state_load_file: the whole context, one sequence)");
  sub->add_option("--mlx-dtype", o->mlx_dtype,
                  "--to mlx: f16|bf16|f32 float type of the KVCache (default: the float type the file's K and V "
                  "share; f16 for a quantized cache, f32 when K and V differ)");
  sub->add_flag("--force", o->force, "replace OUT if it exists (never one of the inputs)");
  sub->add_flag("--report", o->report, "per layer and side: RMSE, max |error| and SNR of the conversion");
  sub->add_flag("--json", o->json, "machine-readable summary including the per-layer report");
  add_progress_flags(sub, o->progress);
  sub->footer(
      "\nExamples:\n"
      "  kvsnap convert slot-f16.bin slot-q8.bin --ctk q8_0 --ctv q8_0 --model model.gguf\n"
      "  kvsnap convert slot.bin slot-nofa.bin --flash-attn off          # for a server run without -fa\n"
      "  kvsnap convert old-b8121.bin new.bin                            # upgrade the format only\n"
      "  kvsnap convert slot.bin s.bin --ctk q4_0 --model m.gguf --report\n"
      "  kvsnap convert old-q8.bin f16.bin --ctk f16 --ctv f16 --model m.gguf --source-build b10361\n"
      "  kvsnap convert new.bin for-b8121.bin --ctk q8_0 --ctv q8_0 --model m.gguf --target-build b8121\n"
      "  kvsnap convert prompt.safetensors q4.safetensors --kv-bits 4 --kv-group-size 64 --report   # mlx-lm\n"
      "  kvsnap convert slot.bin prompt.safetensors --to mlx --model m.gguf [--kv-bits 8] [--mlx-lm 0.31.3]\n"
      "  kvsnap convert prompt.safetensors slot.bin --to llama --model m.gguf --ctk q8_0 --ctv q8_0 [--tokens t.json]\n"
      "  kvsnap convert prompt.safetensors s.session --to llama --model m.gguf --llama-file session\n"
      "  kvsnap convert prompt-0.32.safetensors for-0.28.safetensors --mlx-lm 0.28.0    # mlx-lm 0.32 file, 0.28 reader\n"
      "  kvsnap convert old.safetensors new-q8.safetensors --mlx-lm 0.32.2 --kv-bits 8  # move and requantize\n"
      "\nmlx-lm releases save prompt caches in four layouts: '<i>_keys' tensors (0.18.x, read only),\n"
      "meta_state strings with 'step' (0.19.1-0.28.0), without it (0.28.1-0.31.x), and scalar tensors\n"
      "(0.32.0 on); none loads another's. --mlx-lm VERSION moves a file to that release's layout and\n"
      "class names (MambaCache became ArraysCache in 0.30.6; CacheList loads from 0.31.0), tensors\n"
      "carried byte for byte; a layer the release cannot load is refused (exit 4), naming it.\n"
      "\nRotation: llama.cpp from b8643 stores quantized K/V Hadamard-rotated; the file does not say so, and\n"
      "ggsq v2 / ggsn v9 files come from builds on both sides. kvsnap decides from --src-rotation,\n"
      "--source-build, the file's layout, then the data (with --model), reports the evidence (--report),\n"
      "and stops with exit 6 when nothing decides and the conversion depends on it.\n"
      "\nBetween engines (--to mlx|llama, docs/mlx.md): llama family (K pairs permuted back to mlx-lm's\n"
      "rotate-half order) and NEOX-rope families; the Hadamard rotation is undone or applied, ggml types\n"
      "dequantized, transposed V read as rows. mlx-lm stores no token ids: --to mlx keeps the llama.cpp\n"
      "file's in the cache's 'tokens' metadata, --to llama reads them back (or --tokens). iSWA models\n"
      "other than gemma3 and gemma2, hybrid, recurrent, MLA and M-RoPE models, LongRoPE (long and short\n"
      "rope factors), and caches that do not fit --model, are refused.\n");
  sub->callback([o, &exit_status]() {
    std::string out, warnings;
    Status s = run_convert(*o, out, warnings);
    if (!warnings.empty()) std::fputs(shown_text(render_remedies_as_flags(warnings), /*keep_lines=*/true).c_str(), stderr);
    exit_status = report("convert", s, out);
  });
}

}  // namespace kvsnap::cli

// kvsnap-bench: throughput of kvsnap's row conversions in GB/s of input, beside ggml's own
// routines and memcpy on the same data in the same run. See docs/performance.md.
//
// For each conversion (f16 -> q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl; q8_0 -> f16; and quantized ->
// quantized: q4_0 -> q8_0, q8_0 -> q4_0, q5_0 -> q4_0, q8_0 -> iq4_nl) on K rows of
// n_head_kv x head_dim values (default 8 x 128, llama.cpp's rotation rule with n_rot 128):
//   kvsnap 1T    what `kvsnap convert` runs, one thread: RowConverter (to_f32, rotation step,
//                from_f32), or for quantized -> quantized in one rotation domain ExactRequantizer
//                (exact blocks kept, the others the smaller error of ggml's reference block and a
//                scale search), then RowConverter (the reference requantization) beside it
//   kvsnap NT    the same rows split over N threads, one converter each
//   ggml ref     ggml's reference path, one thread: type_traits(src)->to_float, the same rotation
//                as llama.cpp's CPU backend computes it (mul_mat with GGML_HINT_SRC0_IS_HADAMARD,
//                i.e. its fast Walsh-Hadamard transform), ggml_quantize_chunk
//   ggml cpu     llama.cpp's CPU backend store without rotation, one thread: to_float (the CPU
//                backend's fp16 row conversion for f16) and type_traits_cpu(dst)->from_float
//                (SIMD where the backend has it) from the libggml-cpu-*.so variant of kvsnap's
//                SIMD level (ggml_variant_for: haswell for avx2, x64 for scalar, the best for
//                this CPU at the top level), so that a ratio compares code of one instruction set
//   memcpy       memcpy of the same input bytes
// and the ratios. Then the end-to-end convert_state() of an in-memory slot file (K and V,
// 1 thread and N threads) for the multithreaded pipeline. Nothing here asserts time.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "base/io.h"
#include "base/os.h"
#include "base/simd_level.h"
#include "bench/kv_rows.h"
#include "format/llama_state.h"
#include "migrate/convert_row.h"
#include "migrate/convert_state.h"
#include "migrate/exact_requant.h"
#include "migrate/hadamard.h"
#include "migrate/mlx_affine.h"
#include "migrate/type_traits.h"

#ifdef KVSNAP_BENCH_GGML_LIBDIR
#include <dirent.h>
#include <dlfcn.h>

#include "ggml-cpu.h"
#include "ggml.h"
#endif

namespace kvsnap::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- options ---------------------------------------------------------------------------------

struct Options {
  bool quick = false;
  double mb = 256;          // MB of f16 input data (other sources: the same values, quantized)
  double seconds = 1.0;     // time per measured cell
  int rounds = 5;           // the best of this many rounds counts
  bool wall = false;        // one-thread cells in wall time instead of the thread's CPU time
  unsigned threads = 0;     // 0: hardware concurrency
  uint32_t head_dim = 128;  // K head dim: n_rot = 128
  uint32_t n_head = 8;      // heads per row: a row is n_head * head_dim values
  uint32_t chunk_rows = 64; // rows per call
  bool state = true;        // end-to-end convert_state table
  bool ggml = true;
  bool mlx = true;          // the MLX affine table (and its mx.quantize baseline when mlx_python runs)
  std::string mlx_python;   // an interpreter with mlx (default: ~/.cache/kvsnap-mlx-venv/bin/python)
  std::string only;
};

void usage() {
  std::printf(
      "usage: kvsnap-bench [--quick] [--mb N] [--seconds S] [--rounds R] [--wall] [--threads N] [--head-dim D]\n"
      "                    [--heads H] [--chunk-rows R] [--only NAME] [--no-state] [--no-ggml] [--no-mlx]\n"
      "                    [--mlx-python P] [--simd LEVEL]\n"
      "  --quick       small data and short cells (seconds in all; for CI)\n"
      "  --mb N        MB of f16 input (default 256)\n"
      "  --seconds S   time per cell (default 1.0), split into rounds\n"
      "  --rounds R    rounds per cell; the best round counts (default 5)\n"
      "  --wall        one-thread cells in wall-clock time (default: the thread's CPU time)\n"
      "  --threads N   threads of the all-threads columns (default: all cores)\n"
      "  --only NAME   one conversion, e.g. f16-q8_0 (mlx: only the MLX affine table)\n"
      "  --no-mlx      no MLX affine table\n"
      "  --mlx-python P  the Python with mlx that times mx.quantize for the MLX table's baseline\n"
      "                (default ~/.cache/kvsnap-mlx-venv/bin/python; without one: kvsnap's figures only)\n"
      "  --simd LEVEL  kvsnap's codec level: scalar, avx2, avx512, neon on aarch64 (default: the best this CPU has), or\n"
      "                all: every level this CPU has, one after the other, each against ggml's CPU\n"
      "                variant of the same level, then the ratios of all levels in one table\n");
}

// ---- the machine ---------------------------------------------------------------------------

// /proc/cpuinfo and /proc/loadavg on Linux, sysctl and getloadavg on macOS (base/os.h).
std::string cpu_model() { return kvsnap::cpu_model_name(); }
std::string loadavg() { return kvsnap::load_average_text(); }

// ---- timing ----------------------------------------------------------------------------------

struct Rate {
  double gbps = 0;       // GB/s of input (1e9 bytes)
  bool valid = false;
  double wall_gbps = 0;  // the same cell in wall-clock time
};

// The machine may be shared (other builds, tests), so a cell is measured in rounds and the
// best round counts: the rate the code reaches when it has the core. A round calls fn(chunk)
// for chunk = i, i + 1, ... (mod n_chunks) until round_s have passed; fn returns the input bytes
// it consumed. One call first to warm up.
struct Timing {
  double seconds = 1.0;  // total per cell (at least one round)
  int rounds = 5;
  bool cpu_time = true;  // one-thread cells: the thread's CPU time (immune to time slicing)
};

// CPU time of the calling thread.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// One thread. The rate is bytes per second of the thread's CPU time (tm.cpu_time) or of wall
// time: on a machine shared with other processes the CPU time counts only the time the code
// actually ran, so both sides of a ratio are measured the same way whatever the load.
//
// Several one-thread cells of a row are timed together, their rounds interleaved (a round of
// each, then the next round of each): a machine whose speed drifts (other tenants of the host)
// then slows both sides of a ratio alike, where cells timed one after the other would catch
// different phases.
struct Loop {
  size_t n_chunks;
  std::function<uint64_t(size_t)> fn;  // converts chunk i, returns the input bytes
  Rate* out;
  size_t next = 1;
  double best = 0, best_wall = 0;
};

void time_loops(std::vector<Loop>& loops, const Timing& tm) {
  for (Loop& l : loops) l.fn(0);  // warm up
  const double round_s = tm.seconds / tm.rounds;
  for (int r = 0; r < tm.rounds; r++) {
    for (Loop& l : loops) {
      uint64_t bytes = 0;
      const auto t0 = Clock::now();
      const double c0 = thread_cpu_seconds();
      double t = 0;
      do {
        bytes += l.fn(l.next % l.n_chunks);
        l.next++;
        t = seconds_since(t0);
      } while (t < round_s);
      const double secs = tm.cpu_time ? std::max(1e-9, thread_cpu_seconds() - c0) : t;
      l.best = std::max(l.best, static_cast<double>(bytes) / secs * 1e-9);
      l.best_wall = std::max(l.best_wall, static_cast<double>(bytes) / t * 1e-9);
    }
  }
  for (Loop& l : loops) *l.out = Rate{l.best, true, l.best_wall};
}

Rate time_loop(size_t n_chunks, const Timing& tm, const std::function<uint64_t(size_t)>& fn) {
  Rate rate;
  std::vector<Loop> loops{Loop{n_chunks, fn, &rate}};
  time_loops(loops, tm);
  return rate;
}

// N threads, thread w does chunks w, w + N, ... (mod n_chunks); in each round all threads start
// together and run for round_s; the round's rate is the sum of the threads' rates, the best
// round counts.
Rate time_threads(unsigned n_threads, size_t n_chunks, const Timing& tm,
                  const std::function<std::function<uint64_t(size_t)>(unsigned)>& make_worker) {
  std::vector<std::function<uint64_t(size_t)>> fns;
  for (unsigned w = 0; w < n_threads; w++) fns.push_back(make_worker(w));
  for (unsigned w = 0; w < n_threads; w++) fns[w](w % n_chunks);  // warm up
  const double round_s = tm.seconds / tm.rounds;
  double best = 0;
  std::vector<size_t> next(n_threads);
  for (unsigned w = 0; w < n_threads; w++) next[w] = w;
  for (int r = 0; r < tm.rounds; r++) {
    std::atomic<unsigned> ready{0};
    std::atomic<bool> go{false};
    std::vector<uint64_t> bytes(n_threads, 0);
    std::vector<double> secs(n_threads, 0);
    auto body = [&](unsigned w) {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      const auto t0 = Clock::now();
      double t = 0;
      do {
        bytes[w] += fns[w](next[w] % n_chunks);
        next[w] += n_threads;
        t = seconds_since(t0);
      } while (t < round_s);
      secs[w] = t;
    };
    std::vector<std::thread> pool;
    for (unsigned w = 1; w < n_threads; w++) pool.emplace_back(body, w);
    while (ready.load() + 1 < n_threads) {
    }
    go.store(true, std::memory_order_release);
    body(0);
    for (auto& t : pool) t.join();
    double gbps = 0;
    for (unsigned w = 0; w < n_threads; w++) gbps += static_cast<double>(bytes[w]) / secs[w] * 1e-9;
    best = std::max(best, gbps);
  }
  return Rate{best, true, best};
}

// ---- ggml ------------------------------------------------------------------------------------

#ifdef KVSNAP_BENCH_GGML_LIBDIR
// The CPU backend, loaded the way ggml_backend_load_best() does: every libggml-cpu-*.so
// variant in the directory, the one whose ggml_backend_score() is highest.
struct GgmlCpu {
  void* handle = nullptr;
  std::string variant;
  decltype(&ggml_get_type_traits_cpu) traits_cpu = nullptr;
  decltype(&ggml_cpu_fp16_to_fp32) fp16_to_fp32 = nullptr;
  decltype(&ggml_graph_plan) graph_plan = nullptr;
  decltype(&ggml_graph_compute) graph_compute = nullptr;

  // `want`: that variant only (a file name in dir); empty: the best for this CPU.
  static std::unique_ptr<GgmlCpu> load(const std::string& dir, const std::string& want, std::string* err) {
    DIR* d = opendir(dir.c_str());
    if (!d) {
      *err = "cannot list " + dir;
      return nullptr;
    }
    std::vector<std::string> libs;
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("libggml-cpu-", 0) == 0 && name.size() > 3 && name.substr(name.size() - 3) == ".so" &&
          (want.empty() || name == want)) {
        libs.push_back(name);
      }
    }
    closedir(d);
    std::sort(libs.begin(), libs.end());
    void* best = nullptr;
    int best_score = 0;
    std::string best_name;
    for (const auto& name : libs) {
      void* h = dlopen((dir + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) continue;
      auto score = reinterpret_cast<int (*)()>(dlsym(h, "ggml_backend_score"));
      const int s = score ? score() : 0;  // 0: the variant needs an instruction this CPU lacks
      if (s > best_score) {
        if (best) dlclose(best);
        best = h;
        best_score = s;
        best_name = name;
      } else {
        dlclose(h);
      }
    }
    if (!best) {
      *err = (want.empty() ? std::string("no libggml-cpu-*.so variant") : want) + " loads on this CPU in " + dir;
      return nullptr;
    }
    auto g = std::make_unique<GgmlCpu>();
    g->handle = best;
    g->variant = best_name;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(best, name));
      if (!fn) *err += std::string(err->empty() ? "" : ", ") + "no " + name + " in " + best_name;
    };
    sym(g->traits_cpu, "ggml_get_type_traits_cpu");
    sym(g->fp16_to_fp32, "ggml_cpu_fp16_to_fp32");
    sym(g->graph_plan, "ggml_graph_plan");
    sym(g->graph_compute, "ggml_graph_compute");
    decltype(&ggml_cpu_init) init = nullptr;
    sym(init, "ggml_cpu_init");
    if (!err->empty()) return nullptr;
    init();
    return g;
  }
};

// llama.cpp's rotation on the CPU backend for `cols` blocks of n_rot floats, in place through
// a graph built once: mul_mat(H, x) with GGML_HINT_SRC0_IS_HADAMARD, one thread.
class GgmlRotation {
 public:
  GgmlRotation(const GgmlCpu& cpu, uint32_t n_rot, size_t n_values) : cpu_(cpu) {
    const size_t cols = n_values / n_rot;
    const size_t mem = (static_cast<size_t>(n_rot) * n_rot + 2 * n_values) * sizeof(float) +
                       8 * ggml_tensor_overhead() + ggml_graph_overhead() + (1 << 16);
    ggml_init_params p = {mem, nullptr, false};
    ctx_ = ggml_init(p);
    ggml_tensor* h = ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, n_rot, n_rot);
    x_ = ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, n_rot, static_cast<int64_t>(cols));
    y_ = ggml_mul_mat(ctx_, h, x_);
    ggml_mul_mat_set_hint(y_, GGML_HINT_SRC0_IS_HADAMARD);
    const std::vector<float> hm = hadamard_matrix(n_rot);  // == ggml_gen_hadamard
    std::memcpy(h->data, hm.data(), hm.size() * sizeof(float));
    gf_ = ggml_new_graph(ctx_);
    ggml_build_forward_expand(gf_, y_);
    plan_ = cpu_.graph_plan(gf_, 1, nullptr);
    work_.resize(plan_.work_size + 64);
    plan_.work_data = work_.data();
  }
  ~GgmlRotation() { ggml_free(ctx_); }
  float* input() { return static_cast<float*>(x_->data); }
  const float* run() {
    cpu_.graph_compute(gf_, &plan_);
    return static_cast<const float*>(y_->data);
  }

 private:
  const GgmlCpu& cpu_;
  ggml_context* ctx_ = nullptr;
  ggml_tensor *x_ = nullptr, *y_ = nullptr;
  ggml_cgraph* gf_ = nullptr;
  ggml_cplan plan_{};
  std::vector<uint8_t> work_;
};
#endif

// ---- the conversions -------------------------------------------------------------------------

struct Conversion {
  const char* name;
  GgmlType src, dst;
};
constexpr Conversion kConversions[] = {
    {"f16-q8_0", GgmlType::kF16, GgmlType::kQ8_0},     {"f16-q4_0", GgmlType::kF16, GgmlType::kQ4_0},
    {"f16-iq4_nl", GgmlType::kF16, GgmlType::kIQ4_NL}, {"q8_0-f16", GgmlType::kQ8_0, GgmlType::kF16},
    {"q4_0-q8_0", GgmlType::kQ4_0, GgmlType::kQ8_0},   {"q8_0-q4_0", GgmlType::kQ8_0, GgmlType::kQ4_0},
    {"f16-q4_1", GgmlType::kF16, GgmlType::kQ4_1},     {"f16-q5_0", GgmlType::kF16, GgmlType::kQ5_0},
    {"f16-q5_1", GgmlType::kF16, GgmlType::kQ5_1},     {"q5_0-q4_0", GgmlType::kQ5_0, GgmlType::kQ4_0},
    {"q8_0-iq4_nl", GgmlType::kQ8_0, GgmlType::kIQ4_NL}, {"q4_1-q4_0", GgmlType::kQ4_1, GgmlType::kQ4_0},
    // into an offset target: the float quick search (no integer kernel for these targets yet)
    {"q5_1-q4_1", GgmlType::kQ5_1, GgmlType::kQ4_1},
};

bool is_conversion_name(const std::string& name) {
  for (const Conversion& c : kConversions)
    if (name == c.name) return true;
  return false;
}
std::string conversion_names() {
  std::string out;
  for (const Conversion& c : kConversions) out += std::string(" ") + c.name;
  return out;
}

struct Row {
  std::string name, rotation;
  bool exact = false;  // kvsnap's cells are ExactRequantizer's (what convert runs for this pair)
  Rate ours1, oursN, ggml_ref, ggml_cpu, memcpy_;
  Rate rows1;  // exact rows: RowConverter, the reference requantization (ggml_quantize_chunk's bytes)
  Rate state1, stateN;
};

std::string fmt_rate(const Rate& r) {
  if (!r.valid) return "-";
  char b[32];
  std::snprintf(b, sizeof b, r.gbps < 0.1 ? "%.4f" : "%.3f", r.gbps);
  return b;
}
std::string fmt_ratio(const Rate& a, const Rate& b, bool wall = false) {
  if (!a.valid || !b.valid || b.gbps <= 0) return "-";
  char s[32];
  const double q = wall ? a.wall_gbps / b.wall_gbps : a.gbps / b.gbps;
  std::snprintf(s, sizeof s, q >= 100 ? "%.0fx" : q >= 10 ? "%.1fx" : q >= 0.1 ? "%.2fx" : "%.4fx", q);
  return s;
}

// One ggsq v3 slot file in memory: n_layer layers of `cells` K and V rows of n values of `type`,
// the values taken from `x` (rows of n floats, reused cyclically). K and V share the layout.
std::vector<std::byte> make_slot_file(const TypeTraits& t, const std::vector<std::byte>& rows_bytes, uint64_t row_bytes,
                                      uint32_t n_layer, uint32_t cells) {
  std::vector<std::byte> b;
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
  };
  auto u64 = [&](uint64_t v) {
    u32(static_cast<uint32_t>(v));
    u32(static_cast<uint32_t>(v >> 32));
  };
  const uint64_t avail_rows = rows_bytes.size() / row_bytes;
  uint64_t next_row = 0;
  auto rows = [&](uint64_t n) {
    for (uint64_t r = 0; r < n; r++, next_row = (next_row + 1) % avail_rows) {
      const std::byte* p = rows_bytes.data() + next_row * row_bytes;
      b.insert(b.end(), p, p + row_bytes);
    }
  };
  u32(kMagicGgsq);
  u32(3);
  u32(3);  // three tokens
  u32(1);
  u32(2);
  u32(3);
  u32(1);  // n_stream
  u32(cells);
  for (uint32_t c = 0; c < cells; c++) {
    u32(c);  // pos
    u32(1);  // one seq id
    u32(0);
  }
  u32(0);  // v_trans
  u32(n_layer);
  for (uint32_t l = 0; l < n_layer; l++) {
    u32(static_cast<uint32_t>(t.id()));
    u64(row_bytes);
    rows(cells);
  }
  for (uint32_t l = 0; l < n_layer; l++) {
    u32(static_cast<uint32_t>(t.id()));
    u64(row_bytes);
    rows(cells);
  }
  return b;
}

// The CPU backend variant whose instruction set matches kvsnap's level `l` (a file name in the
// test bed's lib directory; empty: the best variant for this CPU, by ggml_backend_score):
//   scalar  libggml-cpu-x64.so: built with no ISA flag beyond x86-64's SSE2, like kvsnap's scalar
//           codecs (plain C++ at the project's flags). -sse42 would add SSE3/SSSE3/SSE4.x, which
//           ggml's quantizers use (its SSE paths) and kvsnap's scalar level does not.
//   avx2    libggml-cpu-haswell.so: AVX2 + FMA + F16C (+ BMI2), exactly what kvsnap's avx2 level
//           requires (x86-64-v3).
//   above   the best variant (on an AVX-512 CPU an AVX-512 one: zen4, skylakex, ...).
#ifdef KVSNAP_BENCH_GGML_LIBDIR
std::string ggml_variant_for(simd::Level l) {
  if (l == simd::Level::kScalar) return "libggml-cpu-x64.so";
  if (l == simd::Level::kAvx2) return "libggml-cpu-haswell.so";
  return "";
}
#endif

// Issue 13's targets for one row at a SIMD level above scalar (one thread): the ratio of
// kvsnap 1T to which ggml column, and how much (want 0: no target for this conversion).
struct Target {
  Rate Row::* base = &Row::ggml_cpu;
  double want = 0;
  const char* what = "";
};
Target target_of(simd::Level l, const Row& r) {
  if (r.name == "f16-q8_0") return {&Row::ggml_cpu, 1.0, "with rotation >= 1x ggml cpu q8_0 (no rotation)"};
  if (r.name == "q8_0-f16") return {&Row::ggml_cpu, 1.0, "with unrotation >= 1x ggml cpu (no rotation)"};
  if (r.name == "f16-q4_0" || r.name == "f16-q4_1" || r.name == "f16-q5_0" || r.name == "f16-q5_1") {
    return {&Row::ggml_cpu, 3.0, "with rotation >= 3x ggml cpu (no rotation)"};
  }
  if (r.name == "q4_0-q8_0" || r.name == "q8_0-q4_0" || r.name == "q5_0-q4_0" || r.name == "q8_0-iq4_nl" ||
      r.name == "q4_1-q4_0" || r.name == "q5_1-q4_1") {
    return {&Row::ggml_cpu, 2.0, r.exact ? ">= 2x ggml cpu (kvsnap: ExactRequantizer, --requant auto)" : ">= 2x ggml cpu"};
  }
  if (r.name == "f16-iq4_nl") {  // 50x at AVX2 (issue 13); the AVX-512 kernel's own target is 100x
    if (l == simd::Level::kAvx512) return {&Row::ggml_ref, 100.0, ">= 100x ggml's reference path"};
    return {&Row::ggml_ref, 50.0, ">= 50x ggml's reference path"};
  }
  return {};
}

void print_targets(simd::Level l, const std::vector<Row>& table) {
  if (l == simd::Level::kScalar) {
    std::printf("\ntargets: none at the scalar level (issue 13 sets them for the SIMD levels)\n");
    return;
  }
  std::printf("\ntargets at %s (one thread):\n", simd::level_name(l));
  for (const Row& r : table) {
    const Target t = target_of(l, r);
    if (t.want == 0) continue;
    const Rate& base = r.*t.base;
    if (!base.valid) {
      std::printf("  %-11s %s: no ggml figure in this run\n", r.name.c_str(), t.what);
      continue;
    }
    const double q = r.ours1.gbps / base.gbps;
    std::printf("  %-11s %s: %.2fx -> %s\n", r.name.c_str(), t.what, q, q >= t.want ? "met" : "NOT met");
  }
}

// ---- MLX affine (mlx-lm's QuantizedKVCache, migrate/mlx_affine.h) ------------------------

// mx.quantize / mx.dequantize on MLX's CPU backend, timed by bench/mlx_affine_bench.py in a child
// process (per second of its CPU time, the best of its rounds): "quantize 4" -> GB/s of input.
// Empty when no Python with mlx runs.
std::map<std::string, double> mlx_baseline(const Options& opt, uint64_t rows, int dim, int group, int from_bits) {
  std::string py = opt.mlx_python;
  if (py.empty()) {
    const char* home = std::getenv("HOME");
    py = std::string(home ? home : "") + "/.cache/kvsnap-mlx-venv/bin/python";
  }
  std::map<std::string, double> out;
  if (access(py.c_str(), X_OK) != 0) return out;
  char args[256];
  std::snprintf(args, sizeof args, " --rows %" PRIu64 " --dim %d --group %d --bits 2,3,4,5,6,8 --from-bits %d --seconds %g --rounds %d",
                rows, dim, group, from_bits, opt.seconds, opt.rounds);
  const std::string cmd = py + " " KVSNAP_BENCH_SOURCE_DIR "/mlx_affine_bench.py" + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char op[32];
  int bits = 0, g = 0;
  double gbps = 0;
  while (std::fscanf(p, "%31s %d %d %lf", op, &bits, &g, &gbps) == 4) out[std::string(op) + " " + std::to_string(bits)] = gbps;
  pclose(p);
  return out;
}

// kvsnap's MLX rows against mx.quantize on the CPU: bf16 rows of head_dim values quantized at
// every bits (group 64), dequantized, and requantized from 8 bits, each row as
// migrate/mlx_requant.cc converts it (floats of T in, mlx_affine_quantize_row /
// mlx_affine_dequantize_row, scales and biases stored as T).
int run_mlx(const Options& opt) {
  const int dim = static_cast<int>(opt.head_dim), group = 64, from_bits = 8;
  const MlxFloat t = MlxFloat::kBF16;
  const size_t ts = mlx_float_size(t), groups = size_t(dim / group);
  const uint64_t chunk = opt.chunk_rows;
  const uint64_t rows = std::max<uint64_t>(chunk * 4, uint64_t(std::min(opt.mb, 64.0) * 1e6) / (dim * ts) / chunk * chunk);
  const size_t n_chunks = rows / chunk;
  const Timing tm{opt.seconds, opt.rounds, !opt.wall};
  std::printf("\nMLX affine (mlx-lm QuantizedKVCache), %s level: %" PRIu64 " rows of %d BF16 values (%.0f MB), group %d, "
              "%" PRIu64 " rows per call\n",
              simd::level_name(simd::level()), rows, dim, rows * dim * ts / 1e6, group, chunk);
  const std::vector<float> x = make_rows(rows, static_cast<uint32_t>(dim), 777);
  std::vector<std::byte> src(rows * dim * ts);
  mlx_store_floats(t, x.data(), x.size(), src.data());
  struct Packed {  // a quantized copy: codes, scales, biases (T)
    int bits = 0;
    std::vector<std::byte> codes, sc, bi;
  };
  std::vector<float> xf(dim), y(dim), qs(groups), qb(groups);
  // one row of T values (or floats already in xf when `in` is null) -> codes + scales + biases
  auto quant_row = [&](const std::byte* in, int bits, std::byte* codes, std::byte* sc, std::byte* bi) {
    if (in) mlx_load_floats(t, in, size_t(dim), xf.data());
    mlx_affine_quantize_row(xf.data(), dim, bits, group, MlxDevice::kCpu, codes, qs.data(), qb.data());
    mlx_store_floats(t, qs.data(), groups, sc);
    mlx_store_floats(t, qb.data(), groups, bi);
  };
  // one packed row -> floats in xf (and T values in `out` unless null)
  auto dequant_row = [&](const Packed& q, uint64_t r, std::byte* out) {
    const size_t cb = mlx_affine_row_bytes(dim, q.bits);
    mlx_load_floats(t, q.sc.data() + r * groups * ts, groups, qs.data());
    mlx_load_floats(t, q.bi.data() + r * groups * ts, groups, qb.data());
    mlx_affine_dequantize_row(q.codes.data() + r * cb, qs.data(), qb.data(), dim, q.bits, group, t, xf.data());
    if (out) mlx_store_floats(t, xf.data(), size_t(dim), out);
  };
  auto packed = [&](int bits) {
    Packed q;
    q.bits = bits;
    q.codes.resize(rows * mlx_affine_row_bytes(dim, bits));
    q.sc.resize(rows * groups * ts);
    q.bi.resize(rows * groups * ts);
    return q;
  };
  auto quantize_all = [&](int bits) {
    Packed q = packed(bits);
    const size_t cb = mlx_affine_row_bytes(dim, bits);
    for (uint64_t r = 0; r < rows; r++) {
      quant_row(src.data() + r * dim * ts, bits, q.codes.data() + r * cb, q.sc.data() + r * groups * ts,
                q.bi.data() + r * groups * ts);
    }
    return q;
  };
  const Packed q8 = quantize_all(from_bits);
  struct Cell {
    std::string name;
    Rate ours;
    std::string mx_key;  // its line in mlx_affine_bench.py's output ("quantize 4")
    double mx = 0;
  };
  std::vector<Cell> cells;
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    const Packed q = bits == from_bits ? q8 : quantize_all(bits);
    Packed out = packed(bits);
    std::vector<std::byte> back(src.size());
    const size_t cb = mlx_affine_row_bytes(dim, bits), cb8 = mlx_affine_row_bytes(dim, from_bits);
    const uint64_t q_row = cb + 2 * groups * ts, q8_row = cb8 + 2 * groups * ts;
    std::vector<Loop> loops;
    const std::string b = " " + std::to_string(bits);
    Cell cq{"bf16 -> q" + std::to_string(bits) + "g64 (quantize)", {}, "quantize" + b};
    Cell cd{"q" + std::to_string(bits) + "g64 -> bf16 (dequantize)", {}, "dequantize" + b};
    Cell cr{"q8g64 -> q" + std::to_string(bits) + "g64 (requantize)", {}, "requantize" + b};
    loops.push_back(Loop{n_chunks, [&](size_t i) -> uint64_t {
                           for (uint64_t r = i * chunk; r < (i + 1) * chunk; r++) {
                             quant_row(src.data() + r * dim * ts, bits, out.codes.data() + r * cb,
                                       out.sc.data() + r * groups * ts, out.bi.data() + r * groups * ts);
                           }
                           return chunk * dim * ts;
                         },
                         &cq.ours});
    loops.push_back(Loop{n_chunks, [&](size_t i) -> uint64_t {
                           for (uint64_t r = i * chunk; r < (i + 1) * chunk; r++) dequant_row(q, r, back.data() + r * dim * ts);
                           return chunk * q_row;
                         },
                         &cd.ours});
    if (bits != from_bits) {
      loops.push_back(Loop{n_chunks, [&](size_t i) -> uint64_t {
                             for (uint64_t r = i * chunk; r < (i + 1) * chunk; r++) {
                               dequant_row(q8, r, nullptr);
                               quant_row(nullptr, bits, out.codes.data() + r * cb, out.sc.data() + r * groups * ts,
                                         out.bi.data() + r * groups * ts);
                             }
                             return chunk * q8_row;
                           },
                           &cr.ours});
    }
    time_loops(loops, tm);
    cells.push_back(cq);
    cells.push_back(cd);
    if (bits != from_bits) cells.push_back(cr);
  }
  // After kvsnap's cells (not interleaved with them: MLX runs in a child process), on rows of its
  // own of the same shape (mx.random.normal), per second of that process's CPU time.
  const std::map<std::string, double> mx = mlx_baseline(opt, rows, dim, group, from_bits);
  for (Cell& c : cells) c.mx = mx.count(c.mx_key) ? mx.at(c.mx_key) : 0;
  std::printf("baseline: %s\n\n", mx.empty() ? "no Python with mlx (--mlx-python): kvsnap's figures only"
                                             : "mx.quantize / mx.dequantize on MLX's CPU backend (bench/mlx_affine_bench.py, "
                                               "per second of its process CPU time, timed after kvsnap's cells, not "
                                               "interleaved with them, on random rows of its own of the same shape)");
  std::printf("| conversion | kvsnap 1T | mx cpu | kvsnap / mx |\n| --- | ---: | ---: | ---: |\n");
  for (const Cell& c : cells) {
    const Rate base{c.mx, c.mx > 0, 0};
    std::printf("| %s | %s | %s | %s |\n", c.name.c_str(), fmt_rate(c.ours).c_str(), fmt_rate(base).c_str(),
                fmt_ratio(c.ours, base).c_str());
  }
  return 0;
}

int run(const Options& opt, std::vector<Row>* table_out) {
  if (opt.only == "mlx") return run_mlx(opt);
  const unsigned n_threads = opt.threads ? opt.threads : std::max(1u, std::thread::hardware_concurrency());
  const uint32_t n = opt.n_head * opt.head_dim;
  const uint64_t f16_row = uint64_t(n) * 2;
  const uint64_t rows = std::max<uint64_t>(opt.chunk_rows * 4, uint64_t(opt.mb * 1e6) / f16_row / opt.chunk_rows * opt.chunk_rows);
  const size_t n_chunks = rows / opt.chunk_rows;
  const Timing tm{opt.seconds, opt.rounds, !opt.wall};
  Timing tm_wall = tm;
  tm_wall.cpu_time = false;

  std::printf("kvsnap-bench: %s codecs (%s), %u threads for the all-threads columns\n", simd::level_name(simd::level()),
              simd::describe().c_str(), n_threads);
  std::printf("machine: %s, %u hardware threads; load average at start %s\n", cpu_model().c_str(),
              std::thread::hardware_concurrency(), loadavg().c_str());
  std::printf("data: %" PRIu64 " K rows of %u values (%u heads x head_dim %u, N(0,1) x per-channel scales, outlier "
              "channels), %.0f MB as f16; %u rows per call; %.2f s per cell, best of %d rounds\n",
              rows, n, opt.n_head, opt.head_dim, rows * f16_row / 1e6, opt.chunk_rows, opt.seconds, opt.rounds);

#ifdef KVSNAP_BENCH_GGML_LIBDIR
  std::unique_ptr<GgmlCpu> cpu;
  if (opt.ggml) {
    std::string err;
    cpu = GgmlCpu::load(KVSNAP_BENCH_GGML_LIBDIR, ggml_variant_for(simd::level()), &err);
    if (cpu) {
      std::printf("ggml: libggml-base.so and CPU backend %s from %s (llama.cpp v0.5.0; the variant of kvsnap's "
                  "%s level)\n",
                  cpu->variant.c_str(), KVSNAP_BENCH_GGML_LIBDIR, simd::level_name(simd::level()));
    } else {
      std::printf("ggml: CPU backend not loaded (%s): ggml columns without the CPU backend\n", err.c_str());
    }
  }
#else
  std::printf("ggml: not built in (no test bed at configure time): ggml columns print '-'\n");
#endif

  // Source data in every source type: f16 rows, and the rotated values quantized as llama.cpp
  // stores them (each quantized source type of kConversions).
  const auto t_gen = Clock::now();
  const std::vector<float> x = make_rows(rows, n, 12345);
  const TypeTraits& f16 = *find_traits(GgmlType::kF16);
  std::vector<std::byte> src_f16(rows * f16_row);
  f16.from_f32(x.data(), src_f16.data(), x.size());
  auto quantized_source = [&](GgmlType type) {
    const TypeTraits& t = *find_traits(type);
    auto plan = plan_rotation(*f16.layout, *t.layout, opt.head_dim, KvSide::kK);
    auto conv = RowConverter::make(f16, t, n, *plan);
    std::vector<std::byte> out(rows * conv->dst_row_bytes());
    (void)conv->convert(src_f16, out);
    return out;
  };
  // every source type a conversion below starts from, made once
  std::map<GgmlType, std::vector<std::byte>> quantized_sources;
  for (const Conversion& c : kConversions) {
    if (c.src != GgmlType::kF16 && !quantized_sources.count(c.src)) quantized_sources[c.src] = quantized_source(c.src);
  }
  auto source_of = [&](GgmlType t) -> const std::vector<std::byte>& {
    return t == GgmlType::kF16 ? src_f16 : quantized_sources.at(t);
  };
  std::printf("(data made in %.1f s)\n\n", seconds_since(t_gen));

  std::vector<Row> table;
  for (const Conversion& c : kConversions) {
    if (!opt.only.empty() && opt.only != c.name) continue;
    const TypeTraits& st = *find_traits(c.src);
    const TypeTraits& dt = *find_traits(c.dst);
    const std::vector<std::byte>& src = source_of(c.src);
    auto plan = plan_rotation(*st.layout, *dt.layout, opt.head_dim, KvSide::kK);
    auto conv0 = RowConverter::make(st, dt, n, *plan);
    const uint64_t in_row = conv0->src_row_bytes(), out_row = conv0->dst_row_bytes();
    const uint64_t in_chunk = in_row * opt.chunk_rows, out_chunk = out_row * opt.chunk_rows;
    Row row;
    row.name = c.name;
    row.rotation = plan->step == RotationStep::kNone ? "none"
                                                     : std::string(to_string(plan->step)) + " " + std::to_string(plan->n_rot);
    std::vector<std::byte> out(rows * out_row);
    // What `kvsnap convert` runs for this pair (migrate/convert_state.cc): quantized -> quantized in
    // one rotation domain goes through ExactRequantizer (blocks the target holds exactly are kept,
    // the others get the smaller error of ggml's reference block and a scale search), everything
    // else through RowConverter. The kvsnap cells time that path; an exact row also times
    // RowConverter (the reference requantization) beside it.
    row.exact = plan->step == RotationStep::kNone && exact_requant_applies(st, dt);
    if (row.exact) row.rotation += std::string(" (requant. ") + search_name(search_by_default(st, dt)) + ")";
    using ConvertFn = std::function<void(std::span<const std::byte>, std::span<std::byte>)>;
    auto make_converter = [&]() -> ConvertFn {
      if (row.exact) {
        // --requant auto, convert's default: the search only where search_by_default says
        auto e = std::make_shared<ExactRequantizer>(*ExactRequantizer::make(st, dt, n, search_by_default(st, dt)));
        return [e](std::span<const std::byte> in, std::span<std::byte> o) { (void)e->convert(in, o); };
      }
      auto r = std::make_shared<RowConverter>(*RowConverter::make(st, dt, n, *plan));
      return [r](std::span<const std::byte> in, std::span<std::byte> o) { (void)r->convert(in, o); };
    };

    // The one-thread cells (kvsnap, memcpy, ggml's paths) are timed together at the end of the
    // row, their rounds interleaved (time_loops).
    std::vector<Loop> one_thread;
    // kvsnap, one thread
    const ConvertFn ours1 = make_converter();
    one_thread.push_back(Loop{n_chunks, [&](size_t i) -> uint64_t {
                                ours1(std::span<const std::byte>(src.data() + i * in_chunk, in_chunk),
                                      std::span<std::byte>(out.data() + i * out_chunk, out_chunk));
                                return in_chunk;
                              },
                              &row.ours1});
    RowConverter conv1 = *RowConverter::make(st, dt, n, *plan);  // also checked against ggml below
    if (row.exact) {
      one_thread.push_back(Loop{n_chunks, [&](size_t i) -> uint64_t {
                                  (void)conv1.convert(std::span<const std::byte>(src.data() + i * in_chunk, in_chunk),
                                                      std::span<std::byte>(out.data() + i * out_chunk, out_chunk));
                                  return in_chunk;
                                },
                                &row.rows1});
    }
    // kvsnap, all threads
    {
      std::vector<ConvertFn> convs;
      for (unsigned w = 0; w < n_threads; w++) convs.push_back(make_converter());
      row.oursN = time_threads(n_threads, n_chunks, tm, [&](unsigned w) {
        return [&, w](size_t i) -> uint64_t {
          convs[w](std::span<const std::byte>(src.data() + i * in_chunk, in_chunk),
                   std::span<std::byte>(out.data() + i * out_chunk, out_chunk));
          return in_chunk;
        };
      });
    }
    // memcpy of the same input bytes
    std::vector<std::byte> copy(src.size());
    one_thread.push_back(Loop{n_chunks, [&](size_t i) -> uint64_t {
                                std::memcpy(copy.data() + i * in_chunk, src.data() + i * in_chunk, in_chunk);
                                return in_chunk;
                              },
                              &row.memcpy_});
#ifdef KVSNAP_BENCH_GGML_LIBDIR
    const ggml_type gs = static_cast<ggml_type>(c.src), gd = static_cast<ggml_type>(c.dst);
    const size_t vals = size_t(n) * opt.chunk_rows;
    std::vector<float> f(vals), fc(vals);
    std::vector<std::byte> gout(opt.ggml ? rows * out_row : 0), gout_cpu(opt.ggml ? rows * out_row : 0);
    std::unique_ptr<GgmlRotation> rot;
    const bool ref_path = opt.ggml && (plan->step == RotationStep::kNone || cpu);
    if (ref_path) {
      // Reference path: to_float, the CPU backend's rotation, ggml_quantize_chunk.
      if (plan->step != RotationStep::kNone) rot = std::make_unique<GgmlRotation>(*cpu, plan->n_rot, vals);
      const auto to_float = ggml_get_type_traits(gs)->to_float;
      one_thread.push_back(Loop{n_chunks, [&, to_float](size_t i) -> uint64_t {
                                  float* fx = rot ? rot->input() : f.data();
                                  to_float(src.data() + i * in_chunk, fx, static_cast<int64_t>(vals));
                                  const float* q = rot ? rot->run() : fx;
                                  ggml_quantize_chunk(gd, q, gout.data() + i * out_chunk, 0, opt.chunk_rows, n, nullptr);
                                  return in_chunk;
                                },
                                &row.ggml_ref});
    }
    // The CPU backend's store, no rotation.
    if (opt.ggml && cpu) {
      const auto base_to_float = ggml_get_type_traits(gs)->to_float;
      const auto from_float = cpu->traits_cpu(gd)->from_float;
      const auto fp16_to_fp32 = cpu->fp16_to_fp32;
      one_thread.push_back(Loop{n_chunks, [&, base_to_float, from_float, fp16_to_fp32](size_t i) -> uint64_t {
                                  const std::byte* s = src.data() + i * in_chunk;
                                  std::byte* d = gout_cpu.data() + i * out_chunk;
                                  for (uint32_t r = 0; r < opt.chunk_rows; r++) {  // row by row, as ggml_set_rows does
                                    if (gs == GGML_TYPE_F16) {
                                      fp16_to_fp32(reinterpret_cast<const ggml_fp16_t*>(s + r * in_row), fc.data(), n);
                                    } else {
                                      base_to_float(s + r * in_row, fc.data(), n);
                                    }
                                    from_float(fc.data(), d + r * out_row, n);
                                  }
                                  return in_chunk;
                                },
                                &row.ggml_cpu});
    }
#endif
    time_loops(one_thread, tm);
    if (row.exact) {
      // The timed ExactRequantizer, not only conv1 below: its bytes at this level must equal the
      // scalar level's (a fast wrong search kernel must not look good), on the first chunks. The
      // kernels are chosen per call, so the level is switched around each.
      const simd::Level timed_level = simd::level();
      const ConvertFn exact = make_converter();
      std::vector<std::byte> a(out_chunk), b(out_chunk);
      for (size_t i = 0; i < std::min<size_t>(n_chunks, 8); i++) {
        const std::span<const std::byte> in(src.data() + i * in_chunk, in_chunk);
        simd::set_level(simd::Level::kScalar);
        exact(in, a);
        simd::set_level(timed_level);
        exact(in, b);
        if (a != b) {
          std::printf("!! %s: the exact requantizer at %s differs from scalar in chunk %zu\n", c.name,
                      simd::level_name(timed_level), i);
          return 1;
        }
      }
    }
#ifdef KVSNAP_BENCH_GGML_LIBDIR
    if (ref_path) {  // the same bytes as kvsnap (the contract), checked on the first chunks
      const auto to_float = ggml_get_type_traits(gs)->to_float;
      std::vector<std::byte> ours(out_chunk);
      for (size_t i = 0; i < std::min<size_t>(n_chunks, 8); i++) {
        float* fx = rot ? rot->input() : f.data();
        to_float(src.data() + i * in_chunk, fx, static_cast<int64_t>(vals));
        const float* q = rot ? rot->run() : fx;
        ggml_quantize_chunk(gd, q, gout.data(), 0, opt.chunk_rows, n, nullptr);
        (void)conv1.convert(std::span<const std::byte>(src.data() + i * in_chunk, in_chunk), ours);
        if (std::memcmp(ours.data(), gout.data(), out_chunk) != 0) {
          std::printf("!! %s: kvsnap's bytes differ from ggml's reference path in chunk %zu\n", c.name, i);
          return 1;
        }
      }
    }
#endif
    table.push_back(row);
    std::printf("  %-11s done: kvsnap 1T %s GB/s\n", c.name, fmt_rate(row.ours1).c_str());
    std::fflush(stdout);
  }

  // End to end: convert_state on an in-memory slot file, K and V (head_dim 128: K n_rot 128,
  // V n_rot 64), 1 thread and all threads.
  if (opt.state) {
    const uint32_t n_layer = 4;
    const uint32_t cells = static_cast<uint32_t>(std::min<uint64_t>(rows / 2, opt.quick ? 1024 : 8192));
    for (Row& row : table) {
      const Conversion& c = *std::find_if(std::begin(kConversions), std::end(kConversions),
                                          [&](const Conversion& k) { return row.name == k.name; });
      const TypeTraits& st = *find_traits(c.src);
      const std::vector<std::byte>& src = source_of(c.src);
      const uint64_t in_row = uint64_t(n) / st.block_elems() * st.block_bytes();
      const std::vector<std::byte> file = make_slot_file(st, src, in_row, n_layer, cells);
      MemoryFile mf("bench.slot", std::span<const std::byte>(file));
      MemoryShape shape;
      shape.ext_bytes = 0;
      shape.kv_sections_known = true;
      shape.recurrent_known = true;
      shape.kv_sections.push_back(KvSectionShape{std::vector<uint32_t>(n_layer, n), std::vector<uint32_t>(n_layer, n), {}});
      ParseOptions po;
      po.shape = &shape;
      auto parsed = parse_state(mf, po);
      if (!parsed.ok()) {
        std::printf("!! state parse: %s\n", parsed.status().ToString().c_str());
        return 1;
      }
      const uint64_t kv_bytes = uint64_t(n_layer) * 2 * cells * in_row;
      for (unsigned t : {1u, n_threads}) {
        ConvertRequest req;
        req.k_type = static_cast<int32_t>(c.dst);
        req.v_type = static_cast<int32_t>(c.dst);
        req.geometry.k_head_dim = {opt.head_dim};
        req.geometry.v_head_dim = {opt.head_dim};
        req.threads = t;
        Rate r = time_loop(1, tm_wall, [&](size_t) -> uint64_t {
          CountingSink sink;
          auto res = convert_state(*parsed, mf, req, sink);
          if (!res.ok()) {
            std::printf("!! convert_state: %s\n", res.status().ToString().c_str());
            std::exit(1);
          }
          return kv_bytes;
        });
        (t == 1 ? row.state1 : row.stateN) = r;
        if (n_threads == 1) row.stateN = r;
      }
    }
  }

  // ---- report ----
  std::printf("\nGB/s of input (1 GB = 1e9 bytes); rows of %u values, K rotation n_rot %u where llama.cpp rotates.\n"
              "1T columns: per second of the thread's %s; %uT columns and %uT / 1T: wall clock.\n\n",
              n, rotation_block_size(KvSide::kK, opt.head_dim), opt.wall ? "wall-clock time" : "CPU time", n_threads,
              n_threads);
  std::printf("| conversion | rotation | kvsnap 1T | kvsnap %uT | ggml ref 1T | ggml cpu 1T (no rot.) | memcpy 1T | "
              "1T / ggml ref | 1T / ggml cpu | 1T / memcpy | %uT / 1T |\n",
              n_threads, n_threads);
  std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Row& r : table) {
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.name.c_str(), r.rotation.c_str(),
                fmt_rate(r.ours1).c_str(), fmt_rate(r.oursN).c_str(), fmt_rate(r.ggml_ref).c_str(),
                fmt_rate(r.ggml_cpu).c_str(), fmt_rate(r.memcpy_).c_str(), fmt_ratio(r.ours1, r.ggml_ref).c_str(),
                fmt_ratio(r.ours1, r.ggml_cpu).c_str(), fmt_ratio(r.ours1, r.memcpy_).c_str(),
                fmt_ratio(r.oursN, r.ours1, true).c_str());
  }
  bool any_exact = false;
  for (const Row& r : table) any_exact = any_exact || r.exact;
  if (any_exact) {
    std::printf("\nQuantized -> quantized rows above are ExactRequantizer's as kvsnap convert runs it by default "
                "(--requant auto: exact blocks kept, the others ggml's reference block, from a 4/5-bit source the "
                "smaller error of that and a quick scale search); RowConverter, the reference requantization "
                "(ggml_quantize_chunk's bytes, checked against ggml), one thread:\n\n");
    std::printf("| conversion | RowConverter 1T | / ggml cpu | exact / RowConverter |\n| --- | ---: | ---: | ---: |\n");
    for (const Row& r : table) {
      if (!r.exact) continue;
      std::printf("| %s | %s | %s | %s |\n", r.name.c_str(), fmt_rate(r.rows1).c_str(),
                  fmt_ratio(r.rows1, r.ggml_cpu).c_str(), fmt_ratio(r.ours1, r.rows1).c_str());
    }
  }
  if (opt.state) {
    std::printf("\nconvert_state() end to end (in-memory ggsq v3 slot, 4 layers, K and V, head_dim %u: K n_rot %u, V "
                "n_rot 64), GB/s of K+V input, wall clock\n\n",
                opt.head_dim, rotation_block_size(KvSide::kK, opt.head_dim));
    std::printf("| conversion | 1 thread | %u threads | scaling |\n| --- | ---: | ---: | ---: |\n", n_threads);
    for (const Row& r : table) {
      std::printf("| %s | %s | %s | %s |\n", r.name.c_str(), fmt_rate(r.state1).c_str(), fmt_rate(r.stateN).c_str(),
                  fmt_ratio(r.stateN, r.state1, true).c_str());
    }
  }

  std::printf("\nload average at the end: %s (other processes share these cores; each cell is the best of its rounds)\n",
              loadavg().c_str());

  print_targets(simd::level(), table);
  if (opt.mlx && opt.only.empty()) {
    if (const int rc = run_mlx(opt); rc != 0) return rc;
  }
  if (table_out) *table_out = std::move(table);
  return 0;
}

// --simd all: run() at every level this CPU has, lowest first (each against ggml's CPU variant
// of the same level), then one table of the one-thread ratios of all levels.
int run_all_levels(const Options& opt) {
  std::vector<simd::Level> levels;
  std::vector<std::vector<Row>> tables;
  for (size_t i = 0; i < simd::kLevelCount; i++) {
    const auto l = static_cast<simd::Level>(i);
    if (!simd::set_level(l)) continue;
    std::printf("==== level %s ====\n", simd::level_name(l));
    tables.emplace_back();
    if (const int rc = run(opt, &tables.back()); rc != 0) return rc;
    levels.push_back(l);
    std::printf("\n");
  }
  simd::set_level(simd::best_level());
  std::printf("==== all levels: kvsnap 1T / ggml (each level against ggml's CPU variant of that level) ====\n\n");
  std::printf("| conversion | rotation |");
  for (simd::Level l : levels) std::printf(" %s / ggml cpu | %s / ggml ref |", simd::level_name(l), simd::level_name(l));
  std::printf("\n| --- | --- |");
  for (size_t i = 0; i < levels.size(); i++) std::printf(" ---: | ---: |");
  std::printf("\n");
  for (size_t r = 0; r < tables[0].size(); r++) {
    std::printf("| %s | %s |", tables[0][r].name.c_str(), tables[0][r].rotation.c_str());
    for (size_t i = 0; i < levels.size(); i++) {
      const Row& row = tables[i][r];
      const Target t = target_of(levels[i], row);
      auto cell = [&](Rate Row::* base) {
        std::string c = fmt_ratio(row.ours1, row.*base);
        if (levels[i] != simd::Level::kScalar && t.want > 0 && t.base == base && (row.*base).valid) {
          c += row.ours1.gbps / (row.*base).gbps >= t.want ? " (met)" : " (NOT met)";
        }
        return c;
      };
      std::printf(" %s | %s |", cell(&Row::ggml_cpu).c_str(), cell(&Row::ggml_ref).c_str());
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace kvsnap::bench

int main(int argc, char** argv) {
  using kvsnap::bench::Options;
  Options opt;
  std::string simd_level;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--mb") {
      opt.mb = std::atof(next());
    } else if (a == "--seconds") {
      opt.seconds = std::atof(next());
    } else if (a == "--rounds") {
      opt.rounds = std::max(1, std::atoi(next()));
    } else if (a == "--wall") {
      opt.wall = true;
    } else if (a == "--threads") {
      opt.threads = static_cast<unsigned>(std::atoi(next()));
    } else if (a == "--head-dim") {
      opt.head_dim = static_cast<uint32_t>(std::atoi(next()));
    } else if (a == "--heads") {
      opt.n_head = static_cast<uint32_t>(std::atoi(next()));
    } else if (a == "--chunk-rows") {
      opt.chunk_rows = static_cast<uint32_t>(std::max(1, std::atoi(next())));
    } else if (a == "--only") {
      opt.only = next();
    } else if (a == "--no-state") {
      opt.state = false;
    } else if (a == "--no-ggml") {
      opt.ggml = false;
    } else if (a == "--no-mlx") {
      opt.mlx = false;
    } else if (a == "--mlx-python") {
      opt.mlx_python = next();
    } else if (a == "--simd") {
      simd_level = next();
    } else if (a == "-h" || a == "--help") {
      kvsnap::bench::usage();
      return 0;
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      kvsnap::bench::usage();
      return 2;
    }
  }
  if (opt.quick) {
    opt.mb = std::min(opt.mb, 8.0);
    opt.seconds = std::min(opt.seconds, 0.1);
    opt.rounds = std::min(opt.rounds, 2);
  }
  if (!opt.only.empty() && opt.only != "mlx" && !kvsnap::bench::is_conversion_name(opt.only)) {
    std::fprintf(stderr, "--only %s: no such conversion (one of:%s, or mlx)\n", opt.only.c_str(),
                 kvsnap::bench::conversion_names().c_str());
    return 2;
  }
  if (simd_level == "all") return kvsnap::bench::run_all_levels(opt);
  if (!simd_level.empty() && !kvsnap::simd::set_level(simd_level)) {
    std::fprintf(stderr, "--simd %s: unknown or not supported by this CPU\n", simd_level.c_str());
    return 2;
  }
  return kvsnap::bench::run(opt, nullptr);
}

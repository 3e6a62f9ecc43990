#include "migrate/rotation_detect.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "migrate/hadamard.h"
#include "migrate/type_traits.h"

namespace kvsnap {
namespace {

constexpr uint32_t R = kDetectNullDomains;
constexpr uint64_t kReadBudget = 256 * 1024;  // bytes of rows read at once
constexpr uint32_t kSampleRun = 32;           // sampled cells come in runs of this many
constexpr uint64_t kMaxRowValues = 16384;     // values of a row examined, at most (its first blocks)

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Fixed pseudo-random sign patterns for the generic domains: 2 per domain, n_rot each.
std::vector<float> sign_patterns(uint32_t n_rot) {
  std::vector<float> s(size_t(2) * R * n_rot);
  uint64_t st = 0x6b76736e6170ull;  // fixed: the same file gives the same numbers
  for (auto& v : s) v = (splitmix(st) >> 63) ? -1.0f : 1.0f;
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct TensorJob {
  size_t section, stream, layer;
  bool is_v;
  const TypeTraits* traits;
  ByteRange range;
  uint64_t row_bytes;
  uint64_t n_elems;
  uint32_t n_rot;
  uint32_t cell_count;
};

std::string where(const TensorJob& j, size_t n_sections) {
  std::string s;
  if (n_sections > 1) s += "section " + std::to_string(j.section) + " ";
  s += "stream " + std::to_string(j.stream) + " layer " + std::to_string(j.layer) + (j.is_v ? " V" : " K");
  return s;
}

// ln of n * sum p^2 for one block's energies; false when the block has no energy.
bool log_concentration(const float* e, uint32_t n, double& out) {
  double sum = 0, sq = 0;
  for (uint32_t j = 0; j < n; ++j) sum += e[j];
  if (!(sum > 0) || !std::isfinite(sum)) return false;
  for (uint32_t j = 0; j < n; ++j) {
    const double p = e[j] / sum;
    sq += p * p;
  }
  out = std::log(double(n) * sq);
  return std::isfinite(out);
}

// Which cells of the stream to examine: all, or opts.max_cells of them in runs
// of kSampleRun consecutive cells spread evenly over the stream: few separate
// reads, so a cold multi-GB file is not read whole by the kernel's readahead.
std::vector<uint32_t> sample_cells(const TensorJob& j, const DetectOptions& opts) {
  const uint32_t want = std::max<uint32_t>(1, std::min<uint32_t>(opts.max_cells, j.cell_count));
  const uint32_t n_runs = (want + kSampleRun - 1) / kSampleRun;
  std::vector<uint32_t> idx;
  idx.reserve(want);
  if (want >= j.cell_count) {
    for (uint32_t c = 0; c < j.cell_count; ++c) idx.push_back(c);
  } else if (uint64_t(n_runs) * kSampleRun > j.cell_count) {  // runs would overlap: single cells
    for (uint32_t i = 0; i < want; ++i) idx.push_back(uint32_t(uint64_t(i) * j.cell_count / want));
  } else {  // run starts >= kSampleRun apart: span >= (n_runs - 1) * kSampleRun
    for (uint32_t r = 0; r < n_runs; ++r) {
      const uint32_t len = std::min(kSampleRun, want - r * kSampleRun);
      const uint32_t span = j.cell_count > kSampleRun ? j.cell_count - kSampleRun : 0;
      const uint32_t start = n_runs == 1 ? span / 2 : uint32_t(uint64_t(r) * span / (n_runs - 1));
      for (uint32_t o = 0; o < len && start + o < j.cell_count; ++o) idx.push_back(start + o);
    }
  }
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  return idx;
}

// Per-value energy of the examined cells in 2 + R domains (stored, H.stored,
// R generic rotations), each domain n values; float sums: 1024 cells lose
// < 1e-4 relative.
class EnergySums {
 public:
  static constexpr size_t kDomains = 2 + R;

  EnergySums(const std::vector<float>& pattern, uint64_t n, uint32_t n_rot)
      : n_(n), n_rot_(n_rot), signs_(size_t(2) * R * n), energy_(kDomains * n, 0.0f), y_(n) {
    // The sign patterns tiled over a whole row (so the loops below vectorize).
    for (size_t p = 0; p < size_t(2) * R; ++p) {
      for (uint64_t e = 0; e < n; ++e) signs_[p * n + e] = pattern[p * n_rot + e % n_rot];
    }
  }

  // Adds one row's values; false (and nothing added) for NaN, inf or absurd
  // values (a corrupt block scale): that cell is left out.
  bool add(const float* x) {
    int bad = 0;
    for (uint64_t e = 0; e < n_; ++e) bad |= !(std::fabs(x[e]) < 1e18f);
    if (bad) return false;
    float* y = y_.data();
    accumulate(0, x);
    std::memcpy(y, x, n_ * sizeof(float));
    hadamard_rotate(y, n_, n_rot_);
    accumulate(1, y);
    for (uint32_t g = 0; g < R; ++g) {
      const float* s1 = signs_.data() + size_t(2 * g) * n_;
      const float* s2 = s1 + n_;
      for (uint64_t e = 0; e < n_; ++e) y[e] = x[e] * s1[e];
      hadamard_rotate(y, n_, n_rot_);
      for (uint64_t e = 0; e < n_; ++e) y[e] *= s2[e];
      hadamard_rotate(y, n_, n_rot_);
      accumulate(2 + g, y);
    }
    return true;
  }
  const float* domain(size_t d) const { return energy_.data() + d * n_; }

 private:
  void accumulate(size_t d, const float* v) {
    float* es = energy_.data() + d * n_;
    for (uint64_t e = 0; e < n_; ++e) es[e] += v[e] * v[e];
  }

  uint64_t n_;
  uint32_t n_rot_;
  std::vector<float> signs_, energy_, y_;
};

// Reads the sampled cells' rows (their first n values) into `sums`; returns
// how many cells were usable.
Result<uint32_t> read_energy(const ReadableFile& file, const TensorJob& j, const std::vector<uint32_t>& idx, uint64_t n,
                             EnergySums& sums) {
  const uint64_t use_bytes = n / j.traits->block_elems() * j.traits->block_bytes();  // of each row
  // Whole rows: consecutive cells in one read; capped rows: each row's prefix on its own.
  const uint64_t rows_per_read = use_bytes < j.row_bytes ? 1 : std::max<uint64_t>(1, kReadBudget / j.row_bytes);
  std::vector<std::byte> buf;
  std::vector<float> x(n);
  uint32_t used = 0;
  const uint32_t n_idx = uint32_t(idx.size());
  for (uint32_t i = 0; i < n_idx;) {
    // a run of consecutive indices, read at once
    uint32_t k = i + 1;
    while (k < n_idx && idx[k] == idx[k - 1] + 1 && k - i < rows_per_read) ++k;
    const uint64_t run = k - i;
    buf.resize(run == 1 ? use_bytes : run * j.row_bytes);
    KV_RETURN_IF_ERROR(file.read_at(j.range.offset + uint64_t(idx[i]) * j.row_bytes, buf));
    for (uint64_t r = 0; r < run; ++r) {
      j.traits->to_f32(buf.data() + r * j.row_bytes, x.data(), n);
      if (sums.add(x.data())) ++used;
    }
    i = k;
  }
  return used;
}

// The evidence from the energy sums: per block position ln C in every domain
// (blocks without energy left out), stored and H.stored against the spread of
// the generic domains. Nothing when no block has energy.
std::optional<TensorEvidence> weigh_energy(const TensorJob& j, const EnergySums& sums, uint64_t blocks, uint32_t used) {
  const uint32_t n_rot = j.n_rot;
  double sum_s = 0, sum_h = 0, sum_ss = 0;
  std::vector<double> sum_g(R, 0.0);
  uint64_t nb = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    double l[EnergySums::kDomains];
    bool ok = true;
    for (size_t d = 0; d < EnergySums::kDomains && ok; ++d) {
      ok = log_concentration(sums.domain(d) + b * n_rot, n_rot, l[d]);
    }
    if (!ok) continue;
    ++nb;
    sum_s += l[0];
    sum_h += l[1];
    double mu = 0;
    for (uint32_t g = 0; g < R; ++g) mu += l[2 + g];
    mu /= R;
    for (uint32_t g = 0; g < R; ++g) {
      sum_g[g] += l[2 + g];
      sum_ss += (l[2 + g] - mu) * (l[2 + g] - mu);
    }
  }
  if (nb == 0) return std::nullopt;
  TensorEvidence ev;
  ev.section = j.section;
  ev.stream = j.stream;
  ev.layer = j.layer;
  ev.is_v = j.is_v;
  ev.n_rot = n_rot;
  ev.cells = used;
  ev.l_stored = sum_s / double(nb);
  ev.l_h = sum_h / double(nb);
  double mu = 0;
  for (double g : sum_g) mu += g;
  ev.l_null = mu / (double(R) * double(nb));
  // Pooled spread of one block's ln C between generic domains, then of the mean over nb blocks.
  const double sigma_block = std::sqrt(sum_ss / (double(nb) * (R - 1)));
  // Floor: the generic domains can agree by chance; 0.01 in ln C is 1% in concentration.
  ev.sigma = std::max(sigma_block / std::sqrt(double(nb)), 0.01);
  ev.d = ev.l_h - ev.l_stored;
  ev.z = ev.d / (ev.sigma * std::sqrt(2.0));
  const double zh = (ev.l_h - ev.l_null) / ev.sigma, zs = (ev.l_stored - ev.l_null) / ev.sigma;
  if (ev.d >= kDetectMinLogRatio && ev.z >= kDetectMinZ && zh >= kDetectMinZ) ev.decisive = 1;
  if (-ev.d >= kDetectMinLogRatio && -ev.z >= kDetectMinZ && zs >= kDetectMinZ) ev.decisive = -1;
  return ev;
}

Result<std::optional<TensorEvidence>> examine(const ReadableFile& file, const TensorJob& j, const DetectOptions& opts,
                                              const std::vector<float>& pattern) {
  const uint32_t n_rot = j.n_rot;
  // The first whole rotation blocks of each row, at most kMaxRowValues values: memory stays
  // bounded whatever row size a (corrupt) file claims.
  const uint64_t n = std::min<uint64_t>(j.n_elems, std::max<uint64_t>(n_rot, kMaxRowValues / n_rot * n_rot));
  const std::vector<uint32_t> idx = sample_cells(j, opts);
  EnergySums sums(pattern, n, n_rot);
  KV_ASSIGN_OR_RETURN(const uint32_t used, read_energy(file, j, idx, n, sums));
  if (used < kDetectMinCells) return std::optional<TensorEvidence>{};
  return weigh_energy(j, sums, n / n_rot, used);
}

struct SideTally {
  uint32_t examined = 0, rot = 0, plain = 0, layers = 0;
  std::vector<double> d;
};

std::string side_line(const char* name, const SideTally& t) {
  char buf[200];
  if (t.examined == 0) {
    std::snprintf(buf, sizeof buf, "%s: not examined", name);
  } else {
    const double m = median(t.d);
    if (t.rot >= t.plain) {
      std::snprintf(buf, sizeof buf, "%s: %u/%u tensors spikier after un-rotating, %u spikier as stored (median %+.2f)",
                    name, t.rot, t.examined, t.plain, m);
    } else {
      std::snprintf(buf, sizeof buf, "%s: %u/%u tensors spikier as stored, %u after un-rotating (median %+.2f)", name,
                    t.plain, t.examined, t.rot, m);
    }
  }
  return buf;
}

// The tensor of one side (K or V) of one layer when llama.cpp would rotate
// it: quantized, with a head dim that has a rotation block. hd: that head dim.
std::optional<TensorJob> rotating_tensor(const KvStream& s, const KvLayer& L, size_t si, size_t st, size_t il,
                                         bool is_v, const RotationGeometry& geometry, uint32_t& hd) {
  if (is_v && (!L.has_v || s.v_trans)) return std::nullopt;  // transposed V is float: never rotated
  const auto& dims = is_v ? geometry.v_head_dim : geometry.k_head_dim;
  if (si >= dims.size()) return std::nullopt;
  hd = dims[si];
  const uint32_t n_rot = rotation_block_size(is_v ? KvSide::kV : KvSide::kK, hd);
  if (n_rot == 0) return std::nullopt;
  const TypeTraits* t = find_traits(is_v ? L.v_type : L.k_type);
  if (!t || !t->quantized()) return std::nullopt;
  return TensorJob{si, st, il, is_v, t, is_v ? L.v : L.k, is_v ? L.v_row_bytes : L.k_row_bytes, 0, n_rot,
                   s.cell_count};
}

// What the file says about a tensor must hold before its rows are read:
// whole blocks per row, the rows inside the file, whole heads per row.
Status check_job(const ReadableFile& file, size_t n_sections, uint32_t hd, TensorJob& j) {
  const TypeTraits* t = j.traits;
  const uint64_t fsize = file.size();
  const std::string ctx = file.name() + ": " + where(j, n_sections);
  if (j.row_bytes == 0 || j.row_bytes % t->block_bytes() != 0) {
    return Status::Corruption(ctx + ": row of " + std::to_string(j.row_bytes) + " bytes is not whole " +
                              std::string(t->name()) + " blocks");
  }
  j.n_elems = j.row_bytes / t->block_bytes() * t->block_elems();
  if (j.range.size / j.row_bytes < j.cell_count || j.range.offset > fsize || j.range.size > fsize - j.range.offset) {
    return Status::Corruption(ctx + ": " + std::to_string(j.cell_count) + " rows of " + std::to_string(j.row_bytes) +
                              " bytes at offset " + std::to_string(j.range.offset) + " do not fit the file (" +
                              std::to_string(fsize) + " bytes)");
  }
  if (j.n_elems % hd != 0) {
    return Status::Mismatch(ctx + ": a row of " + std::to_string(j.n_elems) + " values is not whole heads of " +
                            std::to_string(hd) + " (the head dim given for this cache): correct {--head-dim-k} / "
                            "{--head-dim-v}, or pass the model ({--model GGUF})");
  }
  return Status::OK();
}

// The tensors to examine, in file order, each checked.
Result<std::vector<TensorJob>> collect_jobs(const ReadableFile& file, const StateFile& state,
                                            const RotationGeometry& geometry) {
  std::vector<TensorJob> jobs;
  const size_t n_sections = state.memory.kv.size();
  for (size_t si = 0; si < n_sections; ++si) {
    const KvSection& sec = state.memory.kv[si];
    for (size_t st = 0; st < sec.streams.size(); ++st) {
      const KvStream& s = sec.streams[st];
      if (s.cell_count == 0) continue;
      for (size_t il = 0; il < s.layers.size(); ++il) {
        for (bool is_v : {false, true}) {
          uint32_t hd = 0;
          std::optional<TensorJob> j = rotating_tensor(s, s.layers[il], si, st, il, is_v, geometry, hd);
          if (!j) continue;
          KV_RETURN_IF_ERROR(check_job(file, n_sections, hd, *j));
          jobs.push_back(*j);
        }
      }
    }
  }
  return jobs;
}

// The evidence of every examined tensor, counted per side and overall.
struct Tally {
  SideTally side[2];  // K, V
  std::vector<double> all_d;
  std::vector<double> agree_excess[2];  // [0] rotated, [1] plain
  uint32_t too_few = 0;                 // tensors with too few usable cells

  void count(const TensorEvidence& ev, RotationEvidence& out) {
    SideTally& t = side[ev.is_v ? 1 : 0];
    ++t.examined;
    t.d.push_back(ev.d);
    all_d.push_back(ev.d);
    ++out.tensors;
    const double excess = std::min(std::fabs(ev.d) / kDetectMinLogRatio, std::fabs(ev.z) / kDetectMinZ) - 1.0;
    if (ev.decisive > 0) {
      ++t.rot;
      ++out.for_rotated;
      agree_excess[0].push_back(excess);
    } else if (ev.decisive < 0) {
      ++t.plain;
      ++out.for_plain;
      agree_excess[1].push_back(excess);
    }
  }
};

// Examines every job, with one set of sign patterns per distinct n_rot.
Status examine_all(const ReadableFile& file, const std::vector<TensorJob>& jobs, size_t n_sections,
                   const DetectOptions& opts, std::vector<TensorEvidence>* per_tensor, Tally& tally,
                   RotationEvidence& out) {
  std::vector<std::vector<float>> signs_by_nrot;  // small: one pattern set per distinct n_rot
  std::vector<uint32_t> nrot_keys;
  for (const TensorJob& j : jobs) {
    size_t k = 0;
    while (k < nrot_keys.size() && nrot_keys[k] != j.n_rot) ++k;
    if (k == nrot_keys.size()) {
      nrot_keys.push_back(j.n_rot);
      signs_by_nrot.push_back(sign_patterns(j.n_rot));
    }
    auto r = examine(file, j, opts, signs_by_nrot[k]);
    if (!r.ok()) return r.status().Prefixed(file.name() + ": " + where(j, n_sections));
    if (!r->has_value()) {
      ++tally.too_few;
      continue;
    }
    if (per_tensor) per_tensor->push_back(**r);
    tally.count(**r, out);
  }
  return Status::OK();
}

// The verdict: one side wins with enough agreeing tensors and few contrary
// ones; the confidence grows with the agreement and how far past the
// thresholds the agreeing tensors are.
void decide_verdict(const Tally& tally, RotationEvidence& out) {
  const uint32_t decisive = out.for_rotated + out.for_plain;
  auto wins = [&](uint32_t agree, uint32_t contrary) {
    return agree >= kDetectMinAgree && 4 * agree >= out.tensors && 10 * contrary <= decisive;
  };
  if (wins(out.for_rotated, out.for_plain)) {
    out.verdict = RotationEvidence::Verdict::kRotated;
  } else if (wins(out.for_plain, out.for_rotated)) {
    out.verdict = RotationEvidence::Verdict::kNotRotated;
  }
  if (out.verdict == RotationEvidence::Verdict::kUnsure) return;
  const bool rot = out.verdict == RotationEvidence::Verdict::kRotated;
  const uint32_t agree = rot ? out.for_rotated : out.for_plain;
  const uint32_t contrary = rot ? out.for_plain : out.for_rotated;
  const double agreement = double(agree - contrary) / double(agree + contrary);
  const double excess = std::max(0.0, median(tally.agree_excess[rot ? 0 : 1]));
  out.confidence = agreement * (1.0 - std::exp(-excess));
}

}  // namespace

const char* verdict_name(RotationEvidence::Verdict v) {
  switch (v) {
    case RotationEvidence::Verdict::kRotated: return "rotated";
    case RotationEvidence::Verdict::kNotRotated: return "not-rotated";
    case RotationEvidence::Verdict::kUnsure: return "unsure";
  }
  return "unsure";
}

Result<RotationEvidence> detect_rotation(const ReadableFile& file, const StateFile& state,
                                         const RotationGeometry& geometry, const DetectOptions& opts) {
  return detect_rotation_detailed(file, state, geometry, opts, nullptr);
}

Result<RotationEvidence> detect_rotation_detailed(const ReadableFile& file, const StateFile& state,
                                                  const RotationGeometry& geometry, const DetectOptions& opts,
                                                  std::vector<TensorEvidence>* per_tensor) {
  RotationEvidence out;
  if (per_tensor) per_tensor->clear();
  KV_ASSIGN_OR_RETURN(const std::vector<TensorJob> jobs, collect_jobs(file, state, geometry));
  Tally tally;
  KV_RETURN_IF_ERROR(examine_all(file, jobs, state.memory.kv.size(), opts, per_tensor, tally, out));
  out.score = median(tally.all_d);
  if (out.tensors == 0) {
    if (jobs.empty()) {
      out.summary = "no quantized tensor whose head dim llama.cpp rotates: nothing to examine";
    } else {
      out.summary = "too few cells: " + std::to_string(tally.too_few) + " quantized tensor(s) with fewer than " +
                    std::to_string(kDetectMinCells) + " usable cells";
    }
    return out;
  }
  decide_verdict(tally, out);
  out.summary = side_line("K", tally.side[0]) + "; " + side_line("V", tally.side[1]);
  if (tally.too_few) out.summary += "; " + std::to_string(tally.too_few) + " tensor(s) with too few cells";
  return out;
}

}  // namespace kvsnap

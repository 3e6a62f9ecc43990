#include "migrate/rope_head_dim.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include "migrate/hadamard.h"
#include "migrate/type_traits.h"

namespace kvsnap {
namespace {

constexpr uint32_t kMinHeadDim = 16;       // smaller candidates are not tried
constexpr uint32_t kMaxPairsPerToken = 8;  // so one frequent token does not make all the evidence
constexpr uint64_t kMaxRowValues = 65536;  // a K row longer than this is no model's (n_head_kv * head dim)
constexpr uint64_t kValueBudget = 1 << 17; // cell pairs * row values examined, at most
constexpr uint32_t kMinCellPairs = 4;
constexpr uint64_t kMinInformative = 24;   // comparisons a test needs to say anything
constexpr double kPassFraction = 0.9;      // of informative comparisons agreeing: the test passes
constexpr double kFailFraction = 0.5;      // at most: it fails (a wrong head dim agrees ~10%)
constexpr double kNoiseSigmas = 4;         // tolerance of a comparison, in noise sigmas
constexpr double kMeasurableSigmas = 8;    // a pair shorter than this many sigmas is noise
constexpr double kMaxTolerance = 0.5;      // rad: a wider angle tolerance is no evidence
// Added to every value's noise: the same token's K computed by another kernel (a batch against a
// single token; a GPU's f16 products), or re-roped by a context shift. Of the row's rms, and of
// the value itself.
constexpr double kNoiseFloor = 0.003;
constexpr double kRelativeNoiseFloor = 0.002;

// Per-value rounding noise of the stored type (uniform rounding: step / sqrt(12)): float types
// relative to the value, quantized types relative to the block's largest |x| (q4_1, q5_1: its
// range; iq4_nl: its grid's widest gap, 24 of 127).
struct NoiseModel {
  bool relative_to_value = false;
  double step = 0;  // fraction of |x|, of the block's amax, or of its range
  bool of_range = false;
};
NoiseModel noise_model(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: return {true, 1.2e-7, false};
    case GgmlType::kF16: return {true, 1.0 / 1024, false};
    case GgmlType::kBF16: return {true, 1.0 / 128, false};
    case GgmlType::kQ8_0: return {false, 1.0 / 127, false};
    case GgmlType::kQ4_0: return {false, 1.0 / 8, false};
    case GgmlType::kQ5_0: return {false, 1.0 / 16, false};
    case GgmlType::kQ4_1: return {false, 1.0 / 15, true};
    case GgmlType::kQ5_1: return {false, 1.0 / 31, true};
    case GgmlType::kIQ4_NL: return {false, 24.0 / 127, false};
  }
  return {false, 0.25, false};
}

// One cell's K row in one domain, with each value's noise variance.
struct Row {
  std::vector<float> x;
  std::vector<float> var;
};

Row stored_row(std::vector<float> x, const TypeTraits& t) {
  const NoiseModel m = noise_model(t.id());
  Row r;
  r.var.resize(x.size());
  if (m.relative_to_value) {
    for (size_t e = 0; e < x.size(); ++e) {
      const double s = m.step * std::fabs(x[e]);
      r.var[e] = float(s * s / 12);
    }
  } else {
    const size_t b = t.block_elems();
    for (size_t s0 = 0; s0 < x.size(); s0 += b) {
      float lo = x[s0], hi = x[s0];
      for (size_t e = s0; e < s0 + b; ++e) lo = std::min(lo, x[e]), hi = std::max(hi, x[e]);
      const double span = m.of_range ? double(hi) - lo : std::max(std::fabs(lo), std::fabs(hi));
      const double s = m.step * span;
      std::fill(r.var.begin() + long(s0), r.var.begin() + long(s0 + b), float(s * s / 12));
    }
  }
  r.x = std::move(x);
  return r;
}

// The row un-rotated with blocks of n_rot: the values by H, each value's noise the mean of its block's.
Row unrotated_row(const Row& stored, uint32_t n_rot) {
  Row r = stored;
  hadamard_unrotate(r.x.data(), r.x.size(), n_rot);
  for (size_t s0 = 0; s0 < r.var.size(); s0 += n_rot) {
    double sum = 0;
    for (size_t e = s0; e < s0 + n_rot; ++e) sum += r.var[e];
    std::fill(r.var.begin() + long(s0), r.var.begin() + long(s0 + n_rot), float(sum / n_rot));
  }
  return r;
}

void add_noise_floor(Row& r) {
  double ss = 0;
  for (float v : r.x) ss += double(v) * v;
  const double floor = kNoiseFloor * std::sqrt(ss / double(r.x.size()));
  for (size_t e = 0; e < r.var.size(); ++e) {
    const double rel = kRelativeNoiseFloor * r.x[e];
    r.var[e] += float(floor * floor + rel * rel);
  }
}

// How RoPE pairs a head's values: adjacent (llama's rope), the head's halves (NEOX, M-RoPE), or the
// halves of its first r values (NEOX and M-RoPE with partial rotary: the rest are not turned).
struct Pairing {
  enum Kind { kAdjacent, kHalves, kRotatedHalves } kind = kAdjacent;
  uint32_t r = 0;  // kRotatedHalves: the values turned at the start of each head

  std::string name() const {
    switch (kind) {
      case kAdjacent: return "adjacent pairs";
      case kHalves: break;
      case kRotatedHalves: return "halves of the first " + std::to_string(r);
    }
    return "halves of the head";
  }
  // Pairs per head of h values that RoPE turns.
  uint32_t pairs(uint32_t h) const { return kind == kRotatedHalves ? r / 2 : h / 2; }
  // The two channels of pair i of head m.
  std::pair<size_t, size_t> channels(uint32_t h, uint32_t m, uint32_t i) const {
    const size_t base = size_t(m) * h;
    switch (kind) {
      case kAdjacent: return {base + 2 * i, base + 2 * i + 1};
      case kHalves: break;
      case kRotatedHalves: return {base + i, base + i + r / 2};
    }
    return {base + i, base + i + h / 2};
  }
};

struct PairTurn {
  bool measurable = false;
  double angle = 0, sigma = 0;  // the turn from cell a to cell b, and its noise
  double len_a = 0, len_b = 0, len_sigma = 0;
};

// The length of (x, y): the square root of the sum of squares rather than std::hypot, which guards
// against overflow and underflow this data cannot reach (rows with a value of 1e18 or more are
// left out below, and un-rotation grows values by at most sqrt(n_rot), so squares stay near 1e41
// at most; a float's square is exact in double; sigmas are below 1) and took a third of a
// witness's time (glibc 2.36, `perf` of `kvsnap info --model`). The two agree to within an ulp.
double length2d(double x, double y) { return std::sqrt(x * x + y * y); }

PairTurn turn(const Row& a, const Row& b, std::pair<size_t, size_t> c) {
  PairTurn t;
  const double a1 = a.x[c.first], a2 = a.x[c.second], b1 = b.x[c.first], b2 = b.x[c.second];
  const double va = std::max(a.var[c.first], a.var[c.second]), vb = std::max(b.var[c.first], b.var[c.second]);
  t.len_a = length2d(a1, a2);
  t.len_b = length2d(b1, b2);
  t.measurable = t.len_a > kMeasurableSigmas * std::sqrt(va) && t.len_b > kMeasurableSigmas * std::sqrt(vb);
  if (!t.measurable) return t;
  t.angle = std::atan2(a1 * b2 - a2 * b1, a1 * b1 + a2 * b2);
  t.sigma = std::sqrt(va / (t.len_a * t.len_a) + vb / (t.len_b * t.len_b));
  t.len_sigma = std::sqrt(va + vb);
  return t;
}

double wrapped(double a) {
  while (a > M_PI) a -= 2 * M_PI;
  while (a < -M_PI) a += 2 * M_PI;
  return a;
}

struct TestCounts {
  uint64_t length_informative = 0, length_kept = 0;   // turning pairs, and those keeping their length
  uint64_t angle_informative = 0, angle_alike = 0;    // pair i in head m against the first head
};

// Every channel pair's turn for each cell pair, for head dim h and one pairing: the turns of cell
// pair c at [c * W/2 + m * h/2 + i] (head m, pair i; with partial rotary the slots past its pairs
// stay unmeasurable). Adjacent pairs are the same whatever h.
std::vector<PairTurn> turns_of(const std::vector<std::pair<const Row*, const Row*>>& cells, uint32_t h, const Pairing& p) {
  const size_t half = cells.front().first->x.size() / 2;
  const uint32_t n_heads = uint32_t(2 * half / h);
  std::vector<PairTurn> t(cells.size() * half);
  for (size_t c = 0; c < cells.size(); ++c) {
    for (uint32_t m = 0; m < n_heads; ++m) {
      for (uint32_t i = 0; i < p.pairs(h); ++i)
        t[c * half + size_t(m) * h / 2 + i] = turn(*cells[c].first, *cells[c].second, p.channels(h, m, i));
    }
  }
  return t;
}

// Both tests for head dim h over the turns of every cell pair (turns_of's layout).
TestCounts count_tests(const std::vector<PairTurn>& turns, size_t n_cells, uint32_t h) {
  TestCounts c;
  const size_t half = turns.size() / n_cells;
  const uint32_t n_heads = uint32_t(2 * half / h);
  for (size_t cell = 0; cell < n_cells; ++cell) {
    const PairTurn* row = turns.data() + cell * half;
    for (uint32_t i = 0; i < h / 2; ++i) {
      const PairTurn* first = nullptr;
      for (uint32_t m = 0; m < n_heads; ++m) {
        const PairTurn& t = row[size_t(m) * h / 2 + i];
        if (!t.measurable) continue;
        if (std::fabs(t.angle) > kMeasurableSigmas * t.sigma) {  // it turns: a rotation keeps its length
          ++c.length_informative;
          c.length_kept += std::fabs(t.len_a - t.len_b) <= kNoiseSigmas * t.len_sigma;
        }
        if (!first) {
          first = &t;
          continue;
        }
        const double tol = kNoiseSigmas * length2d(first->sigma, t.sigma);
        if (tol >= kMaxTolerance || std::max(std::fabs(first->angle), std::fabs(t.angle)) <= 2 * tol) continue;
        ++c.angle_informative;
        c.angle_alike += std::fabs(wrapped(t.angle - first->angle)) <= tol;
      }
    }
  }
  return c;
}

enum class Outcome { kPass, kFail, kUndecided };

struct Judgement {
  Outcome outcome = Outcome::kUndecided;
  double fit = 0;  // a pass's smaller fraction of agreeing comparisons
};

Judgement judge(const TestCounts& c, bool one_head) {
  auto fraction = [](uint64_t k, uint64_t n) { return double(k) / double(n); };
  const bool length_says = c.length_informative >= kMinInformative;
  const bool angle_says = c.angle_informative >= kMinInformative;
  const double length = length_says ? fraction(c.length_kept, c.length_informative) : 0;
  const double angle = angle_says ? fraction(c.angle_alike, c.angle_informative) : 0;
  if ((length_says && length <= kFailFraction) || (angle_says && angle <= kFailFraction)) return {Outcome::kFail, 0};
  const bool length_ok = length_says && length >= kPassFraction;
  const bool angle_ok = one_head || (angle_says && angle >= kPassFraction);
  if (!length_ok || !angle_ok) return {Outcome::kUndecided, 0};
  return {Outcome::kPass, one_head ? length : std::min(length, angle)};
}

// The cells of `stream` paired by token: the cell at position p holds tokens[p].
std::vector<std::pair<uint32_t, uint32_t>> same_token_cells(const KvStream& stream, const std::vector<int32_t>& tokens,
                                                            size_t max_pairs) {
  std::vector<int64_t> cell_at(tokens.size(), -1);  // -2: two cells at one position
  for (uint32_t c = 0; c < stream.cells.size(); ++c) {
    const int32_t p = stream.cells[c].pos;
    if (p < 0 || size_t(p) >= tokens.size()) continue;
    cell_at[size_t(p)] = cell_at[size_t(p)] == -1 ? int64_t(c) : -2;
  }
  std::unordered_map<int32_t, std::vector<uint32_t>> by_token;
  std::vector<int32_t> order;  // tokens in the order of their first position: the same pairs every run
  for (size_t p = 0; p < tokens.size(); ++p) {
    if (cell_at[p] < 0 || tokens[p] < 0) continue;
    auto& cells = by_token[tokens[p]];
    if (cells.empty()) order.push_back(tokens[p]);
    cells.push_back(uint32_t(cell_at[p]));
  }
  std::vector<std::pair<uint32_t, uint32_t>> pairs;
  for (int32_t t : order) {
    const auto& cells = by_token[t];
    for (size_t k = 1; k < cells.size() && k <= kMaxPairsPerToken && pairs.size() < max_pairs; ++k)
      pairs.emplace_back(cells[0], cells[k]);
  }
  return pairs;
}

HeadDimEvidence unsure(const HeadDimClaim& claim, std::string why) {
  HeadDimEvidence e;
  e.claimed = claim.head_dim;
  e.summary = "head dim not checked: " + std::move(why);
  return e;
}

}  // namespace

const char* verdict_name(HeadDimEvidence::Verdict v) {
  switch (v) {
    case HeadDimEvidence::Verdict::kConfirmed: return "confirmed";
    case HeadDimEvidence::Verdict::kContradicted: return "contradicted";
    case HeadDimEvidence::Verdict::kUnsure: break;
  }
  return "unsure";
}

std::optional<HeadDimClaim> model_head_dim_claim(const ModelProfile& model, const std::string& model_name) {
  // MLA caches a latent and a RoPE part, not heads; a model without RoPE has no witness.
  if (model.is_mla || model.rope == RopeKind::kNone || model.rope == RopeKind::kUnknown) return std::nullopt;
  auto sections = memory_sections(model);
  if (!sections.ok()) return std::nullopt;
  size_t kv = 0;
  for (const MemorySectionLayout& s : *sections) {
    if (s.kind == SectionKind::kRecurrent) continue;
    for (size_t li = 0; li < s.layers.size(); ++li) {
      if (s.layers[li].il == 0) return HeadDimClaim{s.layers[li].head_dim_k, kv, li, model_name, model.n_rot};
    }
    ++kv;
  }
  return std::nullopt;
}

Result<HeadDimEvidence> check_head_dim(const ReadableFile& file, const StateFile& f, const HeadDimClaim& claim) {
  if (claim.head_dim == 0) return unsure(claim, "no head dim claimed");
  if (!f.tokens.media_positions.empty()) return unsure(claim, "the file holds media, whose cells take no token's place");
  if (claim.section >= f.memory.kv.size()) return unsure(claim, "the file has no KV section for layer 0");
  const KvStream* stream = nullptr;
  for (const KvStream& st : f.memory.kv[claim.section].streams) {
    if (st.cell_count == 0) continue;
    if (stream) return unsure(claim, "several streams hold cells; the tokens are of one");
    stream = &st;
  }
  if (!stream || claim.layer >= stream->layers.size()) return unsure(claim, "no cells in layer 0");
  const KvLayer& layer = stream->layers[claim.layer];
  const TypeTraits* traits = find_traits(layer.k_type);
  if (!traits) return unsure(claim, "layer 0's K type is not a KV cache type");
  const uint64_t W = layer.k_row_bytes / traits->block_bytes() * traits->block_elems();
  if (W > kMaxRowValues) return unsure(claim, "K rows of " + std::to_string(W) + " values are longer than any model's");
  if (W == 0 || W % claim.head_dim != 0 || claim.head_dim % 2 != 0)
    return unsure(claim, "the claimed head dim " + std::to_string(claim.head_dim) + " does not cut the K row of " +
                             std::to_string(W) + " values into heads");
  if (layer.k.size < uint64_t(stream->cell_count) * layer.k_row_bytes)
    return Status::Corruption(file.name() + ": layer 0's K range is shorter than its cells' rows");

  // Fewer pairs of longer rows: each holds more heads to compare (bounded time and memory).
  const size_t max_pairs = std::clamp<size_t>(kValueBudget / W, kMinCellPairs, kHeadDimMaxPairs);
  const auto cell_pairs = same_token_cells(*stream, f.tokens.tokens, max_pairs);
  if (cell_pairs.size() < kMinCellPairs)
    return unsure(claim, std::to_string(cell_pairs.size()) + " pairs of cells hold the same token (at least " +
                             std::to_string(kMinCellPairs) + " needed)");

  // Each cell's row as stored, decoded once; cells whose values are not finite are left out.
  std::map<uint32_t, std::optional<Row>> stored;
  std::vector<std::byte> buf(layer.k_row_bytes);
  for (const auto& [a, b] : cell_pairs) {
    for (uint32_t c : {a, b}) {
      if (stored.count(c)) continue;
      KV_RETURN_IF_ERROR(file.read_at(layer.k.offset + uint64_t(c) * layer.k_row_bytes, buf));
      std::vector<float> x(W);
      traits->to_f32(buf.data(), x.data(), W);
      bool finite = true;
      for (float v : x) finite &= std::isfinite(v) && std::fabs(v) < 1e18f;
      stored[c] = finite ? std::optional<Row>(stored_row(std::move(x), *traits)) : std::nullopt;
    }
  }

  // The domains a candidate is examined in: as stored, and for quantized K un-rotated with the
  // candidate's block where llama.cpp would rotate at that head dim.
  std::map<uint32_t, std::map<uint32_t, Row>> domains;  // n_rot (0: as stored) -> cell -> row
  auto domain = [&](uint32_t n_rot) -> const std::map<uint32_t, Row>& {
    auto it = domains.find(n_rot);
    if (it != domains.end()) return it->second;
    std::map<uint32_t, Row>& rows = domains[n_rot];
    for (const auto& [c, r] : stored) {
      if (!r) continue;
      Row d = n_rot ? unrotated_row(*r, n_rot) : *r;
      add_noise_floor(d);
      rows.emplace(c, std::move(d));
    }
    return rows;
  };

  struct Candidate {
    uint32_t h;
    Outcome outcome;
    std::string how;  // for the summary: "adjacent pairs", "halves, un-rotated by 64"
    double fit = 0;
    Outcome as_stored = Outcome::kUndecided, unrotated = Outcome::kUndecided;  // per domain
  };
  std::vector<Candidate> candidates;
  uint32_t examined = 0;
  std::map<uint32_t, std::vector<PairTurn>> adjacent;  // per domain: the same for every h
  // Partial rotary turns the first rope_dims values of each head: for NEOX and M-RoPE its pairs
  // are the halves of those (llama's adjacent pairs are the same either way).
  std::vector<Pairing> pairings{{Pairing::kAdjacent}, {Pairing::kHalves}};
  if (claim.rope_dims >= 2 && claim.rope_dims % 2 == 0 && claim.rope_dims < claim.head_dim)
    pairings.push_back({Pairing::kRotatedHalves, claim.rope_dims});
  bool passed = false;
  for (uint32_t h = kMinHeadDim; h <= W; h += 2) {
    if (W % h != 0) continue;
    // The verdict needs the candidates up to the claim and up to the smallest that passes.
    if (h > claim.head_dim && passed) break;
    std::vector<uint32_t> blocks{0};
    const uint32_t n_rot = rotation_block_size(KvSide::kK, h);
    if (traits->quantized() && n_rot != 0) blocks.push_back(n_rot);
    Candidate cand{h, Outcome::kFail, ""};
    for (uint32_t n : blocks) {
      const auto& rows = domain(n);
      std::vector<std::pair<const Row*, const Row*>> cells;
      for (const auto& [a, b] : cell_pairs) {
        auto ia = rows.find(a), ib = rows.find(b);
        if (ia != rows.end() && ib != rows.end()) cells.emplace_back(&ia->second, &ib->second);
      }
      examined = std::max<uint32_t>(examined, uint32_t(cells.size()));
      // This domain: a pass with either pairing, a fail when both fail.
      Outcome in_domain = cells.size() < kMinCellPairs ? Outcome::kUndecided : Outcome::kFail;
      for (const Pairing& p : pairings) {
        if (cells.size() < kMinCellPairs) break;
        if (p.kind == Pairing::kRotatedHalves && p.r >= h) continue;  // the whole head: kHalves
        std::vector<PairTurn> halves;
        const bool adj = p.kind == Pairing::kAdjacent;
        if (adj && !adjacent.count(n)) adjacent[n] = turns_of(cells, h, p);
        if (!adj) halves = turns_of(cells, h, p);
        const Judgement j = judge(count_tests(adj ? adjacent[n] : halves, cells.size(), h), W == h);
        if (j.outcome == Outcome::kPass && in_domain != Outcome::kPass) {
          in_domain = Outcome::kPass;
          if (cand.outcome != Outcome::kPass) {
            cand.how = p.name() + (n ? ", un-rotated by " + std::to_string(n) : "");
            cand.fit = j.fit;
          }
        } else if (j.outcome == Outcome::kUndecided && in_domain == Outcome::kFail) {
          in_domain = Outcome::kUndecided;
        }
      }
      (n ? cand.unrotated : cand.as_stored) = in_domain;
      // The candidate: a pass in some domain, a fail when every domain fails.
      if (in_domain == Outcome::kPass) cand.outcome = Outcome::kPass;
      else if (in_domain == Outcome::kUndecided && cand.outcome == Outcome::kFail) cand.outcome = Outcome::kUndecided;
    }
    passed |= cand.outcome == Outcome::kPass;
    candidates.push_back(cand);
  }

  HeadDimEvidence e;
  e.claimed = claim.head_dim;
  e.cell_pairs = examined;
  const Candidate* claimed = nullptr;
  for (const Candidate& c : candidates) {
    if (!e.observed && c.outcome == Outcome::kPass) e.observed = c.h;
    if (c.h == claim.head_dim) claimed = &c;
  }
  bool smaller_divisors_fail = true;
  for (const Candidate& c : candidates)
    if (c.h < claim.head_dim && claim.head_dim % c.h == 0 && c.outcome != Outcome::kFail) smaller_divisors_fail = false;

  std::string tried;
  for (const Candidate& c : candidates) {
    if (!tried.empty()) tried += ", ";
    tried += std::to_string(c.h) + (c.outcome == Outcome::kPass ? " fits" : c.outcome == Outcome::kFail ? " no" : " ?");
  }
  const std::string what = "layer 0's K in " + std::to_string(examined) + " pairs of cells holding one token (head dims: " +
                           tried + ")";
  const bool claim_fails = claimed && claimed->outcome == Outcome::kFail;
  if (claimed && claimed->outcome == Outcome::kPass) {
    e.agreement = claimed->fit;
    if (claimed->unrotated == Outcome::kPass && claimed->as_stored == Outcome::kFail) e.stored_rotated = Tri::kYes;
    if (claimed->as_stored == Outcome::kPass && claimed->unrotated == Outcome::kFail) e.stored_rotated = Tri::kNo;
  }
  if (claimed && claimed->outcome == Outcome::kPass && smaller_divisors_fail) {
    e.verdict = HeadDimEvidence::Verdict::kConfirmed;
    e.summary = "head dim " + std::to_string(claim.head_dim) + " confirmed by " + what + ", " + claimed->how;
  } else if (e.observed && e.observed != claim.head_dim &&
             (claim_fails || (e.observed < claim.head_dim && claim.head_dim % e.observed == 0))) {
    e.verdict = HeadDimEvidence::Verdict::kContradicted;
    const Candidate* seen = nullptr;
    for (const Candidate& c : candidates)
      if (c.h == e.observed) seen = &c;
    e.summary = "the K cache has head dim " + std::to_string(e.observed) + " (" + seen->how + "), not " +
                std::to_string(claim.head_dim) + ": " + what;
  } else {
    e.summary = "head dim " + std::to_string(claim.head_dim) + " not decided by " + what;
  }
  return e;
}

Status head_dim_status(const HeadDimEvidence& e, const HeadDimClaim& claim, const std::string& file_name) {
  if (e.verdict != HeadDimEvidence::Verdict::kContradicted) return Status::OK();
  const bool flag = claim.source.starts_with("{--");
  return Status::Mismatch(file_name + " was not written with a model of K head dim " + std::to_string(e.claimed) +
                          " as " + claim.source + " says: " + e.summary +
                          (flag ? "; correct " + claim.source + ", or pass the GGUF the file was saved with ({--model GGUF})"
                                : "; pass the GGUF the file was saved with ({--model GGUF})"));
}

}  // namespace kvsnap

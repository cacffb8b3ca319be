#include "model/synth.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "kernels/quant_blocks.h"
#include "kernels/quantize.h"
#include "model/gguf.h"
#include "platform/error.h"
#include "platform/fp16.h"
#include "platform/thread_pool.h"

namespace ebb {
namespace {

constexpr uint64_t kAlignment = 32;  // GgufWriter's default, so no general.alignment key
constexpr float kWeightStd = 0.02f;

// ---------------------------------------------------------------- shapes

SynthShape make_shape(std::string name, std::string arch, int64_t n_layer, int64_t n_embd, int64_t n_head,
                      int64_t n_head_kv, int64_t head_dim, int64_t n_ff, int64_t n_vocab, bool tied,
                      float rope_base, int64_t n_ctx, float rms_eps) {
  SynthShape s;
  s.name = std::move(name);
  s.arch = std::move(arch);
  s.n_layer = n_layer;
  s.n_embd = n_embd;
  s.n_head = n_head;
  s.n_head_kv = n_head_kv;
  s.head_dim = head_dim;
  s.n_ff = n_ff;
  s.n_vocab = n_vocab;
  s.tied = tied;
  s.rope_base = rope_base;
  s.qk_norm = s.arch == "qwen3";
  s.n_ctx = n_ctx;
  s.rms_eps = rms_eps;
  return s;
}

// ---------------------------------------------------------------- types

struct TypeName {
  std::string_view name;
  SynthType type;
  uint32_t file_type;
};
constexpr TypeName kTypes[] = {
    {"f32", {DType::kF32, SynthType::Mix::kNone}, 0},
    {"f16", {DType::kF16, SynthType::Mix::kNone}, 1},
    {"bf16", {DType::kBF16, SynthType::Mix::kNone}, 32},
    {"q8_0", {DType::kQ8_0, SynthType::Mix::kNone}, 7},
    {"q4_0", {DType::kQ4_0, SynthType::Mix::kNone}, 2},
    {"q4_k", {DType::kQ4_K, SynthType::Mix::kNone}, 14},
    {"q5_k", {DType::kQ5_K, SynthType::Mix::kNone}, 16},
    {"q6_k", {DType::kQ6_K, SynthType::Mix::kNone}, 18},
    {"q4_k_m", {DType::kQ4_K, SynthType::Mix::kQ4_K_M}, 15},
    {"q5_k_m", {DType::kQ5_K, SynthType::Mix::kQ5_K_M}, 17},
    {"q4_1", {DType::kQ4_1, SynthType::Mix::kNone}, 3},
    {"q5_0", {DType::kQ5_0, SynthType::Mix::kNone}, 8},
    {"q5_1", {DType::kQ5_1, SynthType::Mix::kNone}, 9},
    {"q2_k", {DType::kQ2_K, SynthType::Mix::kNone}, 10},
    {"q3_k", {DType::kQ3_K, SynthType::Mix::kNone}, 11},  // every matrix Q3_K: the nearest ftype is Q3_K_S
    {"iq4_nl", {DType::kIQ4_NL, SynthType::Mix::kNone}, 25},
    {"iq4_xs", {DType::kIQ4_XS, SynthType::Mix::kNone}, 30},
};

const TypeName* lookup_type(SynthType t) {
  for (const TypeName& n : kTypes)
    if (n.type == t) return &n;
  return nullptr;
}

// llama.cpp's rule for the layers that get more bits in the _M mixes.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// A format whose block divides the row length: Q8_0 when ne0 % 32 == 0,
// else F16.
DType fit_row(DType want, int64_t ne0) {
  if (ne0 % type_info(want).block_size == 0) return want;
  return ne0 % 32 == 0 ? DType::kQ8_0 : DType::kF16;
}

enum class Role { kEmbd, kOutput, kNorm, kAttnV, kFfnDown, kOther };

DType tensor_type(SynthType t, Role role, int64_t layer, int64_t n_layer, bool tied, int64_t ne0) {
  if (role == Role::kNorm) return DType::kF32;
  DType want = t.base;
  if (t.mix != SynthType::Mix::kNone) {
    if (role == Role::kOutput || (role == Role::kEmbd && tied)) {
      want = DType::kQ6_K;
    } else if ((role == Role::kAttnV || role == Role::kFfnDown) && use_more_bits(layer, n_layer)) {
      want = DType::kQ6_K;
    }
  }
  return fit_row(want, ne0);
}

// ---------------------------------------------------------------- metadata

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Sets metadata on a writer (when there is one) and counts its encoded size,
// so the plan knows the exact header size without building the arrays.
struct MetaSink {
  GgufWriter* w = nullptr;
  uint64_t bytes = 0;
  uint64_t count = 0;

  void key(const std::string& k) {
    bytes += 8 + k.size() + 4;
    ++count;
  }
  void str(const std::string& k, const std::string& v) {
    key(k);
    bytes += 8 + v.size();
    if (w) w->set_string(k, v);
  }
  void u32(const std::string& k, uint32_t v) {
    key(k);
    bytes += 4;
    if (w) w->set_uint32(k, v);
  }
  void f32(const std::string& k, float v) {
    key(k);
    bytes += 4;
    if (w) w->set_float32(k, v);
  }
  void boolean(const std::string& k, bool v) {
    key(k);
    bytes += 1;
    if (w) w->set_bool(k, v);
  }
  void str_array(const std::string& k, std::vector<std::string> v) {
    key(k);
    bytes += 4 + 8;
    for (const std::string& s : v) bytes += 8 + s.size();
    if (w) w->set_string_array(k, std::move(v));
  }
  void f32_array(const std::string& k, std::vector<float> v) {
    key(k);
    bytes += 4 + 8 + 4 * v.size();
    if (w) w->set_float32_array(k, std::move(v));
  }
  void i32_array(const std::string& k, std::vector<int32_t> v) {
    key(k);
    bytes += 4 + 8 + 4 * v.size();
    if (w) w->set_int32_array(k, std::move(v));
  }
};

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
};

// SentencePiece token types (GGUF tokenizer.ggml.token_type).
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

Vocab make_vocab(int64_t n_vocab, const std::vector<std::string>& specials) {
  Vocab v;
  const auto n = static_cast<size_t>(n_vocab);
  v.tokens.reserve(n);
  v.scores.reserve(n);
  v.types.reserve(n);
  const auto add = [&](std::string text, float score, int32_t type) {
    if (v.tokens.size() >= n) return;
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0.f, kUnknown);
  add("<s>", 0.f, kControl);
  add("</s>", 0.f, kControl);
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) add({'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'}, 0.f, kByte);
  // Markers as the families' real files type them: "<|...|>" and "[...]"
  // control tokens (text only when asked for), tags such as <tool_call>
  // user-defined (always text).
  for (const std::string& t : specials) add(t, 0.f, t[0] == '<' && t[1] != '|' ? kUserDefined : kControl);
  // Pieces, most "frequent" (highest score) first.
  const std::string sp = "\xE2\x96\x81";  // "▁"
  float score = 0.f;
  const auto piece = [&](std::string text) { add(std::move(text), score -= 1.f, kNormal); };
  piece(sp);
  for (char c = 0x21; c < 0x7F; ++c) piece(std::string(1, c));
  for (char c = 0x21; c < 0x7F; ++c) piece(sp + c);
  for (char a = 'a'; a <= 'z' && v.tokens.size() < n; ++a)
    for (char b = 'a'; b <= 'z'; ++b) {
      piece({a, b});
      piece(sp + a + b);
    }
  for (char a = 'a'; a <= 'z' && v.tokens.size() < n; ++a)
    for (char b = 'a'; b <= 'z' && v.tokens.size() < n; ++b)
      for (char c = 'a'; c <= 'z'; ++c) {
        piece({a, b, c});
        piece(sp + a + b + c);
      }
  while (v.tokens.size() < n) add("[PAD" + std::to_string(v.tokens.size()) + "]", 0.f, kUnused);
  return v;
}

void set_metadata(MetaSink& m, const SynthShape& s, SynthType type, const std::string& chat_template) {
  const std::string a = s.arch + ".";
  m.str("general.architecture", s.arch);
  m.str("general.name", s.name.empty() ? "synthetic" : s.name + "-synthetic");
  m.str("general.description", "ebb synth: random weights with the shapes of " +
                                   (s.name.empty() ? std::string("a custom shape") : s.name));
  m.u32("general.file_type", synth_file_type(type));
  m.u32(a + "context_length", static_cast<uint32_t>(s.n_ctx));
  m.u32(a + "embedding_length", static_cast<uint32_t>(s.n_embd));
  m.u32(a + "block_count", static_cast<uint32_t>(s.n_layer));
  m.u32(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff));
  m.u32(a + "attention.head_count", static_cast<uint32_t>(s.n_head));
  m.u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  m.u32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim));
  m.u32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim));
  m.f32(a + "rope.freq_base", s.rope_base);
  m.u32(a + "rope.dimension_count", static_cast<uint32_t>(s.head_dim));
  m.f32(a + "attention.layer_norm_rms_epsilon", s.rms_eps);
  const std::vector<std::string> specials = synth_special_tokens(chat_template);
  if (static_cast<int64_t>(3 + 256 + specials.size()) > s.n_vocab)
    throw Error("synth: the chat template's " + std::to_string(specials.size()) +
                " special tokens do not fit the shape's vocabulary of " + std::to_string(s.n_vocab));
  uint32_t eos = 2;
  for (size_t i = 0; i < specials.size(); ++i)
    if (specials[i] == "<|im_end|>" || specials[i] == "<|eot_id|>" || specials[i] == "<|end|>")
      eos = static_cast<uint32_t>(3 + 256 + i);
  Vocab v = make_vocab(s.n_vocab, specials);
  m.str("tokenizer.ggml.model", "llama");
  m.str_array("tokenizer.ggml.tokens", std::move(v.tokens));
  m.f32_array("tokenizer.ggml.scores", std::move(v.scores));
  m.i32_array("tokenizer.ggml.token_type", std::move(v.types));
  m.u32("tokenizer.ggml.bos_token_id", 1);
  m.u32("tokenizer.ggml.eos_token_id", eos);
  m.u32("tokenizer.ggml.unknown_token_id", 0);
  m.boolean("tokenizer.ggml.add_bos_token", true);
  m.boolean("tokenizer.ggml.add_eos_token", false);
  if (!chat_template.empty()) m.str("tokenizer.chat_template", chat_template);
  if (type.base != DType::kF32 && type.base != DType::kF16 && type.base != DType::kBF16) {
    m.u32("general.quantization_version", 2);
  }
}

void validate(const SynthShape& s) {
  const std::string who = "synth shape '" + (s.name.empty() ? std::string("(custom)") : s.name) + "': ";
  const auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw Error(who + what);
  };
  need(s.arch == "llama" || s.arch == "qwen3", "arch '" + s.arch + "' is not supported (llama, qwen3)");
  need(s.n_layer >= 1 && s.n_layer <= 4096, "n_layer must be in [1, 4096]");
  need(s.n_embd >= 1 && s.n_embd <= (1 << 20), "n_embd must be in [1, 2^20]");
  need(s.n_head >= 1 && s.n_head <= 4096, "n_head must be in [1, 4096]");
  need(s.n_head_kv >= 1 && s.n_head % s.n_head_kv == 0,
       "n_head " + std::to_string(s.n_head) + " must be a multiple of n_head_kv " + std::to_string(s.n_head_kv));
  need(s.head_dim >= 2 && s.head_dim <= 4096 && s.head_dim % 2 == 0, "head_dim must be even, in [2, 4096]");
  need(s.n_ff >= 1 && s.n_ff <= (1 << 20), "n_ff must be in [1, 2^20]");
  need(s.n_vocab >= 259 && s.n_vocab <= (1 << 24),
       "n_vocab must be in [259, 2^24] (3 control tokens and 256 byte tokens come first)");
  need(s.n_ctx >= 1 && s.n_ctx <= (int64_t{1} << 24), "n_ctx must be in [1, 2^24]");
  need(s.rope_base > 1.0f, "rope_base must be > 1");
  need(s.rms_eps > 0.0f && s.rms_eps < 1.0f, "rms_eps must be in (0, 1)");
  need(s.qk_norm == (s.arch == "qwen3"), "qk_norm must be set exactly for arch qwen3");
}

// ---------------------------------------------------------------- random

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Standard normal by a piecewise-linear inverse CDF: a 32-bit uniform picks
// one of 4096 equiprobable segments (top 12 bits) and a point inside it
// (low 20 bits). Nodes are the quantiles k/4096 (the two infinite ends are
// cut at the 1/16384 quantiles); the table is rescaled so that the variance
// of the piecewise-uniform result is exactly 1.
class NormalTable {
 public:
  static constexpr int kBits = 12;
  static constexpr int kN = 1 << kBits;

  NormalTable() {
    std::array<double, kN + 1> t{};
    for (int k = 0; k <= kN; ++k) {
      const double p = std::clamp(double(k) / kN, 0.25 / kN, 1.0 - 0.25 / kN);
      double lo = -10, hi = 10;  // bisection on Phi(x) = p
      for (int it = 0; it < 100; ++it) {
        const double mid = 0.5 * (lo + hi);
        (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
      }
      t[k] = 0.5 * (lo + hi);
    }
    for (int k = 0; k <= kN / 2; ++k) {  // exact symmetry, so the mean is 0
      const double m = 0.5 * (t[k] - t[kN - k]);
      t[k] = m;
      t[kN - k] = -m;
    }
    double var = 0;  // E[x^2] of x uniform on [a, b] is (a^2 + ab + b^2) / 3
    for (int k = 0; k < kN; ++k) var += (t[k] * t[k] + t[k] * t[k + 1] + t[k + 1] * t[k + 1]) / 3;
    const double scale = 1.0 / std::sqrt(var / kN);
    for (int k = 0; k < kN; ++k) {
      base_[k] = static_cast<float>(t[k] * scale);
      slope_[k] = static_cast<float>((t[k + 1] - t[k]) * scale / double(1u << (32 - kBits)));
    }
  }
  float operator()(uint32_t u) const {
    const uint32_t k = u >> (32 - kBits);
    return base_[k] + static_cast<float>(u & ((1u << (32 - kBits)) - 1)) * slope_[k];
  }

 private:
  std::array<float, kN> base_{};
  std::array<float, kN> slope_{};
};

const NormalTable& normal_table() {
  static const NormalTable t;
  return t;
}

// mean + std * N(0, 1) into out[0..n), from splitmix64 seeded by `state`.
void fill_normal(float* out, int64_t n, uint64_t state, float mean, float std_dev) {
  const NormalTable& nt = normal_table();
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    const uint64_t z = mix64(state += 0x9e3779b97f4a7c15ull);
    out[i] = mean + std_dev * nt(static_cast<uint32_t>(z));
    out[i + 1] = mean + std_dev * nt(static_cast<uint32_t>(z >> 32));
  }
  if (i < n) out[i] = mean + std_dev * nt(static_cast<uint32_t>(mix64(state += 0x9e3779b97f4a7c15ull)));
}

uint64_t row_seed(uint64_t seed, uint64_t tensor, uint64_t row) {
  return mix64(mix64(mix64(seed) + tensor) + row);
}

// ---------------------------------------------------------------- encoders

// Single-pass round-to-nearest encoders for the synthetic weights. The
// library's quantize_row searches scales per block (tens to hundreds of ns
// per element); these take a few ns, which is what lets a 1 GB file be
// written at a good fraction of disk speed. They write the same GGUF block
// layouts (src/kernels/quant_blocks.h); test_synth checks them against the
// kernels' dequantizers. Inputs are finite and far from the F16 range limits.

// Round-to-nearest of a value known to be > -0.5 (truncation is then rounding).
inline int round_pos(float v) { return static_cast<int>(v + 0.5f); }
inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// Round-to-nearest-even F16, branch-free for normal values (random data
// makes the reference's rounding branches mispredict half the time).
inline uint16_t to_half(float f) {
  const uint32_t x = fp32_to_bits(f);
  const uint32_t a = x & 0x7fffffffu;
  if (a < 0x38800000u || a >= 0x477ff000u) return fp32_to_fp16(f);  // subnormal, overflow: rare
  const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(((x >> 16) & 0x8000u) | ((r - 0x38000000u) >> 13));
}

void encode_f16(const float* x, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = to_half(x[i]);
}

void encode_q8_0(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i, x += kQK8_0) {
    float amax = 0.f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f, id = d > 0 ? 1.f / d : 0.f;
    b[i].d = to_half(d);
    for (int j = 0; j < kQK8_0; ++j) b[i].qs[j] = static_cast<int8_t>(round_pos(x[j] * id + 128.f) - 128);
  }
}

// The value of largest magnitude, with its sign.
inline float signed_absmax(const float* x, int n) {
  float v = 0.f;
  for (int j = 0; j < n; ++j) v = std::fabs(x[j]) > std::fabs(v) ? x[j] : v;
  return v;
}

void encode_q4_0(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i, x += kQK8_0) {
    const float d = signed_absmax(x, kQK8_0) / -8.f, id = d != 0.f ? 1.f / d : 0.f;
    b[i].d = to_half(d);
    for (int j = 0; j < kQK8_0 / 2; ++j) {
      const int q0 = std::min(15, round_pos(x[j] * id + 8.f));
      const int q1 = std::min(15, round_pos(x[j + 16] * id + 8.f));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Q4_K / Q5_K super-block: x ~= d * sc[j] * q - dmin * m[j] for sub-block j
// of 32, q in [0, nmax]; sub-block scale (max - min) / nmax, min -min(0, lo).
void encode_k_super(const float* x, int nmax, uint16_t* d_out, uint16_t* dmin_out, uint8_t* scales, uint8_t* q) {
  float s[8], m[8], smax = 0.f, mmax = 0.f;
  for (int j = 0; j < 8; ++j) {
    float lo = 0.f, hi = x[32 * j];
    for (int l = 0; l < 32; ++l) {
      lo = std::min(lo, x[32 * j + l]);
      hi = std::max(hi, x[32 * j + l]);
    }
    s[j] = std::max(0.f, hi - lo) / nmax;
    m[j] = -lo;
    smax = std::max(smax, s[j]);
    mmax = std::max(mmax, m[j]);
  }
  *d_out = to_half(smax / 63.f);
  *dmin_out = to_half(mmax / 63.f);
  const float dq = fp16_to_fp32(*d_out), dmq = fp16_to_fp32(*dmin_out);
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(dq > 0 ? std::min(63, round_pos(s[j] / dq)) : 0);
    mn[j] = static_cast<uint8_t>(dmq > 0 ? std::min(63, round_pos(m[j] / dmq)) : 0);
  }
  // The inverse of unpack_scale_min_k4.
  std::memset(scales, 0, 12);
  for (int j = 0; j < 4; ++j) {
    scales[j] = sc[j];
    scales[j + 4] = mn[j];
  }
  for (int j = 4; j < 8; ++j) {
    scales[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
    scales[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
    scales[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
  }
  for (int j = 0; j < 8; ++j) {
    const float ds = dq * sc[j], dm = dmq * mn[j], inv = ds > 0 ? 1.f / ds : 0.f;
    for (int l = 0; l < 32; ++l)
      q[32 * j + l] = static_cast<uint8_t>(clampi(round_pos((x[32 * j + l] + dm) * inv), 0, nmax));
  }
}

void encode_q4_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    uint8_t q[kQK_K];
    encode_k_super(x, 15, &b[i].d, &b[i].dmin, b[i].scales, q);
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) b[i].qs[32 * k + l] = static_cast<uint8_t>(q[64 * k + l] | (q[64 * k + 32 + l] << 4));
  }
}

void encode_q5_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    uint8_t q[kQK_K];
    encode_k_super(x, 31, &b[i].d, &b[i].dmin, b[i].scales, q);
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l)
        b[i].qs[32 * k + l] = static_cast<uint8_t>((q[64 * k + l] & 15) | ((q[64 * k + 32 + l] & 15) << 4));
    for (int l = 0; l < 32; ++l) {
      uint8_t h = 0;
      for (int j = 0; j < 8; ++j) h |= static_cast<uint8_t>(((q[32 * j + l] >> 4) & 1) << j);
      b[i].qh[l] = h;
    }
  }
}

// Q6_K: 16 sub-blocks of 16, x ~= d * sc[i] * (q - 32), q in [0, 63].
void encode_q6_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ6_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    float s[16], smax = 0.f;
    for (int j = 0; j < 16; ++j) {
      s[j] = signed_absmax(x + 16 * j, 16) / -32.f;
      smax = std::max(smax, std::fabs(s[j]));
    }
    b[i].d = to_half(smax / 127.f);
    const float dq = fp16_to_fp32(b[i].d);
    uint8_t q[kQK_K];
    for (int j = 0; j < 16; ++j) {
      const int sc = dq > 0 ? clampi(static_cast<int>(std::lrint(s[j] / dq)), -127, 127) : 0;
      b[i].scales[j] = static_cast<int8_t>(sc);
      const float ds = dq * sc, inv = ds != 0.f ? 1.f / ds : 0.f;
      for (int l = 0; l < 16; ++l) q[16 * j + l] = static_cast<uint8_t>(clampi(round_pos(x[16 * j + l] * inv + 32.f), 0, 63));
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t* ql = b[i].ql + 64 * h;
      uint8_t* qh = b[i].qh + 32 * h;
      const uint8_t* qq = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((qq[l] & 15) | ((qq[l + 64] & 15) << 4));
        ql[l + 32] = static_cast<uint8_t>((qq[l + 32] & 15) | ((qq[l + 96] & 15) << 4));
        qh[l] = static_cast<uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                     ((qq[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace

void synth_encode_row(DType t, const float* src, void* dst, int64_t n) {
  EBB_CHECK(n % type_info(t).block_size == 0);
  switch (t) {
    case DType::kF16: encode_f16(src, dst, n); return;
    case DType::kQ8_0: encode_q8_0(src, dst, n); return;
    case DType::kQ4_0: encode_q4_0(src, dst, n); return;
    case DType::kQ4_K: encode_q4_k(src, dst, n); return;
    case DType::kQ5_K: encode_q5_k(src, dst, n); return;
    case DType::kQ6_K: encode_q6_k(src, dst, n); return;
    default: quantize_row_fast(t, src, dst, n); return;  // F32 (copy), BF16, the other quantized formats
  }
}

// ---------------------------------------------------------------- public

uint64_t SynthShape::n_params() const {
  const uint64_t E = n_embd, V = n_vocab, q = n_head * head_dim, kv = n_head_kv * head_dim, F = n_ff;
  const uint64_t layer = 2 * E + E * q + 2 * E * kv + q * E + 3 * E * F + (qk_norm ? 2 * head_dim : 0);
  return V * E * (tied ? 1 : 2) + E + n_layer * layer;
}

const std::vector<SynthShape>& synth_shapes() {
  static const std::vector<SynthShape> shapes = {
      // For tests: K-quant rows (256) in the attention, ffn_down rows of 320
      // fall back to Q8_0.
      make_shape("tiny", "qwen3", 2, 256, 4, 2, 64, 320, 1024, true, 1e6f, 512, 1e-6f),
      // Untied llama; width 64, so every K-quant tensor falls back to Q8_0.
      make_shape("tiny-llama", "llama", 2, 64, 4, 2, 16, 160, 384, false, 1e4f, 256, 1e-5f),
      make_shape("qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 128, 3072, 151936, true, 1e6f, 40960, 1e-6f),
      make_shape("qwen3-1.7b", "qwen3", 28, 2048, 16, 8, 128, 6144, 151936, true, 1e6f, 40960, 1e-6f),
      // The real file also holds rope_freqs.weight (Llama 3 frequency
      // scaling, which ebb reads); synth writes plain RoPE with base 5e5.
      make_shape("llama3.2-1b", "llama", 16, 2048, 32, 8, 64, 8192, 128256, true, 5e5f, 131072, 1e-5f),
      make_shape("tinyllama-1.1b", "llama", 22, 2048, 32, 4, 64, 5632, 32000, false, 1e4f, 2048, 1e-5f),
  };
  return shapes;
}

const SynthShape* find_synth_shape(std::string_view name) {
  for (const SynthShape& s : synth_shapes())
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<std::string> synth_shape_names() {
  std::vector<std::string> out;
  for (const SynthShape& s : synth_shapes()) out.push_back(s.name);
  return out;
}

std::optional<SynthType> parse_synth_type(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const TypeName& n : kTypes)
    if (n.name == lower) return n.type;
  return std::nullopt;
}

std::string synth_type_name(SynthType t) {
  const TypeName* n = lookup_type(t);
  return n ? std::string(n->name) : "?";
}

std::vector<std::string> synth_type_names() {
  std::vector<std::string> out;
  for (const TypeName& n : kTypes) out.emplace_back(n.name);
  return out;
}

uint32_t synth_file_type(SynthType t) {
  const TypeName* n = lookup_type(t);
  if (!n) throw Error("synth: type (" + std::string(dtype_name(t.base)) + ", mix) is not a synth type");
  return n->file_type;
}

std::vector<std::string> synth_special_tokens(const std::string& t) {
  std::vector<std::string> out;
  const auto keep = [&](std::string tok) {
    if (std::find(out.begin(), out.end(), tok) == out.end()) out.push_back(std::move(tok));
  };
  const auto upper = [](char c) { return (c >= 'A' && c <= 'Z') || c == '_'; };
  static constexpr const char* kTags[] = {"<tool_call>",     "</tool_call>", "<tool_response>",
                                          "</tool_response>", "<think>",      "</think>"};
  for (size_t i = 0; i < t.size(); ++i) {
    if (t.compare(i, 2, "<|") == 0) {  // <|name|>: no spaces, bars or quotes inside
      size_t j = i + 2;
      while (j < t.size() && j - i < 64 && t[j] != '|' && t[j] != ' ' && t[j] != '\n' && t[j] != '\'' &&
             t[j] != '"')
        ++j;
      if (j > i + 2 && t.compare(j, 2, "|>") == 0) keep(t.substr(i, j + 2 - i));
    } else if (t[i] == '[') {  // [NAME] or [/NAME], upper case
      size_t j = i + 1 + (i + 1 < t.size() && t[i + 1] == '/');
      const size_t b = j;
      while (j < t.size() && j - b < 32 && upper(t[j])) ++j;
      if (j - b >= 2 && j < t.size() && t[j] == ']') keep(t.substr(i, j + 1 - i));
    } else if (t[i] == '<') {
      for (const char* tag : kTags)
        if (t.compare(i, std::strlen(tag), tag) == 0) keep(tag);
    }
  }
  return out;
}

SynthPlan plan_synth_model(const SynthShape& s, SynthType type, const std::string& chat_template) {
  validate(s);
  if (!lookup_type(type)) throw Error("synth: unsupported type " + std::string(dtype_name(type.base)));
  SynthPlan p;
  const auto add = [&](std::string name, std::vector<int64_t> dims, Role role, int64_t layer) {
    SynthTensor t;
    t.name = std::move(name);
    t.dims = std::move(dims);
    t.norm = role == Role::kNorm;
    t.type = tensor_type(type, role, layer, s.n_layer, s.tied, t.dims[0]);
    t.n_elements = 1;
    for (int64_t d : t.dims) t.n_elements *= static_cast<uint64_t>(d);
    t.n_bytes = row_bytes(t.type, t.dims[0]) * (t.n_elements / static_cast<uint64_t>(t.dims[0]));
    t.offset = p.data_bytes;
    p.data_bytes = align_up(p.data_bytes + t.n_bytes, kAlignment);
    p.n_params += t.n_elements;
    p.tensors.push_back(std::move(t));
  };
  const int64_t E = s.n_embd, q = s.n_head * s.head_dim, kv = s.n_head_kv * s.head_dim;
  add("token_embd.weight", {E, s.n_vocab}, Role::kEmbd, 0);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {E}, Role::kNorm, l);
    add(b + "attn_q.weight", {E, q}, Role::kOther, l);
    add(b + "attn_k.weight", {E, kv}, Role::kOther, l);
    add(b + "attn_v.weight", {E, kv}, Role::kAttnV, l);
    add(b + "attn_output.weight", {q, E}, Role::kOther, l);
    if (s.qk_norm) {
      add(b + "attn_q_norm.weight", {s.head_dim}, Role::kNorm, l);
      add(b + "attn_k_norm.weight", {s.head_dim}, Role::kNorm, l);
    }
    add(b + "ffn_norm.weight", {E}, Role::kNorm, l);
    add(b + "ffn_gate.weight", {E, s.n_ff}, Role::kOther, l);
    add(b + "ffn_up.weight", {E, s.n_ff}, Role::kOther, l);
    add(b + "ffn_down.weight", {s.n_ff, E}, Role::kFfnDown, l);
  }
  add("output_norm.weight", {E}, Role::kNorm, 0);
  if (!s.tied) add("output.weight", {E, s.n_vocab}, Role::kOutput, 0);

  MetaSink m;
  set_metadata(m, s, type, chat_template);
  uint64_t h = 4 + 4 + 8 + 8 + m.bytes;
  for (const SynthTensor& t : p.tensors) h += 8 + t.name.size() + 4 + 8 * t.dims.size() + 4 + 8;
  p.header_bytes = align_up(h, kAlignment);
  p.file_bytes = p.header_bytes + p.data_bytes;
  return p;
}

void write_synth_model(const SynthOptions& opts, const std::string& path) {
  const SynthPlan plan = plan_synth_model(opts.shape, opts.type, opts.chat_template);
  GgufWriter w;
  MetaSink m{&w};
  set_metadata(m, opts.shape, opts.type, opts.chat_template);
  for (const SynthTensor& t : plan.tensors) w.add_tensor(t.name, t.dims, t.type);

  ThreadPool pool(ThreadPoolOptions{.n_threads = opts.n_threads});
  int64_t max_cols = 0;
  for (const SynthTensor& t : plan.tensors) max_cols = std::max(max_cols, t.dims[0]);
  std::vector<std::vector<float>> scratch(static_cast<size_t>(pool.size()),
                                          std::vector<float>(static_cast<size_t>(max_cols)));
  uint64_t reported = 0;
  const auto report = [&](uint64_t done) {
    if (!opts.progress || done < reported) return;
    reported = done;
    opts.progress(done, plan.file_bytes);
  };
  const auto fill = [&](size_t index, uint8_t* dst) {
    const SynthTensor& t = plan.tensors[index];
    const int64_t cols = t.dims[0];
    const int64_t rows = static_cast<int64_t>(t.n_elements) / cols;
    const uint64_t rb = row_bytes(t.type, cols);
    // Rows in chunks of about 4 MB of output, so progress moves smoothly.
    const int64_t chunk = std::max<int64_t>(4 * pool.size(), static_cast<int64_t>((4u << 20) / rb));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t r1 = std::min(rows, r0 + chunk);
      pool.parallel_for(r1 - r0, 1, [&](int64_t b, int64_t e, int th) {
        float* x = scratch[static_cast<size_t>(th)].data();
        for (int64_t r = r0 + b; r < r0 + e; ++r) {
          fill_normal(x, cols, row_seed(opts.seed, index, static_cast<uint64_t>(r)), t.norm ? 1.0f : 0.0f,
                      kWeightStd);
          synth_encode_row(t.type, x, dst + static_cast<uint64_t>(r) * rb, cols);
        }
      });
      report(plan.header_bytes + t.offset + static_cast<uint64_t>(r1) * rb);
    }
  };
  try {
    w.write(path, fill, [&](uint64_t done, uint64_t) { report(done); });
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    throw;
  }
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  EBB_CHECK_MSG(!ec && size == plan.file_bytes, "synth: written file size differs from the plan");
}

}  // namespace ebb

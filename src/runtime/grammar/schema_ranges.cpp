#include "runtime/grammar/schema_ranges.h"

#include <vector>

#include "platform/error.h"
#include "runtime/grammar/schema_regex.h"

namespace ebb::grammar {
namespace {

std::string same_length(const std::string& lo, const std::string& hi) {
  const size_t n = lo.size();
  if (lo == hi) return gbnf_literal(lo);
  if (n == 1) return std::string("[") + lo[0] + "-" + hi[0] + "]";
  if (lo[0] == hi[0]) return gbnf_literal(lo.substr(0, 1)) + " " + same_length(lo.substr(1), hi.substr(1));
  std::vector<std::string> alts;
  char start = lo[0], end = hi[0];
  if (lo.find_first_not_of('0', 1) != std::string::npos) {
    alts.push_back(gbnf_literal(lo.substr(0, 1)) + " " + same_length(lo.substr(1), std::string(n - 1, '9')));
    ++start;
  }
  std::string hi_alt;
  if (hi.find_first_not_of('9', 1) != std::string::npos) {
    hi_alt = gbnf_literal(hi.substr(0, 1)) + " " + same_length(std::string(n - 1, '0'), hi.substr(1));
    --end;
  }
  if (start <= end)
    alts.push_back(std::string("[") + start + "-" + end + "] [0-9]{" + std::to_string(n - 1) + "}");
  if (!hi_alt.empty()) alts.push_back(hi_alt);
  std::string s = "(";
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : "") + alts[i];
  return s + ")";
}

constexpr int kMaxDigits = 18;

// 0 <= a <= b (b < 0: unbounded), as decimal without leading zeros.
std::string nonneg_range(int64_t a, int64_t b) {
  std::vector<std::string> alts;
  const std::string as = std::to_string(a);
  if (b < 0) {
    alts.push_back(same_length(as, std::string(as.size(), '9')));
    if (static_cast<int>(as.size()) < kMaxDigits)
      alts.push_back("[1-9] [0-9]{" + std::to_string(as.size()) + "," + std::to_string(kMaxDigits - 1) + "}");
  } else {
    const std::string bs = std::to_string(b);
    for (size_t len = as.size(); len <= bs.size(); ++len) {
      std::string lo(len, '0');  // 10^(len-1), or a itself at its own length
      lo[0] = '1';
      if (len == as.size()) lo = as;
      const std::string hi = len == bs.size() ? bs : std::string(len, '9');
      alts.push_back(same_length(lo, hi));
    }
  }
  std::string s = "(";
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : "") + alts[i];
  return s + ")";
}

}  // namespace

std::string integer_range_gbnf(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  EBB_CHECK(!lo || !hi || *lo <= *hi);
  std::vector<std::string> alts;
  if (!lo || *lo < 0) {  // negative part: "-" n, n in [max(1, -hi), -lo]
    const int64_t n_lo = hi && *hi < 0 ? -*hi : 1;
    alts.push_back("\"-\" " + nonneg_range(n_lo, lo ? -*lo : -1));
  }
  if (!hi || *hi >= 0) alts.push_back(nonneg_range(lo && *lo > 0 ? *lo : 0, hi ? *hi : -1));
  std::string s = "(";
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : "") + alts[i];
  return s + ")";
}

}  // namespace ebb::grammar

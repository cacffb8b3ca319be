// Integers in a range as a GBNF expression over decimal digits, for JSON
// Schema's minimum / maximum on integers: exact (every integer in [lo, hi]
// and nothing else, no leading zeros, "-0" excluded), built digit by digit
// (the usual split of [lo, hi] into runs like "1[2-9][0-9]"). An open end
// goes up to 18 digits, so every value fits an int64.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ebb::grammar {

// lo <= hi when both are given (checked); |lo|, |hi| < 10^18.
std::string integer_range_gbnf(std::optional<int64_t> lo, std::optional<int64_t> hi);

}  // namespace ebb::grammar

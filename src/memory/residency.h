// Residency states of memory units (DESIGN.md "States") and the per-layer
// map that footprint() and `/memory` show.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ebb {

enum class UnitState : uint8_t {
  kResident,          // in RAM, usable
  kCompressed,        // KV chunk in the in-memory compressed stack
  kStored,            // raw in storage: a swap-file slot (KV) or the GGUF (weights)
  kStoredCompressed,  // a compressed KV chunk moved to a swap-file slot (CompKV)
  kLost,              // restore failed (checksum); recomputed from the session's tokens
};

std::string_view unit_state_name(UnitState s);
char unit_state_char(UnitState s);  // '#', 'c', 's', 'z', '!'

struct ResidencyMap {
  std::vector<UnitState> weights;             // [n_layer]
  std::vector<std::vector<UnitState>> kv;     // [n_layer][chunk], chunks of every session in order
  // One line per layer: "L07 W |##cc ss|" (weights char, then one char per KV chunk).
  std::string grid() const;
};

}  // namespace ebb

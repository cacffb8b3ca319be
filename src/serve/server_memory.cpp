// GET /v1/memory, POST /v1/memory/{evict,restore,limit,trim}.
#include "serve/server_impl.h"

namespace ebb::serve {

struct Server::Impl::MemoryState {};

void Server::Impl::memory_routes() {}

void Server::Impl::memory_metrics(std::string&) const {}

}  // namespace ebb::serve

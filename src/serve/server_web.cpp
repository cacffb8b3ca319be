// The page at /: live residency map, memory by state over time, tok/s and queues.
#include "serve/server_impl.h"

namespace ebb::serve {

void Server::Impl::web_routes() {}

}  // namespace ebb::serve

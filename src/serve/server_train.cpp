// /v1/training/jobs: LoRA training as background jobs on the scheduler.
#include "serve/server_impl.h"

namespace ebb::serve {

struct Server::Impl::TrainState {};

void Server::Impl::training_routes() {}

void Server::Impl::training_metrics(std::string&) const {}

void Server::Impl::stop_training() {}

}  // namespace ebb::serve

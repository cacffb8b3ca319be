// The page at /: live residency map, memory by state over time, tok/s and
// queues (web_page.h).
//
// GET / is open even with --api-key: the page is static, the same for every
// server, and holds no data. Its script asks the data routes
// (/v1/memory, /v1/memory/history, /v1/models) with the key as a Bearer
// header, taken from the URL fragment (/#key=KEY, never sent to the server)
// or a prompt, so the key guards the data and the actions as everywhere else.
#include "serve/server_impl.h"
#include "serve/web_page.h"

namespace ebb::serve {

void Server::Impl::web_routes() {
  http.Get("/", guarded(
                    [](const httplib::Request&, httplib::Response& res) {
                      // Nothing but this document, its inline script and style,
                      // and requests back to this server.
                      res.set_header("Content-Security-Policy",
                                     "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                     "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
                                     "frame-ancestors 'none'");
                      res.set_header("X-Content-Type-Options", "nosniff");
                      res.set_header("Referrer-Policy", "no-referrer");
                      res.set_header("Cache-Control", "no-cache");
                      res.set_content(kWebPage, sizeof kWebPage - 1, "text/html; charset=utf-8");
                    },
                    /*open=*/true));
}

}  // namespace ebb::serve

// The REST gateway's OpenAPI 3 document (controller/gateway/openapi.json, built in), served at
// /v1/openapi.json: what clients, code generators and the schemathesis fuzz test read.
#pragma once

namespace rlhfd::controller {

const char* OpenApiDocument();

}  // namespace rlhfd::controller

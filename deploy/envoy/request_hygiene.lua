-- Request hygiene at the edge: what one client sends must never reach the upstream connection
-- that every client shares in a form that can hurt the others (issue 13, finding 12). Runs first
-- in the filter chain, on every request, HTTP/JSON and gRPC alike. render.py prepends the
-- MAX_HEADER_BYTES, MAX_HEADER_COUNT, MAX_ID_CHARS and ID_PATTERN lines.
--
-- - Request headers over MAX_HEADER_BYTES (RFC 7541 accounting: name + value + 32 per field):
--   431 / RESOURCE_EXHAUSTED for that request only. The codec's own limit is set higher
--   (codec_max_request_headers_kb), because over HTTP/2 a field past the codec limit is an HPACK
--   error that closes the whole connection: every neighbour's stream on it died.
-- - More than MAX_HEADER_COUNT header fields: the same 431 / RESOURCE_EXHAUSTED. The codec's own
--   count limit is set higher (as many as fit in its byte limit): over HTTP/2 the codec resets a
--   stream past it, and the client got no response at all (INTERNAL for gRPC). Pseudo-headers and
--   the fields Envoy itself adds before this filter (FORWARDING) do not count.
-- - grpc-timeout that is not 1-8 digits and a unit: 400 / INVALID_ARGUMENT. Forwarded as it was,
--   it broke the upstream's header decoding and failed other clients' requests on the shared
--   connection with INTERNAL "Error parsing 'grpc-timeout' metadata".
-- - /v1/requests/{id}:append|cancel with an id outside the declared bounds: 400. A 20 KB id
--   passed the header limit, then overflowed gRPC's metadata limit upstream (through
--   x-envoy-original-path): a retryable 429 for a client mistake.
-- - gRPC with a content subtype other than proto (application/grpc+json): INVALID_ARGUMENT; the
--   services speak protobuf only (it was UNKNOWN).
-- - gRPC without `te: trailers` (HTTP/2 requires it; a client that omits it got UNAVAILABLE from
--   the upstream resetting the stream): added, since it carries no information.

local FORWARDING = {["x-forwarded-for"] = true, ["x-forwarded-proto"] = true, ["x-request-id"] = true,
                    ["x-envoy-external-address"] = true}

local function reject(handle, is_grpc, http_status, grpc_status, message)
  if is_grpc then
    -- A trailers-only gRPC reply; local_reply_config keeps the message as plain text.
    handle:respond({[":status"] = "200", ["content-type"] = "application/grpc",
                    ["grpc-status"] = grpc_status}, message)
  else
    handle:respond({[":status"] = http_status}, message)
  end
end

local function valid_grpc_timeout(value)
  return string.match(value, "^%d+[HMSmun]$") ~= nil and #value <= 9
end

function envoy_on_request(handle)
  local headers = handle:headers()
  local content_type = headers:get("content-type") or ""
  -- gRPC as Envoy defines it (application/grpc, +subtype or ;params): not application/grpc-web,
  -- which the grpc_web filter has already turned into gRPC where it is served.
  local is_grpc = string.match(content_type, "^application/grpc$") ~= nil
    or string.match(content_type, "^application/grpc[+;]") ~= nil
  local size, count = 0, 0
  for key, value in pairs(headers) do
    size = size + #key + #value + 32
    if string.sub(key, 1, 1) ~= ":" and not FORWARDING[key] then
      count = count + 1
    end
  end
  if size > MAX_HEADER_BYTES then
    return reject(handle, is_grpc, "431", "8",
      "request headers are " .. size .. " bytes; the limit is " .. MAX_HEADER_BYTES)
  end
  if count > MAX_HEADER_COUNT then
    return reject(handle, is_grpc, "431", "8",
      "request has " .. count .. " header fields; the limit is " .. MAX_HEADER_COUNT)
  end
  local timeout = headers:get("grpc-timeout")
  if timeout ~= nil and not valid_grpc_timeout(timeout) then
    return reject(handle, is_grpc, "400", "3",
      "invalid grpc-timeout header: 1 to 8 digits and a unit (H, M, S, m, u, n), e.g. 30S")
  end
  local path = headers:get(":path") or ""
  if string.sub(path, 1, 13) == "/v1/requests/" then
    local id = string.match(path, "^/v1/requests/([^?]*):[%w]+$") or string.match(path, "^/v1/requests/([^?]*)$") or ""
    if #id > MAX_ID_CHARS or string.match(id, ID_PATTERN) == nil then
      return reject(handle, is_grpc, "400", "3",
        "request id in the path: 1 to " .. MAX_ID_CHARS .. " of the characters A-Z a-z 0-9 . _ ~ -")
    end
  end
  if is_grpc then
    local subtype = string.match(string.sub(content_type, 17), "^%+?([^;]*)") or ""
    if subtype ~= "" and subtype ~= "proto" then
      return reject(handle, is_grpc, "415", "3",
        "unsupported gRPC content-type; use application/grpc or application/grpc+proto")
    end
    if headers:get("te") ~= "trailers" then
      headers:replace("te", "trailers")
    end
  end
end

-- Reshapes error responses of the OpenAI routes (/v1/chat/completions, /v1/completions) into
-- OpenAI's error object: {"error": {"message", "type", "code", "param"}}.
--
-- Input is either the transcoder's google.rpc.Status JSON
--   {"code":3,"message":"...","details":[{"@type":".../ErrorInfo","reason":"INVALID_FIELD",...},
--                                        {"@type":".../BadRequest","field_violations":[{"field":"n",...}]}]}
-- or an Envoy local reply, which local_reply_config renders with the same keys. JSON printed by
-- Envoy has no insignificant whitespace and every '"' inside a string is escaped, so the
-- `"key":"` scan below cannot match inside a string value. The message is copied as the raw,
-- still-escaped JSON string literal, so no decoding/encoding is needed here.
-- Bodies that already are OpenAI errors (they start with {"error":) pass unchanged.

-- Same table as services/preprocess/openai/render.py ERROR_TYPES (a unit test compares them).
local ERROR_TYPES = {
  [400] = "invalid_request_error",
  [401] = "authentication_error",
  [403] = "permission_error",
  [404] = "not_found_error",
  [409] = "conflict_error",
  [413] = "invalid_request_error",
  [429] = "rate_limit_error",
  [499] = "cancelled_error",
  [500] = "server_error",
  [501] = "not_implemented_error",
  [503] = "service_unavailable_error",
  [504] = "timeout_error",
}

-- Raw contents of the first "key":"..." string in text (escapes kept), or nil.
local function string_field(text, key)
  local _, last = string.find(text, '"' .. key .. '":"', 1, true)
  if last == nil then
    return nil
  end
  local i = last + 1
  while i <= #text do
    local c = string.sub(text, i, i)
    if c == "\\" then
      i = i + 2
    elseif c == '"' then
      return string.sub(text, last + 1, i - 1)
    else
      i = i + 1
    end
  end
  return nil
end

local function quoted_or_null(raw)
  if raw == nil or raw == "" then
    return "null"
  end
  return '"' .. raw .. '"'
end

function envoy_on_response(handle)
  local status = tonumber(handle:headers():get(":status")) or 200
  if status < 400 then
    return
  end
  local body = handle:body()
  local text = ""
  if body ~= nil and body:length() > 0 then
    text = body:getBytes(0, body:length())
  end
  if string.sub(text, 1, 9) == '{"error":' then
    return
  end
  local message = string_field(text, "message")
  if message == nil then
    -- Not JSON we know (e.g. an empty gRPC error body): fall back to the status line.
    message = "HTTP " .. status
  end
  local reason = string_field(text, "reason")
  if reason ~= nil then
    -- Envoy's own reasons look like `grpc_json_transcode_failure{NOT_FOUND}`: keep codes snake_case.
    reason = string.gsub(string.gsub(string.lower(reason), "[^%w_]+", "_"), "_+$", "")
  end
  local error_type = ERROR_TYPES[status] or (status >= 500 and "server_error" or "invalid_request_error")
  local out = '{"error":{"message":"' .. message .. '","type":"' .. error_type .. '","code":'
    .. quoted_or_null(reason) .. ',"param":' .. quoted_or_null(string_field(text, "field")) .. "}}"
  if body ~= nil then
    body:setBytes(out)
  end
  -- RetryInfo (sent with RESOURCE_EXHAUSTED/UNAVAILABLE) becomes Retry-After, which the openai
  -- client honours when it retries.
  local delay = string.match(text, '"retry_delay":"([%d%.]+)s"')
  if delay ~= nil then
    handle:headers():replace("retry-after", tostring(math.max(1, math.ceil(tonumber(delay)))))
  end
  handle:headers():replace("content-type", "application/json")
  handle:headers():replace("content-length", tostring(#out))
end

-- Reshapes error responses of the HTTP API surfaces into each API's own error shape:
--   openai     {"error": {"message", "type", "code", "param"}}   (chat/completions, completions,
--              embeddings, responses, models, tokenize)
--   anthropic  {"type": "error", "error": {"type", "message"}}   (messages, messages/count_tokens)
-- deploy/envoy/render.py renders one named copy per shape: it writes the shape's status -> type
-- table, its fallbacks and its body (`error_body`) where the RENDERED marker below stands, from
-- services/preprocess/surfaces/{openai,anthropic}/errors.py, the tables the surfaces use after the
-- first byte. No error type is written in this file. Routes pick their copy with LuaPerRoute `name`.
--
-- Input is either the transcoder's google.rpc.Status JSON
--   {"code":3,"message":"...","details":[{"@type":".../ErrorInfo","reason":"INVALID_FIELD",...},
--                                        {"@type":".../BadRequest","field_violations":[{"field":"n",...}]}]}
-- or an Envoy local reply, which local_reply_config renders with the same keys. JSON printed by
-- Envoy has no insignificant whitespace and every '"' inside a string is escaped, so the
-- `"key":"` scan below cannot match inside a string value. The message is copied as the raw,
-- still-escaped JSON string literal, so no decoding/encoding is needed here.
-- Bodies that already are in the API's shape pass unchanged.

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

local function quoted(raw)
  return '"' .. raw .. '"'
end

local function quoted_or_null(raw)
  if raw == nil or raw == "" then
    return "null"
  end
  return quoted(raw)
end

--[[ RENDERED: ERROR_TYPES, SERVER_ERROR_TYPE, CLIENT_ERROR_TYPE, SHAPED_PREFIXES, error_body ]]

local function already_shaped(text)
  for _, prefix in ipairs(SHAPED_PREFIXES) do
    if string.sub(text, 1, #prefix) == prefix then
      return true
    end
  end
  return false
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
  if already_shaped(text) then
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
  local error_type = ERROR_TYPES[status] or (status >= 500 and SERVER_ERROR_TYPE or CLIENT_ERROR_TYPE)
  local out = error_body(message, error_type, reason, string_field(text, "field"))
  if body ~= nil then
    body:setBytes(out)
  end
  -- RetryInfo (sent with RESOURCE_EXHAUSTED/UNAVAILABLE) becomes Retry-After, which the openai
  -- and anthropic clients honour when they retry.
  local delay = string.match(text, '"retry_delay":"([%d%.]+)s"')
  if delay ~= nil then
    handle:headers():replace("retry-after", tostring(math.max(1, math.ceil(tonumber(delay)))))
  end
  handle:headers():replace("content-type", "application/json")
  handle:headers():replace("content-length", tostring(#out))
end

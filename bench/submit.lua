-- wrk script: MCP tools/call requests for the acceptance benchmark.
--
-- Modes (first script argument):
--   new     tools/call with a fresh Idempotency-Key on every request (creates a task)
--   replay  tools/call cycling through the keys listed in the file named by the 2nd argument
--   get     tasks/get cycling through the task ids listed in the file named by the 2nd argument
--   new2025 / get2025  the same as new / get on the 2025-11-25 handshake wire, in the session
--           named by TASKDESK_BENCH_SESSION (tools/call with params.task; no _meta envelope)
-- The bearer token comes from the TASKDESK_BENCH_TOKEN environment variable. A response that
-- is not a 200 carrying the expected result counts as an error (printed by done()).

local mode, listfile
local items = {}
local token = os.getenv("TASKDESK_BENCH_TOKEN")
local run = os.getenv("TASKDESK_BENCH_RUN") or "run"
local threads = {}

local envelope = '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
  .. '"io.modelcontextprotocol/clientInfo":{"name":"wrk","version":"1"},'
  .. '"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}'
local call_body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow_echo",'
  .. '"arguments":{"text":"bench","seconds":1},' .. envelope .. '}}'
local session = os.getenv("TASKDESK_BENCH_SESSION")
local call_body_2025 = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow_echo",'
  .. '"arguments":{"text":"bench","seconds":1},"task":{}}}'

local function headers_2025()
  return {
    ["Content-Type"] = "application/json",
    ["Accept"] = "application/json, text/event-stream",
    ["MCP-Protocol-Version"] = "2025-11-25",
    ["Mcp-Session-Id"] = session,
    ["Authorization"] = "Bearer " .. token,
  }
end

local function headers(method, name)
  return {
    ["Content-Type"] = "application/json",
    ["Accept"] = "application/json, text/event-stream",
    ["MCP-Protocol-Version"] = "2026-07-28",
    ["Mcp-Method"] = method,
    ["Mcp-Name"] = name,
    ["Authorization"] = "Bearer " .. token,
  }
end

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  mode = args[1] or "new"
  listfile = args[2]
  if listfile then
    for line in io.lines(listfile) do
      if #line > 0 then table.insert(items, line) end
    end
  end
  counter = 0
  errors = 0
  -- Each thread starts at its own place in the list.
  offset = (tid or 1) * 7919
end

function request()
  counter = counter + 1
  if mode == "new2025" then
    local h = headers_2025()
    h["Idempotency-Key"] = run .. "-" .. tid .. "-" .. counter
    return wrk.format("POST", "/mcp", h, call_body_2025)
  elseif mode == "get2025" then
    local id = items[(counter + offset) % #items + 1]
    local body = '{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"' .. id .. '"}}'
    return wrk.format("POST", "/mcp", headers_2025(), body)
  elseif mode == "new" then
    local h = headers("tools/call", "slow_echo")
    h["Idempotency-Key"] = run .. "-" .. tid .. "-" .. counter
    return wrk.format("POST", "/mcp", h, call_body)
  elseif mode == "replay" then
    local h = headers("tools/call", "slow_echo")
    h["Idempotency-Key"] = items[(counter + offset) % #items + 1]
    return wrk.format("POST", "/mcp", h, call_body)
  else
    local id = items[(counter + offset) % #items + 1]
    local body = '{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"' .. id
      .. '",' .. envelope .. '}}'
    return wrk.format("POST", "/mcp", headers("tasks/get", id), body)
  end
end

function response(status, headers, body)
  local expected = '"resultType":"task"'
  if mode == "get" or mode == "get2025" then
    expected = '"taskId"'
  elseif mode == "new2025" then
    expected = '"task":{'
  end
  if status ~= 200 or not string.find(body, expected, 1, true) or string.find(body, '"error"', 1, true) then
    errors = errors + 1
    if errors <= 3 then io.stderr:write("unexpected response " .. status .. ": " .. body:sub(1, 300) .. "\n") end
  end
end

function done(summary, latency, requests)
  local total = 0
  for _, thread in ipairs(threads) do total = total + (thread:get("errors") or 0) end
  io.write(string.format("BENCH requests=%d errors=%d p50_us=%d p90_us=%d p99_us=%d\n",
    summary.requests, total, latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end

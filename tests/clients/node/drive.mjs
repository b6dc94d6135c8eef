// Drives a Taskdesk server with an official MCP TypeScript client on the 2025-11-25 wire and
// prints what it saw as one JSON object (read by tests/integration/test_node_clients.py).
//
//   node drive.mjs v1|v2 URL TOKEN KEY
//     v1: @modelcontextprotocol/sdk 1.x (client.experimental.tasks.callToolStream)
//     v2: @modelcontextprotocol/client 2.x in its default (legacy) version negotiation,
//         tasks through @modelcontextprotocol/ext-tasks
//   KEY: the idempotency key of the export (export_report requires one)
//
// Both call export_report as a task and confirm_action, whose question the client answers in
// its elicitation handler with {confirm: true}.

const [mode, url, token, key] = process.argv.slice(2);
const headers = { Authorization: `Bearer ${token}` };
const KEY_META = "dev.taskdesk/idempotencyKey";
const EXPORT = { quarter: "Q4", format: "csv", rows: 50 };
const asked = [];

async function v1() {
  const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
  const { StreamableHTTPClientTransport } = await import(
    "@modelcontextprotocol/sdk/client/streamableHttp.js"
  );
  const { ElicitRequestSchema } = await import("@modelcontextprotocol/sdk/types.js");
  const client = new Client(
    { name: "taskdesk-tests-v1", version: "1.0.0" },
    { capabilities: { elicitation: { form: {} }, tasks: { list: {}, cancel: {} } } },
  );
  client.setRequestHandler(ElicitRequestSchema, async (request) => {
    asked.push(request.params);
    return { action: "accept", content: { confirm: true } };
  });
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  await client.connect(transport);
  const out = {
    protocolVersion: transport.protocolVersion,
    sessionId: transport.sessionId,
    capabilities: client.getServerCapabilities(),
  };
  const listed = await client.listTools();
  out.tools = Object.fromEntries(listed.tools.map((t) => [t.name, t.execution?.taskSupport]));
  const stream = async (name, args, meta) => {
    const seen = [];
    const params = { name, arguments: args, ...(meta ? { _meta: meta } : {}) };
    for await (const message of client.experimental.tasks.callToolStream(params, undefined, {
      task: { ttl: 60000 },
      timeout: 120000,
    })) {
      if (message.type === "taskCreated") seen.push({ type: "taskCreated", taskId: message.task.taskId });
      else if (message.type === "taskStatus") seen.push({ type: "taskStatus", status: message.task.status });
      else if (message.type === "result") seen.push({ type: "result", result: message.result });
      else seen.push({ type: "error", error: String(message.error) });
    }
    return seen;
  };
  out.export = await stream("export_report", EXPORT, { [KEY_META]: key });
  out.confirm = await stream("confirm_action", { action: "ship it" });
  out.asked = asked;
  const listedTasks = await client.experimental.tasks.listTasks();
  out.listed = listedTasks.tasks.map((t) => t.taskId);
  // A blocking tasks/result on a task that outlasts the server's stream limit: the server
  // closes the stream after its priming event and the client resumes it by GET.
  const { CreateTaskResultSchema, CallToolResultSchema } = await import(
    "@modelcontextprotocol/sdk/types.js"
  );
  const slow = await client.request(
    { method: "tools/call", params: { name: "slow_echo", arguments: { text: "late", seconds: 3 }, task: {} } },
    CreateTaskResultSchema,
  );
  const started = Date.now();
  const late = await client.experimental.tasks.getTaskResult(slow.task.taskId, CallToolResultSchema, {
    timeout: 120000,
  });
  out.resumed = { result: late, seconds: (Date.now() - started) / 1000 };
  // A keyed synchronous call runs as a durable task: its stream closes before the answer
  // (this stack holds streams for 1 s) and the client resumes it by GET with Last-Event-ID.
  const syncStarted = Date.now();
  const durable = await client.callTool(
    {
      name: "slow_echo",
      arguments: { text: "durable", seconds: 3 },
      _meta: { [KEY_META]: `${key}-sync` },
    },
    undefined,
    { timeout: 120000 },
  );
  out.durable = { result: durable, seconds: (Date.now() - syncStarted) / 1000 };
  // tasks/cancel of a running task answers with the task already cancelled.
  const running = await client.request(
    { method: "tools/call", params: { name: "slow_echo", arguments: { text: "never", seconds: 60 }, task: {} } },
    CreateTaskResultSchema,
  );
  out.cancelled = await client.experimental.tasks.cancelTask(running.task.taskId);
  await transport.terminateSession();
  await client.close();
  return out;
}

async function v2() {
  const { Client, StreamableHTTPClientTransport } = await import("@modelcontextprotocol/client");
  const { createTaskSessionFromClient, resultFromTaskOutcome } = await import(
    "@modelcontextprotocol/ext-tasks/client"
  );
  const client = new Client(
    { name: "taskdesk-tests-v2", version: "2.0.0" },
    { capabilities: { elicitation: { form: {} } } },
  );
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  await client.connect(transport);
  const out = { protocolVersion: transport.protocolVersion, sessionId: transport.sessionId };
  const listed = await client.listTools();
  out.tools = Object.fromEntries(listed.tools.map((t) => [t.name, t.execution?.taskSupport]));
  const session = createTaskSessionFromClient(client, {
    endpointId: "taskdesk-tests",
    onInputRequest: async (request) => {
      asked.push(request.params);
      return { action: "accept", content: { confirm: true } };
    },
  });
  try {
    const settle = async (name, args, metadata) => {
      const events = [];
      const execution = await session.callTool(name, args, {
        ...(metadata ? { metadata } : {}),
        requestTimeoutMs: 120000,
      });
      const { outcome } = await execution.settle({ onEvent: (e) => events.push(e.type ?? e.kind) });
      return { events, result: resultFromTaskOutcome(outcome) };
    };
    out.export = await settle("export_report", EXPORT, { [KEY_META]: key });
    out.confirm = await settle("confirm_action", { action: "ship it" });
    out.asked = asked;
  } finally {
    await session.close();
  }
  await client.close();
  return out;
}

try {
  const out = await (mode === "v1" ? v1() : v2());
  process.stdout.write(JSON.stringify(out) + "\n");
  process.exit(0);
} catch (error) {
  process.stderr.write(`${error?.stack ?? error}\n`);
  process.exit(1);
}

// Signs in to a Taskdesk server with the official TypeScript SDK 1.x's OAuth client and calls
// export_report as a task (read by tests/integration/test_oauth_clients.py).
//
//   node oauth.mjs --url MCP_URL --redirect-port PORT --name APP_NAME --key KEY
//                  [--client-metadata-url HTTPS_URL]
//
// The SDK's StreamableHTTPClientTransport holds an OAuthClientProvider kept in memory (client
// information, tokens, code verifier, discovery state). With --client-metadata-url the SDK
// uses that URL as its client_id (a client ID metadata document, when the server's metadata
// says it supports them); without it, it registers itself (RFC 7591). The person's browser is
// someone else's business: redirectToAuthorization prints the URL, and a loopback HTTP
// server on PORT (the redirect URI, http://127.0.0.1:PORT/callback) receives the answer,
// checking its state and its issuer (RFC 9207) before the SDK exchanges the code.
//
// Every line on stdout is one JSON object with an "event": client, authorize, unauthorized,
// callback, authorized, connected, task, status, result, denied, done. Exit status 1 (the
// stack on stderr) when something went wrong.

import { randomBytes } from "node:crypto";
import http from "node:http";
import { parseArgs } from "node:util";

const { values: opts } = parseArgs({
  options: {
    url: { type: "string" },
    "redirect-port": { type: "string" },
    name: { type: "string" },
    key: { type: "string" },
    "client-metadata-url": { type: "string" },
  },
});
const REDIRECT_URL = `http://127.0.0.1:${opts["redirect-port"]}/callback`;
const KEY_META = "dev.taskdesk/idempotencyKey";
const EXPORT = { quarter: "Q3", format: "csv", rows: 40 };

function emit(event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + "\n");
}

// An OAuthClientProvider that keeps everything in memory, as a CLI that signs in each time
// it starts would.
class MemoryProvider {
  constructor() {
    this._state = randomBytes(16).toString("hex");
    this._client = undefined;
    this._tokens = undefined;
    this._verifier = undefined;
    this._discovery = undefined;
    this.clientMetadataUrl = opts["client-metadata-url"];
  }

  get redirectUrl() {
    return REDIRECT_URL;
  }

  get clientMetadata() {
    return {
      client_name: opts.name,
      redirect_uris: [REDIRECT_URL],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "none",
    };
  }

  state() {
    return this._state;
  }

  clientInformation() {
    return this._client;
  }

  saveClientInformation(information) {
    this._client = information;
    emit("client", { clientId: information.client_id, hasSecret: Boolean(information.client_secret) });
  }

  tokens() {
    return this._tokens;
  }

  saveTokens(tokens) {
    this._tokens = tokens;
  }

  redirectToAuthorization(url) {
    emit("authorize", { url: url.href });
  }

  saveCodeVerifier(verifier) {
    this._verifier = verifier;
  }

  codeVerifier() {
    if (!this._verifier) throw new Error("no code verifier saved");
    return this._verifier;
  }

  saveDiscoveryState(state) {
    this._discovery = state;
  }

  discoveryState() {
    return this._discovery;
  }

  // The issuer the SDK discovered: the authorization server's metadata names it.
  issuer() {
    return this._discovery?.authorizationServerMetadata?.issuer;
  }
}

// The redirect URI's server: resolves with the query of the first request to /callback.
function callbackServer(port) {
  let received;
  const answer = new Promise((resolve) => {
    received = resolve;
  });
  const server = http.createServer((request, response) => {
    const url = new URL(request.url, REDIRECT_URL);
    if (url.pathname !== "/callback") {
      response.writeHead(404).end();
      return;
    }
    const params = Object.fromEntries(url.searchParams);
    const signedIn = "code" in params;
    response.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
    response.end(
      `<!doctype html><title>${signedIn ? "Signed in" : "Not signed in"}</title>` +
        `<h1 id="outcome">${signedIn ? "Signed in" : "Not signed in"}: you may close this window.</h1>`,
    );
    received(params);
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, "127.0.0.1", () => resolve({ server, answer }));
  });
}

async function main() {
  const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
  const { StreamableHTTPClientTransport } = await import(
    "@modelcontextprotocol/sdk/client/streamableHttp.js"
  );
  const { UnauthorizedError } = await import("@modelcontextprotocol/sdk/client/auth.js");
  const provider = new MemoryProvider();
  const { server, answer } = await callbackServer(Number(opts["redirect-port"]));
  // A client and its transport, both holding the provider: the first is refused (no token
  // yet) and starts the sign-in, the second connects with the tokens finishAuth saved.
  const open = () => ({
    client: new Client(
      { name: "taskdesk-oauth-tests", version: "1.0.0" },
      { capabilities: { tasks: { list: {}, cancel: {} } } },
    ),
    transport: new StreamableHTTPClientTransport(new URL(opts.url), { authProvider: provider }),
  });
  const first = open();
  try {
    await first.client.connect(first.transport);
    throw new Error("the server let the client in without a token");
  } catch (error) {
    if (!(error instanceof UnauthorizedError)) throw error;
    emit("unauthorized", { message: String(error.message) });
  }
  const params = await answer;
  server.close();
  emit("callback", { params: { ...params, code: params.code ? "<code>" : undefined } });
  if (params.state !== provider.state()) throw new Error(`state ${params.state} is not ours`);
  if (params.iss !== provider.issuer()) {
    throw new Error(`iss ${params.iss} is not the issuer discovered, ${provider.issuer()}`);
  }
  if (params.error) {
    emit("denied", { error: params.error, description: params.error_description });
    emit("done", { tokens: provider.tokens() !== undefined });
    return;
  }
  await first.transport.finishAuth(params.code);
  const tokens = provider.tokens();
  emit("authorized", {
    tokenType: tokens.token_type,
    scope: tokens.scope,
    accessPrefix: tokens.access_token.slice(0, 4),
    refreshPrefix: tokens.refresh_token?.slice(0, 4),
  });
  const { client, transport } = open();
  await client.connect(transport);
  emit("connected", { protocolVersion: transport.protocolVersion });
  const request = { name: "export_report", arguments: EXPORT, _meta: { [KEY_META]: opts.key } };
  let final;
  for await (const message of client.experimental.tasks.callToolStream(request, undefined, {
    task: { ttl: 60000 },
    timeout: 120000,
  })) {
    if (message.type === "taskCreated") emit("task", { taskId: message.task.taskId });
    else if (message.type === "taskStatus") emit("status", { status: message.task.status });
    else if (message.type === "result") emit("result", { result: (final = message.result) });
    else throw new Error(`the task stream failed: ${message.error}`);
  }
  await transport.terminateSession();
  await client.close();
  emit("done", { tokens: true, completed: final !== undefined && !final.isError });
}

try {
  await main();
  process.exit(0);
} catch (error) {
  process.stderr.write(`${error?.stack ?? error}\n`);
  process.exit(1);
}

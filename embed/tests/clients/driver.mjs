// A client on the TypeScript SDK's `ClientSideConnection`, driven by the test over this
// process's stdio (embed/tests/real_clients.rs). Usage:
//   node driver.mjs <path of the SDK's dist/acp.js> <proxy stderr file> <proxy> <args...>
// Each stdin line is a JSON command {tag, op, ...}; each stdout line is a JSON report
// {kind, ...}: what the SDK handed this client (updates, permission requests, extension
// notifications), the answers to the commands, and the proxy's exit.
import { spawn } from "node:child_process";
import { openSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";

const [sdkPath, stderrPath, program, ...args] = process.argv.slice(2);
const acp = await import(pathToFileURL(sdkPath).href);

const report = (value) => process.stdout.write(JSON.stringify(value) + "\n");
const failure = (error) => ({
  code: error?.code ?? null,
  message: String(error?.message ?? error),
  data: error?.data ?? null,
});

let proxy = null;
let connection = null;
// While `holding`, permission requests wait for a `release` command (a user who has not
// decided yet).
let holding = false;
const held = [];

class Client {
  async sessionUpdate(params) {
    report({ kind: "update", sessionId: params.sessionId, update: params.update });
  }
  async requestPermission(params) {
    const option =
      params.options.find((o) => o.kind === "allow_once") ?? params.options[0];
    report({
      kind: "permission",
      sessionId: params.sessionId,
      toolCallId: params.toolCall?.toolCallId ?? null,
      options: params.options.map((o) => o.optionId),
      selected: option.optionId,
      held: holding,
    });
    if (holding) {
      return new Promise((resolve) => held.push({ resolve, optionId: option.optionId }));
    }
    return { outcome: { outcome: "selected", optionId: option.optionId } };
  }
  async extNotification(method, params) {
    report({ kind: "ext_notification", method, params });
  }
}

function start() {
  const err = openSync(stderrPath, "a");
  proxy = spawn(program, args, { stdio: ["pipe", "pipe", err] });
  const stream = acp.ndJsonStream(Writable.toWeb(proxy.stdin), Readable.toWeb(proxy.stdout));
  connection = new acp.ClientSideConnection(() => new Client(), stream);
  const pid = proxy.pid;
  proxy.stdin.on("error", () => {});
  proxy.on("exit", (code, signal) => report({ kind: "exited", pid, code, signal }));
  return { pid };
}

const ops = {
  spawn: async () => start(),
  initialize: async () =>
    connection.initialize({
      protocolVersion: acp.PROTOCOL_VERSION,
      clientCapabilities: { fs: { readTextFile: false, writeTextFile: false } },
    }),
  new: async (c) => connection.newSession({ cwd: c.cwd, mcpServers: [] }),
  load: async (c) =>
    connection.loadSession({ sessionId: c.sessionId, cwd: c.cwd, mcpServers: [] }),
  prompt: async (c) =>
    connection.prompt({ sessionId: c.sessionId, prompt: [{ type: "text", text: c.text }] }),
  cancel: async (c) => connection.cancel({ sessionId: c.sessionId }),
  hold: async (c) => {
    holding = c.hold;
    return {};
  },
  release: async (c) => {
    const released = held.splice(0);
    for (const h of released) {
      h.resolve(
        c.outcome === "cancelled"
          ? { outcome: { outcome: "cancelled" } }
          : { outcome: { outcome: "selected", optionId: h.optionId } },
      );
    }
    return { released: released.length };
  },
  close: async () => {
    const exited = new Promise((resolve) => proxy.on("exit", (code) => resolve({ code })));
    proxy.stdin.end();
    return exited;
  },
};

const commands = createInterface({ input: process.stdin });
// The test is gone: so is the driver (and the proxy's stdin with it).
commands.on("close", () => process.exit(0));
commands.on("line", (line) => {
  const command = JSON.parse(line);
  ops[command.op](command).then(
    (result) => report({ kind: "answer", tag: command.tag, result: result ?? null }),
    (error) => report({ kind: "answer", tag: command.tag, error: failure(error) }),
  );
});
process.on("unhandledRejection", (error) => report({ kind: "unhandled", error: String(error) }));

# A client on the Python SDK's `acp.ClientSideConnection`, driven by the test over this
# process's stdio (embed/tests/real_clients.rs). Usage:
#   python driver.py <proxy stderr file> <proxy> <args...>
# The connection is the SDK's `ClientSideConnection`, made by `acp.connect_to_agent`.
# Each stdin line is a JSON command {tag, op, ...}; each stdout line is a JSON report
# {kind, ...}: what the SDK handed this client (updates, permission requests, extension
# notifications), the answers to the commands, and the proxy's exit.
import asyncio
import json
import sys
import threading

from acp import PROTOCOL_VERSION, connect_to_agent
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    RequestPermissionResponse,
    TextContentBlock,
)


def report(value):
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def dump(model):
    if model is None:
        return None
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class Client:
    def __init__(self):
        # While `holding`, permission requests wait for a `release` command (a user who has
        # not decided yet).
        self.holding = False
        self.held = []

    async def session_update(self, session_id, update, **kwargs):
        report({"kind": "update", "sessionId": session_id, "update": dump(update)})

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        option = next((o for o in options if o.kind == "allow_once"), options[0])
        report(
            {
                "kind": "permission",
                "sessionId": session_id,
                "toolCallId": tool_call.tool_call_id,
                "options": [o.option_id for o in options],
                "selected": option.option_id,
                "held": self.holding,
            }
        )
        if self.holding:
            decided = asyncio.get_running_loop().create_future()
            self.held.append(decided)
            if await decided == "cancelled":
                return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=option.option_id))

    async def ext_notification(self, method, params):
        report({"kind": "ext_notification", "method": method, "params": params})


class Driver:
    def __init__(self, stderr_path, argv):
        self.stderr_path = stderr_path
        self.argv = argv
        self.proxy = None
        self.conn = None
        self.client = Client()

    async def spawn(self, command):
        stderr = open(self.stderr_path, "ab")
        self.proxy = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            limit=16 << 20,
        )
        stderr.close()
        self.conn = connect_to_agent(self.client, self.proxy.stdin, self.proxy.stdout)
        proxy = self.proxy

        async def watch():
            code = await proxy.wait()
            report({"kind": "exited", "pid": proxy.pid, "code": code if code >= 0 else None,
                    "signal": -code if code < 0 else None})

        asyncio.ensure_future(watch())
        return {"pid": self.proxy.pid}

    async def initialize(self, command):
        return dump(await self.conn.initialize(protocol_version=PROTOCOL_VERSION,
                                               client_capabilities=ClientCapabilities()))

    async def new(self, command):
        return dump(await self.conn.new_session(cwd=command["cwd"], mcp_servers=[]))

    async def load(self, command):
        return dump(await self.conn.load_session(cwd=command["cwd"], session_id=command["sessionId"],
                                                 mcp_servers=[]))

    async def prompt(self, command):
        return dump(await self.conn.prompt(session_id=command["sessionId"],
                                           prompt=[TextContentBlock(type="text", text=command["text"])]))

    async def cancel(self, command):
        await self.conn.cancel(session_id=command["sessionId"])
        return {}

    async def hold(self, command):
        self.client.holding = command["hold"]
        return {}

    async def release(self, command):
        released, self.client.held = self.client.held, []
        for decided in released:
            decided.set_result(command["outcome"])
        return {"released": len(released)}

    async def close(self, command):
        self.proxy.stdin.close()
        return {"code": await self.proxy.wait()}

    async def run(self, command):
        try:
            result = await getattr(self, command["op"])(command)
            report({"kind": "answer", "tag": command["tag"], "result": result})
        except Exception as error:  # the answer is the error, as the SDK raised it
            report({"kind": "answer", "tag": command["tag"],
                    "error": {"code": getattr(error, "code", None), "message": str(error),
                              "data": getattr(error, "data", None)}})


async def main():
    driver = Driver(sys.argv[1], sys.argv[2:])
    loop = asyncio.get_running_loop()
    lines = asyncio.Queue()

    def read():
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read, daemon=True).start()
    tasks = set()
    while (line := await lines.get()) is not None:
        task = asyncio.ensure_future(driver.run(json.loads(line)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


asyncio.run(main())

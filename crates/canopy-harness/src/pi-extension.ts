// Canopy's tools for pi: pi has no MCP client, so this extension (written into each session's
// directory and loaded with `-e`) lists the tools of the session's MCP endpoint over streamable
// HTTP with the session's bearer token, registers each under its own name, and forwards every
// call. It then narrows pi's built-in tools to the role's (CANOPY_PI_BUILTIN_TOOLS). It holds
// no state beyond the MCP session id and decides nothing: the daemon checks every call.

const url = process.env.CANOPY_MCP_URL ?? "";
const token = process.env.CANOPY_MCP_TOKEN ?? "";
const builtins = (process.env.CANOPY_PI_BUILTIN_TOOLS ?? "").split(",").filter((t) => t.length > 0);

let session: string | null = null;
let next = 0;

function headers(): Record<string, string> {
  const h: Record<string, string> = {
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
    authorization: `Bearer ${token}`,
  };
  if (session) h["mcp-session-id"] = session;
  return h;
}

async function post(body: unknown): Promise<any> {
  const res = await fetch(url, { method: "POST", headers: headers(), body: JSON.stringify(body) });
  const sid = res.headers.get("mcp-session-id");
  if (sid) session = sid;
  const text = await res.text();
  if (!text.trim()) return null;
  if ((res.headers.get("content-type") ?? "").includes("text/event-stream")) {
    const data = text
      .split("\n")
      .filter((l) => l.startsWith("data:"))
      .map((l) => l.slice(5).trim())
      .filter((l) => l.length > 0);
    return data.length > 0 ? JSON.parse(data[data.length - 1]) : null;
  }
  return JSON.parse(text);
}

async function rpc(method: string, params: unknown): Promise<any> {
  const reply = await post({ jsonrpc: "2.0", id: ++next, method, params });
  if (!reply) throw new Error(`Canopy's MCP endpoint gave no answer to ${method}`);
  if (reply.error) throw new Error(reply.error.message ?? JSON.stringify(reply.error));
  return reply.result;
}

export default async function canopy(pi: any) {
  await rpc("initialize", {
    protocolVersion: "2025-03-26",
    capabilities: {},
    clientInfo: { name: "canopy-pi", version: "1" },
  });
  await post({ jsonrpc: "2.0", method: "notifications/initialized" });
  const listed = await rpc("tools/list", {});
  const names: string[] = [];
  for (const tool of listed.tools ?? []) {
    names.push(tool.name);
    pi.registerTool({
      name: tool.name,
      label: tool.name,
      description: tool.description ?? tool.name,
      parameters: tool.inputSchema ?? { type: "object", properties: {} },
      async execute(_callId: string, params: unknown) {
        const result = await rpc("tools/call", { name: tool.name, arguments: params ?? {} });
        const content = result.content ?? [{ type: "text", text: JSON.stringify(result.structuredContent ?? {}) }];
        if (result.isError) throw new Error(content.map((c: any) => c.text ?? "").join("\n"));
        return { content, details: result.structuredContent ?? {} };
      },
    });
  }
  pi.on("session_start", async () => {
    pi.setActiveTools([...builtins, ...names]);
  });
}

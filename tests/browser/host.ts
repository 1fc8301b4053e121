// The browser tests' host page: the official AppBridge of @modelcontextprotocol/ext-apps, hosting
// the app in a sandboxed cross-origin iframe as a real MCP Apps host does. Its requests to the
// MCP server go to the test's Python MCP client (window.mcpRequest, a Playwright binding); every
// request the app makes is recorded in window.hostLog. Built by `node cell/build.mjs --host DIR`.
import { AppBridge, type McpUiHostContext, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

declare global {
  interface Window {
    mcpRequest(method: string, params: string): Promise<string>;
    hostLog: { method: string; params: unknown }[];
    host: HostApi;
  }
}

interface HostApi {
  mount(src: string, context: McpUiHostContext): Promise<void>;
  input(args: Record<string, unknown>): Promise<void>;
  result(result: Record<string, unknown>): Promise<void>;
  cancelled(reason: string): Promise<void>;
  context(context: McpUiHostContext): Promise<void>;
  teardown(): Promise<void>;
}

window.hostLog = [];
let bridge: AppBridge | null = null;
let current: McpUiHostContext = {};

function record(method: string, params: unknown): void {
  window.hostLog.push({ method, params: JSON.parse(JSON.stringify(params ?? null)) });
}

async function forward<T>(method: string, params: unknown): Promise<T> {
  return JSON.parse(await window.mcpRequest(method, JSON.stringify(params ?? {}))) as T;
}

window.host = {
  async mount(src, context) {
    const frame = document.createElement("iframe");
    frame.setAttribute("sandbox", "allow-scripts");
    frame.title = "MCP App";
    frame.style.cssText = "width: 720px; height: 200px; border: 1px solid #888; display: block";
    document.getElementById("frame-holder")!.append(frame);
    current = context;
    bridge = new AppBridge(
      null,
      { name: "mcp-sandbox test host", version: "1.0.0" },
      { serverResources: {}, serverTools: {}, downloadFile: {}, openLinks: {} },
      { hostContext: context },
    );
    bridge.onreadresource = async (params) => {
      record("resources/read", params);
      return await forward("resources/read", params);
    };
    bridge.oncalltool = async (params) => {
      record("tools/call", params);
      return await forward("tools/call", params);
    };
    bridge.ondownloadfile = (params) => {
      record("ui/download-file", params);
      return Promise.resolve({});
    };
    bridge.onopenlink = (params) => {
      record("ui/open-link", params);
      return Promise.resolve({});
    };
    bridge.onmessage = (params) => {
      record("ui/message", params);
      return Promise.resolve({});
    };
    bridge.onupdatemodelcontext = (params) => {
      record("ui/update-model-context", params);
      return Promise.resolve({});
    };
    bridge.onsizechange = (params) => {
      record("ui/notifications/size-changed", params);
      if (typeof params.height === "number") frame.style.height = `${params.height}px`;
    };
    const initialized = new Promise<void>((resolve) => {
      bridge!.oninitialized = () => resolve();
    });
    await bridge.connect(new PostMessageTransport(frame.contentWindow!, frame.contentWindow!));
    frame.src = src;
    await initialized;
  },
  async input(args) {
    await bridge!.sendToolInput({ arguments: args });
  },
  async result(result) {
    await bridge!.sendToolResult(result as Parameters<AppBridge["sendToolResult"]>[0]);
  },
  async cancelled(reason) {
    await bridge!.sendToolCancelled({ reason });
  },
  context(context) {
    current = { ...current, ...context };
    bridge!.setHostContext(current);
    return Promise.resolve();
  },
  async teardown() {
    await bridge!.teardownResource({});
  },
};

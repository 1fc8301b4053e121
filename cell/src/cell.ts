// The MCP App (SEP-1865, io.modelcontextprotocol/ui) that shows one execute_python call as a
// notebook cell. It calls no tool: it only reads server resources (kept outputs and files) and
// asks the host to download them. Rendering is in render.ts.
import "./jitless.ts";
import {
  App,
  applyDocumentTheme,
  applyHostStyleVariables,
  type McpUiHostContext,
  type McpUiResourceTeardownResult,
} from "@modelcontextprotocol/ext-apps";
import { el } from "./dom.ts";
import { type Host, type Input, renderResult, renderStatus, type ToolResult } from "./render.ts";

const cell = document.getElementById("cell")!;
const status = document.getElementById("status")!;
const meta = document.getElementById("meta")!;
const code = document.getElementById("code")!;
const output = document.getElementById("output")!;

const app = new App({ name: "mcp-sandbox-cell", version: "1.0.0" }, {}, { autoResize: true });
let input: Input = { code: null, timeout: null };
let finished = false;
let tornDown = false;

function setStatus(text: string, kind: "" | "ok" | "failed" = ""): void {
  status.textContent = text;
  status.className = kind ? `status ${kind}` : "status";
}

function readInput(args: unknown): Input {
  const given = typeof args === "object" && args !== null ? args as Record<string, unknown> : {};
  return {
    code: typeof given.code === "string" ? given.code : null,
    timeout: typeof given.timeout === "number" && Number.isFinite(given.timeout) ? given.timeout : null,
  };
}

function showCode(text: string | null): void {
  code.textContent = text ?? "";
}

function applyContext(context: McpUiHostContext | undefined): void {
  if (!context) return;
  if (context.theme === "light" || context.theme === "dark") applyDocumentTheme(context.theme);
  if (context.styles?.variables) applyHostStyleVariables(context.styles.variables);
  const box = context.containerDimensions as Record<string, unknown> | undefined;
  if (box) {
    const height = typeof box.height === "number" ? box.height : null;
    const maxHeight = typeof box.maxHeight === "number" ? box.maxHeight : null;
    // Beyond the host's height the cell scrolls inside itself.
    cell.style.height = height !== null ? `${height}px` : "";
    cell.style.maxHeight = height === null && maxHeight !== null ? `${maxHeight}px` : "";
  }
}

const host: Host = {
  canRead: () => Boolean(app.getHostCapabilities()?.serverResources),
  canDownload: () => Boolean(app.getHostCapabilities()?.downloadFile),
  async read(uri) {
    const answer = await app.readServerResource({ uri });
    const first = answer.contents[0] as Record<string, unknown> | undefined;
    return {
      text: typeof first?.text === "string" ? first.text : null,
      blob: typeof first?.blob === "string" ? first.blob : null,
      mimeType: typeof first?.mimeType === "string" ? first.mimeType : null,
    };
  },
  async download(item) {
    const content = "embedded" in item
      ? {
        type: "resource" as const,
        resource: {
          uri: item.embedded.uri,
          mimeType: item.embedded.mimeType ?? "text/plain",
          text: item.embedded.text,
        },
      }
      : {
        type: "resource_link" as const,
        uri: item.link.uri,
        name: item.link.name,
        ...(item.link.mimeType ? { mimeType: item.link.mimeType } : {}),
      };
    const answer = await app.downloadFile({ contents: [content] });
    return !answer.isError;
  },
};

app.ontoolinputpartial = (params) => {
  if (!finished && input.code === null) showCode(readInput(params.arguments).code);
};

app.ontoolinput = (params) => {
  input = readInput(params.arguments);
  showCode(input.code);
  if (!finished) setStatus("Running…");
};

app.ontoolresult = (params) => {
  if (tornDown) return;
  finished = true;
  const result = params as ToolResult;
  const outcome = renderResult(output, result, input, host);
  if (outcome) {
    renderStatus(status, meta, outcome, input);
  } else {
    setStatus(result.isError ? "✗ Failed" : "✓ Done", result.isError ? "failed" : "ok");
  }
};

app.ontoolcancelled = (params) => {
  if (tornDown || finished) return;
  finished = true;
  setStatus("✗ Stopped", "failed");
  const box = el("div", "error");
  box.setAttribute("role", "alert");
  box.append(el("div", "error-title", "Stopped"));
  if (params.reason) box.append(el("pre", undefined, params.reason));
  output.replaceChildren(box);
};

app.onhostcontextchanged = (context) => applyContext(context);

app.onteardown = (): McpUiResourceTeardownResult => {
  tornDown = true;
  return {};
};

app.connect().then(
  () => applyContext(app.getHostContext()),
  (error: unknown) =>
    setStatus(`Could not reach the host: ${error instanceof Error ? error.message : String(error)}`, "failed"),
);

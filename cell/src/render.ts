// One execute_python call as a notebook cell: what the program printed (with its displayed
// tables in place), its figures, the files it wrote, its final value, its error, and the server's
// notes. Everything shown here was made by untrusted code: it is set as text only (dom.ts).
import {
  type Blocks,
  type EmbeddedText,
  firstText,
  IMAGE_TYPES,
  imageSource,
  type Link,
  type Outcome,
  parseBlocks,
  parseOutcome,
  parseTables,
  type Table,
} from "./contract.ts";
import { button, el, formatSize } from "./dom.ts";
import { renderTable } from "./table.ts";

/** What the cell asks of its host: reading a server resource, and downloading a file. */
export interface Host {
  canRead(): boolean;
  canDownload(): boolean;
  read(uri: string): Promise<{ text: string | null; blob: string | null; mimeType: string | null }>;
  download(item: { embedded: EmbeddedText } | { link: Link }): Promise<boolean>;
}

export interface Input {
  code: string | null;
  timeout: number | null;
}

export interface ToolResult {
  content?: unknown;
  structuredContent?: unknown;
  isError?: boolean;
  _meta?: unknown;
}

const SANDBOX_TITLES = new Map([
  ["cancelled", "Stopped"],
  ["memory_limit", "Out of memory"],
  ["crash", "The sandbox crashed"],
  ["rejected", "Rejected"],
]);

function seconds(value: number): string {
  return `${Number(value.toFixed(value < 10 ? 2 : 1))} s`;
}

function errorTitle(outcome: Outcome, input: Input): string {
  if (outcome.status === "timeout") {
    const limit = input.timeout ?? (outcome.durationMs !== null ? outcome.durationMs / 1000 : null);
    return limit !== null ? `Timed out after ${seconds(limit)}` : "Timed out";
  }
  // A program's own exception is named as it is, even one called Timeout.
  return SANDBOX_TITLES.get(outcome.status) ?? outcome.exception ?? "Error";
}

/** Slice by code points: the server counts stdout's characters as Python does. */
function codePoints(text: string): string[] {
  return Array.from(text);
}

function stream(text: string, kind: "stdout" | "stderr"): HTMLElement {
  const pre = el("pre", `stream ${kind}`);
  if (kind === "stderr") pre.append(el("span", "label", "stderr"));
  pre.append(document.createTextNode(text));
  return pre;
}

export function renderStatus(status: HTMLElement, meta: HTMLElement, outcome: Outcome, input: Input): void {
  if (outcome.status === "ok") {
    status.textContent = "✓ Done";
    status.className = "status ok";
  } else {
    status.textContent = `✗ ${errorTitle(outcome, input)}`;
    status.className = "status failed";
  }
  const parts: string[] = [];
  if (outcome.durationMs !== null) {
    parts.push(outcome.durationMs < 1000 ? `${outcome.durationMs} ms` : seconds(outcome.durationMs / 1000));
  }
  if (outcome.backend) parts.push(outcome.backend);
  if (outcome.sessionId) parts.push(`session ${outcome.sessionId}`);
  if (outcome.sessionRestored) {
    parts.push(outcome.restoredFromCall !== null ? `restored from call ${outcome.restoredFromCall}` : "restored");
  }
  if (outcome.sessionLost) parts.push("session lost");
  meta.textContent = parts.join(" · ");
}

function keptLink(host: Host, label: string, uri: string, link: Link | undefined): HTMLElement {
  const row = el("div", "kept");
  row.append(el("span", undefined, label));
  const whole = el("pre", "preview");
  whole.hidden = true;
  if (host.canRead()) {
    const show = button("Show all", async () => {
      show.disabled = true;
      try {
        const got = await host.read(uri);
        whole.textContent = got.text ?? "(not text)";
      } catch (error) {
        whole.textContent = `Could not read it: ${error instanceof Error ? error.message : String(error)}`;
      }
      whole.hidden = false;
    });
    row.append(show);
  }
  if (host.canDownload()) {
    row.append(
      button("Save", () =>
        void host.download({
          link: link ?? { uri, name: label, mimeType: "text/plain", size: null, description: null },
        })),
    );
  }
  const box = el("div");
  box.append(row, whole);
  return box;
}

function isText(mime: string): boolean {
  return mime.startsWith("text/") || /^application\/(json|xml|csv|x-ndjson|yaml|toml)\b/.test(mime) ||
    mime.endsWith("+json") || mime.endsWith("+xml");
}

/** A base64 blob as UTF-8 text, or null when it is not. */
function decodeText(blob: string): string | null {
  try {
    const bytes = Uint8Array.from(atob(blob), (c) => c.charCodeAt(0));
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return null;
  }
}

function renderFiles(outcome: Outcome, blocks: Blocks, figureImages: number, host: Host): HTMLElement | null {
  if (!outcome.files.length) return null;
  const list = el("ul", "files");
  list.setAttribute("aria-label", "Files written");
  const fileImages = blocks.images.slice(figureImages);
  let nextImage = 0;
  for (const file of outcome.files) {
    const item = el("li", "file");
    const head = el("div", "file-head");
    head.append(
      el("span", "file-name", file.name),
      el("span", "file-size", `${formatSize(file.size)} · ${file.mimeType}`),
    );
    item.append(head);
    const image = IMAGE_TYPES.has(file.mimeType) ? fileImages[nextImage++] : undefined;
    const embedded = blocks.embedded.find((e) => e.uri === `sandbox://output/${file.name}`);
    const link = blocks.links.find((l) => l.uri === file.uri) ??
      blocks.links.find((l) => l.uri.includes("/files/") && l.name === file.name) ??
      (file.uri
        ? { uri: file.uri, name: file.name, mimeType: file.mimeType, size: file.size, description: null }
        : undefined);
    const preview = el("div");
    preview.hidden = true;
    const source = image ? imageSource(image) : null;
    if (source) {
      const img = el("img", "figure");
      img.alt = file.name;
      img.src = source;
      item.append(img);
    }
    if (embedded || (link && host.canRead())) {
      const open = button("Open", async () => {
        if (!preview.hidden) {
          preview.hidden = true;
          open.textContent = "Open";
          return;
        }
        preview.replaceChildren(el("pre", "preview pending", "Reading…"));
        preview.hidden = false;
        open.textContent = "Close";
        try {
          if (embedded) {
            preview.replaceChildren(el("pre", "preview", embedded.text));
          } else if (link) {
            const got = await host.read(link.uri);
            const mime = got.mimeType && got.mimeType !== "application/octet-stream" ? got.mimeType : file.mimeType;
            const img = got.blob !== null ? imageSource({ mimeType: mime, data: got.blob }) : null;
            const text = got.text ?? (got.blob !== null && isText(mime) ? decodeText(got.blob) : null);
            if (text !== null) {
              preview.replaceChildren(el("pre", "preview", text));
            } else if (img) {
              const shown = el("img", "figure");
              shown.alt = file.name;
              shown.src = img;
              preview.replaceChildren(shown);
            } else {
              preview.replaceChildren(el("pre", "preview", `Binary (${mime}): save it to open it.`));
            }
          }
        } catch (error) {
          preview.replaceChildren(
            el("pre", "preview", `Could not read it: ${error instanceof Error ? error.message : String(error)}`),
          );
        }
      });
      head.append(open);
    }
    if (host.canDownload() && (embedded || link)) {
      head.append(button("Save", async () => {
        await host.download(embedded ? { embedded } : { link: link! });
      }));
    }
    if (file.savedTo) head.append(el("span", "file-size", `saved to ${file.savedTo}`));
    item.append(preview);
    list.append(item);
  }
  return list;
}

/** Fill `output` with the cell's output. */
export function renderResult(output: HTMLElement, result: ToolResult, input: Input, host: Host): Outcome | null {
  const outcome = parseOutcome(result.structuredContent);
  const parts: HTMLElement[] = [];
  if (!outcome) {
    // Not our server's result (or a protocol error): its text is all there is.
    const text = firstText(result.content) ?? "(no result)";
    if (result.isError) {
      const box = el("div", "error");
      box.setAttribute("role", "alert");
      box.append(el("div", "error-title", "Error"), el("pre", undefined, text));
      parts.push(box);
    } else {
      parts.push(stream(text, "stdout"));
    }
    output.replaceChildren(...parts);
    return null;
  }
  const blocks = parseBlocks(result.content);
  const tables = parseTables(result._meta);

  const notes = [...outcome.notes];
  if (outcome.sessionLost && !notes.some((n) => /lost/i.test(n))) {
    notes.unshift("The session was lost: its variables are gone.");
  }
  if (outcome.sessionRestored && !notes.some((n) => /restored/i.test(n))) {
    notes.unshift(
      `The session was restored${outcome.restoredFromCall !== null ? ` from call ${outcome.restoredFromCall}` : ""}.`,
    );
  }
  if (notes.length) {
    const list = el("ul", "notes");
    list.setAttribute("aria-label", "Notes");
    for (const note of notes) list.append(el("li", undefined, note));
    parts.push(list);
  }

  // stdout, with each display()ed table in place of the text it printed.
  const chars = codePoints(outcome.stdout);
  const placed = tables
    .filter((t) => t.source === "display" && t.printed && t.printed[0] <= t.printed[1] && t.printed[1] <= chars.length)
    .sort((a, b) => a.printed![0] - b.printed![0]);
  let at = 0;
  const inPlace = new Set<Table>();
  for (const table of placed) {
    const [start, end] = table.printed!;
    if (start < at) continue; // overlapping spans: the later one goes after stdout
    if (start > at) parts.push(stream(chars.slice(at, start).join(""), "stdout"));
    parts.push(renderTable(table));
    inPlace.add(table);
    at = end;
  }
  if (at < chars.length) parts.push(stream(chars.slice(at).join(""), "stdout"));
  for (const table of tables) {
    if (table.source === "display" && !inPlace.has(table)) parts.push(renderTable(table));
  }
  const linkFor = (uri: string | null) => (uri ? blocks.links.find((l) => l.uri === uri) : undefined);
  if (outcome.stdoutUri) {
    parts.push(keptLink(host, "stdout was cut; the whole is kept", outcome.stdoutUri, linkFor(outcome.stdoutUri)));
  }
  if (outcome.stderr) parts.push(stream(outcome.stderr, "stderr"));
  if (outcome.stderrUri) {
    parts.push(keptLink(host, "stderr was cut; the whole is kept", outcome.stderrUri, linkFor(outcome.stderrUri)));
  }

  const figureCount = Math.min(outcome.figures, blocks.images.length);
  for (let i = 0; i < figureCount; i++) {
    const source = imageSource(blocks.images[i]);
    if (!source) continue;
    const img = el("img", "figure");
    img.alt = `Figure ${i + 1}`;
    img.src = source;
    parts.push(img);
  }
  const files = renderFiles(outcome, blocks, figureCount, host);
  if (files) parts.push(files);

  const value = tables.find((t) => t.source === "value");
  if (value || outcome.result !== null) {
    const row = el("div", "out-row");
    row.append(el("span", "prompt", "Out"));
    const holder = el("div", "result");
    holder.append(value ? renderTable(value) : el("pre", undefined, outcome.result ?? ""));
    row.append(holder);
    parts.push(row);
  }

  if (outcome.status !== "ok") {
    const box = el("div", "error");
    box.setAttribute("role", "alert");
    box.append(el("div", "error-title", errorTitle(outcome, input)));
    if (outcome.error) box.append(el("pre", undefined, outcome.error));
    parts.push(box);
  }
  output.replaceChildren(...parts);
  return outcome;
}

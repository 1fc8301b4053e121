// What the server sends (the execute_python result) read defensively: every field comes from, or
// is shaped by, untrusted code, so each is checked for its type and anything else dropped.

export type Value = number | string | boolean | null;

export interface Table {
  kind: "DataFrame" | "Series";
  source: "display" | "value";
  shape: [number, number];
  columns: string[];
  dtypes: string[];
  indexName: string | null;
  index: string[];
  rows: Value[][];
  positions: number[];
  printed: [number, number] | null;
}

export interface OutputFile {
  name: string;
  size: number;
  mimeType: string;
  savedTo: string | null;
  /** Where the server keeps it (read with resources/read), when it does. */
  uri: string | null;
}

export interface Outcome {
  /** What happened to the run: ok, error (the program raised `exception`), or the sandbox's outcome. */
  status: string;
  stdout: string;
  stderr: string;
  result: string | null;
  exception: string | null;
  error: string | null;
  truncated: boolean;
  durationMs: number | null;
  backend: string | null;
  sessionId: string | null;
  sessionLost: boolean;
  sessionRestored: boolean;
  restoredFromCall: number | null;
  files: OutputFile[];
  figures: number;
  stdoutUri: string | null;
  stderrUri: string | null;
  notes: string[];
}

export interface ImageBlock {
  mimeType: string;
  data: string;
}

export interface EmbeddedText {
  uri: string;
  mimeType: string | null;
  text: string;
}

export interface Link {
  uri: string;
  name: string;
  mimeType: string | null;
  size: number | null;
  description: string | null;
}

/** The content blocks after the first (the model's text), sorted by kind. */
export interface Blocks {
  texts: string[];
  images: ImageBlock[];
  embedded: EmbeddedText[];
  links: Link[];
}

/** Image types shown as <img>: raster only (an SVG is markup). */
export const IMAGE_TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);

type Json = Record<string, unknown>;

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function str(value: unknown): string | null {
  return typeof value === "string" ? value : null;
}

function num(value: unknown): number | null {
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

function strings(value: unknown): string[] {
  return Array.isArray(value) ? value.map((item) => (typeof item === "string" ? item : String(item))) : [];
}

function cell(value: unknown): Value {
  if (value === null || typeof value === "string" || typeof value === "boolean") return value;
  if (typeof value === "number") return value;
  return value === undefined ? null : String(value);
}

export function parseOutcome(structured: unknown): Outcome | null {
  if (!isObject(structured) || typeof structured.status !== "string") return null;
  const files: OutputFile[] = [];
  if (Array.isArray(structured.files)) {
    for (const file of structured.files) {
      if (!isObject(file) || typeof file.name !== "string") continue;
      files.push({
        name: file.name,
        size: num(file.size) ?? 0,
        mimeType: str(file.mime_type) ?? "application/octet-stream",
        savedTo: str(file.saved_to),
        uri: str(file.uri),
      });
    }
  }
  return {
    status: structured.status,
    stdout: str(structured.stdout) ?? "",
    stderr: str(structured.stderr) ?? "",
    result: str(structured.result),
    exception: str(structured.exception),
    error: str(structured.error),
    truncated: structured.truncated === true,
    durationMs: num(structured.duration_ms),
    backend: str(structured.backend),
    sessionId: str(structured.session_id),
    sessionLost: structured.session_lost === true,
    sessionRestored: structured.session_restored === true,
    restoredFromCall: num(structured.restored_from_call),
    files,
    figures: num(structured.figures) ?? 0,
    stdoutUri: str(structured.stdout_uri),
    stderrUri: str(structured.stderr_uri),
    notes: strings(structured.notes),
  };
}

export function parseTables(meta: unknown): Table[] {
  const list = isObject(meta) ? meta["mcp-sandbox/tables"] : undefined;
  if (!Array.isArray(list)) return [];
  const tables: Table[] = [];
  for (const item of list) {
    if (!isObject(item) || !Array.isArray(item.rows)) continue;
    const shape = Array.isArray(item.shape) ? item.shape.map((n) => num(n) ?? 0) : [];
    const printed = Array.isArray(item.printed) && item.printed.length === 2 &&
        item.printed.every((n) => Number.isInteger(n) && (n as number) >= 0)
      ? [item.printed[0] as number, item.printed[1] as number] as [number, number]
      : null;
    const rows = item.rows.map((row) => (Array.isArray(row) ? row.map(cell) : [cell(row)]));
    const positions = Array.isArray(item.positions) ? item.positions.map((n) => num(n) ?? -1) : [];
    tables.push({
      kind: item.kind === "Series" ? "Series" : "DataFrame",
      source: item.source === "value" ? "value" : "display",
      shape: [shape[0] ?? rows.length, shape[1] ?? 0],
      columns: strings(item.columns),
      dtypes: strings(item.dtypes),
      indexName: str(item.index_name),
      index: strings(item.index),
      rows,
      positions: positions.length === rows.length ? positions : rows.map((_, i) => i),
      printed,
    });
  }
  return tables;
}

export function parseBlocks(content: unknown): Blocks {
  const blocks: Blocks = { texts: [], images: [], embedded: [], links: [] };
  if (!Array.isArray(content)) return blocks;
  for (const block of content.slice(1)) {
    if (!isObject(block)) continue;
    if (block.type === "text" && typeof block.text === "string") {
      blocks.texts.push(block.text);
    } else if (block.type === "image" && typeof block.data === "string") {
      blocks.images.push({ mimeType: str(block.mimeType) ?? "", data: block.data });
    } else if (block.type === "resource" && isObject(block.resource)) {
      const resource = block.resource;
      if (typeof resource.uri === "string" && typeof resource.text === "string") {
        blocks.embedded.push({ uri: resource.uri, mimeType: str(resource.mimeType), text: resource.text });
      }
    } else if (block.type === "resource_link" && typeof block.uri === "string") {
      blocks.links.push({
        uri: block.uri,
        name: str(block.name) ?? "",
        mimeType: str(block.mimeType),
        size: num(block.size),
        description: str(block.description),
      });
    }
  }
  return blocks;
}

/** The first content block's text: what the model reads, shown only when nothing else is there. */
export function firstText(content: unknown): string | null {
  if (!Array.isArray(content) || !isObject(content[0])) return null;
  return str(content[0].text);
}

/** A data: URI for an image block, or null when it is not a raster image in base64. */
export function imageSource(image: ImageBlock): string | null {
  if (!IMAGE_TYPES.has(image.mimeType) || !/^[A-Za-z0-9+/]*={0,2}$/.test(image.data)) return null;
  return `data:${image.mimeType};base64,${image.data}`;
}
